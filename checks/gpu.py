"""GPU host checks: driver, count, architecture, memory, idle, health, NVLink, NVSwitch fabric, and
(with ``--deep``) measured GPU-to-GPU bandwidth. Pure functions of the facts ``nvml`` and
``p2p_bandwidth`` (``doctor/gpu/facts.py``).

TP8 over NVLink is the whole design of this deployment: on PCIe the same service ran TP8 at
26 tok/s and EP8 at 65 tok/s (../shared/DEPLOYMENT.md), so a TP profile on a host without NVLink
is a failure that points at the EP profile.
"""

from __future__ import annotations

import shlex
from typing import Any

from doctor.core.registry import check
from doctor.core.result import Remediation, Result
from doctor.facts.store import FactUnavailable, MalformedFact
from doctor.gpu import fabric, fabric_software, links
from doctor.gpu import pcie as pcie_mod

GIB = 2**30
EP_PROFILE = "rtxpro6000-ep8"
PCIE_TP8_TOK_S, PCIE_EP8_TOK_S = 26, 65  # DEPLOYMENT.md, concurrency 1, 8x RTX PRO 6000
# Measured copy bandwidth against what the links should carry (see gpu.p2p_bandwidth's docstring).
MIN_BANDWIDTH_FRACTION = 0.5
WARN_BANDWIDTH_FRACTION = 0.7
SLOWDOWN_REASONS = {"hw_slowdown": "hardware slowdown", "hw_thermal_slowdown": "hardware thermal slowdown",
                    "sw_thermal_slowdown": "software thermal slowdown",
                    "hw_power_brake_slowdown": "hardware power brake"}


# -- shared ------------------------------------------------------------------------------------------

def _nvml(ctx: Any) -> tuple[dict[str, Any] | None, Result | None]:
    """The fact, or the result a check gives when there is nothing to judge."""
    nvml = ctx.fact("nvml")
    if not isinstance(nvml, dict) or not isinstance(nvml.get("devices", []), list):
        return None, Result.failed("the nvml fact is malformed (not an object with a devices list)",
                                   fact_type=type(nvml).__name__)
    if not nvml.get("available"):
        return None, Result.blocked(f"NVML is not available: {nvml.get('error') or 'unknown reason'} (see gpu.driver)",
                                    "gpu.driver")
    return nvml, None


def _group(ctx: Any, nvml: dict[str, Any]) -> list[dict[str, Any]]:
    return links.group(nvml, ctx.settings.world_size)


def _tp_group(ctx: Any) -> tuple[dict[str, Any], list[dict[str, Any]], Result | None]:
    """The fact and the GPUs of the TP group, or the result a check gives when there is none to judge."""
    nvml, res = _nvml(ctx)
    if res:
        return {}, [], res
    grp = _group(ctx, nvml)
    if not grp:
        return nvml, [], Result.blocked("no GPU visible (see gpu.count)", "gpu.count")
    return nvml, grp, None


def _gpu(d: dict[str, Any]) -> str:
    """``GPU3`` (the CUDA index the service sees), with the NVML index when it differs."""
    cuda, idx = d.get("cuda_index"), d.get("index")
    return f"GPU{cuda}" if cuda == idx or cuda is None else f"GPU{cuda} (NVML {idx})"


def _gib(n: Any) -> str:
    return f"{n / GIB:.1f} GiB" if isinstance(n, (int, float)) else "?"


def _short(text: str, limit: int = 100) -> str:
    """Head and tail of a long command line: the interpreter and the script's own arguments both show."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    return text[:head] + " ... " + text[-(limit - head - 5):]


def _cc(value: Any) -> tuple[int, int] | None:
    try:
        if isinstance(value, str):
            major, minor = value.strip().split(".")
            return int(major), int(minor)
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return int(value[0]), int(value[1])
    except (TypeError, ValueError):
        return None
    return None


def _profiles_for(cc: tuple[int, int], name: str | None) -> list[str]:
    """Built-in profiles made for this GPU (same compute capability; name first)."""
    from doctor.core.settings import ConfigError, load_profile, profile_names

    hits: list[tuple[int, str]] = []
    for pname in profile_names():
        try:
            prof = load_profile(pname)
        except ConfigError:
            continue
        gpu = prof.get("gpu") or {}
        if _cc(gpu.get("compute_capability")) == cc:
            named = bool(name and gpu.get("name_contains") and str(gpu["name_contains"]) in name)
            hits.append((0 if named else 1, pname))
    return [p for _, p in sorted(hits)]


# -- gpu.driver --------------------------------------------------------------------------------------

DRIVER_REMEDIES: dict[str, tuple[str, list[str]]] = {
    "LibraryNotFound": ("Install the NVIDIA datacenter driver (>= 580 for CUDA 13). In a container, run it "
                        "with the NVIDIA container toolkit (--gpus all) so libnvidia-ml.so.1 is mounted.",
                        ["nvidia-smi", "ldconfig -p | grep libnvidia-ml"]),
    "DriverNotLoaded": ("The driver's kernel module is not loaded: load it and look for errors.",
                        ["sudo modprobe nvidia", "sudo dmesg | grep -i -E 'nvrm|xid'"]),
    "NoPermission": ("Run as root or a user allowed to open /dev/nvidia* (video group).",
                     ["ls -l /dev/nvidia*", "id"]),
    "LibRmVersionMismatch": ("The driver was upgraded but the old kernel module is still loaded: reboot "
                             "(or unload and reload the nvidia modules).",
                             ["cat /proc/driver/nvidia/version", "sudo reboot"]),
    "ImportError": ("Install nvidia-ml-py into the doctor's environment.", ["pip install nvidia-ml-py"]),
    "GpuIsLost": ("A GPU fell off the bus: reset it or reboot, and read the kernel log for Xid errors.",
                  ["sudo dmesg | grep -i xid", "nvidia-smi -q | grep -i -A3 retired"]),
}


@check("gpu.driver", "NVIDIA driver and NVML load", needs=("nvml",), timeout=30)
def gpu_driver(ctx: Any) -> Result:
    """Loads NVML (nvidia-ml-py) and reads the driver version, the CUDA version the driver supports
    and the number of GPUs. Nothing else on the GPU side can work without it. When NVML does not
    load, the summary says why: no libnvidia-ml (driver not installed or not mounted into the
    container), kernel module not loaded, no permission on /dev/nvidia*, or a library/kernel
    version mismatch after a driver upgrade without a reboot. By hand: `nvidia-smi`,
    `cat /proc/driver/nvidia/version`."""
    nvml = ctx.fact("nvml")
    if not isinstance(nvml, dict):
        return Result.failed("the nvml fact is malformed (not an object)", fact_type=type(nvml).__name__)
    kind = str(nvml.get("error_kind") or "")
    if not nvml.get("available"):
        text, cmds = DRIVER_REMEDIES.get(kind, ("Check the driver installation and the kernel log.",
                                                ["nvidia-smi", "sudo dmesg | grep -i -E 'nvrm|xid'"]))
        return Result.failed(nvml.get("error") or "NVML is not available", Remediation(text, cmds),
                             error_kind=kind or None, kernel_module_version=nvml.get("kernel_module_version"))
    if not isinstance(nvml.get("devices"), list):
        return Result.failed("the nvml fact is malformed (no devices list)")
    driver, kmod = nvml.get("driver_version"), nvml.get("kernel_module_version")
    details = {"driver_version": driver, "cuda_driver_version": nvml.get("cuda_driver_version"),
               "nvml_version": nvml.get("nvml_version"), "kernel_module_version": kmod,
               "pynvml_version": nvml.get("pynvml_version"), "device_count_total": nvml.get("device_count_total"),
               "nvml_elapsed_s": nvml.get("elapsed_s")}
    if driver and kmod and driver != kmod:
        text, cmds = DRIVER_REMEDIES["LibRmVersionMismatch"]
        return Result.failed(f"NVML library is {driver} but the loaded kernel module is {kmod}",
                             Remediation(text, cmds), **details)
    if not isinstance(driver, str) or not driver:
        why = (nvml.get("errors") or {}).get("driver_version", "not recorded") if isinstance(nvml.get("errors"),
                                                                                              dict) else "not recorded"
        return Result.warned(f"NVML loaded but the driver version could not be read ({why})",
                             "Check `nvidia-smi`; the other GPU checks still judge what NVML reports.", **details)
    cuda = nvml.get("cuda_driver_version")
    cuda_s = f"CUDA {cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else "CUDA version unknown"
    return Result.passed(f"NVIDIA driver {driver or '?'} ({cuda_s}), {nvml.get('device_count_total', 0)} GPU(s)",
                         **details)


# -- gpu.count ---------------------------------------------------------------------------------------

@check("gpu.count", "GPUs visible vs the parallel size", needs=("nvml",), depends=("gpu.driver",))
def gpu_count(ctx: Any) -> Result:
    """Counts the GPUs the service will see (all GPUs NVML sees, narrowed by the service's
    CUDA_VISIBLE_DEVICES, indices or GPU-/MIG- UUIDs, as CUDA reads it) against the profile's
    TP x PP x DP. SGLang takes the first N visible GPUs. An invalid CUDA_VISIBLE_DEVICES entry
    hides it and every later one, as CUDA does. By hand: `nvidia-smi -L`, `echo $CUDA_VISIBLE_DEVICES`."""
    nvml, res = _nvml(ctx)
    if res:
        return res
    want = ctx.settings.world_size
    vis = nvml.get("visible") or {}
    cvd = vis.get("cuda_visible_devices")
    devices = nvml.get("devices") or []
    total = nvml.get("device_count_total", len(devices))
    details = {"visible": len(devices), "required": want, "device_count_total": total, "cuda_visible_devices": cvd,
               "visible_nvml_indices": [d.get("index") for d in devices], "problems": vis.get("problems") or []}
    if vis.get("mig_entries"):
        return Result.failed(f"CUDA_VISIBLE_DEVICES names MIG devices ({', '.join(vis['mig_entries'])}): "
                             f"TP{ctx.settings.tp} needs whole GPUs",
                             Remediation("Disable MIG and list whole GPUs (or unset CUDA_VISIBLE_DEVICES).",
                                         ["nvidia-smi -L", "sudo nvidia-smi -mig 0"]), **details)
    if vis.get("problems"):
        return Result.failed(f"{len(devices)} GPU(s) visible, {want} needed: " + "; ".join(vis["problems"]),
                             Remediation("Fix CUDA_VISIBLE_DEVICES in the service's environment (indices or "
                                         "GPU- UUIDs from `nvidia-smi -L`), or unset it.", ["nvidia-smi -L"]),
                             **details)
    if len(devices) < want:
        if cvd is not None and total >= want:
            text = (f"CUDA_VISIBLE_DEVICES={cvd!r} hides GPUs: this host has {total}. List {want} of them or "
                    f"unset it in the service's environment.")
        else:
            text = (f"This host has {total} GPU(s); the profile runs TP{ctx.settings.tp} over {want}. Use a host "
                    f"with {want} GPUs (or a profile made for this one).")
        return Result.failed(f"{len(devices)} GPU(s) visible, TP x PP x DP = {want} needed",
                             Remediation(text, ["nvidia-smi -L"]), **details)
    if len(devices) > want:
        return Result.passed(f"{len(devices)} GPUs visible; the service uses the first {want}", **details)
    return Result.passed(f"{want} GPU(s) visible, as TP x PP x DP = {want} needs", **details)


# -- gpu.arch ----------------------------------------------------------------------------------------

@check("gpu.arch", "Compute capability of every GPU vs the profile", needs=("nvml",), depends=("gpu.driver",))
def gpu_arch(ctx: Any) -> Result:
    """Compares each GPU's compute capability with the profile's (B300 is 10.3, sm_103; B200 10.0;
    H200 9.0; RTX PRO 6000 Blackwell 12.0). Kernels, the Triton backend and the patches are chosen
    for one architecture; mixed GPUs in one TP group fail. A mismatch names the built-in profile
    made for the GPUs found. By hand: `nvidia-smi --query-gpu=name,compute_cap --format=csv`."""
    _, grp, res = _tp_group(ctx)
    if res:
        return res
    want_raw = ctx.expect("gpu.compute_capability")
    want = _cc(want_raw)
    if want is None:
        return Result.not_judged(f"the profile names no valid gpu.compute_capability ({want_raw!r})",
                                 "Set [gpu] compute_capability (e.g. \"10.3\") in the profile or config.")
    seen = {_gpu(d): (d.get("name"), d.get("compute_capability")) for d in grp}
    details: dict[str, Any] = {"expected": f"{want[0]}.{want[1]}", "gpus": {
        k: {"name": n, "compute_capability": cc} for k, (n, cc) in seen.items()}}
    unread = [f"{_gpu(d)}: {(d.get('errors') or {}).get('compute_capability', 'not read')}"
              for d in grp if _cc(d.get("compute_capability")) is None]
    if unread:
        return Result.errored("could not read the compute capability of " + ", ".join(unread), **details)
    kinds = sorted({(d.get("name") or "?", _cc(d.get("compute_capability"))) for d in grp}, key=str)
    if len(kinds) > 1:
        listing = "; ".join(f"{n} {cc[0]}.{cc[1]}: " + ",".join(_gpu(d) for d in grp if (d.get('name') or '?') == n
                                                             and _cc(d.get('compute_capability')) == cc)
                            for n, cc in kinds)
        return Result.failed(f"mixed GPUs in the TP group: {listing}",
                             Remediation("Use identical GPUs for one TP group: set CUDA_VISIBLE_DEVICES to GPUs of "
                                         "one kind.", ["nvidia-smi -L"]), **details)
    name, cc = kinds[0]
    assert cc is not None
    details["found"] = f"{cc[0]}.{cc[1]}"
    if cc != want:
        better = _profiles_for(cc, name)
        hint = (f"Use the profile made for these GPUs: --profile {better[0]}" if better
                else "No built-in profile targets these GPUs; write a profile for them (--profile FILE.toml).")
        details["matching_profiles"] = better
        return Result.failed(f"{len(grp)}x {name} is compute capability {cc[0]}.{cc[1]} (sm_{cc[0]}{cc[1]}); "
                             f"profile {ctx.settings.profile_name} expects {want[0]}.{want[1]} (sm_{want[0]}{want[1]})",
                             Remediation(hint, [f"k26-doctor check --profile {better[0]}"] if better else []),
                             **details)
    name_want = ctx.expect("gpu.name_contains")
    if name_want and str(name_want) not in str(name):
        return Result.warned(f"{name} has compute capability {cc[0]}.{cc[1]} as expected, but the profile is "
                             f"for {name_want} GPUs (memory and link figures may differ)", **details)
    return Result.passed(f"{len(grp)}x {name}, compute capability {cc[0]}.{cc[1]} (sm_{cc[0]}{cc[1]})", **details)


# -- gpu.memory --------------------------------------------------------------------------------------

@check("gpu.memory", "Per-GPU memory total and free", needs=("nvml",), depends=("gpu.driver",))
def gpu_memory(ctx: Any) -> Result:
    """Total memory of each GPU of the TP group against the profile's gpu.min_memory_gib, and free
    memory against what the server will reserve (server.mem_fraction_static of the total). The
    free figures (details.per_gpu, details.free_min_bytes) feed model.fit. Memory held by other
    processes: see gpu.idle. By hand: `nvidia-smi --query-gpu=memory.total,memory.free --format=csv`."""
    _, grp, res = _tp_group(ctx)
    if res:
        return res
    per_gpu = []
    for d in grp:
        m = d.get("memory")
        per_gpu.append({"gpu": _gpu(d), "index": d.get("index"),
                        **({k: m.get(k) for k in ("total", "free", "used")} if isinstance(m, dict) else {})})
    unread = [f"{_gpu(d)}: {(d.get('errors') or {}).get('memory', 'not read')}" for d in grp
              if not isinstance(d.get("memory"), dict) or not isinstance(d["memory"].get("total"), int)
              or not isinstance(d["memory"].get("free"), int)]
    details: dict[str, Any] = {"per_gpu": per_gpu}
    if unread:
        return Result.errored("could not read memory of " + ", ".join(unread), **details)
    totals = [d["memory"]["total"] for d in grp]
    frees = [d["memory"]["free"] for d in grp]
    details.update(total_min_bytes=min(totals), free_min_bytes=min(frees), free_total_bytes=sum(frees))
    min_gib = ctx.expect("gpu.min_memory_gib")
    if isinstance(min_gib, (int, float)):
        details["min_memory_gib"] = min_gib
        small = [f"{_gpu(d)} {_gib(d['memory']['total'])}" for d in grp if d["memory"]["total"] < min_gib * GIB]
        if small:
            return Result.failed(f"GPU memory below the profile's {min_gib} GiB: " + ", ".join(small),
                                 Remediation("Use GPUs with more memory or the profile made for these GPUs.",
                                             ["nvidia-smi --query-gpu=index,name,memory.total --format=csv"]),
                                 **details)
    frac = ctx.expect("server.mem_fraction_static")
    if isinstance(frac, (int, float)) and 0 < frac <= 1:
        short = [f"{_gpu(d)} {_gib(d['memory']['free'])} free of {_gib(d['memory']['total'])}" for d in grp
                 if d["memory"]["free"] < frac * d["memory"]["total"]]
        if short:
            return Result.warned(f"less free memory than the server reserves ({frac:g} of the total): "
                                 + ", ".join(short),
                                 Remediation("Free the GPUs (see gpu.idle) or lower server.mem_fraction_static.",
                                             ["nvidia-smi"]), **details)
    return Result.passed(f"{len(grp)} GPU(s), {_gib(min(totals))} each at least, {_gib(min(frees))} free at least",
                         **details)


# -- gpu.idle ----------------------------------------------------------------------------------------

@check("gpu.idle", "No other process holds GPU memory", needs=("nvml",), depends=("gpu.driver",), fixer="gpu.idle")
def gpu_idle(ctx: Any) -> Result:
    """Lists the processes that hold memory on the GPUs of the TP group (NVML's compute and
    graphics process lists): PID, command line from /proc, memory. A stale server from an earlier
    start is the usual culprit; the new server then fails to allocate, minutes into its start.
    Fixer: a plan to stop exactly those PIDs (verified to be the same processes, holding
    /dev/nvidia*), applied only with `fix --apply`. By hand: `nvidia-smi`, then `kill PID`."""
    _, grp, res = _tp_group(ctx)
    if res:
        return res
    unread = [f"{_gpu(d)}: {(d.get('errors') or {}).get('processes.compute', 'not read')}" for d in grp
              if not isinstance(d.get("processes"), list)]
    if len(unread) == len(grp):
        return Result.not_judged("process lists not available: " + ", ".join(unread))
    procs: dict[int, dict[str, Any]] = {}
    for d in grp:
        for p in d.get("processes") or []:
            if not isinstance(p, dict) or not isinstance(p.get("pid"), int):
                continue
            entry = procs.setdefault(p["pid"], {**p, "gpus": [], "used_memory_total": 0})
            entry["gpus"].append(_gpu(d))
            entry["used_memory_total"] += p.get("used_memory") or 0
    details: dict[str, Any] = {"processes": sorted(procs.values(), key=lambda e: e["pid"]),
                               "unread": unread}
    if not procs:
        if unread:
            return Result.warned("no process on the GPUs that could be read; not read: " + ", ".join(unread), **details)
        return Result.passed(f"no process holds memory on the {len(grp)} GPU(s)", **details)
    parts = []
    for p in details["processes"]:
        cmd = p.get("cmdline") or ("not visible from this PID namespace" if not p.get("in_namespace") else "?")
        parts.append(f"PID {p['pid']} ({_short(cmd)}) {_gib(p['used_memory_total'])} on {','.join(p['gpus'])}")
    sglang = any("sglang" in (p.get("cmdline") or "") for p in details["processes"])
    text = ("Stop them (`k26-doctor fix --apply` plans exactly these PIDs)."
            + (" One looks like an SGLang server: if it is the service itself, stop its unit instead."
               if sglang else ""))
    unit = ctx.expect("server.unit")
    cmds = ["nvidia-smi", "kill " + " ".join(str(p["pid"]) for p in details["processes"])]
    if sglang and unit:
        cmds.insert(1, f"sudo systemctl stop {unit}")
    return Result.failed(f"{len(procs)} process(es) hold GPU memory: " + "; ".join(parts),
                         Remediation(text, cmds), **details)


# -- gpu.health --------------------------------------------------------------------------------------

@check("gpu.health", "ECC, row remapping, MIG mode, clock-event reasons", needs=("nvml",), depends=("gpu.driver",))
def gpu_health(ctx: Any) -> Result:
    """Per GPU of the TP group: a lost GPU, uncorrected ECC errors since the driver loaded, row
    remapping pending (needs a GPU reset) or failed (RMA), retired pages pending, MIG mode on or
    pending (the service needs whole GPUs) fail; hardware slowdown, thermal or power-brake clock
    events, persistence mode off and ECC off warn. Readings a GPU does not support (NotSupported)
    are listed, not judged. By hand: `nvidia-smi -q -d ECC,ROW_REMAPPER,PERFORMANCE`."""
    _, grp, res = _tp_group(ctx)
    if res:
        return res
    mig_allowed = bool(ctx.expect("gpu.mig_allowed", False))
    fails: list[str] = []
    warns: list[str] = []
    cmds: set[str] = set()
    per_gpu: dict[str, Any] = {}
    judged = 0
    for d in grp:
        g = _gpu(d)
        errs = d.get("errors") or {}
        per_gpu[g] = {k: d.get(k) for k in ("lost", "ecc_mode", "ecc_uncorrected", "row_remap",
                                            "retired_pages_pending", "mig_mode", "clock_event_names",
                                            "persistence_mode", "temperature_c")}
        per_gpu[g]["not_supported"] = sorted(k for k, v in errs.items() if v == "NotSupported")
        per_gpu[g]["errors"] = {k: v for k, v in errs.items() if v != "NotSupported"}
        if d.get("lost") or "handle" in errs:
            fails.append(f"{g} is lost or unreachable ({errs.get('handle', 'GpuIsLost')}): it fell off the bus")
            cmds.update({"sudo dmesg | grep -i xid", "sudo reboot"})
            continue
        vol = (d.get("ecc_uncorrected") or {}).get("volatile")
        if isinstance(vol, int):
            judged += 1
            if vol > 0:
                fails.append(f"{g} has {vol} uncorrected ECC error(s) since the driver loaded")
                cmds.add(f"sudo nvidia-smi -r -i {d.get('index')}")
        remap = d.get("row_remap")
        if isinstance(remap, dict):
            judged += 1
            if remap.get("failure"):
                fails.append(f"{g}: row remapping failed (the GPU needs replacing)")
            elif remap.get("pending"):
                fails.append(f"{g}: row remapping pending (reset the GPU to apply it)")
                cmds.add(f"sudo nvidia-smi -r -i {d.get('index')}")
        if d.get("retired_pages_pending") is True:
            judged += 1
            fails.append(f"{g}: retired pages pending (reset the GPU to retire them)")
            cmds.add(f"sudo nvidia-smi -r -i {d.get('index')}")
        mig = d.get("mig_mode")
        if isinstance(mig, dict):
            judged += 1
            if (mig.get("current") or mig.get("pending")) and not mig_allowed:
                state = "on" if mig.get("current") else "pending"
                fails.append(f"{g}: MIG mode {state} (the service needs the whole GPU)")
                cmds.add(f"sudo nvidia-smi -i {d.get('index')} -mig 0")
        names = d.get("clock_event_names")
        if isinstance(names, list):
            judged += 1
            slow = [SLOWDOWN_REASONS[n] for n in names if n in SLOWDOWN_REASONS]
            if slow:
                warns.append(f"{g}: clocks held down by {', '.join(slow)}")
                cmds.add("nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER")
        if d.get("persistence_mode") == 0:
            warns.append(f"{g}: persistence mode off")
            cmds.add("sudo systemctl enable --now nvidia-persistenced")
        ecc_mode = d.get("ecc_mode")
        if isinstance(ecc_mode, dict) and ecc_mode.get("current") == 0:
            warns.append(f"{g}: ECC disabled")
    details = {"per_gpu": per_gpu}
    if fails:
        return Result.failed("; ".join(fails), Remediation("Reset or replace the GPUs named; see the kernel log for "
                                                           "Xid errors.", sorted(cmds)), **details)
    if judged == 0:
        return Result.not_judged("no health reading was available for any GPU", **details)
    if warns:
        return Result.warned("; ".join(warns), Remediation("Not fatal, but slower or less safe.", sorted(cmds)),
                             **details)
    return Result.passed(f"{len(grp)} GPU(s) healthy: no uncorrected ECC error, no remapping pending, MIG off, "
                         f"no slowdown", **details)


# -- gpu.nvlink --------------------------------------------------------------------------------------

@check("gpu.nvlink", "NVLink P2P between every pair of the TP group; link counts equal", needs=("nvml",),
       depends=("gpu.driver",))
def gpu_nvlink(ctx: Any) -> Result:
    """For every pair of GPUs in the TP group, NVLink P2P as NVML reports it
    (`nvmlDeviceGetP2PStatus` with the NVLINK index), and each GPU's active links
    (`nvmlDeviceGetNvLinkState`, up to the first link NVML calls invalid). Every pair must have
    NVLink and every GPU the same number of active links (a lower count is a link down), at least
    the profile's gpu.min_nvlinks. The PCIe topology level is not used to find NVLink (it says PHB
    for an NV18 pair). A host without NVLink under a TP profile fails with the measured advice: on
    PCIe this service ran TP8 at 26 tok/s and EP8 at 65 tok/s, so use the EP profile
    (rtxpro6000-ep8). details.matrix is a matrix like `nvidia-smi topo -m`, shown with a failure. By hand:
    `nvidia-smi topo -m`, `nvidia-smi nvlink -s`."""
    res = nvlink_verdict(ctx)
    rows = res.details.get("matrix")
    if isinstance(rows, list) and rows:
        res.exhibit = "\n".join(str(r) for r in rows)  # shown with a failure, once under -v
    return res


def nvlink_verdict(ctx: Any) -> Result:
    """gpu.nvlink's verdict (the check adds the matrix as the result's exhibit)."""
    nvml, res = _nvml(ctx)
    if res:
        return res
    grp = _group(ctx, nvml)
    rows = links.matrix(nvml, grp)
    details: dict[str, Any] = {"matrix": rows}
    if len(grp) < 2:
        return Result.skipped(f"{len(grp)} GPU in the TP group: no pair to link", **details)
    required = bool(ctx.expect("gpu.nvlink_required", True))
    min_links = ctx.expect("gpu.min_nvlinks", 0) or 0
    pairs, no_nv, unknown = [], [], []
    for i, a in enumerate(grp):
        for b in grp[i + 1:]:
            pair = links.find_pair(nvml, a.get("index"), b.get("index"))
            status = pair.get("p2p_nvlink") if pair else None
            label = links.pair_label(nvml, a, b)
            pairs.append({"a": _gpu(a), "b": _gpu(b), "p2p_nvlink": status, "label": label,
                          "errors": (pair or {}).get("errors") or {}})
            name = f"{_gpu(a)}-{_gpu(b)}"
            if status == "ok":
                continue
            if status is None:
                why = ((pair or {}).get("errors") or {}).get("p2p_nvlink", "not read")
                unknown.append(f"{name} ({why})")
            else:
                no_nv.append(f"{name} ({label}, {status})")
    counts = {_gpu(d): links.active_links(d) for d in grp}
    slots = {_gpu(d): links.link_slots(d) for d in grp}
    details.update(pairs=pairs, active_links=counts, links_present=slots)
    pcie_only = all(s == 0 for s in slots.values())
    if not required:
        if pcie_only or no_nv:
            return Result.passed(f"no NVLink between {len(no_nv)} of {len(pairs)} pair(s); the profile does not need "
                                 f"it ({ctx.settings.profile_name})", **details)
        return Result.passed(f"NVLink P2P between all {len(pairs)} pair(s) (not required by the profile)", **details)
    ep = int(ctx.expect("parallel.ep", 1) or 1)
    if pcie_only or (no_nv and len(no_nv) == len(pairs) and not any(counts.values())):
        fabric_down = [_gpu(d) for d in grp if (d.get("fabric") or {}).get("state_name") in ("not_started",
                                                                                               "in_progress")]
        if not pcie_only and fabric_down:
            return Result.failed(f"NVLinks are present but none is active on {len(grp)} GPUs: the NVSwitch fabric is "
                                 f"not up on {', '.join(fabric_down)} (see gpu.fabric)",
                                 Remediation("Start nvidia-fabricmanager (same version as the driver).",
                                             ["sudo systemctl start nvidia-fabricmanager", "nvidia-smi nvlink -s"]),
                                 **details)
        if pcie_only and ep == 1:
            return Result.failed(
                f"PCIe only: no NVLink between the {len(grp)} GPUs, but profile {ctx.settings.profile_name} runs "
                f"TP{ctx.settings.tp} over NVLink. On PCIe this service measured TP8 {PCIE_TP8_TOK_S} tok/s vs EP8 "
                f"{PCIE_EP8_TOK_S} tok/s: use expert parallelism (--profile {EP_PROFILE})",
                Remediation(f"Use the EP profile on this host: --profile {EP_PROFILE} (EP8 avoids the MoE all-reduce "
                            f"over PCIe; {PCIE_EP8_TOK_S} vs {PCIE_TP8_TOK_S} tok/s measured at concurrency 1).",
                            [f"k26-doctor check --profile {EP_PROFILE}", "nvidia-smi topo -m"]),
                ep_profile=EP_PROFILE, measured_tok_s={"tp8_pcie": PCIE_TP8_TOK_S, "ep8_pcie": PCIE_EP8_TOK_S},
                **details)
    problems: list[str] = []
    if no_nv:
        problems.append(f"no NVLink P2P between {len(no_nv)} of {len(pairs)} pair(s): " + ", ".join(no_nv[:8])
                        + (" ..." if len(no_nv) > 8 else ""))
    known = {g: c for g, c in counts.items() if isinstance(c, int)}
    if known and len(set(known.values())) > 1:
        top = max(known.values())
        low = [f"{g} {c}/{slots.get(g)}" for g, c in known.items() if c < top]
        problems.append(f"unequal active link counts (degraded link): {', '.join(low)} vs {top} on the others")
    if isinstance(min_links, int) and min_links > 0:
        few = [f"{g} {c}" for g, c in known.items() if c < min_links]
        if few and not (len(set(known.values())) > 1):
            problems.append(f"fewer active links than the profile's {min_links}: {', '.join(few)}")
    if problems:
        return Result.failed("; ".join(problems),
                             Remediation("A link down costs bandwidth on every all-reduce of TP. Check the links, "
                                         "reseat or service the GPU/baseboard; on NVSwitch hosts check the fabric "
                                         "manager.", ["nvidia-smi nvlink -s", "nvidia-smi topo -m",
                                                      "sudo dmesg | grep -i -E 'nvlink|xid'"]), **details)
    if unknown:
        return Result.errored("NVLink P2P could not be read for " + ", ".join(unknown[:8]), **details)
    n = min(known.values()) if known else None
    return Result.passed(f"NVLink P2P between all {len(pairs)} pair(s) of {len(grp)} GPUs"
                         + (f", {n} active links each (NV{n})" if n else ""), **details)


# -- gpu.fabric --------------------------------------------------------------------------------------

@check("gpu.fabric", "NVSwitch fabric state (fabric manager)", needs=("nvml",), depends=("gpu.driver",),
       fixer="gpu.fabric")
def gpu_fabric(ctx: Any) -> Result:
    """On NVSwitch hosts (HGX) every GPU must be registered with the NVLink fabric before CUDA can
    use it: `nvmlDeviceGetGpuFabricInfoV` (or the older call) must say completed with success.
    Not started or in progress means nvidia-fabricmanager is not running (or failed): CUDA then
    fails with "system not yet initialized". The fabric manager must be the same version as the
    driver (gpu.fabric.manager); NVLink 5 hosts also need NVLSM (gpu.fabric.nvlsm). GPUs without a
    fabric (NotSupported) skip. Registration takes minutes after boot: `launch` and the unit's
    ExecStartPre wait for it (the profile's gpu.fabric_wait_s), `check` reports the state it finds
    unless given `--wait-fabric SECONDS`. Fixer: `systemctl start nvidia-fabricmanager`. By hand:
    `systemctl status nvidia-fabricmanager`, `nvidia-smi -q | grep -A3 -i fabric`."""
    nvml, grp, res = _tp_group(ctx)
    if res:
        return res
    fm = nvml.get("fabric_manager") or {}
    per_gpu = {_gpu(d): d.get("fabric") for d in grp}
    details: dict[str, Any] = {"per_gpu": per_gpu, "fabric_manager": fm or None,
                               "driver_version": nvml.get("driver_version")}
    waited = _fabric_wait(ctx)
    if waited:
        details["fabric_wait"] = waited
    states: dict[str, list[str]] = {}
    unread: list[str] = []
    for d in grp:
        f = d.get("fabric")
        if not isinstance(f, dict) or f.get("state") is None:
            err = (f or {}).get("error") if isinstance(f, dict) else None
            if err and str(err).startswith("NotSupported"):
                states.setdefault("not_supported", []).append(_gpu(d))
            else:
                unread.append(f"{_gpu(d)} ({err or 'not read'})")
            continue
        states.setdefault(str(f.get("state_name")), []).append(_gpu(d))
    nvswitch = bool(ctx.expect("gpu.nvswitch", False))
    driver = nvml.get("driver_version")
    fix_text = ("Start the NVIDIA fabric manager, the same version as the driver"
                + (f" ({driver})" if driver else "") + ", and wait until every GPU says completed.")
    fix_cmds = ["sudo systemctl start nvidia-fabricmanager", "systemctl status nvidia-fabricmanager",
                "nvidia-smi -q | grep -i -A3 fabric"]
    bad = {s: g for s, g in states.items() if s in ("not_started", "in_progress")}
    if bad:
        parts = [f"{s.replace('_', ' ')} on {', '.join(g)}" for s, g in bad.items()]
        fm_ver = fm.get("version")
        if fm_ver and driver and fm_ver != driver:
            fix_text += f" Installed fabric manager is {fm_ver}, the driver {driver}: install the matching version."
        after = (f" after waiting {waited.get('waited_s', 0):.0f} s (limit {waited.get('timeout_s', 0):g} s)"
                 if waited else "")
        return Result.failed(f"NVSwitch fabric not ready{after}: " + "; ".join(parts)
                             + (f" (nvidia-fabricmanager is {fm.get('systemctl_is_active')})"
                                if fm.get("systemctl_is_active") else ""),
                             Remediation(fix_text, fix_cmds), **details)
    failed = [f"{_gpu(d)}: {(d.get('fabric') or {}).get('status_name')}" for d in grp
              if (d.get("fabric") or {}).get("state_name") == "completed" and (d.get("fabric") or {}).get("status")]
    if failed:
        return Result.failed("fabric registration completed with an error: " + ", ".join(failed),
                             Remediation("Read the fabric manager log; restart it (same version as the driver).",
                                         ["journalctl -u nvidia-fabricmanager -n 100",
                                          "sudo systemctl restart nvidia-fabricmanager"]), **details)
    unhealthy = [f"{_gpu(d)}: {(d.get('fabric') or {}).get('health_summary')}" for d in grp
                 if (d.get("fabric") or {}).get("health_summary") in ("unhealthy", "limited_capacity")]
    if unread:
        if nvswitch:
            return Result.errored("could not read the fabric state of " + ", ".join(unread), **details)
        return Result.skipped("fabric state not read (" + ", ".join(unread) + "); the profile expects no NVSwitch",
                              **details)
    if "completed" not in states:
        why = "the GPUs report no NVSwitch fabric (NotSupported)"
        return Result.skipped(why + ("; the profile expects one: see gpu.nvlink" if nvswitch else ""), **details)
    if states.get("not_supported"):
        return Result.failed(f"fabric completed on {len(states['completed'])} GPU(s) but not supported on "
                             + ", ".join(states["not_supported"]), **details)
    if unhealthy:
        return Result.warned("fabric completed but health says " + ", ".join(unhealthy),
                             Remediation("Check the fabric manager log and the NVLink error counters.",
                                         ["journalctl -u nvidia-fabricmanager -n 100", "nvidia-smi nvlink -e"]),
                             **details)
    after = f" (after waiting {waited.get('waited_s', 0):.0f} s)" if waited and waited.get("polls", 1) > 1 else ""
    return Result.passed(f"NVSwitch fabric completed on all {len(grp)} GPU(s){after}", **details)


def _fabric_wait(ctx: Any) -> dict[str, Any] | None:
    """The wait's record when this run waited for the fabric (``--wait-fabric``, ``launch``), else None. Old
    snapshots have no such fact: that is "no wait", never a different verdict."""
    try:
        waited = ctx.fact("fabric_wait")
    except MalformedFact:
        raise
    except FactUnavailable:
        return None
    if not isinstance(waited, dict) or not waited.get("asked"):
        return None
    num = (int, float)
    return {**waited, "waited_s": waited["waited_s"] if isinstance(waited.get("waited_s"), num) else 0.0,
            "timeout_s": waited["timeout_s"] if isinstance(waited.get("timeout_s"), num) else 0.0,
            "polls": waited["polls"] if isinstance(waited.get("polls"), int) else 1}



# -- gpu.fabric.manager / gpu.fabric.nvlsm -----------------------------------------------------------

def _fabric_host(ctx: Any, what: str) -> tuple[dict[str, Any], Result | None]:
    """The nvml fact when the fabric software is worth judging here, else the result that says why not."""
    if not ctx.expect("gpu.nvswitch", False):
        return {}, Result.skipped(f"the profile ({ctx.settings.profile_name}) expects no NVSwitch: no {what} to judge")
    nvml, _, res = _tp_group(ctx)
    if res:
        return {}, res
    if fabric.readiness(nvml, ctx.settings.world_size).outcome == "no_fabric":
        return {}, Result.skipped(f"the GPUs report no NVSwitch fabric (NotSupported): no {what} runs here "
                                  f"(see gpu.fabric)")
    return nvml, None


def _fm_running(fm: dict[str, Any], sw: dict[str, Any]) -> tuple[bool | None, str]:
    """Is the fabric manager running: its unit active or its process seen; None when neither could be read."""
    unit = fm.get("unit")
    if fabric_software.unit_active(unit) or fm.get("pids"):
        return True, "running" + (f" (PID {fm['pids'][0]})" if fm.get("pids") else "")
    proc_seen = (sw.get("proc") or {}).get("readable") and (sw.get("proc") or {}).get("pid1") in ("systemd", "init")
    if fabric_software.unit_loaded(unit):
        return False, f"{fabric_software.FM_UNIT} is {unit.get('ActiveState')} ({unit.get('SubState')})"
    if proc_seen:
        return False, "no nv-fabricmanager process and no loaded nvidia-fabricmanager unit"
    return None, "neither systemd nor the host's processes could be read"


@check("gpu.fabric.manager", "Fabric manager installed, running, the driver's version (NVSwitch)",
       needs=("nvml", "fabric_software"), depends=("gpu.driver",))
def gpu_fabric_manager(ctx: Any) -> Result:
    """On NVSwitch hosts (profile gpu.nvswitch = true) the fabric manager must be installed at exactly
    the loaded driver's version: it checks the driver at start and refuses to run with another one,
    and the GPUs then never leave "In Progress". Compares the version of `nv-fabricmanager
    --version` and of its package (dpkg-query / rpm) with the driver's (NVML), and says which
    package to align with the exact apt/dnf command; then that it runs (systemd unit or process).
    Hosts whose GPUs report no fabric skip. By hand: `nv-fabricmanager --version`, `nvidia-smi`,
    `dpkg -l 'nvidia-fabricmanager*'` or `rpm -qa 'nvidia-fabric*'`."""
    nvml, res = _fabric_host(ctx, "fabric manager")
    if res:
        return res
    sw = ctx.fact("fabric_software")
    fm = sw.get("fabric_manager") or {}
    driver = nvml.get("driver_version")
    manager = sw.get("package_manager")
    versions = fabric_software.fm_versions(fm)
    details: dict[str, Any] = {"driver_version": driver, "versions": versions, "packages": fm.get("packages"),
                               "binary": fm.get("binary"), "unit": fm.get("unit"), "pids": fm.get("pids"),
                               "package_manager": manager}
    if not isinstance(driver, str) or not driver:
        return Result.blocked("the driver version was not read (see gpu.driver): nothing to compare the fabric "
                              "manager with", "gpu.driver", **details)
    align = fabric_software.align_commands(manager, fm.get("packages") or [], driver)
    if not versions:
        if manager and not sw.get("packages_error") and not fm.get("binary"):
            return Result.failed(f"the fabric manager is not installed (no package, no nv-fabricmanager); this "
                                 f"NVSwitch host needs the one of driver {driver}",
                                 Remediation(f"Install the fabric manager of driver {driver} and start it.",
                                             [*align, f"sudo systemctl enable --now {fabric_software.FM_UNIT}"]),
                                 **details)
        why = fm.get("binary_error") or sw.get("packages_error") or "no binary, no package database"
        return Result.not_judged(f"the fabric manager's version could not be read ({why})", **details)
    listing = fabric_software.version_mismatch(versions, driver)
    if listing:
        return Result.failed(
            f"fabric manager version differs from the driver {driver} ({listing}): it refuses to start, and the GPUs "
            f"stay 'In Progress'",
            Remediation(f"Install the fabric manager of the loaded driver, {driver}, then restart it. (If the driver "
                        f"is the one to change, install the driver of the fabric manager's version and reboot "
                        f"instead: both must be the same version.)",
                        [*align, f"sudo systemctl restart {fabric_software.FM_UNIT}",
                         "nvidia-smi -q | grep -i -A3 fabric"]), **details)
    running, how = _fm_running(fm, sw)
    details["running"] = running
    if running is False:
        return Result.failed(f"fabric manager {driver} (the driver's version) is installed but not running: {how}",
                             Remediation("Enable and start it; read its log if it stops again.",
                                         [f"sudo systemctl enable --now {fabric_software.FM_UNIT}",
                                          f"journalctl -u {fabric_software.FM_UNIT} -n 100"]), **details)
    if running is None:
        return Result.warned(f"fabric manager {driver}, the driver's version; whether it runs is unknown: {how}",
                             **details)
    return Result.passed(f"fabric manager {driver}, the driver's version ({', '.join(versions)}), {how}", **details)


@check("gpu.fabric.nvlsm", "NVLSM (NVLink subnet manager) installed and running (NVLink 5)",
       needs=("nvml", "fabric_software"), depends=("gpu.driver",), fixer="gpu.fabric.nvlsm")
def gpu_fabric_nvlsm(ctx: Any) -> Result:
    """NVLink 5 systems (HGX B200/B300: profile gpu.nvlink_generation = 5) program their NVSwitches
    through NVLSM, the NVLink subnet manager (package `nvlsm`, /opt/nvidia/nvlsm/sbin/nvlsm, kernel
    module ib_umad for the switches' management ports). The fabric manager's start script runs it
    (some builds ship an `nvlsm` / `nvidia-nvlsm` unit instead). Without it the fabric manager
    fails with NV_WARN_NOTHING_TO_DO, the GPUs stay "In Progress" and CUDA reports
    CUDA_ERROR_SYSTEM_NOT_READY. Checks the package or binary, and the running process or unit
    (read-only). Fixer: `modprobe ib_umad` and `systemctl enable --now` of the unit that runs it.
    By hand: `pgrep -x nvlsm`, `dpkg -l nvlsm`, `journalctl -u nvidia-fabricmanager`."""
    gen = ctx.expect("gpu.nvlink_generation")
    if not isinstance(gen, int) or gen < 5:
        return Result.skipped(f"NVLSM is needed on NVLink 5 NVSwitch hosts (B200/B300); profile "
                              f"{ctx.settings.profile_name} is NVLink {gen if gen is not None else '(unset)'}")
    nvml, res = _fabric_host(ctx, "NVLSM")
    if res:
        return res
    sw = ctx.fact("fabric_software")
    nv, fm = sw.get("nvlsm") or {}, sw.get("fabric_manager") or {}
    manager = sw.get("package_manager")
    pkgs = nv.get("packages") or []
    units = nv.get("units") or {}
    details: dict[str, Any] = {"packages": pkgs, "binary": nv.get("binary"), "pids": nv.get("pids"), "units": units,
                               "ib_umad_loaded": nv.get("ib_umad_loaded"), "fabric_manager_unit": fm.get("unit")}
    start = ["sudo " + " ".join(step) for step in fabric_software.nvlsm_start_plan(nv, fm)]
    if not pkgs and not nv.get("binary"):
        if not manager or sw.get("packages_error"):
            return Result.not_judged(f"whether NVLSM is installed could not be read ({sw.get('packages_error')})",
                                     **details)
        return Result.failed(f"NVLSM is not installed (no {fabric_software.NVLSM_PACKAGE} package, no "
                             f"{fabric_software.NVLSM_BINARY}): on NVLink 5 the fabric manager cannot bring up the "
                             f"NVSwitches and CUDA reports 'system not ready'",
                             Remediation("Install nvlsm, load ib_umad, restart the fabric manager (its start script "
                                         "runs NVLSM).", [*fabric_software.install_nvlsm_commands(manager), *start]),
                             **details)
    version = pkgs[0].get("version") if pkgs else None
    active_units = [u for u, info in units.items() if fabric_software.unit_active(info)]
    if nv.get("pids") or active_units:
        how = f"PID {nv['pids'][0]}" if nv.get("pids") else f"{active_units[0]} active"
        return Result.passed(f"NVLSM {version or '(version unknown)'} running ({how})", **details)
    proc = sw.get("proc") or {}
    if not (proc.get("readable") and proc.get("pid1") in ("systemd", "init")) and not any(
            fabric_software.unit_loaded(info) for info in units.values()):
        return Result.not_judged("NVLSM is installed; whether it runs cannot be seen from here (this /proc does not "
                                 "show the host's processes and no NVLSM unit is loaded)", **details)
    why = [] if nv.get("ib_umad_loaded") else ["the ib_umad module is not loaded"]
    if not fabric_software.unit_active(fm.get("unit")):
        why.append(f"{fabric_software.FM_UNIT} (which starts it) is "
                   f"{(fm.get('unit') or {}).get('ActiveState') or 'not running'}")
    pending = fabric.readiness(nvml, ctx.settings.world_size).outcome in ("pending", "failed")
    summary = "NVLSM is installed but not running" + (f": {'; '.join(why)}" if why else "")
    text = ("Load ib_umad and start NVLSM (through its unit, or the fabric manager whose start script runs it); "
            "`k26-doctor fix --apply` plans exactly these.")
    if fabric_software.version_mismatch(fabric_software.fm_versions(fm), nvml.get("driver_version")):
        text = ("First align the fabric manager with the driver (see gpu.fabric.manager): it refuses to start, and "
                "NVLSM with it. Then load ib_umad and start NVLSM through the fabric manager (or its own unit).")
    remedy = Remediation(text, start)
    if pending:
        return Result.failed(summary + " (the fabric is not up)", remedy, **details)
    return Result.warned(summary + "; the fabric is up now, but link recovery needs NVLSM", remedy, **details)


# -- gpu.p2p -------------------------------------------------------------------------------------------

@check("gpu.p2p", "P2P path: ACS redirect on the PCIe bridges, IOMMU translation (PCIe pairs)",
       needs=("nvml", "pcie"), depends=("gpu.driver",))
def gpu_p2p(ctx: Any) -> Result:
    """Why P2P over PCIe hangs or crawls while `nvidia-smi topo -p2p r` says OK: ACS (Access Control
    Services) P2P Request/Completion Redirect or Egress Control on a switch or root port between two
    GPUs sends their traffic up to the root complex, and an IOMMU that translates DMA (not
    passthrough) sits in that path; NCCL's first all-reduce then hangs. Reads the ACS Control
    register of every bridge above each GPU (sysfs configuration space: root needed for the extended
    space) and the IOMMU mode (the GPUs' IOMMU group type, /sys/class/iommu, the kernel command
    line). Only pairs whose P2P goes over PCIe are judged: NVLink P2P never crosses PCIe, so ACS and
    the IOMMU do not matter for an NVLink pair. Fix: `setpci -s BDF ECAP_ACS+6.w=0000` on each
    bridge named (the exact offset is given; not kept across reboots: set it from a boot unit or in
    the BIOS), and `iommu=pt` (`intel_iommu=on iommu=pt` on Intel) on the kernel command line. By
    hand: `sudo lspci -vvv | grep -i acsctl`, `cat /proc/cmdline`."""
    nvml, grp, res = _tp_group(ctx)
    if res:
        return res
    if len(grp) < 2:
        return Result.skipped(f"{len(grp)} GPU in the TP group: no pair", **{})
    nv_pairs, pcie_pairs = [], []
    for i, a in enumerate(grp):
        for b in grp[i + 1:]:
            pair = links.find_pair(nvml, a.get("index"), b.get("index"))
            (nv_pairs if (pair or {}).get("p2p_nvlink") == "ok" else pcie_pairs).append((a, b))
    details: dict[str, Any] = {"nvlink_pairs": len(nv_pairs), "pcie_pairs": [f"{_gpu(a)}-{_gpu(b)}"
                                                                             for a, b in pcie_pairs]}
    if not pcie_pairs:
        try:
            details["readings"] = _pcie_readings(ctx.fact("pcie"))
        except MalformedFact:
            raise
        except FactUnavailable as exc:
            details["readings"] = f"not read: {exc.reason}"
        return Result.passed(f"all {len(nv_pairs)} pair(s) use NVLink: ACS and the IOMMU do not affect NVLink P2P "
                             f"(PCIe readings in details)", **details)
    pcie = ctx.fact("pcie")
    by_bdf = {g.get("bdf"): g for g in pcie.get("gpus") or [] if isinstance(g, dict) and isinstance(g.get("bdf"), str)}
    iommu = pcie.get("iommu") if isinstance(pcie.get("iommu"), dict) else {}
    mode = iommu.get("mode") if iommu.get("mode") in ("passthrough", "translated", "off") else "unknown"
    redirect: dict[str, list[str]] = {}  # bridge -> pairs
    unread: dict[str, str] = {}
    acs_of: dict[str, dict[str, Any]] = {}
    not_found, rows = [], []
    for a, b in pcie_pairs:
        name = f"{_gpu(a)}-{_gpu(b)}"
        ga, gb = (by_bdf.get(pcie_mod.norm_bdf(d.get("pci_bus_id") or "")) for d in (a, b))
        if ga is None or gb is None:
            not_found.append(name)
            continue
        path = pcie_mod.path_bridges(pcie_mod.gpu_upstream(ga), pcie_mod.gpu_upstream(gb))
        row: dict[str, Any] = {"pair": name, "bridges": path, "redirect": [], "unread": []}
        for br in path:
            acs = acs_of.setdefault(br, pcie_mod.bridge_acs(pcie, br))
            if acs["redirects"]:
                redirect.setdefault(br, []).append(name)
                row["redirect"].append(br)
            elif acs["present"] is None:
                unread[br] = acs["error"] or "not read"
                row["unread"].append(br)
        rows.append(row)
    details.update(pairs=rows, iommu=iommu, bridges=acs_of)
    problems, cmds = [], []
    if redirect:
        bits: set[str] = set()
        for br in redirect:
            bits.update(pcie_mod.acs_names(acs_of[br]["enabled"], pcie_mod.REDIRECT_BITS) or
                        [n.replace("_", " ") for n in acs_of[br]["redirects"]])
            cmd = pcie_mod.setpci_command(acs_of[br])
            if cmd:
                cmds.append(cmd)
        hit = sorted({p for pairs in redirect.values() for p in pairs})
        names = list(redirect)
        problems.append(f"ACS {' + '.join(sorted(bits))} on {len(names)} bridge(s) ({', '.join(names[:4])}"
                        f"{' ...' if len(names) > 4 else ''}) under {len(hit)} pair(s)")
        details["redirecting_bridges"] = redirect
    if mode == "translated":
        problems.append(f"the IOMMU translates the GPUs' DMA ({iommu.get('why')})")
        cmds += pcie_mod.iommu_fix(iommu.get("vendor"))[1]
    if problems:
        fix = ("P2P over PCIe then goes through the root complex: the first all-reduce hangs or crawls although "
               "`nvidia-smi topo -p2p r` says OK. ")
        if redirect:
            fix += ("Clear ACS control on the bridges named (setpci at the ACS capability's control register, "
                    "ECAP_ACS+6; lost at reboot: run it from a boot unit, or disable ACS in the BIOS). ")
        if mode == "translated":
            fix += f"Put the IOMMU in passthrough: add `{pcie_mod.iommu_fix(iommu.get('vendor'))[0]}` to the kernel " \
                   f"command line and reboot."
        return Result.failed(f"P2P of {len(pcie_pairs)} PCIe pair(s) goes through the root complex: "
                             + "; ".join(problems),
                             Remediation(fix.strip(), cmds), **details)
    if not_found and len(not_found) == len(pcie_pairs):
        errors = [str(e) for e in pcie.get("errors") or []] if isinstance(pcie.get("errors"), list) else []
        return Result.not_judged("the GPUs were not found in sysfs" + (f" ({'; '.join(errors)})" if errors else "")
                              + ": cannot read their PCIe path", **details)
    if unread:
        why = next(iter(unread.values()))
        return Result.not_judged(f"ACS of {len(unread)} bridge(s) on the PCIe P2P path not readable ({why}); IOMMU "
                              f"{mode}; run `sudo k26-doctor check --only gpu.p2p` to judge it", **details)
    seen = len(details["bridges"])
    where = (f"no ACS redirect on the {seen} bridge(s) between them" if seen else
             "no PCIe bridge is visible between them (a virtual machine shows none of the host's bridges)")
    if mode == "unknown":
        return Result.warned(f"{len(pcie_pairs)} PCIe pair(s): {where}, but the IOMMU mode is unknown "
                             f"({iommu.get('why')})", **details)
    return Result.passed(f"{len(pcie_pairs)} PCIe pair(s): {where}; IOMMU {mode}", **details)


def _pcie_readings(pcie: Any) -> dict[str, Any]:
    """A short account of the PCIe readings, for a verdict that did not need them."""
    if not isinstance(pcie, dict):
        return {}
    bridges = [str(b) for b in pcie["bridges"]] if isinstance(pcie.get("bridges"), dict) else []
    acs = [pcie_mod.bridge_acs(pcie, b) for b in bridges]
    iommu = pcie.get("iommu") if isinstance(pcie.get("iommu"), dict) else {}
    return {"iommu": iommu.get("mode"), "bridges": len(bridges),
            "bridges_with_acs_redirect": sorted(a["bdf"] for a in acs if a["redirects"]),
            "bridges_unread": sorted(a["bdf"] for a in acs if a["present"] is None)}

# -- gpu.p2p_bandwidth (--deep) ----------------------------------------------------------------------

@check("gpu.p2p_bandwidth", "Measured GPU-to-GPU copy bandwidth of every pair (--deep)",
       needs=("nvml", "p2p_bandwidth"), depends=("gpu.driver", "python.venv"), deep=True, timeout=330)
def gpu_p2p_bandwidth(ctx: Any) -> Result:
    """With --deep: copies 256 MiB 20 times between every ordered pair of the TP group, with torch
    in the service's interpreter, and compares the one-direction rate with what the links should
    carry (active NVLinks x per-link rate of the NVLink version: 25 GB/s for NVLink 4, 50 for
    NVLink 5; on PCIe, lanes x per-lane rate). Required: at least 50% (gpu.min_p2p_bandwidth_fraction);
    below 70% warns. Copy-engine copies on healthy links typically reach 80-90% of the link rate, a link down
    costs only 1/18 (gpu.nvlink catches that), while traffic falling back to PCIe or staged
    through the host reaches under 15% of NVLink: 50% separates the two with room for noise.
    Each pair runs in a child process of its own under a deadline (30 s): a copy that never
    completes (P2P through a root complex with ACS redirect or a translating IOMMU: see gpu.p2p)
    fails that pair, named, instead of hanging the run.
    By hand: nvbandwidth, or `nvidia-smi nvlink -gt d` while copying."""
    nvml, res = _nvml(ctx)
    if res:
        return res
    bw = ctx.fact("p2p_bandwidth")
    if not isinstance(bw, dict):
        return Result.failed("the p2p_bandwidth fact is malformed", fact_type=type(bw).__name__)
    grp = _group(ctx, nvml)
    details: dict[str, Any] = {"local_copy": bw.get("local"), "torch": bw.get("torch"), "python": bw.get("python")}
    if not bw.get("measured"):
        reason = bw.get("reason") or bw.get("error") or "not measured"
        if bw.get("probe_failed"):
            return Result.errored(str(reason), **details)
        if "only with --deep" in str(reason):
            return Result.skipped(str(reason), **details)
        return Result.failed(f"could not measure: {reason}",
                             Remediation("The service's torch must see the GPUs and copy between them.",
                                         [f"{shlex.quote(str(bw.get('python') or 'python3'))} -c 'import torch; "
                                          f"print(torch.cuda.device_count())'"]), **details)
    if len(grp) < 2:
        return Result.skipped(f"{len(grp)} GPU in the TP group: no pair to measure", **details)
    min_frac = float(ctx.expect("gpu.min_p2p_bandwidth_fraction", MIN_BANDWIDTH_FRACTION))
    warn_frac = float(ctx.expect("gpu.warn_p2p_bandwidth_fraction", WARN_BANDWIDTH_FRACTION))
    measured: dict[tuple[int, int], dict[str, Any]] = {}
    for p in bw.get("pairs") or []:
        if isinstance(p, dict) and isinstance(p.get("src"), int) and isinstance(p.get("dst"), int):
            measured[(p["src"], p["dst"])] = p
    gen = ctx.expect("gpu.nvlink_generation")
    rows, low, warn, missing, corrupt, unjudged = [], [], [], [], [], []
    for i, a in enumerate(grp):
        for b in grp[i + 1:]:
            ca, cb = a.get("cuda_index", i), b.get("cuda_index", grp.index(b))
            name = f"{_gpu(a)}-{_gpu(b)}"
            got = [measured.get((ca, cb)), measured.get((cb, ca))]
            if any(g is None for g in got):
                missing.append(name)
                continue
            rate = min(float(g.get("gb_per_s") or 0) for g in got)
            if any(g.get("data_ok") is False for g in got):
                corrupt.append(name)
            expect, how = links.expected_pair_gbps(nvml, a, b, gen if isinstance(gen, int) else None)
            frac = rate / expect if expect else None
            rows.append({"pair": name, "gb_per_s": rate, "expected_gb_per_s": expect, "basis": how,
                         "fraction": round(frac, 3) if frac is not None else None,
                         "peer_access": all(g.get("peer_access") for g in got)})
            if frac is None:
                unjudged.append(name)
            elif frac < min_frac:
                low.append(f"{name} {rate:.0f} GB/s ({frac:.0%} of {expect:.0f})")
            elif frac < warn_frac:
                warn.append(f"{name} {rate:.0f} GB/s ({frac:.0%} of {expect:.0f})")
    by_cuda = {d.get("cuda_index", i): _gpu(d) for i, d in enumerate(grp)}
    failed = []
    for f in bw.get("failed_pairs") or []:
        if isinstance(f, dict) and isinstance(f.get("a"), int) and isinstance(f.get("b"), int):
            name = f"{by_cuda.get(f['a'], 'GPU' + str(f['a']))}-{by_cuda.get(f['b'], 'GPU' + str(f['b']))}"
            failed.append(f"{name} ({'hung: ' if f.get('timed_out') else ''}{f.get('error') or 'failed'})")
            missing = [m for m in missing if m != name]
    details.update(pairs=rows, min_fraction=min_frac, warn_fraction=warn_frac, missing=missing,
                   failed_pairs=bw.get("failed_pairs") or [])
    cmds = ["nvidia-smi topo -m", "nvidia-smi nvlink -s", "nvidia-smi -q | grep -i -A3 fabric"]
    if failed:
        return Result.failed(f"GPU-to-GPU copies did not complete for {len(failed)} pair(s): " + ", ".join(failed[:6])
                             + (" ..." if len(failed) > 6 else ""),
                             Remediation("A copy that never completes is P2P routed through the root complex (ACS "
                                         "redirect, an IOMMU translating DMA: see gpu.p2p) or a fabric that is not "
                                         "up (gpu.fabric). Do not start the service: its first all-reduce would hang.",
                                         ["k26-doctor check --only gpu.p2p --only 'gpu.fabric*' -v", *cmds]),
                             **details)
    if corrupt:
        return Result.failed("GPU-to-GPU copies returned wrong data: " + ", ".join(corrupt),
                             Remediation("Do not run the service on these GPUs; check the kernel log for Xid errors.",
                                         ["sudo dmesg | grep -i xid"]), **details)
    if low:
        return Result.failed(f"copy bandwidth below {min_frac:.0%} of the links' rate: " + ", ".join(low[:6]),
                             Remediation("Traffic is not taking the links it should (P2P off, PCIe fallback, "
                                         "degraded fabric).", cmds), **details)
    if not rows:
        return Result.errored("no pair of the TP group was measured", **details)
    if len(unjudged) == len(rows):
        return Result.not_judged("measured, but the links' expected rate is unknown: "
                              + ", ".join(f"{r['pair']} {r['gb_per_s']:.0f} GB/s" for r in rows[:6]), **details)
    worst = min((r for r in rows if r["fraction"] is not None), key=lambda r: r["fraction"])
    summary = (f"{len(rows)} pair(s), lowest {worst['pair']} {worst['gb_per_s']:.0f} GB/s "
               f"({worst['fraction']:.0%} of {worst['expected_gb_per_s']:.0f} GB/s, {worst['basis']})")
    if warn or missing:
        extra = ([f"below {warn_frac:.0%}: " + ", ".join(warn[:6])] if warn else []) + (
            [f"not measured (probe budget): {', '.join(missing[:6])}"] if missing else [])
        return Result.warned(summary + "; " + "; ".join(extra), Remediation("Lower than a healthy link gives.", cmds),
                             **details)
    return Result.passed(summary, **details)
