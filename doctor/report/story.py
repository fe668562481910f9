"""The one verdict of a run that every renderer tells: text, JSON, JUnit, live or replayed.

After ``doctor.core.causes`` has settled the results, ``story`` sorts them into what a reader needs, in
the order a reader fixes them:

* ``roots``: the results that are a cause of their own (failed, errored, not judged for want of facts,
  warned), failures first and among them the one that explains the most checks first, each with the
  ``dependents`` it explains (followed through chains: ``model.config`` under ``model.shards``);
* the notices said once at the top (``--python`` not set) with the results they explain;
* ``passed`` and ``not_applicable`` (skips that nothing explains and that are not for want of facts);
* ``next_step``: the one command that resolves the first root cause (``doctor/data/next_steps.toml``,
  else the fix plan of a fixer that would change something, else ``k26-doctor explain``).

The text report folds the dependents under their root and ends with the next step; the JSON report carries
the same roots (``summary.roots``, ``results[].root``) and next step (``summary.next_step``); the JUnit
report names the root in a dependent's ``skipped``/``failure`` message. "Not judged" is only ever a result
that is ``unjudged`` (for want of facts), in every renderer.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.core.causes import roots
from doctor.core.datafile import load_toml
from doctor.core.result import Notice, Result, Status

NEXT_STEPS = Path(__file__).resolve().parents[1] / "data" / "next_steps.toml"


@dataclass
class Root:
    """A result that is a cause of its own, with the results it explains."""

    result: Result
    dependents: list[Result] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.result.id


@dataclass
class Story:
    roots: list[Root]
    notices: list[tuple[Notice, list[Result]]]
    passed: list[Result]
    not_applicable: list[Result]
    root_of: dict[str, str]  # dependent id -> the id of its root (a result or a notice)
    next_step: str | None
    next_for: str | None  # the id of the root (or notice) the next step resolves

    def failing_roots(self) -> list[Root]:
        return [r for r in self.roots if r.result.status.failed]


# Roots that are the doctor's own inputs come first among the failures: until the service's interpreter is
# right, every check that runs it judged nothing, whatever else the host lacks (a wrong --python on a host
# without a GPU is fixed first, and is the next step, even where gpu.driver blocks more checks).
FIRST_ROOTS = ("python.venv",)


def _group(res: Result) -> int:
    if res.status.failed:
        return 0
    if res.unjudged:
        return 1
    return 2  # warned (an ignored failure included)


def story(report: Any) -> Story:
    """The run sorted into roots (with their dependents), notices, passes and what does not apply here."""
    results: list[Result] = list(report.results)
    notices: list[Notice] = list(getattr(report, "notices", []) or [])
    root_of = roots(results, notices)
    by_root: dict[str, list[Result]] = {}
    for res in results:
        if res.id in root_of:
            by_root.setdefault(root_of[res.id], []).append(res)
    order = {r.id: i for i, r in enumerate(results)}
    own = [Root(r, by_root.get(r.id, [])) for r in results
           if r.id not in root_of and (r.status in (Status.FAIL, Status.ERROR, Status.WARN) or r.unjudged)]
    own.sort(key=lambda root: (_group(root.result), root.id not in FIRST_ROOTS, -len(root.dependents),
                               order[root.id]))
    passed = [r for r in results if r.id not in root_of and r.status is Status.PASS]
    not_applicable = [r for r in results if r.id not in root_of and r.status is Status.SKIP and not r.unjudged]
    told = [(n, by_root.get(n.id, [])) for n in notices]
    step, step_for = next_step(report, told, own)
    return Story(own, told, passed, not_applicable, root_of, step, step_for)


def next_step(report: Any, notices: list[tuple[Notice, list[Result]]],
              own: list[Root]) -> tuple[str | None, str | None]:
    """The one command that resolves the first root cause, and the id it is for. A notice that explains results
    comes first (the checks judged the wrong interpreter); then the first failing root, else the first other."""
    for notice, dependents in notices:
        if notice.remediation.commands and dependents:
            return notice.remediation.commands[0], notice.id
    if not own:
        return None, None
    first = own[0].result
    if first.id.startswith("doctor."):
        return None, None
    for step in _table():
        if step.get("check") != first.id:
            continue
        pattern = step.get("summary")
        if pattern and not re.search(str(pattern), first.summary):
            continue
        return str(step["command"]), first.id
    fixable = report.fixable() if hasattr(report, "fixable") else []
    if first.id in fixable:
        return shlex.join(["k26-doctor", "fix", "--only", first.id]) + "   (the plan; then add --apply)", first.id
    return shlex.join(["k26-doctor", "explain", first.id]) + "   (what it looks at and how to fix it)", first.id


def _table() -> list[dict[str, Any]]:
    doc = load_toml(NEXT_STEPS)
    steps = doc.get("step") if isinstance(doc, dict) else None
    return [s for s in steps or [] if isinstance(s, dict) and s.get("check") and s.get("command")]


def role(res: Result, st: Story) -> str:
    """One word for what a result is in the story: root, dependent, passed, not_applicable."""
    if res.id in st.root_of:
        return "dependent"
    if res.status is Status.PASS:
        return "passed"
    if res.status is Status.SKIP and not res.unjudged:
        return "not_applicable"
    return "root"
