"""``fix``: plan, show, confirm, apply with backups, then verify by running the checks again.

mlenvdoctor's loop (plan -> dry-run -> apply -> verify), with brew doctor's rule that the plan
says exactly what will change. Backups go to ``<state_dir>/backups/<time>/`` and the path is
printed, so a change can be taken back by hand. Planning itself is ``doctor.core.fixing``. The plan wraps to the
terminal as ``check``'s report does (``COLUMNS``, else its width, else 80 columns); commands wrap with a shell
continuation, so they still paste, and a diff keeps its lines.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

import click

from doctor.app import Report, registry_for, render, run
from doctor.commands.options import guarded, selection_options, settings_from
from doctor.core import deadline
from doctor.core.actions import ActionError, new_backup_dir
from doctor.core.causes import roots
from doctor.core.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from doctor.core.fixing import CheckPlan, plan_for, wants_fix
from doctor.core.result import Result, Status
from doctor.core.settings import Settings
from doctor.report.text import terminal_width, wrap, wrap_command


def say(text: str, first: str = "", rest: str | None = None) -> None:
    """``text`` after ``first``, wrapped to the terminal at word boundaries, continued under ``rest``."""
    for line in wrap(text, terminal_width(sys.stdout), first, first + "  " if rest is None else rest):
        click.echo(line)


def say_command(command: str, pad: str) -> None:
    """``$ command``, continued with `` \\`` at word boundaries when it is wider than the terminal."""
    for line in wrap_command(command, terminal_width(sys.stdout), pad):
        click.echo(line)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@selection_options
@click.option("--apply", "do_apply", is_flag=True, help="Make the changes (default: only show the plan).")
@click.option("--yes", is_flag=True, help="Do not ask before each change.")
@guarded
def fix(flags: dict[str, Any], do_apply: bool, yes: bool) -> int:
    """Show (and with --apply, make) the changes that fix failing checks, then check again."""
    settings = settings_from(flags)
    if flags.get("fmt") == "openmetrics":
        click.echo("k26-doctor: fix has no openmetrics report (it is check's: check --format openmetrics)", err=True)
        return EXIT_USAGE
    if do_apply and not yes and not sys.stdin.isatty():
        click.echo("k26-doctor: refusing to change anything: stdin is not a terminal and --yes was not given",
                   err=True)
        return EXIT_USAGE
    if do_apply and settings.from_snapshot:
        click.echo("k26-doctor: cannot apply fixes to a snapshot; plan only", err=True)
        return EXIT_USAGE
    plans, report = make_plans(settings)
    fmt = flags.get("fmt") or "text"
    if not do_apply:
        if fmt == "json":
            click.echo(json.dumps({"plans": [p.to_dict() for p in plans],
                                   "report": report.to_dict()}, indent=2, default=str))
        else:
            print_plans(plans, report)
        return report.decision().exit_code
    print_plans(plans, report)
    deadline.clear()  # --timeout bounded the checks and the planning; the changes the user asked for run whole
    return apply_plans(plans, settings, ask=not yes, fmt=fmt)


def make_plans(settings: Settings) -> tuple[list[CheckPlan], Report]:
    """Run the checks; for each failing (or warning) check with a fixer, ask the fixer for its plan."""
    registry = registry_for(settings)
    report, ctx = run(settings, registry=registry)
    plans = [plan_for(registry, ctx, res) for res in report.results if wants_fix(res)]
    report.fixable_ids = [p.check_id for p in plans if p.actions]
    return plans, report


def remedy_lines(res: Result, indent: str = "  ") -> list[str]:
    """The remediation of ``res`` wrapped to the terminal: its text, then each command as it pastes."""
    rem = res.remediation
    columns = terminal_width(sys.stdout)
    if rem is None or not (rem.text or rem.commands):
        return wrap(f"(no remediation written: `k26-doctor explain {res.id}`)", columns, indent, indent + "  ")
    lines = wrap(rem.text, columns, indent, indent + "  ") if rem.text else []
    for c in rem.commands:
        lines.extend(wrap_command(c, columns, indent + "  "))
    return lines


def print_actions(acting: list[CheckPlan]) -> None:
    for plan in acting:
        say(f"{plan.check_id}: {plan.result.summary}")
        say(f"fixer {plan.fixer_id}: {plan.title}", "  ")
        for note in plan.notes:  # what the fixer chose not to touch, and why
            say(f"note: {note}", "  ", "        ")
        for i, action in enumerate(plan.actions, 1):
            root = "  [needs root]" if action.needs_root else ""
            say(f"{i}. {action.summary}{root}", "  ", "     ")
            for line in action.details():  # a diff, a file's new text: laid out as it is
                click.echo(f"       {line}")


def print_by_hand(by_hand: list[Result], others: dict[str, CheckPlan], report: Report) -> None:
    for notice in report.notices:
        say(f"note: {notice.summary}")
    root = roots(report.results, report.notices)
    say(f"{len(by_hand)} check(s) nothing can change automatically; by hand:")
    for res in by_hand:
        if root.get(res.id) and not root[res.id].startswith("doctor."):
            say(f"{res.id}: same cause as {root[res.id]}")
            continue
        say(f"{res.id}: {res.summary}")
        plan = others.get(res.id)
        if plan is not None:
            if plan.error:
                say(f"! fixer {plan.fixer_id}: {plan.error}", "  ")
            for note in plan.notes:
                say(f"note: {note}", "  ", "        ")
        for line in remedy_lines(res):
            click.echo(line)


def print_plans(plans: list[CheckPlan], report: Report) -> None:
    """The fixes that change something, each with its steps; then, once per check, the remediation of
    every failing check that nothing can change automatically (a fixer with an empty plan included)."""
    acting = [p for p in plans if p.actions]
    print_actions(acting)
    planned = {p.check_id for p in acting}
    by_hand = [r for r in report.results if r.id not in planned
               and (r.status.failed or r.status is Status.WARN or r.unjudged)]
    if by_hand:
        if acting:
            click.echo("")
        print_by_hand(by_hand, {p.check_id: p for p in plans if not p.actions}, report)
    if not acting and not by_hand:
        click.echo("nothing to fix: every check passed.")
    click.echo("")


def apply_plans(plans: list[CheckPlan], settings: Settings, ask: bool, fmt: str = "text") -> int:
    """Apply every action (asking first when ``ask``), then re-run the fixed checks; the exit code."""
    todo = [p for p in plans if p.actions]
    if not todo:
        click.echo("nothing to apply.")
        return EXIT_FAILED if any(p.result.status.failed for p in plans) else EXIT_OK
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
                from doctor.core import interrupt

                click.echo(f"interrupted ({interrupt.cause()}); what was applied is listed above (each file whole: "
                           "as it was or as planned)", err=True)
                return EXIT_INTERRUPTED
    # Verify: run the fixed checks again with fresh facts.
    again = replace(settings, only=[p.check_id for p in todo], skip=[], snapshot=None)
    report, _ = run(again)
    click.echo("\nafter the fixes:")
    render(report, "json" if fmt == "json" else "text", settings.verbose, sys.stdout, each=True)
    return EXIT_FAILED if failed_actions or report.decision().exit_code else EXIT_OK
