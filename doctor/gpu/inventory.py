"""What the GPUs are: the driver and NVML, how many the service sees, their architecture and memory. Judgements
of the ``nvml`` fact for gpu.driver, gpu.count, gpu.arch and gpu.memory."""

from __future__ import annotations

from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.gpu.group import GIB, available, compute_capability, gib, label, profiles_for, tp_group
from doctor.gpu.nvml_fact import NvmlFact

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
UNKNOWN_DRIVER_REMEDY = ("Check the driver installation and the kernel log.",
                         ["nvidia-smi", "sudo dmesg | grep -i -E 'nvrm|xid'"])


def judge_driver(nvml: NvmlFact) -> Findings:
    """NVML loaded, its library and the kernel module of one version, the driver version read."""
    kind = str(nvml.get("error_kind") or "")
    if not nvml.get("available"):
        text, cmds = DRIVER_REMEDIES.get(kind, UNKNOWN_DRIVER_REMEDY)
        return Findings(error_kind=kind or None, kernel_module_version=nvml.get("kernel_module_version")).fail(
            "gpu.driver.nvml_unavailable", nvml.get("error") or "NVML is not available", Remediation(text, cmds))
    driver, kmod = nvml.get("driver_version"), nvml.get("kernel_module_version")
    out = Findings(driver_version=driver, cuda_driver_version=nvml.get("cuda_driver_version"),
                   nvml_version=nvml.get("nvml_version"), kernel_module_version=kmod,
                   pynvml_version=nvml.get("pynvml_version"), device_count_total=nvml.get("device_count_total"),
                   nvml_elapsed_s=nvml.get("elapsed_s"))
    if driver and kmod and driver != kmod:
        text, cmds = DRIVER_REMEDIES["LibRmVersionMismatch"]
        return out.fail("gpu.driver.module_mismatch", f"NVML library is {driver} but the loaded kernel module is "
                        f"{kmod}", Remediation(text, cmds))
    if not driver:
        why = (nvml.get("errors") or {}).get("driver_version", "not recorded")
        return out.warn("gpu.driver.version_unread", f"NVML loaded but the driver version could not be read ({why})",
                        "Check `nvidia-smi`; the other GPU checks still judge what NVML reports.")
    cuda = nvml.get("cuda_driver_version")
    cuda_s = f"CUDA {cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else "CUDA version unknown"
    return out.info("gpu.driver.loaded", f"NVIDIA driver {driver} ({cuda_s}), {nvml.get('device_count_total', 0)} "
                    "GPU(s)")


def judge_count(nvml: NvmlFact, settings: Settings) -> Findings:
    """The GPUs the service will see (CUDA_VISIBLE_DEVICES as CUDA reads it) against TP x PP x DP."""
    want = settings.world_size
    nvml = available(nvml)
    vis = nvml.get("visible") or {}
    cvd = vis.get("cuda_visible_devices")
    devices = nvml.get("devices") or []
    total = nvml.get("device_count_total")
    total = len(devices) if total is None else total
    out = Findings(visible=len(devices), required=want, device_count_total=total, cuda_visible_devices=cvd,
                   visible_nvml_indices=[d.get("index") for d in devices], problems=vis.get("problems") or [])
    if vis.get("mig_entries"):
        return out.fail("gpu.count.mig", f"CUDA_VISIBLE_DEVICES names MIG devices ({', '.join(vis['mig_entries'])}): "
                        f"TP{settings.tp} needs whole GPUs",
                        Remediation("Disable MIG and list whole GPUs (or unset CUDA_VISIBLE_DEVICES).",
                                    ["nvidia-smi -L", "sudo nvidia-smi -mig 0"]))
    if vis.get("problems"):
        return out.fail("gpu.count.visible_devices", f"{len(devices)} GPU(s) visible, {want} needed: "
                        + "; ".join(vis["problems"]),
                        Remediation("Fix CUDA_VISIBLE_DEVICES in the service's environment (indices or GPU- UUIDs "
                                    "from `nvidia-smi -L`), or unset it.", ["nvidia-smi -L"]))
    if len(devices) < want:
        if cvd is not None and total >= want:
            text = (f"CUDA_VISIBLE_DEVICES={cvd!r} hides GPUs: this host has {total}. List {want} of them or "
                    f"unset it in the service's environment.")
        else:
            text = (f"This host has {total} GPU(s); the profile runs TP{settings.tp} over {want}. Use a host "
                    f"with {want} GPUs (or a profile made for this one).")
        return out.fail("gpu.count.too_few", f"{len(devices)} GPU(s) visible, TP x PP x DP = {want} needed",
                        Remediation(text, ["nvidia-smi -L"]))
    if len(devices) > want:
        return out.info("gpu.count.more", f"{len(devices)} GPUs visible; the service uses the first {want}")
    return out.info("gpu.count.exact", f"{want} GPU(s) visible, as TP x PP x DP = {want} needs")


def _mixed_listing(grp: list[dict[str, Any]], kinds: list[tuple[str, tuple[int, int] | None]]) -> str:
    """``NAME 9.0: GPU0,GPU1; NAME 8.0: GPU2``: which GPUs are of which kind, for a mixed TP group."""
    def of_kind(d: dict[str, Any], n: str, cc: tuple[int, int] | None) -> bool:
        return (d.get("name") or "?") == n and compute_capability(d.get("compute_capability")) == cc

    return "; ".join(f"{n} {cc[0]}.{cc[1]}: " + ",".join(label(d) for d in grp if of_kind(d, n, cc))
                     for n, cc in kinds if cc is not None)


def _other_gpu(out: Findings, count: int, name: str, cc: tuple[int, int], want: tuple[int, int],
               settings: Settings) -> Findings:
    """GPUs of another compute capability than the profile's: the fix names the built-in profile made for them."""
    better = profiles_for(cc, name)
    hint = (f"Use the profile made for these GPUs: --profile {better[0]}" if better
            else "No built-in profile targets these GPUs; write a profile for them (--profile FILE.toml).")
    out.details["matching_profiles"] = better
    return out.fail("gpu.arch.other_gpu", f"{count}x {name} is compute capability {cc[0]}.{cc[1]} "
                    f"(sm_{cc[0]}{cc[1]}); profile {settings.profile_name} expects {want[0]}.{want[1]} "
                    f"(sm_{want[0]}{want[1]})",
                    Remediation(hint, [f"k26-doctor check --profile {better[0]}"] if better else []))


def _wanted_cc(settings: Settings) -> tuple[int, int]:
    """The profile's compute capability; without a valid one there is nothing to judge against (``NotJudged``)."""
    want_raw = settings.gpu.compute_capability
    want = compute_capability(want_raw)
    if want is None:
        raise NotJudged.missing(f"the profile names no valid gpu.compute_capability ({want_raw!r})",
                                "Set [gpu] compute_capability (e.g. \"10.3\") in the profile or config.")
    return want


def judge_arch(nvml: NvmlFact, settings: Settings) -> Findings:
    """Every GPU of the TP group of one kind, of the profile's compute capability (else the profile for it)."""
    grp = tp_group(nvml, settings.world_size)
    want = _wanted_cc(settings)
    seen = {label(d): (d.get("name"), d.get("compute_capability")) for d in grp}
    out = Findings(expected=f"{want[0]}.{want[1]}",
                   gpus={k: {"name": n, "compute_capability": cc} for k, (n, cc) in seen.items()})
    unread = [f"{label(d)}: {(d.get('errors') or {}).get('compute_capability', 'not read')}"
              for d in grp if compute_capability(d.get("compute_capability")) is None]
    if unread:
        raise NotJudged.failing("could not read the compute capability of " + ", ".join(unread), **out.details)
    kinds = sorted({(d.get("name") or "?", compute_capability(d.get("compute_capability"))) for d in grp}, key=str)
    if len(kinds) > 1:
        return out.fail("gpu.arch.mixed", f"mixed GPUs in the TP group: {_mixed_listing(grp, kinds)}",
                        Remediation("Use identical GPUs for one TP group: set CUDA_VISIBLE_DEVICES to GPUs of one "
                                    "kind.", ["nvidia-smi -L"]))
    name, cc = kinds[0]
    assert cc is not None
    out.details["found"] = f"{cc[0]}.{cc[1]}"
    if cc != want:
        return _other_gpu(out, len(grp), name, cc, want, settings)
    name_want = settings.gpu.name_contains
    if name_want and str(name_want) not in str(name):
        return out.warn("gpu.arch.other_name", f"{name} has compute capability {cc[0]}.{cc[1]} as expected, but the "
                        f"profile is for {name_want} GPUs (memory and link figures may differ)")
    return out.info("gpu.arch.match", f"{len(grp)}x {name}, compute capability {cc[0]}.{cc[1]} (sm_{cc[0]}{cc[1]})")


def _memory_rows(grp: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per GPU: its label, index and what NVML said of its memory (total, free, used), for the details."""
    rows: list[dict[str, Any]] = []
    for d in grp:
        m = d.get("memory")
        rows.append({"gpu": label(d), "index": d.get("index"),
                     **({k: m.get(k) for k in ("total", "free", "used")} if isinstance(m, dict) else {})})
    return rows


def _memory_unread(grp: list[dict[str, Any]]) -> list[str]:
    """``GPU3: <error>`` for every GPU whose total or free memory was not read as a number."""
    def read(d: dict[str, Any]) -> bool:
        m = d.get("memory") or {}
        return isinstance(m.get("total"), int) and isinstance(m.get("free"), int)

    return [f"{label(d)}: {(d.get('errors') or {}).get('memory', 'not read')}" for d in grp if not read(d)]


def _too_small(out: Findings, grp: list[dict[str, Any]], totals: list[int], min_gib: Any) -> Findings | None:
    """GPUs below the profile's minimum memory (when the profile sets one): a failure, the model does not fit."""
    if not isinstance(min_gib, (int, float)):
        return None
    out.details["min_memory_gib"] = min_gib
    small = [f"{label(d)} {gib(t)}" for d, t in zip(grp, totals, strict=True) if t < min_gib * GIB]
    if not small:
        return None
    return out.fail("gpu.memory.small", f"GPU memory below the profile's {min_gib} GiB: " + ", ".join(small),
                    Remediation("Use GPUs with more memory or the profile made for these GPUs.",
                                ["nvidia-smi --query-gpu=index,name,memory.total --format=csv"]))


def _held(out: Findings, grp: list[dict[str, Any]], totals: list[int], frees: list[int], frac: Any) -> Findings | None:
    """GPUs with less free memory than the server reserves (``mem_fraction_static`` of the total): a warning,
    something else holds them now."""
    if not (isinstance(frac, (int, float)) and 0 < frac <= 1):
        return None
    short = [f"{label(d)} {gib(f)} free of {gib(t)}" for d, t, f in zip(grp, totals, frees, strict=True)
             if f < frac * t]
    if not short:
        return None
    return out.warn("gpu.memory.held", f"less free memory than the server reserves ({frac:g} of the total): "
                    + ", ".join(short),
                    Remediation("Free the GPUs (see gpu.idle) or lower server.mem_fraction_static.",
                                ["nvidia-smi"]))


def judge_memory(nvml: NvmlFact, settings: Settings) -> Findings:
    """Each GPU's total memory against the profile's minimum, its free memory against what the server reserves."""
    grp = tp_group(nvml, settings.world_size)
    unread = _memory_unread(grp)
    out = Findings(per_gpu=_memory_rows(grp))
    if unread:
        raise NotJudged.failing("could not read memory of " + ", ".join(unread), **out.details)
    totals = [int(d["memory"]["total"]) for d in grp]  # type: ignore[index]
    frees = [int(d["memory"]["free"]) for d in grp]  # type: ignore[index]
    out.details.update(total_min_bytes=min(totals), free_min_bytes=min(frees), free_total_bytes=sum(frees))
    small = _too_small(out, grp, totals, settings.gpu.min_memory_gib)
    if small is not None:
        return small
    held = _held(out, grp, totals, frees, settings.server.mem_fraction_static)
    if held is not None:
        return held
    return out.info("gpu.memory.enough", f"{len(grp)} GPU(s), {gib(min(totals))} each at least, {gib(min(frees))} "
                    "free at least")
