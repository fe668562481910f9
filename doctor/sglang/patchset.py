"""The profile's SGLang patch set in the service's install (sglang.patches): every file of the set pristine, applied,
drifted or missing (``doctor.sglang.patching.status.evaluate`` over the ``sglang_patches`` fact), and what to run.
The DDTree deployment needs these patches; a missing one fails late, a drifted one silently runs code nobody
reviewed."""

from __future__ import annotations

import shlex
from typing import Any

from doctor.core.registry import Applicability
from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import DEFAULT_STATE_DIR, Settings
from doctor.sglang.patching.status import (
    APPLIED,
    DRIFTED,
    MISSING,
    NOT_A_FILE,
    PARTIAL,
    PRISTINE,
    Evaluation,
    evaluate,
)

NOT_APPLIED = "sglang.patches.not_applied"  # the set is not (all) applied: what the apply fixer plans


def patches_command(settings: Settings, verb: str, *extra: str) -> str:
    """The exact ``k26-doctor patches ...`` command for this run's settings."""
    argv = ["k26-doctor", "patches", verb, "--profile", settings.profile_name]
    if settings.python_given:
        argv += ["--python", settings.python]
    if settings.config_path:
        argv += ["--config", settings.config_path]
    if settings.patches_dir:
        argv += ["--patches-dir", settings.patches_dir]
    if settings.state_dir and settings.state_dir != DEFAULT_STATE_DIR:
        argv += ["--state-dir", settings.state_dir]
    return shlex.join(argv + list(extra))


def usable_fact(fact: dict[str, Any], settings: Settings, set_name: str, out: Findings) -> Findings | None:
    """Why the fact cannot be judged against the set (another patch-set directory, a set or install that cannot be
    used), or None."""
    status_cmd = patches_command(settings, "status")
    site_dir = settings.patches_dir
    if site_dir and "patches_dir" in fact and fact.get("patches_dir") != site_dir:
        # The fact was gathered without the site's set directory: judging it could judge the wrong set.
        raise NotJudged.failing(f"the sglang_patches fact was collected without the site's patch-set directory "
                                f"{site_dir} (it used {fact.get('patches_dir') or 'only the built-in sets'}); "
                                f"run `{status_cmd}`", set=set_name)
    if fact.get("set_error"):
        return out.fail("sglang.patches.set_unusable", f"patch set {set_name!r} cannot be used: {fact['set_error']}",
                        Remediation("Fix the profile's [patches] set or point --patches-dir at the site's sets.",
                                    [status_cmd]))
    if fact.get("install_error"):
        out.details["python"] = fact.get("python")
        out.cause = "sglang.install"
        return out.fail("sglang.patches.no_install", f"SGLang install of {fact.get('python')} cannot be judged: "
                        f"{fact['install_error']}",
                        Remediation("Install SGLang in the service's environment (see sglang.install), then apply the "
                                    "patch set.", [patches_command(settings, "apply")]))
    return None


def names_a_set(settings: Settings) -> bool:
    """The patches are judged only where the profile names a set ([patches] set)."""
    return bool(settings.patches.set)


def _no_set(settings: Settings) -> str:
    return f"profile {settings.profile_name} uses no SGLang patch set ([patches] set is empty)"


PATCHES_APPLY = Applicability(names_a_set, _no_set)  # sglang.patches's applies_if


def judge_patches(fact: dict[str, Any], settings: Settings) -> Findings:
    """The profile's patch set (``PATCHES_APPLY``, declared on the check: the profile names one) in the installed
    SGLang. A recording made under a profile without a set (``no_set``) has no files of one to judge."""
    set_name = settings.patches.set or fact.get("set_name", "")
    if fact.get("no_set"):
        raise NotJudged.inapplicable("the facts were collected for a profile with no SGLang patch set: no patched "
                                     "file was read")
    unusable = usable_fact(fact, settings, set_name, Findings(set=set_name))
    if unusable is not None:
        return unusable
    ev = evaluate(fact)
    out = Findings(set=ev.set_name or set_name, sglang_version=ev.version, sglang_spec=ev.spec,
                   site_packages=fact.get("site_packages"), overall=ev.overall,
                   files={f.path: f.state for f in ev.files}, patches={p.id: p.state for p in ev.patches})
    status_cmd = patches_command(settings, "status")
    if ev.overall == "invalid":
        return out.fail("sglang.patches.invalid", f"patch set {set_name}: {'; '.join(ev.problems)}",
                        Remediation("", [status_cmd]))
    if ev.journal and ev.journal.get("running"):
        return out.fail("sglang.patches.running", f"a patch run is changing SGLang's files right now "
                        f"({ev.journal['running']})",
                        Remediation("Wait for it to finish, then check again.", [status_cmd]))
    if ev.journal:
        return out.fail("sglang.patches.interrupted", f"an interrupted patch run ({ev.journal.get('op')} of "
                        f"{ev.journal.get('started')}) left its journal {ev.journal.get('path')}",
                        Remediation("The next apply or revert rolls it back first, then does its work.",
                                    [patches_command(settings, "apply")]))
    if not ev.version_ok:
        pin = (f"{shlex.quote(settings.python)} -m pip install --no-deps 'sglang{ev.spec}'"
               if ev.spec.startswith("==") else status_cmd)
        return out.fail("sglang.patches.other_version", f"patch set {ev.set_name} is for sglang {ev.spec}, installed "
                        f"{ev.version}", Remediation("Install the SGLang version the set is for, or use a set made for "
                                                     "this one.", [pin, patches_command(settings, "apply")]))
    if ev.problems:
        return out.fail("sglang.patches.misfit", f"patch set {ev.set_name} does not fit this install: "
                        f"{'; '.join(ev.problems)}", Remediation("The set was made for another build of SGLang.",
                                                                 [status_cmd]))
    if ev.ok:
        return out.info("sglang.patches.applied", f"patch set {ev.set_name}: all {len(ev.patches)} patches applied "
                        f"({len(ev.files)} files match their post-image), sglang {ev.version}")
    return not_applied(ev, settings, out)


def not_applied(ev: Evaluation, settings: Settings, out: Findings) -> Findings:
    groups = []
    for state in (NOT_A_FILE, DRIFTED, MISSING, PARTIAL, PRISTINE):
        paths = [f"{f.path} ({f.note.split(':')[0]})" if state == NOT_A_FILE else f.path
                 for f in ev.files if f.state == state]
        if paths:
            groups.append(f"{len(paths)} {state}: {', '.join(paths)}")
    applied_patches = sum(1 for p in ev.patches if p.state == APPLIED)
    summary = (f"patch set {ev.set_name} {ev.overall} ({applied_patches}/{len(ev.patches)} patches, "
               f"{ev.count(APPLIED)}/{len(ev.files)} files applied); " + "; ".join(groups))
    if ev.count(NOT_A_FILE):  # what no patch run can write over: the files' kinds say why, no --force
        text = ("Something that is not a file stands where SGLang's file should be (a FIFO, a device, a directory): "
                "remove it, reinstall SGLang, then apply the set.")
        cmds = [patches_command(settings, "status"),
                f"{shlex.quote(settings.python)} -m pip install --force-reinstall --no-deps 'sglang=={ev.version}'",
                patches_command(settings, "apply")]
    elif ev.count(DRIFTED) or ev.count(MISSING):
        text = ("Drifted files were edited by hand or come from another build: look at them, then either "
                "reinstall SGLang and apply, or apply with --force (the drifted files are backed up).")
        cmds = [patches_command(settings, "status"),
                f"{shlex.quote(settings.python)} -m pip install --force-reinstall --no-deps 'sglang=={ev.version}'",
                patches_command(settings, "apply"), patches_command(settings, "apply", "--force")]
    else:
        text = "Apply the set: all files at once, with backups and a journal; `revert` takes it back."
        cmds = [patches_command(settings, "apply")]
    return out.fail(NOT_APPLIED, summary, Remediation(text, cmds))
