"""Checks of the service's Python stack: CUDA/torch/Triton/SGLang, Triton's JIT toolchain, the venv.

The B300 service's first start failed after 120 s because Triton could not compile ``cuda_utils.c``
(no ``Python.h`` for the system Python; the venv had been copied from another machine). Each check
here turns one such failure into a second of preflight: pure judgments over the facts of
``doctor.stack.facts`` (and ``nvml`` for the driver and the GPUs).
"""

from __future__ import annotations

import shlex
from typing import Any

from packaging.version import Version

from doctor.core.registry import check
from doctor.core.result import Remediation, Result, Status
from doctor.facts.store import FactUnavailable
from doctor.stack import compat, kernels, libcuda
from doctor.stack.cuda_arch import best_match, cc_str
from doctor.stack.judging import (
    applicable_requirements,
    gpu_ccs,
    installed_dist,
    norm,
    parse_spec,
    parse_version,
    pip_install,
    probe_failed,
    service_python,
    stack_fact,
)
from doctor.stack.verdict import Verdict

COMPONENTS = ("torch", "triton", "sglang", "sglang_kernel", "flashinfer")
PIP_NAMES = {"torch": "torch", "triton": "triton", "sglang": "sglang", "sglang_kernel": "sglang-kernel",
             "flashinfer": "flashinfer-python"}


# -- shared helpers ------------------------------------------------------------------------------


# -- cuda.compat ---------------------------------------------------------------------------------

@check("cuda.compat", "Driver CUDA version vs the CUDA runtime torch was built with",
       needs=("nvml", "stack", "torch_info"), depends=("python.venv",), timeout=180)
def cuda_compat(ctx: Any) -> Result:
    """Compares the CUDA version the NVIDIA driver supports (NVML) with the CUDA runtime torch was built
    with: by default ``cuda`` of ``torch/version.py``, parsed from its syntax tree in the ``stack`` probe
    (what ``torch.version.cuda`` returns, without the seconds ``import torch`` costs); with --deep (or a
    recording without that file's reading) torch is imported in a child process, which also tells whether
    torch can use the GPUs at all (``torch.cuda.is_available()``: a runtime question only an import answers).

    A runtime newer than the driver fails at the first CUDA call ("CUDA driver version is insufficient").
    NVIDIA's rules (doctor/data/compat.toml): each toolkit release has a minimum driver (13.0 GA needs
    >= 580.65.06, 12.8 GA >= 570.26); within a major family, minor-version compatibility lets a newer
    runtime run on an older driver of the same family (13.x on >= 580, 12.x on >= 525) with a limited
    feature set (no JIT of newer PTX): warn. Fix by hand: install a driver at least as new as the table
    says, or a torch built for an older CUDA (e.g. the cu128 wheel).
    """
    try:
        nvml = ctx.fact("nvml")
    except FactUnavailable as exc:
        return Result.not_judged(f"no driver reading to compare with: {exc.reason}")
    if not isinstance(nvml, dict) or not nvml.get("available"):
        err = nvml.get("error") if isinstance(nvml, dict) else "no NVML fact"
        return Result.blocked(f"NVML/driver unavailable ({err}); gpu.driver judges that", "gpu.driver")
    info = None if ctx.deep else _torch_from_files(ctx)
    if info is None:
        info = ctx.fact("torch_info")
    if not isinstance(info, dict) or not info.get("ok"):
        return _torch_unusable(ctx, info if isinstance(info, dict) else {})
    runtime = info.get("cuda")
    if not runtime:
        return Result.failed(f"torch {info.get('version')} is a CPU-only build (torch.version.cuda is None)",
                             Remediation("Install the CUDA build the profile expects.",
                                         [pip_install(ctx, "torch", "torch")]),
                             torch=info.get("version"))
    driver = str(nvml.get("driver_version") or "")
    driver_cuda = compat.cuda_from_nvml(nvml.get("cuda_driver_version"))
    need = compat.min_driver(runtime)
    details = {"driver": driver, "driver_cuda": driver_cuda, "torch": info.get("version"), "torch_cuda": runtime,
               "min_driver": need}
    expect = ctx.expect("stack.cuda_runtime")
    note = ""
    if expect and (compat.version_tuple(str(expect)) or ())[:2] != (compat.version_tuple(runtime) or ())[:2]:
        note = f"; the profile expects CUDA {expect}"
        details["profile_cuda_runtime"] = expect
    rt = compat.version_tuple(runtime) or (0,)
    drv = compat.version_tuple(driver)
    dc = compat.version_tuple(driver_cuda)
    need_t = compat.version_tuple(need)
    fix = Remediation(
        f"Install NVIDIA driver >= {need or 'the one matching CUDA ' + runtime} (CUDA {runtime}), or a torch "
        f"built for CUDA {driver_cuda or 'your driver'}; on datacenter GPUs the cuda-compat package is a third way.",
        ["nvidia-smi", shlex.join([service_python(ctx), "-c", "import torch; print(torch.version.cuda)"])])
    # NVML's CUDA version is what the driver itself says it supports; the table is the fallback.
    if dc is not None:
        supported = rt[:2] <= dc[:2]
    elif drv is not None and need_t is not None:
        supported = drv >= need_t
    else:
        return Result.errored(f"cannot judge: NVML reported driver {driver or '?'} and no CUDA version, and CUDA "
                              f"{runtime} is not in the table", **details)
    gpus = [d for d in nvml.get("devices") or [] if isinstance(d, dict)]
    if gpus and info.get("cuda_available") is False:
        why = "; ".join(info.get("cuda_warnings") or []) or info.get("cuda_error") or "no reason given"
        return Result.failed(f"NVML sees {len(gpus)} GPU(s) but torch {info.get('version')} cannot use CUDA: {why}",
                             fix, **details)
    if supported:
        summary = f"driver {driver} (CUDA {driver_cuda or '?'}) runs torch's CUDA {runtime} runtime"
        if note:
            return Result.warned(summary + note, "torch's CUDA differs from the profile's; see stack.versions",
                                 **details)
        return Result.passed(summary, **details)
    family_min = compat.minor_compat_min_driver(runtime)
    fam_t = compat.version_tuple(family_min)
    if dc is not None and dc[0] == rt[0] and fam_t and drv and drv >= fam_t:
        return Result.warned(
            f"driver {driver} supports CUDA {driver_cuda} < torch's {runtime}: runs only under minor-version "
            f"compatibility (>= {family_min}), without JIT of newer PTX", fix, mode="minor-version-compat", **details)
    return Result.failed(f"driver {driver} supports CUDA {driver_cuda or '?'} but torch {info.get('version')} "
                         f"needs CUDA {runtime} (driver >= {need or '?'})", fix, **details)


def _torch_unusable(ctx: Any, info: dict[str, Any]) -> Result:
    if info.get("missing_module") == "torch":
        res = Result.failed(f"torch is not installed in {service_python(ctx)}",
                            Remediation("Install the torch the profile pins.", [pip_install(ctx, "torch", "torch")]))
        res.cause = "stack.versions"  # which names every package missing: said once
        return res
    return Result.failed(f"torch cannot be imported by {service_python(ctx)}: {info.get('error') or 'probe failed'}",
                         Remediation("Reinstall torch in the service's environment.",
                                     [pip_install(ctx, "torch", "torch")]), probe=info)


# -- torch.arch ----------------------------------------------------------------------------------

@check("torch.arch", "torch has kernels that run on each GPU's architecture", needs=("torch_info", "nvml"),
       depends=("python.venv",), timeout=300)
def torch_arch(ctx: Any) -> Result:
    """Matches the targets compiled into torch (``torch._C._cuda_getArchFlags()``, read in a child
    process) against every GPU's compute capability by CUDA's binary compatibility rules
    (doctor/stack/cuda_arch.py): an sm_XY cubin runs on sm_XZ with Z >= Y of the same major; arch-specific
    ``a`` targets run only on their exact GPU; PTX (compute_XY) is JIT-compiled for anything newer.

    torch 2.11.0+cu130 has sm_100 and no sm_103: B300 (10.3) runs its sm_100 cubins, which is fine.
    Without a compatible target torch fails with "no kernel image is available for execution on the
    device". By default the targets are read from ``torch/lib/libtorch_cuda.so``'s fat binary and
    ``torch/version.py`` (facts ``kernels`` and ``stack``: torch is not imported); arch-specific
    ``sm_XYa`` kernels count only where no general target runs. With --deep (or a recording without
    those facts) torch is imported in a child process and, with --deep, a small matmul runs on every
    GPU. Fix by hand: install a torch wheel whose CUDA build covers the GPU (cu128 or newer for Blackwell).
    """
    info = None if ctx.deep else _torch_from_binaries(ctx)
    if info is None:
        info = ctx.fact("torch_info")
    if not isinstance(info, dict) or not info.get("ok"):
        return _torch_unusable(ctx, info if isinstance(info, dict) else {})
    if not info.get("cuda"):
        return Result.failed(f"torch {info.get('version')} is a CPU-only build: no GPU kernels at all",
                             Remediation("Install the CUDA build of torch.", [pip_install(ctx, "torch", "torch")]),
                             torch=info.get("version"))
    flags = [str(f) for f in info.get("arch_flags") or []]
    if not flags:
        return Result.failed(f"torch {info.get('version')} reports no compiled CUDA targets", torch=info.get("version"))
    ccs, where, source = gpu_ccs(ctx)
    if not ccs:
        return Result.not_judged("no GPU to judge: NVML sees none and the profile names no compute_capability",
                              **source)
    general = [f for f in flags if not f.endswith("a")]  # arch-specific extras are not torch's kernel set
    per_cc = {cc_str(cc): best_match(general, cc) if best_match(general, cc).ok else best_match(flags, cc)
              for cc in ccs}
    details: dict[str, Any] = {"torch": info.get("version"), "arch_flags": flags, "gpus": where, **source,
                               "targets_from": info.get("targets_from", "torch._C._cuda_getArchFlags()"),
                               "match": {k: {"how": m.how, "target": m.target, "note": m.note}
                                         for k, m in per_cc.items()}}
    bad = {k: m for k, m in per_cc.items() if not m.ok}
    if bad:
        needs = []
        for cc in bad:
            arch = compat.arch_info(cc)
            if arch.get("min_cuda"):
                needs.append(f"{arch.get('name', cc)} ({cc}) needs a torch built with CUDA >= {arch['min_cuda']}")
        text = "Install a torch wheel built for this GPU's architecture" + (f": {'; '.join(needs)}" if needs else "")
        return Result.failed(
            f"torch {info.get('version')} (CUDA {info.get('cuda')}) has no kernels for {where}: "
            + "; ".join(m.note for m in bad.values()) + f" (has {' '.join(flags)})",
            Remediation(text + ".", [pip_install(ctx, "torch", "torch")]), **details)
    summary = f"torch {info.get('version')} on {where}: " + "; ".join(m.note for m in per_cc.values())
    if ctx.deep:
        deep = _judge_matmul(info, details)
        if deep is not None:
            return deep
        summary += "; matmul ran on every GPU"
    if source.get("source") == "profile":
        summary += f" (NVML unavailable: {source.get('nvml')})"
    if any(m.how == "ptx" for m in per_cc.values()):
        return Result.warned(summary, "Only PTX matches: every kernel is JIT-compiled at first use; install a torch "
                             "build with cubins for this GPU.", **details)
    return Result.passed(summary, **details)


def _torch_from_files(ctx: Any) -> dict[str, Any] | None:
    """torch's version and CUDA build from ``torch/version.py`` (the ``stack`` fact: parsed, not imported), shaped
    as the ``torch_info`` fact; None when the file was not read (a recording made before, a failed probe): then
    torch_info."""
    try:
        stack = ctx.fact("stack")
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


def _torch_from_binaries(ctx: Any) -> dict[str, Any] | None:
    """torch's version, CUDA and targets from its files (no import), shaped as the ``torch_info`` fact; None
    when those facts cannot be had (a recording made before they existed, a failed probe): then torch_info."""
    try:
        fact, stack = ctx.fact("kernels"), ctx.fact("stack")
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


def _judge_matmul(info: dict[str, Any], details: dict[str, Any]) -> Result | None:
    runs = info.get("matmul")
    if runs is None:
        details["deep"] = "no GPU visible to torch: matmul not run"
        return Result.failed(f"--deep: torch sees no CUDA device ({info.get('cuda_error') or 'device_count 0'})",
                             **details)
    details["matmul"] = runs
    failed = [r for r in runs if not r.get("ok")]
    if failed:
        first = failed[0]
        return Result.failed(f"--deep: matmul failed on GPU {first.get('index')}: "
                             f"{first.get('error') or 'wrong result, max abs error ' + str(first.get('max_abs_err'))}",
                             **details)
    return None


# -- stack.kernels, cuda.libcuda (judged in doctor/stack/) -------------------------------------------

def _result(v: Verdict) -> Result:
    rem = Remediation(v.fix, v.commands) if (v.fix or v.commands) else None
    status = {"pass": Status.PASS, "warn": Status.WARN, "fail": Status.FAIL, "skip": Status.SKIP}[v.status]
    res = Result(status, v.summary, v.details, rem)
    res.cause, res.unjudged = v.cause, v.unjudged and status is Status.SKIP
    return res


@check("stack.kernels", "GPU code (SASS/PTX) of every kernel package against every GPU; the libtorch ABI",
       needs=("kernels", "nvml", "stack"), depends=("python.venv",), timeout=120)
def stack_kernels(ctx: Any) -> Result:
    """Reads every installed package's GPU code from its files (``.nv_fatbin`` of each shared object,
    bare cubins; doctor/stack/fatbin.py, nothing imported) and judges it against every GPU's compute
    capability by CUDA's rules: ``sm_100`` SASS runs on 10.3, ``sm_100a`` does not, ``sm_100f`` runs on
    10.0 and 10.3, PTX JIT-compiles forward when the driver knows its ISA (doctor/stack/kernels.py).
    A required package (torch, sgl-kernel) with no code for a GPU fails ("no kernel image is available");
    kernels built for another GPU of the same generation only (flashinfer's sm_100a cubins on a B300) warn.
    It also resolves each kernel library's undefined torch symbols against the installed torch's
    libraries (a kernel built for another torch fails at import with "undefined symbol", after the
    weights began loading) and reads every installed package's Requires-Dist pins. Fix by hand: install
    the kernel builds made for the installed torch and GPU (the remediation names them).
    """
    fact = ctx.fact("kernels")
    if not isinstance(fact, dict) or not fact.get("ok"):
        return probe_failed(ctx, fact if isinstance(fact, dict) else {}, "read the installed packages' binaries")
    ccs, where, _source = gpu_ccs(ctx)
    nvml, stack = _optional(ctx, "nvml"), _optional(ctx, "stack")
    driver_cuda = compat.cuda_from_nvml(nvml.get("cuda_driver_version")) if isinstance(nvml, dict) else None
    markers = ((stack.get("python") or {}).get("markers") or None) if isinstance(stack, dict) else None
    return _result(kernels.judge(fact, ccs, where, driver_cuda, markers, service_python(ctx)))


def _optional(ctx: Any, name: str) -> Any:
    """A fact that only refines the judgement: None when it cannot be had."""
    try:
        return ctx.fact(name)
    except FactUnavailable:
        return None


@check("cuda.libcuda", "The libcuda.so.1 the service loads against the kernel module; forward compatibility",
       needs=("libcuda", "nvml"), depends=("python.venv",), timeout=60)
def cuda_libcuda(ctx: Any) -> Result:
    """Loads ``libcuda.so.1`` in a child of the service's interpreter, with the service's environment,
    as torch does, and reads which file the loader mapped (``/proc/self/maps``) and its version (its real
    file name), against the kernel module's (``/proc/driver/nvidia/version``); ``cuInit`` says what the
    driver itself thinks. A different version is error 803 (a container's loader cache or an
    LD_LIBRARY_PATH entry); a newer one is CUDA forward compatibility, which only data center GPUs
    support (804 elsewhere). The CUDA toolkit's link stub (``lib64/stubs``, cuInit 34) on the path fails,
    as does any cuInit error from the right library (no device nodes, nvidia-uvm missing). Fix by hand: the
    LD_LIBRARY_PATH value or ld.so.conf line the remediation names, then ``ldconfig``.
    """
    fact = ctx.fact("libcuda")
    if not isinstance(fact, dict) or not fact.get("ok"):
        return probe_failed(ctx, fact if isinstance(fact, dict) else {}, "load libcuda.so.1")
    nvml = _optional(ctx, "nvml")
    names = ([str(d.get("name")) for d in nvml.get("devices") or [] if isinstance(d, dict)]
             if isinstance(nvml, dict) and nvml.get("available") else None)
    return _result(libcuda.judge(fact, names))


# -- stack.versions ------------------------------------------------------------------------------

@check("stack.versions", "torch / triton / sglang / sglang-kernel / flashinfer against the supported matrix",
       needs=("stack",), depends=("python.venv",))
def stack_versions(ctx: Any) -> Result:
    """Reads the installed versions from the service interpreter's package metadata (nothing is
    imported) and compares them with the profile's [stack] pins and the supported matrix
    (doctor/data/compat.toml): torch pins its Triton (2.14.1 -> ~=3.8.0), SGLang 0.5.23 pins
    sglang-kernel 0.4.10 and flashinfer-python 0.7.2. Then, like ``pip check``, evaluates the
    requirements these packages declare on each other. A pin, the matrix's or a package's own, that the
    profile deliberately overrides (the installed version is the one the profile pins) is a warning, the
    same from either source; a package SGLang needs that is missing is named once. Mismatched kernels
    load and then crash or silently miscompute. Fix by hand: install the pinned versions (the remediation
    lists the exact pip command).
    """
    stack, err = stack_fact(ctx)
    if err:
        return err
    assert stack is not None
    rows: dict[str, Any] = {}
    problems: list[str] = []
    warnings: list[str] = []
    versions: dict[str, Version | None] = {}
    for comp in COMPONENTS:
        dist = installed_dist(stack, comp)
        want_text = ctx.expect(f"stack.{comp}")
        want = parse_spec(want_text)
        row: dict[str, Any] = {"installed": dist.get("version") if dist else None, "expected": want_text}
        rows[comp] = row
        if want_text and want is None:
            problems.append(f"the profile's stack.{comp} {want_text!r} is not a version specifier")
            continue
        if dist is None:
            versions[comp] = None
            if want is not None:
                problems.append(f"{PIP_NAMES[comp]} is not installed (profile: {want_text})")
            continue
        ver = parse_version(dist.get("version"))
        versions[comp] = ver
        if ver is None:
            problems.append(f"{dist.get('name')} has an invalid version {dist.get('version')!r}")
            continue
        if want is not None and not want.contains(ver, prereleases=True):
            problems.append(f"{dist.get('name')} {ver} does not match the profile's {want_text}")
            row["ok"] = False
        else:
            row["ok"] = True
    missing = _matrix(versions, problems, warnings, rows)
    unmet = _unmet_requirements(ctx, stack, set(missing))
    for item in unmet:
        (warnings if item["overridden_by_profile"] else problems).append(item["text"])
    for err in stack.get("metadata_errors") or []:
        problems.append(f"unreadable package metadata: {err}")
    dups = [d for d in stack.get("duplicates") or [] if norm(d.get("name", "")) in _stack_dist_names()]
    for d in dups:
        warnings.append(f"two copies of {d['name']} on sys.path ({d['shadowed_by']} imports, {d['version']} shadowed)")
    details = {"components": rows, "unmet": unmet, "duplicates": dups, "python": service_python(ctx),
               "metadata_errors": stack.get("metadata_errors") or [], "warnings": warnings}
    summary_versions = ", ".join(f"{PIP_NAMES[c]} {rows[c]['installed']}" for c in COMPONENTS if rows[c]["installed"])
    if problems:
        specs = [f"{PIP_NAMES[c]}{ctx.expect(f'stack.{c}')}" for c in COMPONENTS if ctx.expect(f"stack.{c}")]
        specs += [f"{PIP_NAMES[c]}=={pin}" for c, pin in missing.items()]
        text = "Install the versions the profile pins (they are tested together)"
        if missing:
            text += " and what the installed SGLang needs that the profile does not pin"
        return Result.failed("; ".join(problems), Remediation(
            text + ".", [shlex.join([service_python(ctx), "-m", "pip", "install", *specs])]), **details)
    if warnings:
        return Result.warned(f"{summary_versions}; " + "; ".join(warnings), **details)
    return Result.passed(summary_versions or "no stack package installed and none expected", **details)


def _stack_dist_names() -> set[str]:
    return {norm(n) for names in compat.distribution_names().values() for n in names}


def _matrix(versions: dict[str, Version | None], problems: list[str], warnings: list[str],
            rows: dict[str, Any]) -> dict[str, str]:
    """The supported matrix's pins (compat.toml) against the installed versions; a pin the profile deliberately
    overrides is a warning, as in ``_unmet_requirements``. Returns the components SGLang pins that are missing
    and the profile does not name, with SGLang's pin (named here once)."""

    def judged(comp: str, text: str) -> None:
        row = rows.get(comp) or {}
        if row.get("expected") and row.get("ok"):
            warnings.append(text + " (the profile pins it deliberately)")
        else:
            problems.append(text)

    missing: dict[str, str] = {}
    torch_v, triton_v, sglang_v = versions.get("torch"), versions.get("triton"), versions.get("sglang")
    if torch_v is not None and triton_v is not None:
        pinned = compat.triton_for_torch(str(torch_v))
        rows["torch"]["pins_triton"] = pinned
        spec = parse_spec(pinned if pinned and not pinned[0].isdigit() else f"=={pinned}")
        if pinned and spec is not None and not spec.contains(Version(triton_v.base_version), prereleases=True):
            judged("triton", f"torch {torch_v} pins triton {pinned}, installed {triton_v}")
    if sglang_v is not None:
        pins = compat.sglang_pins(str(sglang_v))
        rows["sglang"]["pins"] = pins
        for comp, pinned in pins.items():
            have = versions.get(comp)
            if have is not None and Version(pinned) != have:
                judged(comp, f"sglang {sglang_v} pins {PIP_NAMES.get(comp, comp)} {pinned}, installed {have}")
            elif have is None and not rows.get(comp, {}).get("expected"):  # else already reported as missing
                problems.append(f"sglang {sglang_v} needs {PIP_NAMES.get(comp, comp)} {pinned}, not installed")
                missing[comp] = pinned
    return missing


def _unmet_requirements(ctx: Any, stack: dict[str, Any], named_missing: set[str]) -> list[dict[str, Any]]:
    """Requirements among the stack's own packages that the installed versions do not meet (pip check);
    ``named_missing``: components already reported missing by the matrix."""
    dists = stack.get("distributions") or {}
    names = _stack_dist_names()
    by_dist = {norm(n): comp for comp, ns in compat.distribution_names().items() for n in ns}
    out = []
    for key in sorted(names):
        dist = dists.get(key)
        if not dist:
            continue
        for req in applicable_requirements(stack, dist.get("requires")):
            target = norm(req.name)
            if target not in names:
                continue
            have = dists.get(target)
            have_v = parse_version(have.get("version")) if have else None
            if have_v is not None and req.specifier.contains(have_v, prereleases=True):
                continue
            comp = by_dist.get(target, target)
            want = parse_spec(ctx.expect(f"stack.{comp}"))
            if have is None and (want is not None or comp in named_missing):
                continue  # reported once, as "not installed (profile: ...)" or "sglang X needs ..., not installed"
            overridden = have_v is not None and want is not None and want.contains(have_v, prereleases=True)
            text_out = (f"{dist['name']} {dist['version']} requires {req}, installed "
                        f"{have.get('version') if have else 'nothing'}")
            if overridden:
                text_out += " (the profile pins it deliberately)"
            out.append({"dist": dist["name"], "requirement": str(req), "installed": have_v and str(have_v),
                        "overridden_by_profile": overridden, "text": text_out})
    return out


# -- sglang.install ------------------------------------------------------------------------------

