"""Planning a fix: ask the fixer of a failing check what it would change. Planning reads; it changes nothing.

The ``fix`` command (``doctor.commands.fix``) shows the plans, confirms and applies them with backups, then runs
the fixed checks again; the report's footer offers only fixers whose plan would change something.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from doctor.core import deadline
from doctor.core.actions import Plan
from doctor.core.context import Context
from doctor.core.registry import Registry
from doctor.core.result import Result, Status


@dataclass
class CheckPlan:
    """One failing check, its fixer and the ``Plan`` (actions and notes) the fixer returned."""

    check_id: str
    fixer_id: str
    title: str
    result: Result
    actions: list[Any] = field(default_factory=list)
    error: str | None = None
    notes: list[str] = field(default_factory=list)  # what the fixer chose not to touch, and why

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check_id, "fixer": self.fixer_id, "title": self.title,
                "status": self.result.status.value, "summary": self.result.summary,
                "actions": [a.to_dict() for a in self.actions], "notes": self.notes, "error": self.error}


def wants_fix(res: Result) -> bool:
    """A result whose fixer is asked for a plan: it failed, errored or warned (an ignored failure included)."""
    return bool(res.fixer) and (res.status in (Status.FAIL, Status.ERROR, Status.WARN) or res.ignored is not None)


def plan_for(registry: Registry, ctx: Context, res: Result) -> CheckPlan:
    """The plan of ``res``'s fixer (reading only: planning changes nothing); a fixer that cannot plan says so.
    The fixer reads the facts of the check it fixes and its own ``needs``."""
    fx = registry.fixers.get(res.fixer or "")
    if fx is None:
        return CheckPlan(res.id, str(res.fixer), "?", res, error=f"fixer {res.fixer!r} is not registered")
    why_not = not_plannable(res)
    if why_not:
        return CheckPlan(res.id, fx.id, fx.title, res, error=why_not)
    chk = registry.checks.get(res.id)
    view = ctx.view(registry.fact_needs(chk) if chk is not None else fx.needs)
    try:
        plan = Plan.of(fx.plan(view, res))
        return CheckPlan(res.id, fx.id, fx.title, res, plan.actions, notes=plan.notes)
    except Exception as exc:  # a fixer that cannot plan says so; it never takes the run down
        return CheckPlan(res.id, fx.id, fx.title, res, error=f"cannot plan: {type(exc).__name__}: {exc}")


def not_plannable(res: Result) -> str | None:
    """Why no plan is made for ``res`` (None: plan it): the run's deadline passed (``--timeout``, Ctrl-C), or
    the check itself never finished (its facts may still be being collected: planning would wait on them)."""
    if deadline.expired():
        return f"not planned: {deadline.ended()}"
    if isinstance(res.details, dict) and "timeout_s" in res.details:
        return "not planned: the check did not finish in time"
    return None
