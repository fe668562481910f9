"""Checks of the SGLang area: the install (``sglang.install``), the patch set (``sglang.patches``), the
server flags (``sglang.flags``) and the DDTree worker gate (``sglang.ddtree``).

Pure judgements over the facts of ``doctor.sglang.facts`` (and ``stack`` for the installed
distributions). The flag verdict is ``doctor.sglang.flags.judge_flags``, the same one the launcher
uses on the real argv; patch status is ``doctor.sglang.patching.status.evaluate``.
"""

from __future__ import annotations

import shlex
from typing import Any

from doctor.core.context import Context
from doctor.core.registry import check
from doctor.core.result import Remediation, Result
from doctor.core.settings import ConfigError
from doctor.facts.store import FactUnavailable
from doctor.service.launcher import build_server_args
from doctor.sglang.flags import judge_flags
from doctor.sglang.patching.status import APPLIED, DRIFTED, MISSING, PARTIAL, PRISTINE, evaluate
from doctor.sglang.runtime import flashinfer_jit_problems, runtime_problems
from doctor.stack.judging import (
    applicable_requirements,
    has_sglang,
    installed_dist,
    is_under,
    norm,
    parse_spec,
    parse_version,
    pip_install,
    service_python,
    stack_fact,
)

# -- sglang.install ------------------------------------------------------------------------------

@check("sglang.install", "SGLang importable from the service's interpreter, version as the profile pins",
       needs=("stack", "sglang_import"), depends=("python.venv",), timeout=300)
def sglang_install(ctx: Any) -> Result:
    """Finds SGLang without importing it (package metadata and ``find_spec``) and checks its version against
    the profile's pin. By default that is all from files, in the ``stack`` probe: every ``Requires-Dist`` of
    SGLang installed (``pip check``'s rule: SGLang imports most of them lazily, so ``import sglang`` can succeed
    while the server stops at start on a missing one; one at a version SGLang excludes warns), and what
    the server imports at start beyond ``import sglang`` (``doctor/data/sglang_runtime.toml``, each rule seen
    stopping a real server) found on disk: FlashInfer's ``sampling`` module and the JIT source directories
    DFLASH/DDTREE verify compiles, the CuTe DSL for Llama/Qwen-family MLPs, and DFlash's tree-sampling kernel
    module (without it SGLang silently verifies greedily: warn).

    Importing SGLang (it imports torch: seconds to a minute) moves to ``--deep``, ``--import-sglang`` and
    ``launch``, which sets it: a wheel can be present with every requirement yet fail to import (a
    dependency's shared library, a mismatched build), and a start that fails there costs the ~20 minutes
    the weights take to load, so the gate before a start pays for the real import; the systemd unit's
    ExecStartPre passes ``--import-sglang`` for the same reason. A recording without the on-disk reading
    is judged from its import. Fix by hand: ``pip install 'sglang==<pin>'`` (and what the failure names)
    in the service's venv.
    """
    stack, err = stack_fact(ctx)
    if err:
        return err
    assert stack is not None
    dist = installed_dist(stack, "sglang")
    pkg = (stack.get("packages") or {}).get("sglang") or {}
    want_text = ctx.expect("stack.sglang")
    install = Remediation("Install the SGLang the profile pins into the service's environment.",
                          [pip_install(ctx, "sglang", "sglang")])
    if dist is None and not pkg.get("found"):
        return Result.failed(f"SGLang is not installed in {service_python(ctx)}", install)
    details: dict[str, Any] = {"metadata_version": dist and dist.get("version"), "package_dirs": pkg.get("dirs"),
                               "expected": want_text}
    if dist is None:
        return Result.failed(f"an sglang package is importable from {pkg.get('dirs')} but has no installed metadata "
                             "(a source tree on sys.path?)", install, **details)
    want = parse_spec(want_text)
    ver = parse_version(dist.get("version"))
    if want_text and want is None:
        return Result.failed(f"the profile's stack.sglang {want_text!r} is not a version specifier", **details)
    if ver is None or (want is not None and not want.contains(ver, prereleases=True)):
        return Result.failed(f"sglang {dist.get('version')} installed, the profile pins {want_text}", install,
                             **details)
    warnings = []
    loc = dist.get("location")
    dirs = pkg.get("dirs") or []
    if loc and dirs and not any(is_under(d, loc) for d in dirs if d):
        warnings.append(f"`import sglang` would load {dirs[0]}, not the installed {loc}")
    on_disk = stack.get("sglang_runtime")
    if not (ctx.deep or ctx.settings.import_sglang) and isinstance(on_disk, dict):
        return _judge_on_disk(ctx, stack, dist, on_disk, warnings, details)
    imp = ctx.fact("sglang_import")
    if not isinstance(imp, dict) or not imp.get("imported"):
        imp = imp if isinstance(imp, dict) else {}
        missing = imp.get("missing_module")
        text = "Importing SGLang failed. "
        cmds = [shlex.join([service_python(ctx), "-c", "import sglang"]), shlex.join([service_python(ctx), "-m", "pip",
                                                                                      "check"])]
        if missing:
            text += f"The module {missing!r} is missing: install SGLang with its dependencies."
            cmds.insert(0, pip_install(ctx, "sglang", "sglang"))
        shadow = f" ({'; '.join(warnings)})" if warnings else ""
        return Result.failed(f"sglang {ver} is installed but `import sglang` fails: {imp.get('error')}{shadow}",
                             Remediation(text, cmds), traceback_tail=imp.get("traceback_tail"), **details)
    details["import_s"] = imp.get("import_s")
    if imp.get("version") and str(imp.get("version")) != str(dist.get("version")):
        warnings.append(f"sglang.__version__ is {imp.get('version')} but the metadata says {dist.get('version')}")
    return _judge_runtime(ctx, stack, imp.get("runtime"), imp.get("dflash"), warnings, details,
                          f"sglang {ver} imports in {imp.get('import_s')}s from {dirs[0] if dirs else loc}",
                          f"sglang {ver} imports")


def _judge_on_disk(ctx: Any, stack: dict[str, Any], dist: dict[str, Any], on_disk: dict[str, Any],
                   warnings: list[str], details: dict[str, Any]) -> Result:
    """The default tier: SGLang's requirements and runtime dependencies from the ``stack`` fact (no import)."""
    ver = dist.get("version")
    missing, mismatched = _sglang_requirements(stack, dist)
    details["requirements"] = {"missing": missing, "mismatched": mismatched}
    if missing:
        names = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        shadow = f" ({'; '.join(warnings)})" if warnings else ""
        one = len(missing) == 1
        return Result.failed(
            f"sglang {ver} is installed but {len(missing)} of its requirements {'is' if one else 'are'} not: "
            f"{names} (the server imports them at start or on first use){shadow}",
            Remediation(f"SGLang's requirement{'' if one else 's'} {names} {'is' if one else 'are'} missing: "
                        "install SGLang with its dependencies.",
                        [pip_install(ctx, "sglang", "sglang"),
                         shlex.join([service_python(ctx), "-m", "pip", "check"])]),
            **details)
    for text in mismatched:
        warnings.append(f"sglang {ver} requires {text}")
    pkg = (stack.get("packages") or {}).get("sglang") or {}
    where = (pkg.get("dirs") or [None])[0] or dist.get("location")
    return _judge_runtime(ctx, stack, on_disk, on_disk.get("dflash"), warnings, details,
                          f"sglang {ver} installed at {where} with its requirements (not imported: --deep and "
                          "launch import it)", f"sglang {ver} is installed")


def _sglang_requirements(stack: dict[str, Any], dist: dict[str, Any]) -> tuple[list[str], list[str]]:
    """SGLang's Requires-Dist against the installed distributions, as ``pip check`` reads them: (missing,
    installed at a version the requirement excludes). Markers are evaluated for the service's interpreter."""
    dists = stack.get("distributions") if isinstance(stack.get("distributions"), dict) else {}
    missing: list[str] = []
    mismatched: list[str] = []
    for req in applicable_requirements(stack, dist.get("requires")):
        have = dists.get(norm(req.name))
        named = f"{req.name}{req.specifier}"  # without the marker, already evaluated
        if not isinstance(have, dict):
            missing.append(named)
            continue
        have_v = parse_version(have.get("version"))
        if req.specifier and (have_v is None or not req.specifier.contains(have_v, prereleases=True)):
            mismatched.append(f"{named}, installed {have.get('version')}")
    return missing, mismatched


def _judge_runtime(ctx: Any, stack: dict[str, Any], runtime: Any, dflash: Any, warnings: list[str],
                   details: dict[str, Any], summary: str, stop_prefix: str) -> Result:
    """What the server needs at start beyond ``import sglang``, from the import or from the files alike."""
    details["dflash"] = dflash
    jit = stack.get("sglang_jit")
    if isinstance(jit, dict):
        details["jit_nvcc"] = jit
        if not jit.get("exists"):
            warnings.append(f"SGLang builds its JIT kernels (DFlash tree sampling among them) with nvcc at first use: "
                            f"none at {jit.get('nvcc')} (via {jit.get('found_by')}); set CUDA_HOME or install the "
                            "CUDA toolkit")
    algorithm = ctx.expect("server.speculative_algorithm")
    fails, runtime_warns, runtime_cmds = runtime_problems(
        runtime, algorithm=algorithm,
        architectures=ctx.expect("model.architectures"), flashinfer_pin=ctx.expect("stack.flashinfer"))
    details["runtime"] = runtime
    fi_jit = stack.get("flashinfer_jit")
    if isinstance(fi_jit, dict):
        details["flashinfer_jit"] = fi_jit
        torch_cuda = ((stack.get("torch") or {}).get("version_py") or {}).get("cuda")
        jit_fails, jit_cmds, jit_note = flashinfer_jit_problems(
            fi_jit, stack.get("distributions"), algorithm=algorithm,
            compute_capability=ctx.expect("gpu.compute_capability"), torch_cuda=torch_cuda)
        fails, runtime_cmds = fails + jit_fails, runtime_cmds + jit_cmds
        if jit_note:
            summary += "; " + jit_note
    if fails:
        return Result.failed(f"{stop_prefix}, but the server would stop at start: " + "; ".join(fails),
                             Remediation("Install what the server imports at start into the service's "
                                         "environment.", runtime_cmds), **details)
    warnings.extend(runtime_warns)
    dflash = dflash if isinstance(dflash, dict) else {}
    if dflash.get("available") is False:
        warnings.append("DFlash's tree-sampling kernel is unavailable: SGLang will verify greedily "
                        "(temperature sampling ignored)")
    elif dflash.get("available") is None:
        warnings.append(f"cannot tell whether DFlash's sampling kernel is available: {dflash.get('error')}")
    if warnings:
        return Result.warned(summary + "; " + "; ".join(warnings), **details)
    return Result.passed(summary + "; DFlash sampling kernel available", **details)


# -- sglang.patches -----------------------------------------------------------------------------

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
       needs=("sglang_patches",), depends=("python.venv",), tags=("sglang", "patches"), fixer="sglang.patches.apply",
       timeout=60)
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
        res = Result.failed(f"SGLang install of {fact.get('python')} cannot be judged: {fact['install_error']}",
                            Remediation("Install SGLang in the service's environment (see sglang.install), then "
                                        "apply the patch set.", [patches_command(ctx, "apply")]),
                            set=set_name, python=fact.get("python"))
        res.cause = "sglang.install"
        return res
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


# -- sglang.flags -------------------------------------------------------------------------------

@check("sglang.flags", "Every server flag is one the installed SGLang accepts", needs=("sglang_flags",),
       depends=("python.venv",), tags=("sglang", "launch"))
def sglang_flags(ctx: Context) -> Result:
    """Reads the flags the service interpreter's SGLang accepts from its sources (the annotated
    fields of ``sglang/srt/arg_groups/fields/`` in 0.5.2x, ``add_argument`` calls in older releases;
    nothing is imported) and replays argparse on the command ``k26-doctor launch`` would run: the
    profile's flags, its ``[server] args``.

    Why: SGLang parses its flags only after seconds to minutes of imports, then exits with status 2:
    0.5.20 removed ``--cuda-graph-max-bs`` and argparse calls it an "ambiguous option"; a DDTree flag
    is "unrecognized" when the patch set is not applied. Under systemd that becomes a restart loop.
    Fix by hand: use the replacement flag named in the result (`k26-doctor launch --dry-run` shows the
    command), or apply the patch set (`k26-doctor patches apply`).
    """
    fact = ctx.fact("sglang_flags")
    try:
        args, _ = build_server_args(ctx.settings, placeholders=True)
    except ConfigError as exc:
        return Result.failed(f"the profile's server settings are invalid: {exc}",
                             "Fix the [server] table of the config.")
    return judge_flags(fact, args)


# -- sglang.ddtree ------------------------------------------------------------------------------

GATE = "SGLANG_DDTREE_UNVALIDATED_WORKER"


@check("sglang.ddtree", "DDTREE will be accepted by the patched SGLang (worker gate)", needs=("env", "stack"))
def ddtree_gate(ctx: Context) -> Result:
    """When the profile launches `--speculative-algorithm DDTREE`, reads the service's environment
    (process, profile [server.env], EnvironmentFile) for SGLANG_DDTREE_UNVALIDATED_WORKER.

    Why: the DDTree patch set's tree-verify worker has been validated on CPU (torch, Triton's
    interpreter) and its kernels on an H200, but never inside a running SGLang server; the patched
    SGLang refuses DDTREE at argument resolution unless the site opts in with that variable. A start
    without it fails after minutes of imports.
    Fix by hand: set server.speculative_algorithm = "DFLASH" in the config (chain verification,
    validated upstream), or opt in knowingly (`SGLANG_DDTREE_UNVALIDATED_WORKER=1` in the env file)
    and validate as the patch set's README says.
    """
    algo = str(ctx.expect("server.speculative_algorithm", "") or "").upper()
    if algo != "DDTREE":
        return Result.skipped(f"the profile launches {algo or 'no speculative algorithm'}, not DDTREE")
    env = ctx.fact("env")
    value = (env.get("vars") or {}).get(GATE) if isinstance(env, dict) else None
    if value == "1":
        return Result.warned(
            f"{GATE}=1: SGLang will run the DDTree worker, which has not been validated inside a real server",
            "Compare the first outputs token for token with a non-speculative server (patch set README, "
            "'Validating on a real host') before serving traffic.", variable=GATE, value=value)
    env_file = ctx.expect("server.env_file", "/etc/k26-doctor/sglang-k26.env")
    try:
        absent = has_sglang(ctx.fact("stack")) is False
    except FactUnavailable:  # not recorded: the gate is judged all the same
        absent = False
    if absent:
        summary = f"DDTREE needs SGLang with the DDTree patch set (not installed) and {GATE}=1 (not set)"
    else:
        summary = (f"the profile launches DDTREE, but {GATE}=1 is not set: SGLang with the DDTree patch set "
                   "refuses DDTREE without it (its worker is not yet validated on a real host)")
    return Result.failed(
        summary,
        Remediation("Launch the DFlash chain instead (server.speculative_algorithm = \"DFLASH\" in the config), "
                    f"or opt in knowingly with {GATE}=1 in the service's environment file and validate "
                    "as sglang_patches/ddtree-0.5.23/README.md says.",
                    [f"echo '{GATE}=1' | sudo tee -a {env_file}"]),
        variable=GATE, value=value)
