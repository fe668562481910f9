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

from doctor.core import deadline
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


def plan_for(registry: Any, ctx: Any, res: Result) -> CheckPlan:
    """The plan of ``res``'s fixer (reading only: planning changes nothing); a fixer that cannot plan says so."""
    fx = registry.fixers.get(res.fixer)
    if fx is None:
        return CheckPlan(res.id, str(res.fixer), "?", res, error=f"fixer {res.fixer!r} is not registered")
    why_not = not_plannable(res)
    if why_not:
        return CheckPlan(res.id, fx.id, fx.title, res, error=why_not)
    try:
        plan = Plan.of(fx.plan(ctx, res))
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


def make_plans(settings: Settings) -> tuple[list[CheckPlan], Any]:
    """Run the checks; for each failing (or warning) check with a fixer, ask the fixer for its plan."""
    from doctor.app import registry_for, run

    registry = registry_for(settings)
    report, ctx = run(settings, registry=registry)
    plans: list[CheckPlan] = []
    for res in report.results:
        if not res.fixer or (res.status not in (Status.FAIL, Status.ERROR, Status.WARN) and res.ignored is None):
            continue
        plans.append(plan_for(registry, ctx, res))
    report._fixable = [p.check_id for p in plans if p.actions]
    return plans, report


def _remedy_lines(res: Result, indent: str = "  ") -> list[str]:
    rem = res.remediation
    if rem is None or not (rem.text or rem.commands):
        return [f"{indent}(no remediation written: `k26-doctor explain {res.id}`)"]
    return ([f"{indent}{rem.text}"] if rem.text else []) + [f"{indent}  $ {c}" for c in rem.commands]


def print_plans(plans: list[CheckPlan], report: Any) -> None:
    """The fixes that change something, each with its steps; then, once per check, the remediation of
    every failing check that nothing can change automatically (a fixer with an empty plan included)."""
    acting = [p for p in plans if p.actions]
    for plan in acting:
        click.echo(f"{plan.check_id}: {plan.result.summary}")
        click.echo(f"  fixer {plan.fixer_id}: {plan.title}")
        for note in plan.notes:  # what the fixer chose not to touch, and why
            click.echo(f"  note: {note}")
        for i, action in enumerate(plan.actions, 1):
            root = "  [needs root]" if action.needs_root else ""
            click.echo(f"  {i}. {action.summary}{root}")
            for line in action.details():
                click.echo(f"       {line}")
    planned = {p.check_id for p in acting}
    by_hand = [r for r in report.results if r.id not in planned
               and (r.status.failed or r.status is Status.WARN or r.unjudged)]
    others = {p.check_id: p for p in plans if not p.actions}
    if by_hand:
        if acting:
            click.echo("")
        for notice in getattr(report, "notices", []) or []:
            click.echo(f"note: {notice.summary}")
        from doctor.report.causes import roots

        root = roots(report.results, getattr(report, "notices", None))
        click.echo(f"{len(by_hand)} check(s) nothing can change automatically; by hand:")
        for res in by_hand:
            if root.get(res.id) and not root[res.id].startswith("doctor."):
                click.echo(f"{res.id}: same cause as {root[res.id]}")
                continue
            click.echo(f"{res.id}: {res.summary}")
            plan = others.get(res.id)
            if plan is not None:
                if plan.error:
                    click.echo(f"  ! fixer {plan.fixer_id}: {plan.error}")
                for note in plan.notes:
                    click.echo(f"  note: {note}")
            for line in _remedy_lines(res):
                click.echo(line)
    if not acting and not by_hand:
        click.echo("nothing to fix: every check passed.")
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
    render(report, "json" if fmt == "json" else "text", settings.verbose, sys.stdout, each=True)
    return 1 if failed_actions or report.exit_code() else 0
