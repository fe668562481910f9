"""SGLang as the service's interpreter has it (sglang.install): installed at the profile's pin, with its requirements
(``pip check``'s rule) and what the server imports at start beyond ``import sglang`` (``doctor/data/
sglang_runtime.toml``: FlashInfer's sampling module, the CuTe DSL, DFlash's tree-sampling kernel; for DFLASH/DDTREE,
FlashInfer's JIT). By default all from files (the ``stack`` fact); with --deep, --import-sglang and launch, from a
real import (``sglang_import``): a start that fails at the import costs the weights' load."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from doctor.core.result import Finding, Findings, Remediation, Severity
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

# What the server would stop on at start has a code per kind (doctor.sglang.runtime: sglang.install.runtime.*,
# sglang.install.jit_*), all said in one verdict with this remediation:
STOP_FIX = "Install what the server imports at start into the service's environment."
WARNING = "sglang.install.warning"  # what does not stop the start: a shadowed copy, a version, DFlash's kernel


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
    if not _version_ok(dist, want_text, install, out):
        return out
    warnings = _shadowed(dist, pkg.get("dirs") or [])
    on_disk = stack.get("sglang_runtime")
    if not (settings.deep or settings.import_sglang) and isinstance(on_disk, dict):
        return judge_on_disk(stack, dist, on_disk, warnings, settings, out)
    return judge_import(stack, read_import(), dist, parse_version(dist.get("version")), warnings, settings, out)


def _version_ok(dist: dict[str, Any], want_text: str | None, install: Remediation, out: Findings) -> bool:
    """Whether the installed version is one the profile's pin allows; a failure in ``out`` when not (or when
    the pin itself is no version specifier)."""
    want = parse_spec(want_text)
    ver = parse_version(dist.get("version"))
    if want_text and want is None:
        out.fail("sglang.install.bad_pin", f"the profile's stack.sglang {want_text!r} is not a version specifier")
        return False
    if ver is None or (want is not None and not want.contains(ver, prereleases=True)):
        out.fail("sglang.install.version", f"sglang {dist.get('version')} installed, the profile pins {want_text}",
                 install)
        return False
    return True


def _shadowed(dist: dict[str, Any], dirs: list[Any]) -> list[str]:
    """A warning when ``import sglang`` would load another copy than the installed distribution's."""
    loc = dist.get("location")
    if loc and dirs and not any(is_under(d, loc) for d in dirs if d):
        return [f"`import sglang` would load {dirs[0]}, not the installed {loc}"]
    return []


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
    found = runtime_problems(runtime, algorithm=algorithm, architectures=settings.model.architectures,
                             flashinfer_pin=settings.stack.flashinfer)
    out.details["runtime"] = runtime
    fi_jit = stack.get("flashinfer_jit")
    if isinstance(fi_jit, dict):
        out.details["flashinfer_jit"] = fi_jit
        torch_cuda = ((stack.get("torch") or {}).get("version_py") or {}).get("cuda")
        found.extend(flashinfer_jit_problems(fi_jit, stack.get("distributions"), algorithm=algorithm,
                                             compute_capability=settings.gpu.compute_capability,
                                             torch_cuda=torch_cuda))
    if found.failing:
        return _would_stop(out, stop_prefix, found.of(Severity.FAIL))
    summary += "".join(f"; {note.message}" for note in found.of(Severity.INFO))
    warned = [Finding(Severity.WARN, WARNING, text) for text in warnings] + found.of(Severity.WARN) + [
        Finding(Severity.WARN, WARNING, text) for text in _dflash_warnings(dflash)]
    if warned:
        out.info("sglang.install.installed", summary)
        out.extend(warned)
        return out
    return out.info("sglang.install.installed", summary + "; DFlash sampling kernel available")


def _would_stop(out: Findings, stop_prefix: str, fails: list[Finding]) -> Findings:
    """The server would stop at start: each problem stays a finding of its own code (a fixer acts on one kind),
    said as one line (the first carries the lead) with one remediation (``Result.of`` merges their commands)."""
    lead = f"{stop_prefix}, but the server would stop at start: "
    for n, problem in enumerate(fails):
        out.fail(problem.code, (lead if n == 0 else "") + problem.message,
                 Remediation(STOP_FIX, problem.fix.commands if problem.fix else []))
    return out


def _dflash_warnings(dflash: Any) -> list[str]:
    """DFlash's tree-sampling kernel unavailable (SGLang then verifies greedily), or not known to be available."""
    dflash = dflash if isinstance(dflash, dict) else {}
    if dflash.get("available") is False:
        return ["DFlash's tree-sampling kernel is unavailable: SGLang will verify greedily "
                "(temperature sampling ignored)"]
    if dflash.get("available") is None:
        return [f"cannot tell whether DFlash's sampling kernel is available: {dflash.get('error')}"]
    return []
