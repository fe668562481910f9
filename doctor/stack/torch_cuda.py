"""torch against the driver and the GPUs: the CUDA runtime torch was built with against the driver's (cuda.compat),
and the targets compiled into torch against every GPU's compute capability (torch.arch). By default read from
torch's files (``torch/version.py`` in the ``stack`` fact, the fat binary of ``libtorch_cuda.so`` in ``kernels``):
torch is not imported; with --deep (or a recording without those readings) from ``torch_info``, an import."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from doctor.core.context import FactUnavailable, MalformedFact
from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.stack import compat, kernels
from doctor.stack.cuda_arch import Match, best_match, cc_str
from doctor.stack.distributions import pip_install

Reader = Callable[[str], Any]  # a fact by name (``ctx.fact``), read only when needed


def torch_from_files(read: Reader) -> dict[str, Any] | None:
    """torch's version and CUDA build from ``torch/version.py`` (the ``stack`` fact: parsed, not imported), shaped
    as the ``torch_info`` fact; None when the file was not read (a recording made before, a failed probe)."""
    try:
        stack = read("stack")
    except MalformedFact:
        raise
    except FactUnavailable:
        return None
    if not isinstance(stack, dict) or not stack.get("ok"):
        return None
    dists = stack.get("distributions") if isinstance(stack.get("distributions"), dict) else {}
    torch = stack.get("torch") if isinstance(stack.get("torch"), dict) else {}
    version_py = torch.get("version_py") if isinstance(torch.get("version_py"), dict) else {}
    if "torch" not in dists and not torch:
        return {"ok": False, "missing_module": "torch", "error": "torch is not installed"}
    if "cuda" not in version_py:  # unread: whether it is a CUDA build is unknown, not "no"
        return None
    cuda = version_py.get("cuda")
    return {"ok": True, "version": version_py.get("__version__") or (dists.get("torch") or {}).get("version"),
            "cuda": cuda if isinstance(cuda, str) and cuda else None, "from": "torch/version.py"}


def torch_from_binaries(read: Reader) -> dict[str, Any] | None:
    """torch's version, CUDA and targets from its files (no import), shaped as the ``torch_info`` fact; None
    when those facts cannot be had (a recording made before they existed, a failed probe)."""
    try:
        fact, stack = read("kernels"), read("stack")
    except MalformedFact:
        raise
    except FactUnavailable:
        return None
    if not isinstance(fact, dict) or not fact.get("ok") or not isinstance(stack, dict) or not stack.get("ok"):
        return None
    if "torch" not in (fact.get("distributions") or {}):
        return {"ok": False, "missing_module": "torch", "error": "torch is not installed"}
    version_py = (stack.get("torch") or {}).get("version_py") or {}
    if "cuda" not in version_py:  # torch/version.py unread: whether it is a CUDA build is unknown, not "no"
        return None
    targets, source = kernels.torch_targets(fact)
    return {"ok": True, "version": version_py.get("__version__") or fact["distributions"]["torch"].get("version"),
            "cuda": version_py.get("cuda"), "arch_flags": targets,
            "targets_from": f"{source} (fat binary)" if source else "no torch CUDA library"}


def torch_reading(read: Reader, deep: bool, from_files: Callable[[Reader], dict[str, Any] | None]) -> dict[str, Any]:
    """What torch is: from its files unless --deep, else (or when the files were not read) its import."""
    info = None if deep else from_files(read)
    if info is None:
        info = read("torch_info")
    return info if isinstance(info, dict) else {}


def torch_unusable(settings: Settings, info: dict[str, Any]) -> Findings:
    if info.get("missing_module") == "torch":
        found = Findings().fail("stack.torch.missing", f"torch is not installed in {settings.python}",
                                Remediation("Install the torch the profile pins.",
                                            [pip_install(settings, "torch", "torch")]))
        found.cause = "stack.versions"  # which names every package missing: said once
        return found
    return Findings(probe=info).fail(
        "stack.torch.unimportable", f"torch cannot be imported by {settings.python}: "
        f"{info.get('error') or 'probe failed'}",
        Remediation("Reinstall torch in the service's environment.", [pip_install(settings, "torch", "torch")]))


# -- cuda.compat --------------------------------------------------------------------------------------------

def driver_reading(read: Reader) -> dict[str, Any]:
    """The nvml fact when the driver answered; else why there is nothing to compare with."""
    try:
        nvml = read("nvml")
    except MalformedFact:
        raise
    except FactUnavailable as exc:
        raise NotJudged.missing(f"no driver reading to compare with: {exc.reason}") from None
    if not isinstance(nvml, dict) or not nvml.get("available"):
        err = nvml.get("error") if isinstance(nvml, dict) else "no NVML fact"
        raise NotJudged.blocked(f"NVML/driver unavailable ({err}); gpu.driver judges that", "gpu.driver")
    return nvml


def _profile_cuda_note(settings: Settings, runtime: str, out: Findings) -> str:
    """``; the profile expects CUDA X`` when torch's CUDA major.minor is not the profile's (recorded in the
    details too): the pair still runs, but it is not the stack the profile was measured with."""
    expect = settings.stack.cuda_runtime
    if expect and (compat.version_tuple(str(expect)) or ())[:2] != (compat.version_tuple(runtime) or ())[:2]:
        out.details["profile_cuda_runtime"] = expect
        return f"; the profile expects CUDA {expect}"
    return ""


def _driver_runs(runtime: str, driver: str, driver_cuda: str | None, need: str | None, out: Findings) -> bool:
    """Whether the driver runs torch's CUDA runtime: NVML's CUDA version is what the driver itself says it
    supports; the table's minimum driver is the fallback; with neither it cannot be judged (``NotJudged``)."""
    rt = compat.version_tuple(runtime) or (0,)
    drv = compat.version_tuple(driver)
    dc = compat.version_tuple(driver_cuda)
    need_t = compat.version_tuple(need)
    if dc is not None:
        return rt[:2] <= dc[:2]
    if drv is not None and need_t is not None:
        return drv >= need_t
    raise NotJudged.failing(f"cannot judge: NVML reported driver {driver or '?'} and no CUDA version, and CUDA "
                            f"{runtime} is not in the table", **out.details)


def _torch_blind(nvml: dict[str, Any], info: dict[str, Any]) -> str | None:
    """Why torch cannot use CUDA while NVML sees GPUs (the finding's text), or None when that is not so."""
    gpus = [d for d in nvml.get("devices") or [] if isinstance(d, dict)]
    if gpus and info.get("cuda_available") is False:
        why = "; ".join(info.get("cuda_warnings") or []) or info.get("cuda_error") or "no reason given"
        return f"NVML sees {len(gpus)} GPU(s) but torch {info.get('version')} cannot use CUDA: {why}"
    return None


def judge_compat(read: Reader, settings: Settings) -> Findings:
    """Driver CUDA version (NVML) against the CUDA runtime torch was built with (doctor/data/compat.toml)."""
    nvml = driver_reading(read)
    info = torch_reading(read, settings.deep, torch_from_files)
    if not info.get("ok"):
        return torch_unusable(settings, info)
    runtime = info.get("cuda")
    if not runtime:
        return Findings(torch=info.get("version")).fail(
            "cuda.compat.cpu_torch", f"torch {info.get('version')} is a CPU-only build (torch.version.cuda is None)",
            Remediation("Install the CUDA build the profile expects.", [pip_install(settings, "torch", "torch")]))
    driver = str(nvml.get("driver_version") or "")
    driver_cuda = compat.cuda_from_nvml(nvml.get("cuda_driver_version"))
    need = compat.min_driver(runtime)
    out = Findings(driver=driver, driver_cuda=driver_cuda, torch=info.get("version"), torch_cuda=runtime,
                   min_driver=need)
    note = _profile_cuda_note(settings, runtime, out)
    fix = Remediation(
        f"Install NVIDIA driver >= {need or 'the one matching CUDA ' + runtime} (CUDA {runtime}), or a torch "
        f"built for CUDA {driver_cuda or 'your driver'}; on datacenter GPUs the cuda-compat package is a third way.",
        ["nvidia-smi", shlex.join([settings.python, "-c", "import torch; print(torch.version.cuda)"])])
    supported = _driver_runs(runtime, driver, driver_cuda, need, out)
    blind = _torch_blind(nvml, info)
    if blind:
        return out.fail("cuda.compat.no_cuda", blind, fix)
    if supported:
        summary = f"driver {driver} (CUDA {driver_cuda or '?'}) runs torch's CUDA {runtime} runtime"
        if note:
            return out.warn("cuda.compat.other_cuda", summary + note,
                            "torch's CUDA differs from the profile's; see stack.versions")
        return out.info("cuda.compat.runs", summary)
    return _unsupported(out, info, runtime, driver, driver_cuda, fix)


def _unsupported(out: Findings, info: dict[str, Any], runtime: str, driver: str, driver_cuda: str | None,
                 fix: Remediation) -> Findings:
    """A driver older than torch's CUDA runtime: it still runs under minor-version compatibility when the driver
    is of the runtime's major and at least the family's minimum (a warning: no JIT of newer PTX), else it fails."""
    rt = compat.version_tuple(runtime) or (0,)
    drv = compat.version_tuple(driver)
    dc = compat.version_tuple(driver_cuda)
    family_min = compat.minor_compat_min_driver(runtime)
    fam_t = compat.version_tuple(family_min)
    if dc is not None and dc[0] == rt[0] and fam_t and drv and drv >= fam_t:
        out.details["mode"] = "minor-version-compat"
        return out.warn("cuda.compat.minor_version", f"driver {driver} supports CUDA {driver_cuda} < torch's "
                        f"{runtime}: runs only under minor-version compatibility (>= {family_min}), without JIT of "
                        "newer PTX", fix)
    return out.fail("cuda.compat.driver_too_old", f"driver {driver} supports CUDA {driver_cuda or '?'} but torch "
                    f"{info.get('version')} needs CUDA {runtime} (driver >= {out.details.get('min_driver') or '?'})",
                    fix)


# -- torch.arch ---------------------------------------------------------------------------------------------

def matmul_failure(info: dict[str, Any], out: Findings) -> Findings | None:
    """--deep: the matmul torch ran on every GPU, or the finding that it did not."""
    runs = info.get("matmul")
    if runs is None:
        out.details["deep"] = "no GPU visible to torch: matmul not run"
        return out.fail("torch.arch.no_device", f"--deep: torch sees no CUDA device "
                        f"({info.get('cuda_error') or 'device_count 0'})")
    out.details["matmul"] = runs
    failed = [r for r in runs if not r.get("ok")]
    if failed:
        first = failed[0]
        return out.fail("torch.arch.matmul", f"--deep: matmul failed on GPU {first.get('index')}: "
                        f"{first.get('error') or 'wrong result, max abs error ' + str(first.get('max_abs_err'))}")
    return None


def _no_arch_to_judge(info: dict[str, Any], settings: Settings) -> Findings | None:
    """A torch with nothing to match against a GPU: a CPU-only build, or one that reports no compiled target."""
    if not info.get("cuda"):
        return Findings(torch=info.get("version")).fail(
            "torch.arch.cpu_torch", f"torch {info.get('version')} is a CPU-only build: no GPU kernels at all",
            Remediation("Install the CUDA build of torch.", [pip_install(settings, "torch", "torch")]))
    if not info.get("arch_flags"):
        return Findings(torch=info.get("version")).fail("torch.arch.no_targets", f"torch {info.get('version')} "
                                                        "reports no compiled CUDA targets")
    return None


def _arch_match(flags: list[str], cc: tuple[int, int]) -> Match:
    """The best of torch's targets for one GPU, its general targets first: the arch-specific extras (``sm_90a``)
    are not torch's kernel set, only a fallback."""
    general = [f for f in flags if not f.endswith("a")]
    match = best_match(general, cc)
    return match if match.ok else best_match(flags, cc)


def _no_kernels(out: Findings, info: dict[str, Any], bad: dict[str, Match], where: str, flags: list[str],
                settings: Settings) -> Findings:
    """No usable target for some GPU: the fix names the CUDA each architecture needs a torch built with."""
    needs = []
    for cc in bad:
        arch = compat.arch_info(cc)
        if arch.get("min_cuda"):
            needs.append(f"{arch.get('name', cc)} ({cc}) needs a torch built with CUDA >= {arch['min_cuda']}")
    text = "Install a torch wheel built for this GPU's architecture" + (f": {'; '.join(needs)}" if needs else "")
    notes = "; ".join(m.note for m in bad.values())
    return out.fail("torch.arch.no_kernels", f"torch {info.get('version')} (CUDA {info.get('cuda')}) has no "
                    f"kernels for {where}: {notes} (has {' '.join(flags)})",
                    Remediation(text + ".", [pip_install(settings, "torch", "torch")]))


def judge_arch(read: Reader, judged: Callable[[], tuple[list[tuple[int, int]], str, dict[str, Any]]],
               settings: Settings) -> Findings:
    """torch's compiled targets against every GPU by CUDA's binary compatibility (doctor/stack/cuda_arch.py)."""
    info = torch_reading(read, settings.deep, torch_from_binaries)
    if not info.get("ok"):
        return torch_unusable(settings, info)
    early = _no_arch_to_judge(info, settings)
    if early is not None:
        return early
    flags = [str(f) for f in info.get("arch_flags") or []]
    ccs, where, source = judged()
    if not ccs:
        raise NotJudged.missing("no GPU to judge: NVML sees none and the profile names no compute_capability",
                                **source)
    per_cc = {cc_str(cc): _arch_match(flags, cc) for cc in ccs}
    out = Findings(torch=info.get("version"), arch_flags=flags, gpus=where, **source,
                   targets_from=info.get("targets_from", "torch._C._cuda_getArchFlags()"),
                   match={k: {"how": m.how, "target": m.target, "note": m.note} for k, m in per_cc.items()})
    bad = {k: m for k, m in per_cc.items() if not m.ok}
    if bad:
        return _no_kernels(out, info, bad, where, flags, settings)
    return _kernels_found(out, info, per_cc, where, source, settings)


def _kernels_found(out: Findings, info: dict[str, Any], per_cc: dict[str, Match], where: str,
                   source: dict[str, Any], settings: Settings) -> Findings:
    """Every GPU has a target: with --deep the matmul must also have run everywhere; a PTX-only match warns (every
    kernel JIT-compiled at first use); GPUs taken from the profile are said to be so."""
    summary = f"torch {info.get('version')} on {where}: " + "; ".join(m.note for m in per_cc.values())
    if settings.deep:
        failed = matmul_failure(info, out)
        if failed is not None:
            return failed
        summary += "; matmul ran on every GPU"
    if source.get("source") == "profile":
        summary += f" (NVML unavailable: {source.get('nvml')})"
    if any(m.how == "ptx" for m in per_cc.values()):
        return out.warn("torch.arch.ptx_only", summary, "Only PTX matches: every kernel is JIT-compiled at first use; "
                        "install a torch build with cubins for this GPU.")
    return out.info("torch.arch.runs", summary)
