"""The fact ``nvml``: what the NVIDIA driver says about the GPUs the service will see.

Read through nvidia-ml-py (``pynvml``), imported only inside the collector so that the doctor
starts without it. The collector is isolated: NVML calls can hang in the driver (a GPU falling
off the bus), so it runs in a child process that the fact layer kills at its deadline.

Every NVML error is recorded as data, never raised: a failed ``nvmlInit`` makes
``available: false`` with the reason; a call that fails for one GPU is recorded under that GPU's
``errors`` by field name (``"NotSupported"``, ``"NoPermission"``...); a lost GPU (``GpuIsLost``)
is marked ``lost`` and not read further. Checks (``checks/gpu.py``) judge.

Lessons from real hosts (``../shared/reference/h200x2-nvml.json``, 2x H200 through NVSwitch):

- links past the last one answer ``InvalidArgument`` (not ``NotSupported``): that ends the scan;
- the remote PCI id of every link is ``FFFFFFFF:FF:FF.0`` when the far end is an NVSwitch;
- the topology common ancestor says 30 (host bridge) for an NV18 pair: it describes the PCIe
  path only, so NVLink is judged by ``nvmlDeviceGetP2PStatus(.., NVLINK)`` and link states;
- pynvml's ``NVML_P2P_CAPS_INDEX_READ`` is the tuple ``(0,)`` (a stray comma), which ctypes
  cannot convert: plain ints are passed here;
- ``nvmlDeviceGetGpuFabricInfo`` needs a struct argument: ``nvmlDeviceGetGpuFabricInfoV`` with a
  versioned struct is tried first, then the old call.
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from collections.abc import Callable
from typing import Any

from doctor.core.fileio import open_regular
from doctor.core.registry import collector
from doctor.facts.shape import NUM, mapping, opt
from doctor.gpu.nvml_fact import NvmlFact

# -- NVML constants, as ints (never pynvml's, see the module docstring) -------------------------

NVML_ERRORS: dict[int, str] = {
    1: "Uninitialized", 2: "InvalidArgument", 3: "NotSupported", 4: "NoPermission",
    5: "AlreadyInitialized", 6: "NotFound", 7: "InsufficientSize", 8: "InsufficientPower",
    9: "DriverNotLoaded", 10: "Timeout", 11: "IrqIssue", 12: "LibraryNotFound", 13: "FunctionNotFound",
    14: "CorruptedInforom", 15: "GpuIsLost", 16: "ResetRequired", 17: "OperatingSystem",
    18: "LibRmVersionMismatch", 19: "InUse", 20: "Memory", 21: "NoData", 22: "VgpuEccNotSupported",
    23: "InsufficientResources", 24: "FreqNotSupported", 25: "ArgumentVersionMismatch",
    26: "Deprecated", 27: "NotReady", 28: "GpuNotFound", 29: "InvalidState", 999: "Unknown",
}
ERR_INVALID_ARGUMENT = 2
ERR_NOT_SUPPORTED = 3
ERR_FUNCTION_NOT_FOUND = 13
ERR_GPU_IS_LOST = 15
ERR_ARGUMENT_VERSION_MISMATCH = 25

# Why nvmlInit failed, in words a operator can act on.
INIT_ERROR_HINTS: dict[str, str] = {
    "LibraryNotFound": "libnvidia-ml.so.1 was not found: the NVIDIA driver is not installed (or not mounted "
                       "into this container)",
    "DriverNotLoaded": "the NVIDIA kernel module is not loaded (driver installed but not running)",
    "NoPermission": "not allowed to open the NVIDIA device files (/dev/nvidia*): run as a user in the "
                    "video group or as root",
    "LibRmVersionMismatch": "the NVML library and the loaded kernel module have different versions: the "
                            "driver was upgraded without a reboot (or module reload)",
    "Timeout": "the driver did not answer in time (a GPU may be hung)",
    "IrqIssue": "the kernel module reports an interrupt problem with a GPU",
    "GpuIsLost": "a GPU has fallen off the bus (GpuIsLost)",
    "Unknown": "NVML returned an unknown error",
}

P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}
P2P_STATUS = {0: "ok", 1: "chipset_not_supported", 2: "gpu_not_supported", 3: "ioh_topology_not_supported",
              4: "disabled_by_regkey", 5: "not_supported", 6: "unknown"}
NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
NVLINK_DEVICE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch", 255: "unknown"}
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
FABRIC_HEALTH_SUMMARY = {0: "not_supported", 1: "healthy", 2: "unhealthy", 3: "limited_capacity"}
TOPOLOGY_LEVELS = {0: "internal", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS in current headers; the scan stops at InvalidArgument anyway
NO_REMOTE_PCI = "FFFFFFFF:FF:FF.0"  # what a link to an NVSwitch reports as its far end
MEMORY_ERROR_UNCORRECTED = 1
VOLATILE_ECC, AGGREGATE_ECC = 0, 1
MAX_FDS_SCANNED = 4096


class GpuLost(Exception):
    """Raised inside the reader when a GPU answers GpuIsLost: stop reading that GPU."""


def error_name(exc: BaseException) -> str:
    """``NotSupported`` for an NVML error, ``TypeError: ...`` for anything else."""
    code = getattr(exc, "value", None)
    if isinstance(code, int) and type(exc).__name__.startswith("NVMLError"):
        return NVML_ERRORS.get(code, f"NVMLError({code})")
    return f"{type(exc).__name__}: {exc}"


def _code(exc: BaseException) -> int | None:
    code = getattr(exc, "value", None)
    return code if isinstance(code, int) and type(exc).__name__.startswith("NVMLError") else None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Reader:
    """Calls NVML, counting calls and recording each failure under a field name.

    ``get(errors, field, fn, *args)`` returns the value or ``None``; the error goes to
    ``errors[field]``. A ``GpuIsLost`` answer raises ``GpuLost`` so the caller stops reading
    that GPU (every further call would fail the same way, slowly).
    """

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.calls = 0

    def get(self, errors: dict[str, str], field: str, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.nv, fn_name, None)
        if fn is None:
            errors[field] = f"FunctionNotFound: this nvidia-ml-py has no {fn_name}"
            return None
        self.calls += 1
        try:
            return fn(*args)
        except Exception as exc:  # NVMLError and ctypes errors alike become data
            errors[field] = error_name(exc)
            if _code(exc) == ERR_GPU_IS_LOST:
                raise GpuLost() from None
            return None


# -- CUDA_VISIBLE_DEVICES ------------------------------------------------------------------------

def resolve_visible(value: str | None, uuids: list[str], mig_parent: Callable[[str], int | None] | None = None,
                    order: str | None = None) -> dict[str, Any]:
    """Which NVML indices the service will see, in CUDA order, as CUDA reads the variable.

    Unset: every GPU. Empty: none. Otherwise comma-separated entries, each an index, a GPU UUID
    (``GPU-...``, a unique prefix is enough) or a MIG device (``MIG-...``); as CUDA does, the first
    entry that is invalid (unknown, ambiguous, out of range, repeated) hides it and every later one.
    ``mig_parent`` maps a MIG UUID to its parent GPU's NVML index (None if unknown).
    """
    out: dict[str, Any] = {"cuda_visible_devices": value, "cuda_device_order": order, "indices": [],
                           "entries": [], "ignored": [], "problems": [], "mig_entries": []}
    if value is None:
        out["indices"] = list(range(len(uuids)))
        return out
    tokens = [t.strip() for t in value.split(",")] if value.strip() else []
    for pos, token in enumerate(tokens):
        index, why = _resolve_token(token, uuids, mig_parent)
        if index is not None and index in out["indices"]:
            index, why = None, f"GPU {index} is listed twice"
        if index is None:
            out["problems"].append(f"CUDA_VISIBLE_DEVICES entry {token!r}: {why}; CUDA ignores it and every "
                                   f"entry after it")
            out["ignored"] = tokens[pos:]
            break
        out["indices"].append(index)
        out["entries"].append(token)
        if token.upper().startswith("MIG-"):
            out["mig_entries"].append(token)
    return out


def _resolve_token(token: str, uuids: list[str], mig_parent: Callable[[str], int | None] | None
                   ) -> tuple[int | None, str]:
    if not token:
        return None, "empty entry"
    if re.fullmatch(r"[+-]?[0-9]+", token):  # ASCII digits only: "¹".isdigit() is True, int("¹") fails
        idx = int(token)
        if 0 <= idx < len(uuids):
            return idx, ""
        return None, f"no GPU with index {idx} ({len(uuids)} GPUs)"
    if token.upper().startswith("GPU-"):
        matches = [i for i, u in enumerate(uuids) if u.lower().startswith(token.lower())]
        if len(matches) == 1:
            return matches[0], ""
        return None, "no GPU has this UUID" if not matches else f"ambiguous UUID prefix ({len(matches)} GPUs)"
    if token.upper().startswith("MIG-GPU-") and "/" in token:  # legacy MIG-GPU-<uuid>/<gi>/<ci>
        gpu = token[len("MIG-"):].split("/", 1)[0].lower()
        matches = [i for i, u in enumerate(uuids) if u.lower() == gpu]
        return (matches[0], "") if matches else (None, "no GPU has the UUID of this MIG device")
    if token.upper().startswith("MIG-"):
        parent = mig_parent(token) if mig_parent else None
        if parent is None:
            return None, "no MIG device has this UUID"
        return parent, ""
    return None, "neither an index, a GPU- UUID nor a MIG- UUID"


# -- /proc ---------------------------------------------------------------------------------------

def describe_process(pid: int, proc_root: str = "/proc") -> dict[str, Any]:
    """Command line, owner, start time and whether it holds /dev/nvidia*, from /proc.

    NVML reports PIDs of the host's PID namespace; inside a container the same number can be
    another process or none. ``holds_nvidia_device`` (an open /dev/nvidia* file descriptor) is the
    evidence a fixer needs before it may stop a PID; None when the fds cannot be read.
    """
    base = os.path.join(proc_root, str(pid))
    info: dict[str, Any] = {"in_namespace": os.path.isdir(base), "cmdline": None, "uid": None,
                            "start_ticks": None, "holds_nvidia_device": None}
    if not info["in_namespace"]:
        return info
    try:
        with open_regular(os.path.join(base, "cmdline")) as fh:
            raw = fh.read(65536)
        info["cmdline"] = " ".join(p.decode("utf-8", "replace") for p in raw.split(b"\0") if p) or None
    except OSError:
        pass
    try:
        with open_regular(os.path.join(base, "status")) as fh:
            for line in fh.read(1 << 16).decode("utf-8", "replace").splitlines():
                if line.startswith("Uid:"):
                    info["uid"] = int(line.split()[1])
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open_regular(os.path.join(base, "stat")) as fh:
            info["start_ticks"] = int(fh.read(1 << 16).decode("utf-8", "replace").rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        pass
    try:
        fds = os.listdir(os.path.join(base, "fd"))
        holds = False
        for name in fds[:MAX_FDS_SCANNED]:
            try:
                if os.readlink(os.path.join(base, "fd", name)).startswith("/dev/nvidia"):
                    holds = True
                    break
            except OSError:
                continue
        info["holds_nvidia_device"] = holds
    except OSError:
        pass
    return info


def kernel_module_version(path: str = "/proc/driver/nvidia/version") -> str | None:
    """The loaded kernel module's version (independent of NVML), e.g. ``580.159.04``."""
    try:
        with open_regular(path) as fh:
            first = fh.read(4096).decode("utf-8", "replace").split("\n", 1)[0]
    except OSError:
        return None
    for word in first.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return word
    return None


# -- per GPU ---------------------------------------------------------------------------------------

def read_device(r: Reader, handle: Any, index: int, proc_root: str = "/proc") -> dict[str, Any]:
    """Everything the checks judge about one GPU; failures go to ``errors``."""
    errors: dict[str, str] = {}
    dev: dict[str, Any] = {"index": index, "lost": False, "errors": errors}
    try:
        _read_identity(r, handle, dev, errors)
        _read_health(r, handle, dev, errors)
        dev["processes"] = _read_processes(r, handle, errors, proc_root)
        dev["nvlink"] = _read_nvlinks(r, handle)
        dev["fabric"] = read_fabric(r, handle)
    except GpuLost:
        dev["lost"] = True
    for key in ("name", "uuid", "pci_bus_id", "compute_capability", "memory", "processes", "nvlink", "fabric"):
        dev.setdefault(key, None)
    return dev


def _read_identity(r: Reader, h: Any, dev: dict[str, Any], errors: dict[str, str]) -> None:
    name = r.get(errors, "name", "nvmlDeviceGetName", h)
    dev["name"] = _text(name) if name is not None else None
    uuid = r.get(errors, "uuid", "nvmlDeviceGetUUID", h)
    dev["uuid"] = _text(uuid) if uuid is not None else None
    pci = r.get(errors, "pci", "nvmlDeviceGetPciInfo", h)
    dev["pci_bus_id"] = _text(pci.busId) if pci is not None else None
    cc = r.get(errors, "compute_capability", "nvmlDeviceGetCudaComputeCapability", h)
    dev["compute_capability"] = [int(cc[0]), int(cc[1])] if cc is not None else None
    mem = r.get(errors, "memory", "nvmlDeviceGetMemoryInfo", h)
    dev["memory"] = ({"total": int(mem.total), "free": int(mem.free), "used": int(mem.used)}
                     if mem is not None else None)
    pcie: dict[str, Any] = {}
    for key, fn in (("gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"), ("width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
                    ("gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
                    ("width_current", "nvmlDeviceGetCurrPcieLinkWidth")):
        value = r.get(errors, f"pcie.{key}", fn, h)
        pcie[key] = int(value) if value is not None else None
    dev["pcie"] = pcie


def _read_health(r: Reader, h: Any, dev: dict[str, Any], errors: dict[str, str]) -> None:
    dev["persistence_mode"] = r.get(errors, "persistence_mode", "nvmlDeviceGetPersistenceMode", h)
    mig = r.get(errors, "mig_mode", "nvmlDeviceGetMigMode", h)
    dev["mig_mode"] = {"current": int(mig[0]), "pending": int(mig[1])} if mig is not None else None
    ecc = r.get(errors, "ecc_mode", "nvmlDeviceGetEccMode", h)
    dev["ecc_mode"] = {"current": int(ecc[0]), "pending": int(ecc[1])} if ecc is not None else None
    dev["ecc_uncorrected"] = {
        "volatile": r.get(errors, "ecc_uncorrected.volatile", "nvmlDeviceGetTotalEccErrors", h,
                          MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC),
        "aggregate": r.get(errors, "ecc_uncorrected.aggregate", "nvmlDeviceGetTotalEccErrors", h,
                           MEMORY_ERROR_UNCORRECTED, AGGREGATE_ECC),
    }
    remap = r.get(errors, "row_remap", "nvmlDeviceGetRemappedRows", h)
    dev["row_remap"] = ({"correctable": int(remap[0]), "uncorrectable": int(remap[1]), "pending": bool(remap[2]),
                         "failure": bool(remap[3])} if remap is not None else None)
    pending = r.get(errors, "retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", h)
    dev["retired_pages_pending"] = bool(pending) if pending is not None else None
    fn = ("nvmlDeviceGetCurrentClocksEventReasons" if hasattr(r.nv, "nvmlDeviceGetCurrentClocksEventReasons")
          else "nvmlDeviceGetCurrentClocksThrottleReasons")
    mask = r.get(errors, "clock_event_reasons", fn, h)
    dev["clock_event_reasons"] = int(mask) if mask is not None else None
    dev["clock_event_names"] = ([n for bit, n in CLOCK_EVENT_REASONS.items() if int(mask) & bit]
                                if mask is not None else None)
    temp = r.get(errors, "temperature_c", "nvmlDeviceGetTemperature", h, 0)
    dev["temperature_c"] = int(temp) if temp is not None else None


def _read_processes(r: Reader, h: Any, errors: dict[str, str], proc_root: str) -> list[dict[str, Any]] | None:
    found: dict[int, dict[str, Any]] = {}
    ok = False
    for kind, fn in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                     ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
        procs = r.get(errors, f"processes.{kind}", fn, h)
        if procs is None:
            continue
        ok = True
        for p in procs:
            pid = int(p.pid)
            used = getattr(p, "usedGpuMemory", None)
            entry = found.setdefault(pid, {"pid": pid, "used_memory": None, "types": []})
            entry["types"].append(kind)
            if isinstance(used, int):
                entry["used_memory"] = max(entry["used_memory"] or 0, used)
    if not ok:
        return None
    for entry in found.values():
        entry.update(describe_process(entry["pid"], proc_root))
    return sorted(found.values(), key=lambda e: e["pid"])


def _read_nvlinks(r: Reader, h: Any) -> dict[str, Any]:
    """Scan links from 0 until NVML says InvalidArgument (no such link)."""
    links: list[dict[str, Any]] = []
    out: dict[str, Any] = {"supported": None, "links": links, "active": 0, "error": None}
    for link in range(MAX_NVLINKS):
        errs: dict[str, str] = {}
        state = r.get(errs, "state", "nvmlDeviceGetNvLinkState", h, link)
        if "state" in errs:
            if errs["state"] == "InvalidArgument":
                break  # past the last link
            if errs["state"] == "NotSupported" and link == 0:
                out["supported"] = False  # no NVLink on this GPU (PCIe card)
                return out
            links.append({"link": link, "active": None, "error": errs["state"]})
            continue
        out["supported"] = True
        entry: dict[str, Any] = {"link": link, "active": bool(state)}
        if state:
            out["active"] += 1
            version = r.get(errs, "version", "nvmlDeviceGetNvLinkVersion", h, link)
            entry["version"] = int(version) if version is not None else None
            pci = r.get(errs, "remote_pci", "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            entry["remote_pci_bus_id"] = _text(pci.busId) if pci is not None else None
            rtype = r.get(errs, "remote_type", "nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            entry["remote_type"] = NVLINK_DEVICE_TYPES.get(int(rtype), str(rtype)) if rtype is not None else None
            if errs:
                entry["errors"] = errs
        links.append(entry)
    if out["supported"] is None and links:
        out["error"] = "every link query failed"
    return out


def read_fabric(r: Reader, h: Any) -> dict[str, Any]:
    """NVSwitch fabric registration: ``nvmlDeviceGetGpuFabricInfoV`` (v3, then v2 struct), else the old call."""
    nv = r.nv
    tried: list[str] = []
    attempts: list[tuple[str, str]] = []
    if hasattr(nv, "nvmlDeviceGetGpuFabricInfoV"):
        for struct in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t", "c_nvmlGpuFabricInfoV_t"):
            if hasattr(nv, struct):
                attempts.append(("nvmlDeviceGetGpuFabricInfoV", struct))
    if hasattr(nv, "nvmlDeviceGetGpuFabricInfo") and hasattr(nv, "c_nvmlGpuFabricInfo_t"):
        attempts.append(("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"))
    seen_structs: set[str] = set()
    last_error = "this nvidia-ml-py has no fabric-info call"
    for fn, struct_name in attempts:
        cls = getattr(nv, struct_name)
        if cls in seen_structs:
            continue
        seen_structs.add(cls)
        info = cls()
        errs: dict[str, str] = {}
        r.get(errs, "fabric", fn, h, ctypes.byref(info) if isinstance(info, ctypes.Structure) else info)
        tried.append(f"{fn}({struct_name})")
        if "fabric" not in errs:
            state = int(info.state)
            status = int(info.status)
            out: dict[str, Any] = {
                "api": fn, "struct": struct_name, "state": state, "state_name": FABRIC_STATES.get(state, str(state)),
                "status": status, "status_name": "Success" if status == 0 else NVML_ERRORS.get(status, str(status)),
                "clique_id": int(getattr(info, "cliqueId", 0) or 0),
                "cluster_uuid": bytes(bytearray(info.clusterUuid)).hex() if hasattr(info, "clusterUuid") else None,
                "health_mask": int(info.healthMask) if hasattr(info, "healthMask") else None,
                "health_summary": None, "error": None,
            }
            if hasattr(info, "healthSummary"):
                hs = int(info.healthSummary)
                out["health_summary"] = FABRIC_HEALTH_SUMMARY.get(hs, str(hs))
            return out
        last_error = errs["fabric"]
        # A version mismatch or a missing entry point means: try the next struct/call. Anything
        # else (NotSupported, NoPermission) is the answer.
        if not (last_error.startswith(("ArgumentVersionMismatch", "FunctionNotFound"))
                or last_error.startswith(("TypeError", "ArgumentError"))):
            break
    return {"api": None, "state": None, "state_name": None, "error": last_error, "tried": tried}


# -- the whole host --------------------------------------------------------------------------------

def _unavailable(error: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {"available": False, "error": error, "error_kind": kind, "driver_version": None,
            "cuda_driver_version": None, "device_count_total": 0,
            "visible": {"cuda_visible_devices": None, "indices": [], "problems": []}, "devices": [], "pairs": [],
            **extra}


def read_nvml(nv: Any, env: dict[str, str], proc_root: str = "/proc") -> dict[str, Any]:
    """Read the whole host through the NVML module ``nv`` (pynvml, or a stand-in in tests)."""
    start = time.monotonic()
    kmod = kernel_module_version(os.path.join(proc_root, "driver/nvidia/version"))
    try:
        nv.nvmlInit()
    except Exception as exc:
        name = error_name(exc)
        hint = INIT_ERROR_HINTS.get(name, f"NVML could not start: {name}")
        return _unavailable(f"nvmlInit failed: {name}: {hint}", name, kernel_module_version=kmod)
    r = Reader(nv)
    try:
        return _read_host(r, env, proc_root, kmod, start)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def _read_host(r: Reader, env: dict[str, str], proc_root: str, kmod: str | None, start: float) -> dict[str, Any]:
    errors: dict[str, str] = {}
    driver = r.get(errors, "driver_version", "nvmlSystemGetDriverVersion")
    cuda = r.get(errors, "cuda_driver_version", "nvmlSystemGetCudaDriverVersion")
    nvml_version = r.get(errors, "nvml_version", "nvmlSystemGetNVMLVersion")
    count = r.get(errors, "device_count", "nvmlDeviceGetCount")
    out: dict[str, Any] = {
        "available": True, "error": None, "error_kind": None,
        "driver_version": _text(driver) if driver is not None else None,
        "cuda_driver_version": int(cuda) if cuda is not None else None,
        "nvml_version": _text(nvml_version) if nvml_version is not None else None,
        "kernel_module_version": kmod, "pynvml_version": _pynvml_version(),
        "device_count_total": int(count) if count is not None else 0, "errors": errors,
    }
    if count is None:
        out.update(available=False, error=f"nvmlDeviceGetCount failed: {errors['device_count']}",
                   error_kind=errors["device_count"].split(":")[0])
    handles: dict[int, Any] = {}
    all_uuids: list[str] = []
    lost: dict[int, str] = {}
    for i in range(out["device_count_total"]):
        errs: dict[str, str] = {}
        try:
            h = r.get(errs, "handle", "nvmlDeviceGetHandleByIndex", i)
            uuid = r.get(errs, "uuid", "nvmlDeviceGetUUID", h) if h is not None else None
        except GpuLost:
            h, uuid = None, None
            lost[i] = "GpuIsLost"
        if h is None and i not in lost:
            lost[i] = errs.get("handle", "no handle")
        handles[i] = h
        all_uuids.append(_text(uuid) if uuid is not None else "")

    def mig_parent(token: str) -> int | None:
        errs: dict[str, str] = {}
        try:
            mh = r.get(errs, "mig", "nvmlDeviceGetHandleByUUID", token)
            parent = r.get(errs, "mig_parent", "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mh) if mh else None
            idx = r.get(errs, "mig_index", "nvmlDeviceGetIndex", parent) if parent else None
        except GpuLost:
            return None
        return int(idx) if idx is not None else None

    out["visible"] = resolve_visible(env.get("CUDA_VISIBLE_DEVICES"), all_uuids, mig_parent,
                                     env.get("CUDA_DEVICE_ORDER"))
    devices: list[dict[str, Any]] = []
    for cuda_index, i in enumerate(out["visible"]["indices"]):
        if handles.get(i) is None:
            devices.append({"index": i, "cuda_index": cuda_index, "lost": lost.get(i) == "GpuIsLost",
                            "uuid": all_uuids[i] or None, "name": None, "compute_capability": None, "memory": None,
                            "pci_bus_id": None, "processes": None, "nvlink": None, "fabric": None,
                            "errors": {"handle": lost.get(i, "no handle")}})
            continue
        dev = read_device(r, handles[i], i, proc_root)
        dev["cuda_index"] = cuda_index
        devices.append(dev)
    out["devices"] = devices
    out["pairs"] = _read_pairs(r, handles, devices)
    if any((d.get("fabric") or {}).get("state") not in (None, 0) for d in devices):
        out["fabric_manager"] = fabric_manager_state()
    out["nvml_calls"] = r.calls
    out["elapsed_s"] = round(time.monotonic() - start, 4)
    return out


def _read_pairs(r: Reader, handles: dict[int, Any], devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    usable = [d for d in devices if not d.get("lost") and handles.get(d["index"]) is not None]
    pairs: list[dict[str, Any]] = []
    for a_pos, a in enumerate(usable):
        for b in usable[a_pos + 1:]:
            ha, hb = handles[a["index"]], handles[b["index"]]
            errs: dict[str, str] = {}
            pair: dict[str, Any] = {"a": a["index"], "b": b["index"], "errors": errs}
            try:
                for cap in ("nvlink", "read"):
                    status = r.get(errs, f"p2p_{cap}", "nvmlDeviceGetP2PStatus", ha, hb, P2P_CAPS[cap])
                    pair[f"p2p_{cap}"] = P2P_STATUS.get(int(status), str(status)) if status is not None else None
                level = r.get(errs, "topology", "nvmlDeviceGetTopologyCommonAncestor", ha, hb)
                pair["topology"] = TOPOLOGY_LEVELS.get(int(level), str(level)) if level is not None else None
            except GpuLost:
                pair["lost"] = True
            pairs.append(pair)
    return pairs


def fabric_manager_state() -> dict[str, Any]:
    """Is nvidia-fabricmanager running, and which version (it must match the driver)?"""
    from doctor.core.proc import run

    out: dict[str, Any] = {}
    res = run(["systemctl", "is-active", "nvidia-fabricmanager"], 3)
    out["systemctl_is_active"] = (res.stdout.strip() or None) if res.start_error is None else None
    out["systemctl_error"] = res.start_error or (None if res.returncode is not None else res.why())
    ver = run(["nv-fabricmanager", "--version"], 3)
    text = (ver.stdout + ver.stderr).strip()
    out["version"] = None
    for word in text.replace(":", " ").split():
        if word.count(".") >= 1 and all(p.isdigit() for p in word.split(".")):
            out["version"] = word
            break
    out["version_error"] = ver.start_error
    return out


def _pynvml_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("nvidia-ml-py")
    except PackageNotFoundError:
        return None


# What the GPU checks read of each fact besides nvml (doctor.facts.shape).
P2P_SHAPE = {"ok": opt(bool), "measured": opt(bool), "error": opt(str), "reason": opt(str), "probe_failed": opt(bool),
             "python": opt(str), "torch": opt(str), "cuda": opt(str), "local": opt([dict]), "devices": opt([dict]),
             "pairs": opt([{"src": int, "dst": int, "gb_per_s": opt(NUM), "data_ok": opt(bool),
                            "peer_access": opt(bool), "seconds": opt(NUM)}]),
             "failed_pairs": opt([{"a": int, "b": int, "timed_out": opt(bool), "error": opt(str)}])}


@collector("nvml", timeout=15, isolate=True, shape=NvmlFact)
def collect_nvml(opts: Any) -> NvmlFact:
    """NVIDIA driver, GPUs, health, processes, NVLink, NVSwitch fabric, through NVML (isolated)."""
    try:
        import pynvml
    except ImportError as exc:
        return _unavailable(f"nvidia-ml-py is not importable in the doctor's Python ({exc}): "
                            f"pip install nvidia-ml-py", "ImportError",
                            kernel_module_version=kernel_module_version())
    env, source = service_env(opts)
    out = read_nvml(pynvml, env)
    out.setdefault("visible", {})["source"] = source
    return out


def service_env(opts: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """The service's environment (``doctor.host.facts.service_env``: env file included)."""
    from doctor.host.facts import service_env as host_service_env

    return host_service_env(opts)


# -- measured bandwidth (--deep) -------------------------------------------------------------------

# Each pair runs in a child of its own under PAIR_TIMEOUT_S (a hung copy fails that pair, not the run); no new
# pair starts after BANDWIDTH_BUDGET_S; the probe as a whole is killed at BANDWIDTH_PROBE_TIMEOUT_S.
PAIR_TIMEOUT_S = 30.0
SETUP_TIMEOUT_S = 60.0
BANDWIDTH_BUDGET_S = 180.0
BANDWIDTH_PROBE_TIMEOUT_S = SETUP_TIMEOUT_S + BANDWIDTH_BUDGET_S + PAIR_TIMEOUT_S + 20.0


def world_size(opts: Any) -> int:
    """TP x PP x DP from the run's options (the GPUs the service uses)."""
    par = (opts.profile or {}).get("parallel") or {}
    try:
        return max(1, int(opts.tp)) * max(1, int(par.get("pp", 1) or 1)) * max(1, int(par.get("dp", 1) or 1))
    except (TypeError, ValueError):
        return max(1, int(opts.tp or 1))


@collector("p2p_bandwidth", timeout=BANDWIDTH_PROBE_TIMEOUT_S + 10, shape=P2P_SHAPE)
def collect_p2p_bandwidth(opts: Any) -> dict[str, Any]:
    """GPU-to-GPU copy bandwidth of every pair of the TP group, measured with torch (only with --deep)."""
    if not opts.deep:
        return {"measured": False, "reason": "measured only with --deep"}
    from doctor.core.proc import run_probe

    n = world_size(opts)
    args = ["--devices", ",".join(str(i) for i in range(n)), "--size-mib", "256", "--iters", "20",
            "--budget-s", str(BANDWIDTH_BUDGET_S), "--pair-timeout-s", str(PAIR_TIMEOUT_S),
            "--setup-timeout-s", str(SETUP_TIMEOUT_S)]
    env, _ = service_env(opts)
    data, res = run_probe(opts.python, "p2p_bandwidth", args, timeout=BANDWIDTH_PROBE_TIMEOUT_S, env=env)
    if data is None:
        return {"measured": False, "reason": f"the bandwidth probe failed under {opts.python}: {res.why()}",
                "probe_failed": True, "python": opts.python, "duration_s": round(res.duration_s, 3)}
    data["measured"] = bool(data.get("ok"))
    data["python"] = opts.python
    data["world_size"] = n
    data["duration_s"] = round(res.duration_s, 3)
    if not data["measured"]:
        data["reason"] = data.get("error") or "the probe measured nothing"
    return data


# -- fabric readiness, fabric software, PCIe P2P path -----------------------------------------------

FABRIC_WAIT_SHAPE = {"asked": opt(bool), "reason": opt(str), "outcome": opt(str), "timeout_s": opt(NUM),
                     "waited_s": opt(NUM), "polls": opt(int), "state": opt(str), "verdict": opt(str),
                     "history": opt([dict]), "poll_errors": opt([str])}


@collector("fabric_wait", timeout=5, shape=FABRIC_WAIT_SHAPE)
def collect_fabric_wait(opts: Any) -> dict[str, Any]:
    """How long the run waited for the NVSwitch fabric before judging (``doctor.gpu.fabric``). The wait itself
    runs before the checks (``--wait-fabric SECONDS``; ``launch``: the profile's gpu.fabric_wait_s) and
    records its outcome here; this collector answers when no wait was asked."""
    return {"asked": False, "reason": "no wait asked: check reports the state it finds (--wait-fabric SECONDS waits)"}


_PKG = [{"name": str, "version": opt(str), "upstream": opt(str)}]
_UNIT = mapping(opt(str))
FABRIC_SOFTWARE_SHAPE = {
    "package_manager": opt(str), "packages_error": opt(str),
    "fabric_manager": {"binary": opt(str), "binary_version": opt(str), "binary_error": opt(str), "packages": _PKG,
                       "unit": opt(_UNIT), "pids": [int]},
    "nvlsm": {"packages": _PKG, "binary": opt(str), "units": mapping(_UNIT), "pids": [int], "ib_umad_loaded": opt(bool),
              "start_script": opt(str)},
    "systemd": {"error": opt(str)}, "proc": {"readable": opt(bool), "pid1": opt(str), "error": opt(str)},
}


MULTICAST_TIMEOUT_S = 20.0  # cuInit on a host whose fabric is coming up can take seconds; a hung one is killed
MULTICAST_SHAPE = {
    "ok": opt(bool), "loaded": opt(bool), "error": opt(str), "timed_out": opt(bool), "cu_init": opt(int),
    "cu_init_error": opt(str), "count_error": opt(str), "cuda_driver": opt(int), "attribute": opt(int),
    "devices": opt([{"ordinal": int, "pci_bus_id": opt(str), "multicast_supported": opt(bool), "rc": opt(int),
                     "error": opt(str), "call": opt(str)}]),
    "probe_s": opt(NUM),
}


@collector("multicast", timeout=MULTICAST_TIMEOUT_S + 5, shape=MULTICAST_SHAPE)
def collect_multicast(opts: Any) -> dict[str, Any]:
    """CUDA's multicast-supported attribute of every GPU the service sees (probe ``multicast``: ``cuInit`` and
    ``cuDeviceGetAttribute`` in a child with a deadline, the service's environment; no context, no multicast
    object). Stdlib only, so it runs under the doctor's own interpreter: libcuda is found by the loader from
    the environment, whatever the interpreter."""
    import sys

    from doctor.core.proc import run_probe

    env, _ = service_env(opts)
    data, res = run_probe(sys.executable, "multicast", [], timeout=MULTICAST_TIMEOUT_S, env=env)
    if data is None:
        return {"ok": False, "error": f"the multicast probe failed: {res.why()}", "timed_out": res.timed_out}
    data["probe_s"] = round(res.duration_s, 3)
    return data


@collector("fabric_software", timeout=30, shape=FABRIC_SOFTWARE_SHAPE)
def collect_fabric_software(opts: Any) -> dict[str, Any]:
    """The fabric manager's version (binary and package), unit and process, and NVLSM's package, binary,
    unit, process and ib_umad (``doctor.gpu.fabric_software``; read-only, each command under a deadline)."""
    from doctor.gpu.fabric_software import read_fabric_software

    return read_fabric_software()


PCIE_SHAPE = {
    "gpus": [{"bdf": str, "upstream": opt([str]), "iommu_group": opt(str), "iommu_group_type": opt(str),
              "error": opt(str)}],
    "bridges": mapping({"bdf": opt(str), "acs": opt({"present": opt(bool), "redirects": opt([str]),
                                                     "enabled": opt(mapping(bool)), "control_offset": opt(int),
                                                     "error": opt(str)}), "error": opt(str)}),
    "iommu": {"mode": opt(str), "why": opt(str), "vendor": opt(str), "units": opt([str]), "cmdline": opt(mapping(str)),
              "groups": opt(int)},
    "errors": [str],
}


@collector("pcie", timeout=15, shape=PCIE_SHAPE)
def collect_pcie(opts: Any) -> dict[str, Any]:
    """Each NVIDIA GPU's upstream PCIe bridges with their ACS control (from the configuration space in sysfs)
    and the IOMMU mode (``doctor.gpu.pcie``; read-only)."""
    from doctor.gpu.pcie import read_pcie

    return read_pcie()
