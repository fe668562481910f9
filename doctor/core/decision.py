"""The one decision a run leads to: the status it reports, the exit code, and whether ``launch`` may start the
server. One table, read by every command and renderer (pip's ``status_codes``, black's ``Report``); ``smoke``
decides by it too, and ``decide_node`` reads the same rows for the node a run judged (``slurm-health``,
``kube-node``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from doctor.core.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from doctor.core.result import Result, Status


@dataclass(frozen=True)
class Decision:
    status: Status  # the run's status as reported (JSON ``summary.status``): pass, warn or fail
    exit_code: int  # EXIT_OK, EXIT_FAILED or EXIT_INTERRUPTED
    refusal: str | None  # why ``launch`` must not start the server; None: it may


def decide(results: Sequence[Result], *, interrupted: bool = False, strict: bool = False) -> Decision:
    """Status, exit code and the launch gate of a run, by the first row that holds:

    ==========================================================  ======  ====  =========================================
    the run                                                     status  exit  launch
    ==========================================================  ======  ====  =========================================
    interrupted (Ctrl-C) before every check finished            (a)     130   refused: "the run was interrupted"
    a check failed or errored                                   fail    1     refused: "N check(s) failed: IDS"
    a check not judged for want of facts, under ``--strict``    fail    1     refused: "N check(s) could not be judged"
    a check not judged for want of facts                        (b)     0     refused: "N check(s) could not be judged"
    a warning, under ``--strict``                               fail    1     refused: "warnings under --strict"
    a warning                                                   warn    0     starts
    anything else (passes, skips that do not apply)             pass    0     starts
    ==========================================================  ======  ====  =========================================

    (a) as the rows below it would say (a check that failed before Ctrl-C: fail; the checks it stopped are not
    failures); (b) warn if a check warned, else pass. An ignored failure (``--ignore``) is a warning here, and a
    check not judged that is ignored is judged knowingly: neither refuses on its own.
    """
    failed = [r.id for r in failing(results, interrupted=interrupted)]
    unjudged = [r.id for r in not_judged(results)]
    warned = any(r.status is Status.WARN for r in results)
    strict_fails = strict and (warned or bool(unjudged))
    status = Status.FAIL if failed or strict_fails else Status.WARN if warned else Status.PASS
    if interrupted:
        return Decision(status, EXIT_INTERRUPTED, "the run was interrupted")
    if failed:
        return Decision(Status.FAIL, EXIT_FAILED, f"{len(failed)} check(s) failed: {', '.join(failed)}")
    code = EXIT_FAILED if strict_fails else EXIT_OK
    if unjudged:
        return Decision(status, code, f"{len(unjudged)} check(s) could not be judged for want of facts: "
                                      f"{', '.join(unjudged)} (--ignore ID accepts that knowingly)")
    return Decision(status, code, "warnings under --strict" if strict_fails else None)


def failing(results: Sequence[Result], *, strict: bool = False, interrupted: bool = False) -> list[Result]:
    """The results that fail a run: a check that failed or errored, and under ``--strict`` a warning (``decide``'s
    second and fifth rows). In an interrupted run the checks Ctrl-C stopped are left out: they judged nothing, so
    they are no failure of the node's or of anything else."""
    return [r for r in results if (r.status.failed or (strict and r.status is Status.WARN))
            and not (interrupted and r.details.get("interrupted"))]


def not_judged(results: Sequence[Result]) -> list[Result]:
    """The checks not judged for want of facts (skipped, but not because a dependency failed): never a pass."""
    return [r for r in results if r.status is Status.SKIP and r.unjudged]


Split = Callable[[list[Result]], tuple[list[Result], list[Result]]]


@dataclass(frozen=True)
class NodeDecision:
    """What a run means for the node it ran on (``slurm-health``, ``kube-node``): the run's rows, seen from the
    node."""

    state: str  # "interrupted", "failed", "not_judged" or "healthy": NODE_EXIT's keys
    node: list[Result]  # the failures of the node's own (warnings too under --strict)
    configuration: list[Result]  # the deployment's failures: the same on every node, said, never acted on
    unjudged: list[Result]  # the node's checks not judged for want of facts
    exit_code: int


# slurm-health's exit status per node state. An interrupted run exits 130 as every command's Ctrl-C does: it is no
# verdict on the node, and still non-zero, so a prolog that was interrupted does not let the job start.
NODE_EXIT = {"interrupted": EXIT_INTERRUPTED, "failed": EXIT_FAILED, "not_judged": EXIT_FAILED, "healthy": EXIT_OK}


def decide_node(results: Sequence[Result], split: Split, *, interrupted: bool = False, strict: bool = False,
                drain_unjudged: bool = False) -> NodeDecision:
    """The node's state and exit status from a run's results, by the first row that holds:

    =====================================================================  ===========  ====
    the node                                                               state        exit
    =====================================================================  ===========  ====
    the run was interrupted (Ctrl-C) before every check finished           interrupted  130
    a failure of the node's own (``failing``: a warning too, --strict)     failed       1
    a node check not judged, under ``--drain-unjudged`` or ``--strict``    not_judged   1
    anything else (the deployment's failures are said, not acted on)       healthy      0
    =====================================================================  ===========  ====

    An interrupted run says nothing about the node's hardware (the checks it stopped judged nothing, and what
    finished may depend on them), as ``decide``'s first row: the node is left as it is (not drained, resumed,
    tainted nor marked) and the next run judges it. Its lists still hold what finished (the checks it stopped
    left out), for a caller that shows them.

    ``split`` parts the failing results into (the node's, the deployment's configuration's), by what the check
    whose failure explains each one declares (``doctor.service.fleet.split_by_failure``); a check not judged
    counts for the node unless it declares ``failure="deployment"``.
    """
    node, configuration = split(failing(results, strict=strict, interrupted=interrupted))
    unjudged = [r for r in not_judged(results) if r.failure != "deployment"]
    if interrupted:
        state = "interrupted"
    elif node:
        state = "failed"
    elif unjudged and (drain_unjudged or strict):
        state = "not_judged"
    else:
        state = "healthy"
    return NodeDecision(state, node, configuration, unjudged, NODE_EXIT[state])
