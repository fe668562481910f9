"""The one verdict of a run that every renderer tells: text, JSON, JUnit, live or replayed.

After ``doctor.core.causes`` has settled the results, ``story`` sorts them into what a reader needs, in
the order a reader fixes them:

* ``roots``: the results that are a cause of their own (failed, errored, not judged for want of facts,
  warned), failures first and among them the one that blocks the most checks first, each with the
  ``dependents`` it explains (followed through chains: ``model.config`` under ``model.shards``);
* the notices (``--python`` not set) with the results they explain, ranked among the roots by the same rule
  (``order``): a host without a NVIDIA driver blocks more than the interpreter the checks judged;
* ``interrupted``: the checks Ctrl-C stopped before they finished (one line, no root of their own);
* ``passed`` and ``not_applicable`` (skips that nothing explains and that are not for want of facts);
* ``next_step``: the one command that resolves the first root cause in ``order`` (``doctor/data/next_steps.toml``,
  else the fix plan of a fixer that would change something, else ``k26-doctor explain``). It runs as written; a
  command that needs what only the user knows names it in capitals (``PYTHON``) and says what it is (the table's
  ``[placeholders]``), never a made-up path. An interrupted run has none: it judged too little.

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
    order: list[str] = field(default_factory=list)  # the ids of the notices and roots, in the order to fix them
    interrupted: list[Result] = field(default_factory=list)  # stopped by Ctrl-C before they finished

    def failing_roots(self) -> list[Root]:
        return [r for r in self.roots if r.result.status.failed]

    def causes(self) -> list[Root | tuple[Notice, list[Result]]]:
        """The roots and the notices, in ``order`` (a notice that explains no result first: said, not ranked)."""
        by: dict[str, Root | tuple[Notice, list[Result]]] = {r.id: r for r in self.roots}
        by.update((n.id, (n, deps)) for n, deps in self.notices if deps)
        alone: list[Root | tuple[Notice, list[Result]]] = [(n, deps) for n, deps in self.notices if not deps]
        return alone + [by[i] for i in self.order if i in by]


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


def is_interrupted(res: Result) -> bool:
    """A check Ctrl-C stopped before it finished (``doctor.core.runner``): not a cause, a gap in the report."""
    return res.status is Status.ERROR and bool(res.details.get("interrupted"))


def rank(own: list[Root], notices: list[tuple[Notice, list[Result]]], results: list[Result]) -> list[str]:
    """The ids of the roots and the notices in the order to fix them: failures (a notice whose results failed
    among them) before what could not be judged before warnings; among those the doctor's own inputs first
    (``FIRST_ROOTS``), then the one that blocks the most checks; then the order of the run."""
    order = {r.id: i for i, r in enumerate(results)}
    keyed = [((_group(r.result), r.id not in FIRST_ROOTS, -len(r.dependents), order[r.id]), r.id) for r in own]
    keyed += [((min(_group(d) for d in deps), True, -len(deps), -1), n.id) for n, deps in notices if deps]
    return [i for _, i in sorted(keyed)]


def _dependents_by_root(results: list[Result], root_of: dict[str, str]) -> dict[str, list[Result]]:
    """The results folded under each root, in run order: kept apart from ``story`` so the sorting reads on its
    own."""
    by_root: dict[str, list[Result]] = {}
    for res in results:
        if res.id in root_of:
            by_root.setdefault(root_of[res.id], []).append(res)
    return by_root


def _own_roots(results: list[Result], root_of: dict[str, str], by_root: dict[str, list[Result]]) -> list[Root]:
    """The results that are a cause of their own (not folded, not interrupted, not a pass or a skip that was
    judged), each with its dependents: kept apart from ``story`` so the sorting reads on its own."""
    return [Root(r, by_root.get(r.id, [])) for r in results
            if r.id not in root_of and not is_interrupted(r)
            and (r.status in (Status.FAIL, Status.ERROR, Status.WARN) or r.unjudged)]


def story(report: Any) -> Story:
    """The run sorted into roots (with their dependents), notices, passes and what does not apply here."""
    results: list[Result] = list(report.results)
    notices: list[Notice] = list(getattr(report, "notices", []) or [])
    root_of = roots(results, notices)
    by_root = _dependents_by_root(results, root_of)
    stopped = [r for r in results if r.id not in root_of and is_interrupted(r)]
    own = _own_roots(results, root_of, by_root)
    passed = [r for r in results if r.id not in root_of and r.status is Status.PASS]
    not_applicable = [r for r in results if r.id not in root_of and r.status is Status.SKIP and not r.unjudged]
    told = [(n, by_root.get(n.id, [])) for n in notices]
    order = rank(own, told, results)
    own.sort(key=lambda root: order.index(root.id))
    step, step_for = (None, None) if stopped else next_step(report, told, own, order)
    return Story(own, told, passed, not_applicable, root_of, step, step_for, order, stopped)


def next_step(report: Any, notices: list[tuple[Notice, list[Result]]], own: list[Root],
              order: list[str] | None = None) -> tuple[str | None, str | None]:
    """The one command that resolves the first cause in ``order`` (default: the notices, then the roots), and
    the id it is for: a notice's own command; for a root, the table's, else its fixer's plan, else ``explain``."""
    order = order or [n.id for n, deps in notices if deps] + [r.id for r in own]
    if not order:
        return None, None
    for notice, _ in notices:
        if notice.id == order[0]:
            if not notice.remediation.commands:
                return None, None
            return supplied(notice.remediation.commands[0]), notice.id
    first = next(r.result for r in own if r.id == order[0])
    if first.id.startswith("doctor."):
        return None, None
    for step in _table():
        if step.get("check") != first.id:
            continue
        pattern = step.get("summary")
        if pattern and not re.search(str(pattern), first.summary):
            continue
        return supplied(str(step["command"])), first.id
    fixable = report.fixable() if hasattr(report, "fixable") else []
    if first.id in fixable:
        return shlex.join(["k26-doctor", "fix", "--only", first.id]) + "   (the plan; then add --apply)", first.id
    return shlex.join(["k26-doctor", "explain", first.id]) + "   (what it looks at and how to fix it)", first.id


def placeholders() -> dict[str, str]:
    """What the user supplies in a next step, by the word that stands for it (``PYTHON``: the service's
    interpreter): the table's ``[placeholders]``."""
    doc = load_toml(NEXT_STEPS)
    table = doc.get("placeholders") if isinstance(doc, dict) else None
    return {str(k): str(v) for k, v in (table or {}).items()}


def supplied(command: str) -> str:
    """``command`` followed by what each placeholder in it stands for: ``k26-doctor check --python PYTHON   (PYTHON:
    the interpreter ...)``; a command without one is returned as it is (it runs as written)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    said = [f"{w}: {text}" for w, text in placeholders().items() if w in words]
    return command + (f"   ({'; '.join(said)})" if said else "")


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
    if is_interrupted(res):
        return "interrupted"
    return "root"
