"""Slurm: the node health check and prolog (``k26-doctor slurm-health``).

The profile's checks run on the node; a failing one drains it with its root cause as the reason
(``scontrol update nodename=N state=drain reason="k26-doctor: gpu.nvlink: ..."``), and a node this program
drained is resumed once the checks pass again. As LBNL NHC does: a drain of ours carries a prefix
(``doctor/data/fleet.toml`` ``[slurm] reason_prefix``), and only such a drain is ever resumed; a node an
administrator drained keeps its reason and stays drained.

* Only a failure of the node drains it: a check declares what its failure means (``@check(failure=...)``), and a
  failure of the deployment's configuration (``failure="deployment"``: a profile, a flag, a version, DDTree not
  validated for this configuration) is the same on every node, so it drains nothing; the output names the check
  and says the launch is blocked by the configuration, and the exit status is 0 (a prolog's non-zero exit would
  make Slurm drain the node itself; the job's own gate, ``launch``, refuses to start the server).
* A check that could not be judged for want of facts drains nothing unless ``--drain-unjudged`` is given, and
  the output says which were not judged; with the flag, the reason says "not judged".
* An interrupted run (Ctrl-C before every check finished) is no verdict on the node: it is neither drained nor
  resumed, one line says so, and the exit status is 130 (the interrupted exit of every command).
* In the prolog (``SLURM_SCRIPT_CONTEXT=prolog_slurmd``) the job has not started: every check runs, and a failure
  exits 1 so that Slurm requeues the job (the node is already drained with our reason, which Slurm keeps).
  As ``HealthCheckProgram`` on a node with jobs (ALLOCATED, MIXED, COMPLETING) the GPUs and the port are the
  job's: the checks that judge a host before a start are left out (``--while-serving``).
* ``scontrol`` runs with a deadline (it retries a missing controller for a minute): ``HealthCheckProgram`` is
  killed by slurmd after 60 s, and it runs with an empty environment (no PATH): scontrol is looked up in the
  usual places.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from doctor.core import proc
from doctor.core.decision import decide_node
from doctor.core.exitcodes import EXIT_OK
from doctor.core.printable import printable
from doctor.facts.redaction import redact_text
from doctor.service.fleet import fleet_data, root_causes, split_by_failure

INTERRUPTED_LINE = "the check was interrupted before it finished; nothing was changed (the next run judges the node)"
BUSY_STATES = ("ALLOCATED", "MIXED", "COMPLETING")
SCONTROL_PLACES = ("/usr/bin/scontrol", "/usr/local/bin/scontrol", "/opt/slurm/bin/scontrol")
_REASON_SUFFIX = re.compile(r"\s*\[[^\]\s]*@[^\]\s]*\]\s*$")  # "[root@2026-12-01T09:04:02]" that scontrol adds


class SlurmError(Exception):
    """scontrol could not do what was asked (the controller unreachable, a refusal, a timeout)."""


class UnknownNode(SlurmError):
    """The controller does not know this node name."""


def slurm_table() -> dict[str, Any]:
    return fleet_data()["slurm"]


@dataclass
class NodeState:
    """One node as ``scontrol -o show node`` prints it."""

    name: str
    states: list[str]  # the base state first, then its flags: ["IDLE", "DRAIN"]
    reason: str | None = None  # without the "[user@time]" scontrol appends

    @property
    def drained(self) -> bool:
        return any(s.startswith("DRAIN") for s in self.states)

    @property
    def busy(self) -> bool:
        """Jobs run on it: the GPUs and the port belong to them."""
        return any(s in BUSY_STATES for s in self.states)

    def drained_by(self, prefix: str) -> bool:
        return self.drained and (self.reason or "").startswith(prefix)


def parse_node(text: str) -> NodeState | None:
    """The node of ``scontrol -o show node NAME`` (one line; ``Reason=`` is last and may hold spaces)."""
    for line in text.splitlines():
        name = re.match(r"NodeName=(\S+)", line)
        state = re.search(r"(?:^| )State=(\S+)", line)
        if not name or not state:
            continue
        reason = re.search(r"(?:^| )Reason=(.*)$", line)
        text_reason = _REASON_SUFFIX.sub("", reason.group(1)).strip() if reason else None
        if text_reason in ("", "(null)", "None"):
            text_reason = None
        return NodeState(name.group(1), [s for s in re.split(r"[+*~#!%$@^-]", state.group(1)) if s], text_reason)
    return None


def find_scontrol(given: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """``--scontrol``, else scontrol on PATH, else where distributions put it (a health check gets no PATH)."""
    if given:
        return given
    found = shutil.which("scontrol", path=(env or os.environ).get("PATH") or None)
    if found:
        return found
    return next((p for p in SCONTROL_PLACES if os.access(p, os.X_OK)), None)


@dataclass
class Scontrol:
    """``scontrol``, each call under a deadline."""

    path: str
    timeout: float
    env: dict[str, str] | None = None

    def _run(self, *args: str) -> proc.CommandResult:
        return proc.run([self.path, *args], self.timeout, env=self.env)

    def show_node(self, name: str) -> NodeState:
        res = self._run("-o", "show", "node", name)
        if not res.ok:
            why = res.why()
            if res.returncode is not None and re.search(r"not found|Invalid node name", res.stderr + res.stdout, re.I):
                raise UnknownNode(f"Slurm knows no node {name!r} ({why}); give --node NAME as slurm.conf names it")
            raise SlurmError(f"scontrol show node {name}: {why}")
        node = parse_node(res.stdout)
        if node is None:
            raise SlurmError(f"scontrol show node {name}: no node in its answer: {res.stdout.strip()[:200]!r}")
        return node

    def update(self, name: str, *fields: str) -> None:
        res = self._run("update", f"nodename={name}", *fields)
        if not res.ok:
            raise SlurmError(f"scontrol update nodename={name} {' '.join(fields)}: {res.why()}")


def node_name(given: str | None, env: Mapping[str, str]) -> str:
    """``--node``, else ``SLURMD_NODENAME`` (set by slurmd for the prolog and the health check), else the short
    host name (what slurm.conf usually names a node)."""
    import socket

    return given or env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def in_prolog(env: Mapping[str, str]) -> bool:
    """A prolog or epilog of a job: the job's own processes are not running."""
    return bool(env.get("SLURM_JOB_ID")) or env.get("SLURM_SCRIPT_CONTEXT", "").startswith(("prolog", "epilog"))


def serving(mode: str, node: NodeState, env: Mapping[str, str]) -> bool:
    """Whether to leave out the checks that judge a host before a start: ``yes``/``no``, or ``auto``: on a node
    with jobs, outside a prolog."""
    if mode in ("yes", "no"):
        return mode == "yes"
    return node.busy and not in_prolog(env)


@dataclass
class NodeAction:
    """What to do with the node, what to say, and the exit status (built on the run's report; the run's own
    verdict is ``doctor.core.decision``)."""

    action: str  # "drain", "resume" or "keep"
    reason: str | None = None
    lines: list[str] = field(default_factory=list)
    exit_code: int = EXIT_OK


def _one_line(text: str) -> str:
    """A summary as a drain reason (which every user reads with ``sinfo -R``): redacted, on one line, escaped."""
    return printable(" ".join(redact_text(str(text)).split()))


def drain_reason(prefix: str, causes: list[tuple[str, str]], limit: int, what: str = "") -> str:
    """``k26-doctor: gpu.nvlink: <its summary> (+2 more: host.disk, model.shards)``, at most ``limit`` characters."""
    first_id, first_summary = causes[0]
    more = [cid for cid, _ in causes[1:]]
    tail = f" (+{len(more)} more: {', '.join(more)})" if more else ""
    head = f"{prefix} {what}{first_id}: "
    room = limit - len(head) - len(tail)
    summary = _one_line(first_summary)
    if room < 16:  # many causes: the ids are what matters
        tail = f" (+{len(more)} more)"
        room = limit - len(head) - len(tail)
    if len(summary) > room:
        summary = summary[: max(0, room - 3)].rstrip() + "..."
    return (head + summary + tail)[:limit]


def node_action(report: Any, node: NodeState, *, drain_unjudged: bool = False) -> NodeAction:
    """The node's fate from the report (pure), its state and exit status by the one table
    (``doctor.core.decision.decide_node``): drain with the root cause of a node failure, resume a drain of ours,
    or keep; a failure of the deployment's configuration is said and drains nothing, and an interrupted run
    keeps the node as it is (its one line says so)."""
    table = slurm_table()
    prefix, limit = table["reason_prefix"], int(table["reason_max_chars"])
    verdict = decide_node(report.results, lambda failed: split_by_failure(report, failed),
                          interrupted=report.outcome.interrupted, strict=bool(report.settings.strict),
                          drain_unjudged=drain_unjudged)
    if verdict.state == "interrupted":  # no verdict on the node: nothing to drain or resume, nothing else to say
        return NodeAction("keep", None, [f"{node.name}: {INTERRUPTED_LINE}"], verdict.exit_code)
    lines: list[str] = []
    if verdict.configuration:
        lines.append(f"{node.name}: not drained for the deployment's configuration (the same on every node; it "
                     "blocks the launch): " + drain_reason("configuration:",
                                                          root_causes(report, verdict.configuration), limit))
    if verdict.state == "failed":
        return drain(node, drain_reason(prefix, root_causes(report, verdict.node), limit), prefix, lines,
                     verdict.exit_code)
    if verdict.state == "not_judged":
        reason = drain_reason(prefix, [(r.id, r.summary) for r in verdict.unjudged], limit, what="not judged: ")
        return drain(node, reason, prefix, lines, verdict.exit_code)
    if verdict.unjudged:
        lines.append(f"{node.name}: not judged for want of facts (not drained for them; --drain-unjudged drains): "
                     + ", ".join(r.id for r in verdict.unjudged))
    return healthy(node, prefix, lines, "the node's checks pass" if verdict.configuration else "the checks pass",
                   verdict.exit_code)


def drain(node: NodeState, reason: str, prefix: str, lines: list[str], exit_code: int) -> NodeAction:
    """A node failure: drain, unless someone else drained the node or our drain already says ``reason``."""
    if node.drained and not node.drained_by(prefix):
        lines.append(f"{node.name}: {reason}; the node is drained already by someone else "
                     f"({node.reason or 'no reason'}): left as it is")
        return NodeAction("keep", reason, lines, exit_code)
    if node.drained and node.reason == reason:
        lines.append(f"{node.name}: still drained: {reason}")
        return NodeAction("keep", reason, lines, exit_code)
    lines.append(f"{node.name}: drain: {reason}")
    return NodeAction("drain", reason, lines, exit_code)


def healthy(node: NodeState, prefix: str, lines: list[str], said: str, exit_code: int) -> NodeAction:
    """No failure of the node's own: resume a drain of ours, leave anyone else's."""
    if node.drained_by(prefix):
        lines.append(f"{node.name}: {said}: resume (it was drained: {node.reason})")
        return NodeAction("resume", None, lines, exit_code)
    if node.drained:
        lines.append(f"{node.name}: {said}; drained by someone else ({node.reason or 'no reason'}): left drained")
        return NodeAction("keep", None, lines, exit_code)
    lines.append(f"{node.name}: {said}")
    return NodeAction("keep", None, lines, exit_code)


def carry_out(tool: Scontrol, node: NodeState, decision: NodeAction) -> None:
    """Drain or resume through scontrol (``SlurmError`` when it refuses or does not answer)."""
    if decision.action == "drain":
        tool.update(node.name, "state=drain", f"reason={decision.reason}")
    elif decision.action == "resume":
        tool.update(node.name, "state=resume")
