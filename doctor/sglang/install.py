"""SGLang as the service's interpreter has it (sglang.install): installed at the profile's pin, with its requirements
(``pip check``'s rule) and what the server imports at start beyond ``import sglang`` (``doctor/data/
sglang_runtime.toml``: FlashInfer's sampling module, the CuTe DSL, DFlash's tree-sampling kernel; for DFLASH/DDTREE,
FlashInfer's JIT). By default all from files (the ``stack`` fact); with --deep, --import-sglang and launch, from a
real import (``sglang_import``): a start that fails at the import costs the weights' load."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from doctor.core.result import Findings, Remediation
from doctor.core.settings import Settings
from doctor.sglang.runtime import flashinfer_jit_problems, runtime_problems
from doctor.stack.distributions import (
    applicable_requirements,
    installed_dist,
    is_under,
    norm,
    parse_spec,
    parse_version,
    pip_install,
)
from doctor.stack.service_probe import probe_failure

RUNTIME = "sglang.install.runtime"  # the server would stop at start: a module or file it imports is missing
JIT_TOOLCHAIN = "sglang.install.jit_toolchain"  # only the toolkit FlashInfer's JIT compiles with is wrong


def requirements(stack: dict[str, Any], dist: dict[str, Any]) -> tuple[list[str], list[str]]:
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


def judge_install(stack: dict[str, Any], read_import: Callable[[], Any], settings: Settings) -> Findings:
    """``read_import()``: the ``sglang_import`` fact, read only when SGLang is to be imported."""
    if not stack.get("ok"):
        return probe_failure(settings.python, stack, "read the installed packages")
    dist = installed_dist(stack, "sglang")
    pkg = (stack.get("packages") or {}).get("sglang") or {}
    want_text = settings.stack.sglang
    install = Remediation("Install the SGLang the profile pins into the service's environment.",
                          [pip_install(settings, "sglang", "sglang")])
    if dist is None and not pkg.get("found"):
        return Findings().fail("sglang.install.missing", f"SGLang is not installed in {settings.python}", install)
    out = Findings(metadata_version=dist and dist.get("version"), package_dirs=pkg.get("dirs"), expected=want_text)
    if dist is None:
        return out.fail("sglang.install.no_metadata", f"an sglang package is importable from {pkg.get('dirs')} but has "
                        "no installed metadata (a source tree on sys.path?)", install)
    want = parse_spec(want_text)
    ver = parse_version(dist.get("version"))
    if want_text and want is None:
        return out.fail("sglang.install.bad_pin", f"the profile's stack.sglang {want_text!r} is not a version "
                        "specifier")
    if ver is None or (want is not None and not want.contains(ver, prereleases=True)):
        return out.fail("sglang.install.version", f"sglang {dist.get('version')} installed, the profile pins "
                        f"{want_text}", install)
    warnings = []
    loc = dist.get("location")
    dirs = pkg.get("dirs") or []
    if loc and dirs and not any(is_under(d, loc) for d in dirs if d):
        warnings.append(f"`import sglang` would load {dirs[0]}, not the installed {loc}")
    on_disk = stack.get("sglang_runtime")
    if not (settings.deep or settings.import_sglang) and isinstance(on_disk, dict):
        return judge_on_disk(stack, dist, on_disk, warnings, settings, out)
    return judge_import(stack, read_import(), dist, ver, warnings, settings, out)


def judge_import(stack: dict[str, Any], imp: Any, dist: dict[str, Any], ver: Any, warnings: list[str],
                 settings: Settings, out: Findings) -> Findings:
    """The import tier: ``import sglang`` in the service's interpreter, and what its server imports at start."""
    dirs = ((stack.get("packages") or {}).get("sglang") or {}).get("dirs") or []
    if not isinstance(imp, dict) or not imp.get("imported"):
        imp = imp if isinstance(imp, dict) else {}
        missing = imp.get("missing_module")
        text = "Importing SGLang failed. "
        cmds = [shlex.join([settings.python, "-c", "import sglang"]),
                shlex.join([settings.python, "-m", "pip", "check"])]
        if missing:
            text += f"The module {missing!r} is missing: install SGLang with its dependencies."
            cmds.insert(0, pip_install(settings, "sglang", "sglang"))
        shadow = f" ({'; '.join(warnings)})" if warnings else ""
        out.details["traceback_tail"] = imp.get("traceback_tail")
        return out.fail("sglang.install.import", f"sglang {ver} is installed but `import sglang` fails: "
                        f"{imp.get('error')}{shadow}", Remediation(text, cmds))
    out.details["import_s"] = imp.get("import_s")
    if imp.get("version") and str(imp.get("version")) != str(dist.get("version")):
        warnings.append(f"sglang.__version__ is {imp.get('version')} but the metadata says {dist.get('version')}")
    where = dirs[0] if dirs else dist.get("location")
    return judge_runtime(stack, imp.get("runtime"), imp.get("dflash"), warnings, settings, out,
                         f"sglang {ver} imports in {imp.get('import_s')}s from {where}", f"sglang {ver} imports")


def judge_on_disk(stack: dict[str, Any], dist: dict[str, Any], on_disk: dict[str, Any], warnings: list[str],
                  settings: Settings, out: Findings) -> Findings:
    """The default tier: SGLang's requirements and runtime dependencies from the ``stack`` fact (no import)."""
    ver = dist.get("version")
    missing, mismatched = requirements(stack, dist)
    out.details["requirements"] = {"missing": missing, "mismatched": mismatched}
    if missing:
        names = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        shadow = f" ({'; '.join(warnings)})" if warnings else ""
        one = len(missing) == 1
        return out.fail(
            "sglang.install.requirements", f"sglang {ver} is installed but {len(missing)} of its requirements "
            f"{'is' if one else 'are'} not: {names} (the server imports them at start or on first use){shadow}",
            Remediation(f"SGLang's requirement{'' if one else 's'} {names} {'is' if one else 'are'} missing: "
                        "install SGLang with its dependencies.",
                        [pip_install(settings, "sglang", "sglang"),
                         shlex.join([settings.python, "-m", "pip", "check"])]))
    for text in mismatched:
        warnings.append(f"sglang {ver} requires {text}")
    pkg = (stack.get("packages") or {}).get("sglang") or {}
    where = (pkg.get("dirs") or [None])[0] or dist.get("location")
    return judge_runtime(stack, on_disk, on_disk.get("dflash"), warnings, settings, out,
                         f"sglang {ver} installed at {where} with its requirements (not imported: --deep and "
                         "launch import it)", f"sglang {ver} is installed")


def judge_runtime(stack: dict[str, Any], runtime: Any, dflash: Any, warnings: list[str], settings: Settings,
                  out: Findings, summary: str, stop_prefix: str) -> Findings:
    """What the server needs at start beyond ``import sglang``, from the import or from the files alike."""
    out.details["dflash"] = dflash
    jit = stack.get("sglang_jit")
    if isinstance(jit, dict):
        out.details["jit_nvcc"] = jit
        if not jit.get("exists"):
            warnings.append(f"SGLang builds its JIT kernels (DFlash tree sampling among them) with nvcc at first use: "
                            f"none at {jit.get('nvcc')} (via {jit.get('found_by')}); set CUDA_HOME or install the "
                            "CUDA toolkit")
    algorithm = settings.server.speculative_algorithm
    fails, runtime_warns, runtime_cmds = runtime_problems(
        runtime, algorithm=algorithm, architectures=settings.model.architectures,
        flashinfer_pin=settings.stack.flashinfer)
    out.details["runtime"] = runtime
    fi_jit = stack.get("flashinfer_jit")
    code = RUNTIME
    if isinstance(fi_jit, dict):
        out.details["flashinfer_jit"] = fi_jit
        torch_cuda = ((stack.get("torch") or {}).get("version_py") or {}).get("cuda")
        jit_fails, jit_cmds, jit_note, toolchain = flashinfer_jit_problems(
            fi_jit, stack.get("distributions"), algorithm=algorithm,
            compute_capability=settings.gpu.compute_capability, torch_cuda=torch_cuda)
        code = JIT_TOOLCHAIN if toolchain and not fails else code
        fails, runtime_cmds = fails + jit_fails, runtime_cmds + jit_cmds
        if jit_note:
            summary += "; " + jit_note
    if fails:
        return out.fail(code, f"{stop_prefix}, but the server would stop at start: "
                        + "; ".join(fails), Remediation("Install what the server imports at start into the service's "
                                                        "environment.", runtime_cmds))
    warnings.extend(runtime_warns)
    dflash = dflash if isinstance(dflash, dict) else {}
    if dflash.get("available") is False:
        warnings.append("DFlash's tree-sampling kernel is unavailable: SGLang will verify greedily "
                        "(temperature sampling ignored)")
    elif dflash.get("available") is None:
        warnings.append(f"cannot tell whether DFlash's sampling kernel is available: {dflash.get('error')}")
    if warnings:
        out.info("sglang.install.installed", summary)
        for warning in warnings:
            out.warn("sglang.install.warning", warning)
        return out
    return out.info("sglang.install.installed", summary + "; DFlash sampling kernel available")
