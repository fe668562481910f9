"""``fix``: plan, show, confirm, apply with backups, then verify by running the checks again.

mlenvdoctor's loop (plan -> dry-run -> apply -> verify), with brew doctor's rule that the plan
says exactly what will change. Backups go to ``<state_dir>/backups/<time>/`` and the path is
printed, so a change can be taken back by hand.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import click

from doctor.core.actions import Plan
from doctor.core.result import Result, Status
from doctor.core.settings import Settings


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


def make_plans(settings: Settings) -> tuple[list[CheckPlan], Any]:
    """Run the checks; for each failing (or warning) check with a fixer, ask the fixer for its plan."""
    from doctor.app import registry_for, run

    registry = registry_for(settings)
    report, ctx = run(settings, registry=registry)
    plans: list[CheckPlan] = []
    for res in report.results:
        if not res.fixer or (res.status not in (Status.FAIL, Status.ERROR, Status.WARN) and res.ignored is None):
            continue
        fx = registry.fixers.get(res.fixer)
        if fx is None:
            plans.append(CheckPlan(res.id, res.fixer, "?", res, error=f"fixer {res.fixer!r} is not registered"))
            continue
        try:
            plan = Plan.of(fx.plan(ctx, res))
            plans.append(CheckPlan(res.id, fx.id, fx.title, res, plan.actions, notes=plan.notes))
        except Exception as exc:  # a fixer that cannot plan says so; it never takes the run down
            plans.append(CheckPlan(res.id, fx.id, fx.title, res, error=f"cannot plan: {type(exc).__name__}: {exc}"))
    return plans, report


def print_plans(plans: list[CheckPlan], report: Any) -> None:
    failing = [r for r in report.results if r.status.failed]
    if not plans:
        if failing:
            click.echo(f"{len(failing)} check(s) failing, none with an automatic fix: "
                       + ", ".join(r.id for r in failing))
            click.echo("run `k26-doctor check` for the remediation of each.")
        else:
            click.echo("nothing to fix: no failing check has a fixer.")
        return
    for plan in plans:
        click.echo(f"{plan.check_id}: {plan.result.summary}")
        click.echo(f"  fixer {plan.fixer_id}: {plan.title}")
        if plan.error:
            click.echo(f"  ! {plan.error}")
        for note in plan.notes:  # what the fixer chose not to touch, and why
            click.echo(f"  note: {note}")
        if not plan.actions and not plan.error:
            click.echo("  (nothing can be changed automatically; see the remediation)")
        for i, action in enumerate(plan.actions, 1):
            root = "  [needs root]" if action.needs_root else ""
            click.echo(f"  {i}. {action.summary}{root}")
            for line in action.details():
                click.echo(f"       {line}")
    click.echo("")


def apply_plans(plans: list[CheckPlan], settings: Settings, ask: bool, fmt: str = "text") -> int:
    """Apply every action (asking first when ``ask``), then re-run the fixed checks; exit code."""
    from doctor.core.actions import ActionError, new_backup_dir

    todo = [p for p in plans if p.actions]
    if not todo:
        click.echo("nothing to apply.")
        return 1 if any(p.result.status.failed for p in plans) else 0
    backup_dir = new_backup_dir(settings.state_dir)
    click.echo(f"backups of changed files go to {backup_dir}")
    failed_actions = 0
    for plan in todo:
        for action in plan.actions:
            if ask and not click.confirm(f"{plan.check_id}: {action.summary}?", default=False):
                click.echo("  skipped")
                continue
            try:
                click.echo("  " + action.apply(backup_dir))
            except ActionError as exc:
                failed_actions += 1
                click.echo(f"  failed: {exc}", err=True)
                break  # the rest of this plan may depend on this step
            except KeyboardInterrupt:
                click.echo("interrupted; what was applied is listed above", err=True)
                return 1
    # Verify: run the fixed checks again with fresh facts.
    from dataclasses import replace

    from doctor.app import render, run

    again = replace(settings, only=[p.check_id for p in todo], skip=[], snapshot=None)
    report, _ = run(again)
    click.echo("\nafter the fixes:")
    render(report, "json" if fmt == "json" else "text", settings.verbose, sys.stdout)
    return 1 if failed_actions or report.exit_code() else 0
