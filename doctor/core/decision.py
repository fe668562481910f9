"""The one decision a run leads to: the status it reports, the exit code, and whether ``launch`` may start the
server. One table, read by every command and renderer (pip's ``status_codes``, black's ``Report``)."""

from __future__ import annotations

from collections.abc import Sequence
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
    failed = [r.id for r in results if r.status.failed and not (interrupted and r.details.get("interrupted"))]
    unjudged = [r.id for r in results if r.status is Status.SKIP and r.unjudged]
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
