"""``k26-doctor patches status|apply|revert|make-manifest``: the profile's SGLang patch set.

``status`` exits 0 when the set is fully applied, 1 otherwise, 2 on a usage/config error (as
``check``). ``apply`` and ``revert`` show the plan, then (without ``--yes``) ask per patch when stdin
is a terminal and refuse with exit 2 when it is not (CONTRACT.md, like ``fix --apply``).
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from doctor.commands.options import Stop, settings_options
from doctor.core.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from doctor.core.fileio import read_text
from doctor.core.settings import ConfigError, Settings
from doctor.sglang.patching import locate, manifest, record
from doctor.sglang.patching.engine import Engine, EngineError, Outcome, Transaction
from doctor.sglang.patching.state import StateError
from doctor.sglang.patching.status import APPLIED, Evaluation, evaluate


def target_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The setting flags that pick the environment and the set (derived from ``doctor.core.settings``),
    plus ``--set``."""

    @functools.wraps(func)
    def wrapper(flags: dict[str, Any], set_name: str | None, **kwargs: Any) -> Any:
        try:
            settings = _settings(flags)
            name = set_name if set_name is not None else str(settings.patches.set or "")
            return func(settings=settings, set_name=name, **kwargs)
        except ConfigError as exc:
            click.echo(f"k26-doctor: {exc}", err=True)
            return EXIT_USAGE

    wrapper = click.option("--set", "set_name", default=None,
                           help="A patch set name or directory instead of the profile's.")(wrapper)
    return settings_options("config", "profile", "python", "patches_dir", "state_dir", "verbose",
                            report=False)(wrapper)


def _settings(flags: dict[str, Any]) -> Settings:
    from doctor.app import settings_from_flags

    return settings_from_flags(flags)


def _engine(settings: Settings, set_name: str) -> Engine:
    """Set + install -> engine; exits 2 for an unusable set, 1 for an install that cannot be found."""
    try:
        pset = manifest.resolve(set_name, settings.patches_dir)
    except manifest.ManifestError as exc:
        raise ConfigError(str(exc)) from None
    try:
        found = locate.locate(settings.python)
    except locate.LocateError as exc:
        click.echo(f"k26-doctor: {exc}", err=True)
        raise Stop(EXIT_FAILED) from None
    return Engine(pset, found.installed, state_dir=settings.state_dir, package_root=found.package_root)


def _no_set(settings: Settings) -> int:
    click.echo(f"profile {settings.profile_name} uses no SGLang patch set ([patches] set is empty); nothing to do")
    return EXIT_OK


@click.group("patches")
def patches() -> None:
    """The profile's SGLang patch set ([patches] set) in the --python environment.

    \b
    k26-doctor patches status           per patch and file: pristine/applied/partial/drifted/missing
    k26-doctor patches apply [--yes]    all files or none: backups, journal, lock; --force over drift
    k26-doctor patches revert [--yes]   every file back to the bytes RECORD lists, checked
    k26-doctor patches list             the sets known here (site --patches-dir first, then built-in)
    k26-doctor patches make-manifest    (re)generate a set's hashes from its diffs and a pristine install
    """


@patches.command("status")
@target_options
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--from-snapshot", "snapshot", type=click.Path(dir_okay=False), default=None,
              help="Judge the sglang_patches fact of a `k26-doctor snapshot` instead of this host.")
def status_cmd(settings: Settings, set_name: str, fmt: str, snapshot: str | None) -> int:
    """Per patch and per file: pristine, applied, partial, drifted or missing."""
    if snapshot:
        obs, problems = _recorded(snapshot)
        where = {"set_directory": (obs.get("set") or {}).get("directory"), "python": obs.get("python"),
                 "site_packages": obs.get("site_packages")}
    else:
        if not set_name:
            return _no_set(settings)
        eng = _engine(settings, set_name)
        obs, problems = eng.observe(), eng.check_diffs()
        where = {"set_directory": str(eng.pset.directory), "python": settings.python,
                 "site_packages": str(eng.installed.site_packages)}
    ev = evaluate(obs)
    if fmt == "json":
        doc = {**where, **ev.to_dict()}
        doc["problems"] = doc["problems"] + problems
        click.echo(json.dumps(doc, indent=2))
    else:
        _print_status(where, ev, settings.verbose)
        for p in problems:
            click.echo(f"  ! {p}")
    return EXIT_OK if ev.ok and not problems else EXIT_FAILED


def _recorded(path: str) -> tuple[dict[str, Any], list[str]]:
    """The sglang_patches fact of a snapshot; usage errors (exit 2) when it is not there to judge."""
    from doctor.facts.snapshot import SnapshotError, load_snapshot

    try:
        fact = load_snapshot(path)["facts"].get("sglang_patches")
    except SnapshotError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(fact, dict) or "__error__" in fact:
        why = fact.get("__error__") if isinstance(fact, dict) else "not recorded"
        raise ConfigError(f"{path} has no usable sglang_patches fact ({why})")
    for key in ("set_error", "install_error"):
        if fact.get(key):
            click.echo(f"recorded: {fact[key]}")
            raise Stop(EXIT_FAILED) from None
    if fact.get("no_set"):
        click.echo("the recorded profile used no SGLang patch set")
        raise Stop(EXIT_OK)
    return fact, []


def _print_status(where: dict[str, Any], ev: Evaluation, verbose: int) -> None:
    click.echo(f"patch set {ev.set_name} (for sglang {ev.spec}) from {where.get('set_directory')}")
    click.echo(f"sglang {ev.version} in {where.get('site_packages')}"
               + ("" if ev.version_ok else "  <- not a version this set is for"))
    by_path = {f.path: f for f in ev.files}
    for patch in ev.patches:
        click.echo(f"  {patch.state:<9} {patch.id}")
        if patch.description:  # whole words, wrapped to the terminal, never cut mid-word
            width = max(60, shutil.get_terminal_size((110, 24)).columns - 1)
            for line in textwrap.wrap(" ".join(patch.description.split()), width=width - 12,
                                      break_long_words=False, break_on_hyphens=False):
                click.echo(f"            {line}")
        for path in patch.files:
            f = by_path[path]
            click.echo(f"      {f.state:<9} {path}" + (f"  ({f.note})" if f.note else ""))
            if verbose and f.state not in (APPLIED,):
                click.echo(f"                sha256 {f.sha256 or 'absent'}; original {f.pristine or 'absent'}; "
                           f"patched {f.target or 'absent'}")
    if ev.journal and ev.journal.get("running"):
        click.echo(f"  ! a {ev.journal.get('op')} is running now: {ev.journal['running']}")
    elif ev.journal:
        click.echo(f"  ! interrupted {ev.journal.get('op')} of {ev.journal.get('started')}: journal "
                   f"{ev.journal.get('path')} (the next apply/revert rolls it back)")
    for p in ev.problems:
        click.echo(f"  ! {p}")
    if ev.last_run:
        click.echo(f"  last run: {ev.last_run.get('op')} of {ev.last_run.get('set')}, {ev.last_run.get('outcome')} "
                   f"({ev.last_run.get('finished')})")
    applied_p = sum(1 for p in ev.patches if p.state == APPLIED)
    click.echo(f"overall: {ev.overall} ({applied_p}/{len(ev.patches)} patches, "
               f"{ev.count(APPLIED)}/{len(ev.files)} files applied)")


def _print_plan(plan: Transaction, verbose: int) -> None:
    if plan.changes:
        click.echo(f"plan: {plan.op} {len(plan.changes)} file(s) of patch set {plan.set_name}, all or nothing:")
    for c in plan.changes:
        click.echo(f"  {c.path}: {c.why} ({(c.old_sha or 'absent')[:12]} -> {(c.new_sha or 'deleted')[:12]})")
        if verbose:
            for line in c.diff_lines():
                click.echo(f"      {line}")
    for n in plan.notes:
        click.echo(f"  note: {n}")
    for r in plan.refusals:
        click.echo(f"  refused: {r}")


def _confirm_patches(eng: Engine, plan: Transaction) -> list[str] | None:
    """Ask per patch that has changes; returns the chosen ids (None: all were chosen)."""
    pending = [p for p in plan.evaluation.patches
               if (p.state != APPLIED if plan.op == "apply" else p.state != "pristine")]
    chosen = []
    for p in pending:
        if click.confirm(f"{plan.op} {p.id} ({', '.join(p.files)})?", default=False):
            chosen.append(p.id)
    return None if len(chosen) == len(pending) else chosen


def _run(settings: Settings, set_name: str, op: str, yes: bool, force: bool, only: tuple[str, ...]) -> int:
    if not set_name:
        return _no_set(settings)
    eng = _engine(settings, set_name)
    selected = list(only) or None
    try:
        plan, out = _plan_and_execute(eng, op, yes, force, selected, settings.verbose)
    except Stop as stop:  # said why already
        return stop.code
    except (EngineError, StateError) as exc:
        click.echo(f"k26-doctor: {exc}", err=True)
        return (EXIT_FAILED)
    except OSError as exc:  # e.g. the state directory's disk; every file is as it was or as planned
        click.echo(f"k26-doctor: {op} stopped: {exc}", err=True)
        return (EXIT_FAILED)
    except KeyboardInterrupt:
        click.echo("interrupted; every file is as it was (rolled back)", err=True)
        return (EXIT_FAILED)
    _print_outcome(op, out, settings.verbose)
    ev = eng.status()
    want = APPLIED if op == "apply" else "pristine"
    chosen = set(plan_ids(plan)) if selected or not yes else None
    done = all(p.state == want for p in ev.patches if chosen is None or p.id in chosen)
    click.echo(f"now: {ev.overall}")
    return (EXIT_OK if done else EXIT_FAILED)


def _plan_and_execute(eng: Engine, op: str, yes: bool, force: bool, selected: list[str] | None, verbose: int
                      ) -> tuple[Transaction, Outcome]:
    """Recover an interrupted run, plan, show the plan, let the user choose (without ``--yes``) and carry out
    what was chosen: (the plan carried out, its outcome). A run that ends before writing raises ``Stop`` with
    its exit code, having said why."""
    recovered = eng.recover()
    if recovered:
        click.echo(recovered)
    make = eng.plan_apply if op == "apply" else eng.plan_revert
    plan = make(force=force, only=selected)
    _print_plan(plan, verbose)
    if not plan.ok:
        click.echo(f"{op} refused; nothing was written.", err=True)
        raise Stop(EXIT_FAILED)
    if not plan.changes:
        click.echo(f"nothing to {op}: patch set {eng.pset.name} is already "
                   f"{'applied' if op == 'apply' else 'reverted'} ({eng.installed.site_packages})")
        raise Stop(EXIT_OK)
    if not yes:
        plan = _chosen_plan(eng, plan, make, op, force)
    return plan, eng.execute(plan)


def _chosen_plan(eng: Engine, plan: Transaction, make: Callable[..., Transaction], op: str, force: bool
                 ) -> Transaction:
    """The plan of the patches the user chose at the terminal (asked one by one); never asked when stdin is
    not a terminal: that needs ``--yes`` (exit 2)."""
    if not sys.stdin.isatty():
        click.echo(f"refusing to {op} without --yes: stdin is not a terminal", err=True)
        raise Stop(EXIT_USAGE)
    chosen = _confirm_patches(eng, plan)
    if chosen is None:
        return plan
    if not chosen:
        click.echo("nothing chosen; nothing was written.")
        raise Stop(EXIT_OK)
    plan = make(force=force, only=chosen)
    if not plan.ok:
        _print_plan(plan, 0)
        raise Stop(EXIT_FAILED)
    return plan


def _print_outcome(op: str, out: Outcome, verbose: int) -> None:
    click.echo(f"{op}: {len(out.changed)} file(s) changed" +
               (f", {len(out.removed_bytecode)} stale .pyc removed" if out.removed_bytecode else ""))
    if out.backups:
        click.echo(f"  originals backed up in {Path(next(iter(out.backups.values()))).parent} (named by sha256)")
    if verbose:
        for path, backup in out.backups.items():
            click.echo(f"    {path}: {backup}")
    click.echo(f"  record: {out.history}")


def plan_ids(plan: Transaction) -> list[str]:
    """The patch ids a plan's changes carry out."""
    ids: list[str] = []
    for c in plan.changes:
        ids.extend(pid for pid in c.patch_ids if pid not in ids)
    return ids


def change_options(force_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The flags of a command that changes files (apply, revert): the target's, ``--yes``, ``--force``
    (worded per command: what it overrides differs) and ``--patch``; one list, so both stay alike."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func = click.option("--patch", "only", multiple=True, help="Only this patch id (repeatable).")(func)
        func = click.option("--force", is_flag=True, help=force_help)(func)
        func = click.option("--yes", is_flag=True, help="Do not ask (required when stdin is not a terminal).")(func)
        return target_options(func)

    return decorate


@patches.command("apply")
@change_options("Patch over drifted files too (they are backed up first).")
def apply_cmd(settings: Settings, set_name: str, yes: bool, force: bool, only: tuple[str, ...]) -> int:
    """Apply the set to every file at once (a second apply does nothing)."""
    return _run(settings, set_name, "apply", yes, force, only)


@patches.command("revert")
@change_options("Put stored originals back over drifted files (backed up first).")
def revert_cmd(settings: Settings, set_name: str, yes: bool, force: bool, only: tuple[str, ...]) -> int:
    """Put every file back to the bytes RECORD lists, checked."""
    return _run(settings, set_name, "revert", yes, force, only)


@patches.command("list")
@click.option("--patches-dir", default=None, help="A site directory of patch sets, searched first.")
def list_cmd(patches_dir: str | None) -> int:
    """The patch sets this doctor knows: the site's (--patches-dir) and the built-in ones."""
    seen: set[str] = set()
    for base in manifest.search_dirs(patches_dir):
        for mpath in sorted(base.glob(f"*/{manifest.MANIFEST_NAME}")):
            name = mpath.parent.name
            shadow = " (shadowed by the site's)" if name in seen else ""
            seen.add(name)
            try:
                pset = manifest.load(mpath.parent)
                click.echo(f"{name:<24} sglang {pset.sglang:<12} {len(pset.patches)} patch(es), "
                           f"{len(pset.chains())} file(s)  {mpath.parent}{shadow}")
            except manifest.ManifestError as exc:
                click.echo(f"{name:<24} unusable: {exc}")
    return EXIT_OK


@patches.command("make-manifest")
@click.argument("set_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--python", "python", default=None, help="Interpreter of a pristine SGLang install.")
@click.option("--site-packages", "site_packages", default=None, type=click.Path(file_okay=False, exists=True),
              help="A pristine site-packages directory (instead of --python).")
@click.option("--name", default=None, help="Set name (default: the manifest's, else the directory name).")
@click.option("--sglang", "spec", default=None, help="Version specifier (default: ==<installed version>).")
@click.option("--description", default=None)
@click.option("--check", "check_only", is_flag=True, help="Write nothing; exit 1 if manifest.json is not up to date.")
def make_manifest(set_dir: str, python: str | None, site_packages: str | None, name: str | None, spec: str | None,
                  description: str | None, check_only: bool) -> int:
    """(Re)generate SET_DIR/manifest.json from its diffs and a pristine install (hashes from RECORD)."""
    from doctor.sglang.patching import generate as gen

    try:
        if site_packages:
            installed = record.installed_in(site_packages)
            root = installed.site_packages
        else:
            found = locate.locate(python or sys.executable)
            installed, root = found.installed, found.package_root
        pset = gen.generate(set_dir, installed, name=name, sglang=spec, description=description,
                            package_root=root, write=not check_only)
    except (record.RecordError, locate.LocateError, gen.GenerateError) as exc:
        click.echo(f"k26-doctor: {exc}", err=True)
        return EXIT_FAILED
    path = Path(set_dir) / manifest.MANIFEST_NAME
    if check_only:
        try:
            current = json.loads(read_text(path, manifest.MAX_MANIFEST_BYTES, "a manifest"))
        except (OSError, ValueError):
            current = None
        if current != pset.to_dict():
            click.echo(f"{path} is not up to date with its diffs and sglang {installed.version}", err=True)
            return EXIT_FAILED
        click.echo(f"{path} is up to date")
        return EXIT_OK
    nfiles = len(pset.chains())
    click.echo(f"wrote {path}: {len(pset.patches)} patch(es), {nfiles} file(s), sglang {pset.sglang}")
    return EXIT_OK
