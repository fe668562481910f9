"""Fixer of ``sglang.patches``: apply the profile's patch set with the engine's transaction.

The plan is the engine's own plan (every file with its diff), computed when ``fix`` shows it; at
``fix --apply`` the engine plans again and refuses if anything differs from what was shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.core.actions import Action, ActionError, Plan, backup_file
from doctor.core.context import Context
from doctor.core.registry import fixer
from doctor.core.result import Result
from doctor.facts.store import CollectOptions
from doctor.sglang.facts import patches_dir_of
from doctor.sglang.patching import locate, manifest
from doctor.sglang.patching.engine import Engine, EngineError, Transaction


def engine_for(python: str, set_name: str, patches_dir: str | None, state_dir: str | None) -> Engine:
    """An engine for the live install; ``EngineError`` for a set or install that cannot be used."""
    try:
        pset = manifest.resolve(set_name, patches_dir)
        found = locate.locate(python)
    except (manifest.ManifestError, locate.LocateError) as exc:
        raise EngineError(str(exc)) from None
    return Engine(pset, found.installed, state_dir=state_dir, package_root=found.package_root)


@dataclass
class ApplyPatchSet(Action):
    """Apply a patch set to an installed SGLang, all files or none."""

    python: str = ""
    set_name: str = ""
    patches_dir: str | None = None
    state_dir: str | None = None
    planned: list[dict[str, Any]] = field(default_factory=list)  # Change.to_dict() of the shown plan
    diff: list[str] = field(default_factory=list)

    def details(self) -> list[str]:
        lines = [f"{c['path']}: {c['why']} ({(c['old_sha256'] or 'absent')[:12]} -> "
                 f"{(c['new_sha256'] or 'deleted')[:12]})" for c in self.planned]
        return lines + self.diff

    def apply(self, backup_dir: Path) -> str:
        try:
            eng = engine_for(self.python, self.set_name, self.patches_dir, self.state_dir)
            recovered = eng.recover()
            plan = eng.plan_apply()
            if not plan.ok:
                raise EngineError("; ".join(plan.refusals))
            if [c.to_dict() for c in plan.changes] != self.planned:
                raise EngineError("the files changed since the plan was shown; nothing was written: run fix again")
            for c in plan.changes:  # the fix run's own backup directory gets a copy too
                if c.old is not None:
                    backup_file(eng.root / c.path, backup_dir)
            out = eng.execute(plan)
        except EngineError as exc:
            raise ActionError(str(exc)) from None
        msg = f"applied patch set {self.set_name}: {len(out.changed)} file(s) changed"
        if out.removed_bytecode:
            msg += f", {len(out.removed_bytecode)} stale .pyc removed"
        if recovered:
            msg = recovered + "; " + msg
        return msg + (f"; originals in {eng.state_dir or 'the state directory'} (history {out.history})")


def action_for(plan: Transaction, python: str, set_name: str, patches_dir: str | None,
               state_dir: str | None) -> ApplyPatchSet:
    diff: list[str] = []
    for c in plan.changes:
        diff.extend(c.diff_lines())
    return ApplyPatchSet(summary=f"apply SGLang patch set {set_name} to {len(plan.changes)} file(s) "
                                 f"(all or nothing, originals backed up)",
                         python=python, set_name=set_name, patches_dir=patches_dir, state_dir=state_dir,
                         planned=[c.to_dict() for c in plan.changes], diff=diff)


@fixer("sglang.patches.apply", "Apply the profile's SGLang patch set (transactional, with backups)")
def plan_patches(ctx: Context, result: Result) -> Plan:
    """When sglang.patches found something wrong with the set's files (``sglang.patches.*``: not applied, drifted,
    another version, an interrupted run): plan the apply through the engine, which refuses with the reason what it
    cannot apply safely (drift, a wrong version, a journal to roll back first)."""
    s = ctx.settings
    set_name = str(s.patches.set or "")
    if not set_name or not result.has("sglang.patches."):
        return Plan()
    patches_dir = patches_dir_of(CollectOptions.from_settings(s))
    eng = engine_for(s.python, set_name, patches_dir, s.state_dir)
    if eng.status().journal:
        raise EngineError("an interrupted patch run must be rolled back first: run `k26-doctor patches apply`")
    plan = eng.plan_apply()
    if not plan.ok:
        raise EngineError("; ".join(plan.refusals) + " (see `k26-doctor patches status`)")
    if not plan.changes:
        return Plan()
    return Plan([action_for(plan, s.python, set_name, patches_dir, s.state_dir)])
