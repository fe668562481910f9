"""Judging the libcuda.so.1 the service loads against the NVIDIA kernel module (facts: probe ``libcuda``).

The user-mode driver (libcuda) must match the kernel module exactly, with one exception: CUDA
forward compatibility (NVIDIA, "CUDA Compatibility": the ``cuda-compat-X-Y`` package), a *newer*
libcuda on an older kernel module, supported only on NVIDIA data center GPUs (and select NGC-ready
RTX server SKUs, Jetson). Everything else fails at the first CUDA call:

* 803 ``cudaErrorSystemDriverMismatch`` ("system has unsupported display driver / cuda driver
  combination"): a container's loader cache or an ``LD_LIBRARY_PATH`` entry resolves a libcuda of
  another driver than the kernel module;
* 804 ``cudaErrorCompatNotSupportedOnDevice`` ("forward compatibility was attempted on non supported
  HW"): the forward-compatibility libcuda on a GPU that cannot use it.

``judge`` returns the ``Findings`` (one finding, with its fix text and commands, and the details) that the
``cuda.libcuda`` check turns into its Result; the fix names the exact ``LD_LIBRARY_PATH`` value or
``ld.so.conf`` line to change and ``ldconfig``.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation, Severity
from doctor.stack import compat
from doctor.stack.service_probe import probe_failure

ERR_STUB = 34
ERR_MISMATCH = 803
ERR_COMPAT_UNSUPPORTED = 804


def cuinit_error(code: Any) -> str:
    """``cuInit``'s return code as CUDA names it, with what it means here (doctor/data/compat.toml)."""
    name, meaning = (compat.load().get("cuinit_errors", {}).get(str(code)) or [None, None])[:2]
    return f"{code} ({name}: {meaning})" if name else f"{code}"


def is_stub(path: str | None, cu_init: Any) -> bool:
    """The toolkit's link stub (``.../lib64/stubs/libcuda.so``): links programs, runs nothing. Found by cuInit's
    own answer (34) or, when cuInit was not run, by the directory it comes from."""
    if cu_init == ERR_STUB:
        return True
    return bool(path) and any(os.path.basename(d) == "stubs" for d in
                              (os.path.dirname(str(path)), os.path.dirname(os.path.realpath(str(path)))))


def datacenter_gpu(name: str) -> bool | None:
    """Whether a GPU (NVML name) is one forward compatibility supports; None when the table does not say."""
    table = compat.load().get("forward_compat", {})
    for pattern in table.get("supported", []):
        if re.search(pattern, name, re.IGNORECASE):
            return True
    for pattern in table.get("unsupported", []):
        if re.search(pattern, name, re.IGNORECASE):
            return False
    return None


def _where(fact: dict[str, Any], path: str) -> tuple[str, str, list[str]]:
    """How the loader found ``path`` and how to stop it: (origin, fix text, commands)."""
    directory = os.path.dirname(path)
    real_dir = os.path.dirname(os.path.realpath(path))
    entries = [d for d in str(fact.get("ld_library_path") or "").split(os.pathsep) if d]
    hits = [d for d in entries if os.path.normpath(d) in (os.path.normpath(directory), real_dir)]
    if hits:
        rest = [d for d in entries if d not in hits]
        value = os.pathsep.join(rest)
        cmd = f"export LD_LIBRARY_PATH={shlex.quote(value)}" if rest else "unset LD_LIBRARY_PATH"
        return (f"LD_LIBRARY_PATH entry {hits[0]}",
                f"Remove {hits[0]} from the service's LD_LIBRARY_PATH (the unit's Environment/EnvironmentFile, or "
                f"the profile's [server.env]) so the loader falls back to the driver's own libcuda.", [cmd])
    for entry in fact.get("ldconfig") or []:
        if entry.get("path") == path or entry.get("realpath") == os.path.realpath(path):
            conf = entry.get("conf")
            if conf:
                line = os.path.dirname(str(entry.get("path")))
                return (f"the loader cache, from {conf}",
                        f"Remove the line {line} from {conf} (or the file itself), then rebuild the loader cache.",
                        [f"sudo sed -i '\\#^{line}/*$#d' {shlex.quote(conf)}", "sudo ldconfig",
                         "ldconfig -p | grep libcuda.so.1"])
            return ("the loader cache", "Rebuild the loader cache so it names the driver's libcuda; if a directory "
                    "holding another libcuda is listed under /etc/ld.so.conf.d, remove it first.",
                    ["sudo ldconfig", "ldconfig -p | grep libcuda.so.1"])
    return (directory, f"Remove or replace {path}: it is not the driver's libcuda.", [f"ls -l {shlex.quote(path)}"])


def said(code: str, severity: str, summary: str, fix: str = "", commands: list[str] | None = None,
         details: dict[str, Any] | None = None) -> Findings:
    """One finding of cuda.libcuda with the details it read (a remediation only when there is something to do)."""
    out = Findings(**(details or {}))
    if severity == "pass":
        return out.info(code, summary)
    return out.add(Severity(severity), code, summary, Remediation(fix, list(commands or [])) if fix or commands
                   else None)


def judge(fact: dict[str, Any], gpu_names: list[str] | None) -> Findings:
    """The verdict on one ``libcuda`` fact; ``gpu_names`` from NVML, None when NVML could not be read."""
    kmd = fact.get("kernel_module") or {}
    res = fact.get("resolved") or {}
    kmd_v = kmd.get("version")
    lib_v = res.get("version")
    path = res.get("path") or res.get("realpath")
    cu_init = res.get("cu_init")
    details: dict[str, Any] = {"kernel_module": kmd_v, "libcuda": path, "libcuda_version": lib_v,
                               "cu_init": cu_init, "ld_library_path": fact.get("ld_library_path"),
                               "driver_cuda": (res.get("driver_get_version") or {}).get("cuda"),
                               "compat_dirs": fact.get("compat_dirs"), "gpus": gpu_names}
    matching = sorted({str(c.get("path")) for c in _candidates(fact) if kmd_v and c.get("version") == kmd_v})
    details["matching_candidates"] = matching
    if not res.get("loaded"):
        return _not_loaded(kmd, res, details)
    if is_stub(path, cu_init):
        return _stub(fact, str(path), cu_init, matching, details)
    if not lib_v:
        return _unversioned(fact, path, cu_init, kmd_v, details)
    origin, fix, commands = _where(fact, str(path))
    details["origin"] = origin
    if matching:
        fix += f" The libcuda matching the kernel module is {matching[0]}."
    if cu_init in (ERR_MISMATCH, ERR_COMPAT_UNSUPPORTED) or (kmd_v and lib_v != kmd_v):
        return _mismatch(kmd_v, lib_v, str(path), origin, cu_init, gpu_names, fix, commands, details)
    if not kmd_v:
        return said("cuda.libcuda.module_unread", "warn",
                    f"the service loads libcuda {lib_v} ({path}); the kernel module's version is unreadable "
                       f"({kmd.get('error') or kmd.get('text') or 'no version'})", details=details)
    return _matches(fact, kmd_v, lib_v, path, cu_init, details)


def _not_loaded(kmd: dict[str, Any], res: dict[str, Any], details: dict[str, Any]) -> Findings:
    """No libcuda.so.1 loaded: no driver at all is gpu.driver's to judge; a kernel module without its user-space
    library fails here."""
    kmd_v = kmd.get("version")
    if not kmd.get("present"):
        raise NotJudged.blocked("no NVIDIA driver here: no kernel module (/proc/driver/nvidia/version) and no "
                                "libcuda.so.1; gpu.driver judges the driver", "gpu.driver", **details)
    return said("cuda.libcuda.not_found", "fail",
                f"the NVIDIA kernel module {kmd_v or '?'} is loaded but the service's loader finds no "
                   f"libcuda.so.1: {res.get('error')}",
                   "Install the driver's user-space libraries of the same version (e.g. libnvidia-compute-"
                   f"{(kmd_v or 'BRANCH').split('.')[0]}), or make their directory known to the loader.",
                   ["ldconfig -p | grep libcuda", "cat /proc/driver/nvidia/version"], details)


def _stub(fact: dict[str, Any], path: str, cu_init: Any, matching: list[str], details: dict[str, Any]) -> Findings:
    """The CUDA toolkit's link stub loaded in place of the driver's libcuda: every CUDA call fails."""
    origin, fix, commands = _where(fact, path)
    details["origin"] = origin
    if matching:
        fix += f" The libcuda matching the kernel module is {matching[0]}."
    return said("cuda.libcuda.stub", "fail",
                f"the service loads the CUDA toolkit's link stub {path} (via {origin}), not the "
                   "driver's libcuda: every CUDA call fails"
                   + (f"; cuInit returned {cuinit_error(cu_init)}" if cu_init not in (None, 0) else ""),
                   fix + " The stub belongs on a build's link path (-L), never on a service's library path.",
                   commands, details)


def _unversioned(fact: dict[str, Any], path: Any, cu_init: Any, kmd_v: Any, details: dict[str, Any]) -> Findings:
    """A libcuda whose file name carries no version: a failure when cuInit refused it, else a warning (it cannot
    be compared with the kernel module)."""
    if cu_init not in (None, 0):
        origin, fix, commands = _where(fact, str(path))
        details["origin"] = origin
        return said("cuda.libcuda.unversioned_refused", "fail",
                f"the service loads {path or 'a libcuda.so.1'} (via {origin}), whose file name "
                       f"carries no driver version, and cuInit returned {cuinit_error(cu_init)}", fix, commands,
                       details)
    return said("cuda.libcuda.unversioned", "warn",
                f"the service loads {path or 'a libcuda.so.1'} whose file name carries no driver "
                   f"version; cannot compare it with the kernel module {kmd_v or '?'}", details=details)


def _matches(fact: dict[str, Any], kmd_v: str, lib_v: str, path: Any, cu_init: Any, details: dict[str, Any]
             ) -> Findings:
    """The library matches the kernel module: still a failure when cuInit refuses (the driver itself), a warning
    when other versions wait on the search path."""
    # Only what the loader could pick up: LD_LIBRARY_PATH and the loader cache. The forward-compatibility
    # directories ship in every CUDA container image (/usr/local/cuda/compat) and stay unused until named.
    others = sorted({f"{c.get('path')} ({c.get('version')})" for c in _candidates(fact, ("ld_library_path_candidates",
                                                                                         "ldconfig"))
                     if c.get("version") and c.get("version") != kmd_v})
    details["other_versions"] = others
    summary = f"libcuda.so.1 -> {path} ({lib_v}) matches the kernel module {kmd_v}"
    if cu_init not in (None, 0):
        return said("cuda.libcuda.cuinit", "fail",
                    summary + f", but cuInit returned {cuinit_error(cu_init)}",
                       "The library is the right one; the driver itself refuses: check the device nodes the service "
                       "sees, the nvidia-uvm module and the GPUs' state (gpu.driver, gpu.health).",
                       ["ls -l /dev/nvidia*", "lsmod | grep -E '^nvidia(_uvm)? '", "nvidia-smi"], details)
    if others:
        return said("cuda.libcuda.others_on_path", "warn",
                    summary + f"; other libcuda on the search path: {', '.join(others)}",
                       "Not loaded now, but a change of LD_LIBRARY_PATH or the loader cache would pick them up.",
                       details=details)
    return said("cuda.libcuda.matches", "pass",
                    summary, details=details)


def _candidates(fact: dict[str, Any], keys: tuple[str, ...] = ("ld_library_path_candidates", "ldconfig",
                                                                 "compat_dirs")) -> list[dict[str, Any]]:
    return [c for key in keys for c in fact.get(key) or [] if isinstance(c, dict)]


def _is_803(kmd_v: str | None, lib_v: str, cu_init: Any) -> bool:
    """Whether a libcuda of another version than the kernel module is a plain mismatch (error 803) rather than an
    attempt at forward compatibility: cuInit said 803, or the library is not newer and cuInit did not say 804."""
    newer = bool(kmd_v) and (compat.version_tuple(lib_v) or ()) > (compat.version_tuple(kmd_v) or ())
    return cu_init == ERR_MISMATCH or (not newer and cu_init != ERR_COMPAT_UNSUPPORTED)


def _compat_unknown_why(gpu_names: list[str] | None, unknown: list[str], cu_init: Any) -> str | None:
    """Why forward compatibility cannot be confirmed (no GPU names, a GPU the table lacks, no cuInit), or None."""
    if gpu_names is None:
        return "NVML could not name the GPUs"
    if unknown:
        return f"the table does not know {', '.join(sorted(set(unknown)))}"
    return "cuInit was not run" if cu_init is None else None


def _forward_compat(kmd_v: str | None, loaded: str, cu_init: Any, gpu_names: list[str] | None,
                    fix: str, commands: list[str], details: dict[str, Any]) -> Findings:
    """A newer libcuda than the kernel module (forward compatibility): it fails on GPUs that are not data center
    ones (error 804), is unconfirmed when the GPUs or cuInit are unknown, else runs."""
    unsupported = [n for n in gpu_names or [] if datacenter_gpu(n) is False]
    unknown = [n for n in gpu_names or [] if datacenter_gpu(n) is None]
    details["forward_compat"] = {"unsupported_gpus": unsupported, "unknown_gpus": unknown}
    if cu_init == ERR_COMPAT_UNSUPPORTED or unsupported:
        who = ", ".join(sorted(set(unsupported))) or "this GPU"
        return said("cuda.libcuda.compat_804", "fail",
                    f"error {ERR_COMPAT_UNSUPPORTED} (forward compatibility was attempted on non supported "
                    f"HW): the service loads the forward-compatibility libcuda {loaded} on "
                    f"kernel module {kmd_v or '?'}, and {who} cannot use it",
                    fix + " Forward compatibility works only on NVIDIA data center GPUs: upgrade the driver "
                    "instead.",
                    commands, details)
    summary = (f"forward compatibility: libcuda {loaded} on kernel module {kmd_v}"
               + (f", cuInit {cu_init}" if cu_init is not None else ""))
    why = _compat_unknown_why(gpu_names, unknown, cu_init)
    if why is not None:
        return said("cuda.libcuda.compat_unknown", "warn",
                    summary + f"; only data center GPUs support it and {why}",
                    "Check the GPU is in NVIDIA's forward-compatibility support list, or upgrade the driver.",
                    commands, details)
    return said("cuda.libcuda.compat", "pass",
                summary + f", supported on {', '.join(sorted(set(gpu_names or [])))}", details=details)


def _mismatch(kmd_v: str | None, lib_v: str, path: str, origin: str, cu_init: Any, gpu_names: list[str] | None,
              fix: str, commands: list[str], details: dict[str, Any]) -> Findings:
    """A libcuda whose version is not the kernel module's: a plain mismatch (803), or forward compatibility."""
    loaded = f"{lib_v} ({path}, via {origin})"
    if _is_803(kmd_v, lib_v, cu_init):
        return said("cuda.libcuda.mismatch_803", "fail",
                    f"error {ERR_MISMATCH} (system has unsupported display driver / cuda driver "
                    f"combination): the service loads libcuda {loaded} on kernel module "
                    f"{kmd_v or '?'}"
                    + (f"; cuInit returned {cu_init}" if cu_init not in (None, 0) else ""),
                    fix, commands, details)
    return _forward_compat(kmd_v, loaded, cu_init, gpu_names, fix, commands, details)


def judge_libcuda(fact: dict[str, Any], nvml: Any, python: str) -> Findings:
    """cuda.libcuda from its facts: ``nvml`` (None when it cannot be had) names the GPUs for forward compatibility."""
    if not fact.get("ok"):
        return probe_failure(python, fact, "load libcuda.so.1")
    names = ([str(d.get("name")) for d in nvml.get("devices") or [] if isinstance(d, dict)]
             if isinstance(nvml, dict) and nvml.get("available") else None)
    return judge(fact, names)
