"""``sglang.patches``: the profile's SGLang patch set is fully applied and nothing drifted.

The deployment runs SGLang with local patches (DDTree). Grepping for a line says nothing about the
rest of a file; hashes do. This check judges the fact ``sglang_patches`` (doctor.facts.sglang).
"""

from __future__ import annotations

import shlex
from typing import Any

from doctor.context import Context
from doctor.patching.status import APPLIED, DRIFTED, MISSING, PARTIAL, PRISTINE, evaluate
from doctor.registry import check
from doctor.result import Remediation, Result


def patches_command(ctx: Context, verb: str, *extra: str) -> str:
    """The exact ``k26-doctor patches ...`` command for this run's settings."""
    s = ctx.settings
    argv = ["k26-doctor", "patches", verb, "--profile", s.profile_name]
    if s.python_given:
        argv += ["--python", s.python]
    if s.config_path:
        argv += ["--config", s.config_path]
    if s.patches_dir:
        argv += ["--patches-dir", s.patches_dir]
    if s.state_dir and s.state_dir != "/var/lib/k26-doctor":
        argv += ["--state-dir", s.state_dir]
    return shlex.join(argv + list(extra))


@check("sglang.patches", "Every patch of the profile's SGLang patch set applied, none drifted",
       needs=("sglang_patches",), tags=("sglang", "patches"), fixer="sglang.patches.apply", timeout=60)
def sglang_patches(ctx: Context) -> Result:
    """Hashes every file the profile's patch set (`[patches] set`, from `sglang_patches/<set>/` or the
    site's `patches_dir`) touches in the service interpreter's SGLang, without importing SGLang,
    and compares each with the manifest: pristine (RECORD's hash), applied (the post-image),
    drifted (neither: a hand edit, another SGLang build) or missing.

    Why: the DDTree deployment needs these patches; a missing one fails late (at server start or
    at the first tree verify), a drifted one silently runs code nobody reviewed.

    Fix: `k26-doctor patches status` shows each file; `k26-doctor patches apply` applies the set
    atomically (backups, journal, all or nothing); a drifted file is refused unless `--force`.
    `k26-doctor patches revert` puts RECORD's bytes back. By hand: `pip install --force-reinstall
    --no-deps sglang==VERSION`, then apply.
    """
    fact: dict[str, Any] = ctx.fact("sglang_patches")
    if not isinstance(fact, dict):
        return Result.failed(f"the sglang_patches fact is not an object ({type(fact).__name__}); re-record it",
                             Remediation("", [patches_command(ctx, "status")]))
    set_name = ctx.expect("patches.set", "") or fact.get("set_name", "")
    if not set_name or fact.get("no_set"):
        return Result.skipped(f"profile {ctx.settings.profile_name} uses no SGLang patch set ([patches] set is empty)")
    status_cmd = patches_command(ctx, "status")
    site_dir = ctx.settings.patches_dir
    if site_dir and "patches_dir" in fact and fact.get("patches_dir") != site_dir:
        # The fact was gathered without the site's set directory: judging it could judge the wrong set.
        return Result.errored(f"the sglang_patches fact was collected without the site's patch-set directory "
                              f"{site_dir} (it used {fact.get('patches_dir') or 'only the built-in sets'}); "
                              f"run `{status_cmd}`", set=set_name)
    if fact.get("set_error"):
        return Result.failed(f"patch set {set_name!r} cannot be used: {fact['set_error']}",
                             Remediation("Fix the profile's [patches] set or point --patches-dir at the site's sets.",
                                         [status_cmd]), set=set_name)
    if fact.get("install_error"):
        return Result.failed(f"SGLang install of {fact.get('python')} cannot be judged: {fact['install_error']}",
                             Remediation("Install SGLang in the service's environment (see sglang.install), then "
                                         "apply the patch set.", [patches_command(ctx, "apply")]),
                             set=set_name, python=fact.get("python"))
    ev = evaluate(fact)
    details: dict[str, Any] = {"set": ev.set_name or set_name, "sglang_version": ev.version, "sglang_spec": ev.spec,
                               "site_packages": fact.get("site_packages"), "overall": ev.overall,
                               "files": {f.path: f.state for f in ev.files},
                               "patches": {p.id: p.state for p in ev.patches}}
    if ev.overall == "invalid":
        return Result.failed(f"patch set {set_name}: {'; '.join(ev.problems)}", Remediation("", [status_cmd]),
                             **details)
    if ev.journal and ev.journal.get("running"):
        return Result.failed(f"a patch run is changing SGLang's files right now ({ev.journal['running']})",
                             Remediation("Wait for it to finish, then check again.", [status_cmd]), **details)
    if ev.journal:
        return Result.failed(f"an interrupted patch run ({ev.journal.get('op')} of {ev.journal.get('started')}) left "
                             f"its journal {ev.journal.get('path')}",
                             Remediation("The next apply or revert rolls it back first, then does its work.",
                                         [patches_command(ctx, "apply")]), **details)
    if not ev.version_ok:
        return Result.failed(f"patch set {ev.set_name} is for sglang {ev.spec}, installed {ev.version}",
                             Remediation("Install the SGLang version the set is for, or use a set made for this one.",
                                         [f"{shlex.quote(ctx.settings.python)} -m pip install --no-deps "
                                          f"'sglang{ev.spec}'" if ev.spec.startswith("==") else status_cmd,
                                          patches_command(ctx, "apply")]), **details)
    if ev.problems:
        return Result.failed(f"patch set {ev.set_name} does not fit this install: {'; '.join(ev.problems)}",
                             Remediation("The set was made for another build of SGLang.", [status_cmd]), **details)
    if ev.ok:
        return Result.passed(f"patch set {ev.set_name}: all {len(ev.patches)} patches applied "
                             f"({len(ev.files)} files match their post-image), sglang {ev.version}", **details)
    groups = []
    for state in (DRIFTED, MISSING, PARTIAL, PRISTINE):
        paths = [f.path for f in ev.files if f.state == state]
        if paths:
            groups.append(f"{len(paths)} {state}: {', '.join(paths)}")
    applied_patches = sum(1 for p in ev.patches if p.state == APPLIED)
    summary = (f"patch set {ev.set_name} {ev.overall} ({applied_patches}/{len(ev.patches)} patches, "
               f"{ev.count(APPLIED)}/{len(ev.files)} files applied); " + "; ".join(groups))
    if ev.count(DRIFTED) or ev.count(MISSING):
        text = ("Drifted files were edited by hand or come from another build: look at them, then either "
                "reinstall SGLang and apply, or apply with --force (the drifted files are backed up).")
        cmds = [status_cmd,
                f"{shlex.quote(ctx.settings.python)} -m pip install --force-reinstall --no-deps 'sglang=={ev.version}'",
                patches_command(ctx, "apply"), patches_command(ctx, "apply", "--force")]
    else:
        text = "Apply the set: all files at once, with backups and a journal; `revert` takes it back."
        cmds = [patches_command(ctx, "apply")]
    return Result.failed(summary, Remediation(text, cmds), **details)
