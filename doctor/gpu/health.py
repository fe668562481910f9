"""The GPUs' health as NVML reads it (gpu.health): lost GPUs, ECC, row remapping, retired pages, MIG mode, clock
events, persistence. What fails needs a reset or a replacement; what warns makes the service slower or less safe."""

from __future__ import annotations

import re
from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.gpu.group import label, tp_group
from doctor.gpu.nvml_fact import Device, NvmlFact

SLOWDOWN_REASONS = {"hw_slowdown": "hardware slowdown", "hw_thermal_slowdown": "hardware thermal slowdown",
                    "sw_thermal_slowdown": "software thermal slowdown",
                    "hw_power_brake_slowdown": "hardware power brake"}
READINGS = ("lost", "ecc_mode", "ecc_uncorrected", "row_remap", "retired_pages_pending", "mig_mode",
            "clock_event_names", "persistence_mode", "temperature_c")


class Reading:
    """One GPU's health: what fails, what warns, the commands that help, and how many readings could judge."""

    def __init__(self) -> None:
        self.fails: list[str] = []
        self.warns: list[str] = []
        self.cmds: set[str] = set()
        self.judged = 0


def read_device(d: Device, mig_allowed: bool, into: Reading) -> None:
    g, errs = label(d), d.get("errors") or {}
    if d.get("lost") or "handle" in errs:
        into.fails.append(f"{g} is lost or unreachable ({errs.get('handle', 'GpuIsLost')}): it fell off the bus")
        into.cmds.update({"sudo dmesg | grep -i xid", "sudo reboot"})
        return
    reset = f"sudo nvidia-smi -r -i {d.get('index')}"
    vol = (d.get("ecc_uncorrected") or {}).get("volatile")
    if isinstance(vol, int):
        into.judged += 1
        if vol > 0:
            into.fails.append(f"{g} has {vol} uncorrected ECC error(s) since the driver loaded")
            into.cmds.add(reset)
    remap = d.get("row_remap")
    if isinstance(remap, dict):
        into.judged += 1
        if remap.get("failure"):
            into.fails.append(f"{g}: row remapping failed (the GPU needs replacing)")
        elif remap.get("pending"):
            into.fails.append(f"{g}: row remapping pending (reset the GPU to apply it)")
            into.cmds.add(reset)
    if d.get("retired_pages_pending") is True:
        into.judged += 1
        into.fails.append(f"{g}: retired pages pending (reset the GPU to retire them)")
        into.cmds.add(reset)
    mig = d.get("mig_mode")
    if isinstance(mig, dict):
        into.judged += 1
        if (mig.get("current") or mig.get("pending")) and not mig_allowed:
            into.fails.append(f"{g}: MIG mode {'on' if mig.get('current') else 'pending'} (the service needs the "
                              "whole GPU)")
            into.cmds.add(f"sudo nvidia-smi -i {d.get('index')} -mig 0")
    read_slowdowns(d, g, into)


def read_slowdowns(d: Device, g: str, into: Reading) -> None:
    names = d.get("clock_event_names")
    if isinstance(names, list):
        into.judged += 1
        slow = [SLOWDOWN_REASONS[n] for n in names if n in SLOWDOWN_REASONS]
        if slow:
            into.warns.append(f"{g}: clocks held down by {', '.join(slow)}")
            into.cmds.add("nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER")
    if d.get("persistence_mode") == 0:
        into.warns.append(f"{g}: persistence mode off")
        into.cmds.add("sudo systemctl enable --now nvidia-persistenced")
    ecc_mode = d.get("ecc_mode")
    if isinstance(ecc_mode, dict) and ecc_mode.get("current") == 0:
        into.warns.append(f"{g}: ECC disabled")


def per_gpu(d: Device) -> dict[str, Any]:
    errs = d.get("errors") or {}
    out: dict[str, Any] = {k: d.get(k) for k in READINGS}
    out["not_supported"] = sorted(k for k, v in errs.items() if v == "NotSupported")
    out["errors"] = {k: v for k, v in errs.items() if v != "NotSupported"}
    return out


def judge_health(nvml: NvmlFact, settings: Settings) -> Findings:
    grp = tp_group(nvml, settings.world_size)
    mig_allowed = bool(settings.gpu.mig_allowed)
    seen = Reading()
    for d in grp:
        read_device(d, mig_allowed, seen)
    out = Findings(per_gpu={label(d): per_gpu(d) for d in grp})
    if seen.fails:
        fix = Remediation("Reset or replace the GPUs named; see the kernel log for Xid errors.", sorted(seen.cmds))
        for line in seen.fails:
            out.fail("gpu.health.fault", line, fix)
        return out
    if seen.judged == 0:
        raise NotJudged.missing("no health reading was available for any GPU", **out.details)
    if seen.warns:
        fix = Remediation("Not fatal, but slower or less safe.", sorted(seen.cmds))
        for line in seen.warns:
            out.warn("gpu.health.degraded", line, fix)
        return out
    return out.info("gpu.health.healthy", f"{len(grp)} GPU(s) healthy: no uncorrected ECC error, no remapping "
                    "pending, MIG off, no slowdown")



NARROW_LINK = "gpu.pcie_width.narrow"
WIDTH_READS = ("pcie.width_current", "pcie.width_max")


def link_width(d: Device) -> tuple[int, int] | None:
    """(current, max) lanes of a GPU's PCIe link as NVML read them, or None when either was not read."""
    pcie = d.get("pcie") or {}
    cur, top = pcie.get("width_current"), pcie.get("width_max")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (cur, top))
    return (int(cur), int(top)) if ok else None  # type: ignore[arg-type]


def width_readings(grp: list[Device]) -> tuple[dict[str, tuple[int, int]], list[str], list[str]]:
    """The TP group's link widths by GPU, the GPUs NVML cannot read them on (NotSupported), and those whose
    reading is missing for another reason."""
    widths: dict[str, tuple[int, int]] = {}
    unsupported: list[str] = []
    unread: list[str] = []
    for d in grp:
        width = link_width(d)
        if width is not None:
            widths[label(d)] = width
        elif any((d.get("errors") or {}).get(k) == "NotSupported" for k in WIDTH_READS):
            unsupported.append(label(d))
        else:
            unread.append(label(d))
    return widths, unsupported, unread


def lspci_command(d: Device) -> str:
    """``lspci`` on this GPU's bus id (NVML's 8-digit domain cut to lspci's 4): its LnkCap against LnkSta. A bus id
    that is not one (a damaged or hostile snapshot) never reaches the command line."""
    bus = re.fullmatch(r"(?:[0-9a-fA-F]{4})?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])",
                       str(d.get("pci_bus_id") or ""))
    where = f"-s {bus.group(1)} " if bus else ""
    return f"sudo lspci -vv {where}| grep -E 'LnkCap:|LnkSta:'"


def warn_narrow(out: Findings, narrow: list[Device], widths: dict[str, tuple[int, int]]) -> Findings:
    fix = Remediation("Reseat the GPU or have its riser, cable or slot replaced; a reboot retrains the link. "
                      "lspci's LnkSta shows the width the link trained at, LnkCap the width it can do.",
                      [*sorted({lspci_command(d) for d in narrow}), "nvidia-smi --query-gpu=index,pci.bus_id,"
                       "pcie.link.width.current,pcie.link.width.max --format=csv"])
    for d in narrow:
        cur, top = widths[label(d)]
        out.warn(NARROW_LINK, f"{label(d)}: PCIe link at x{cur} of x{top}: host-to-device copies at "
                 f"{cur / top:.0%} of the rate", fix)
    return out


def judge_pcie_width(nvml: NvmlFact, settings: Settings) -> Findings:
    """gpu.pcie_width: every GPU of the TP group has its PCIe link at its full width. A link that trained narrower
    (x8 of x16: a riser, retimer or slot fault, a card not seated) stays so until it is retrained, and every
    host-to-device copy runs at that fraction: the weights' load, and the all-reduce on hosts without NVLink.
    The generation is recorded, not judged: GPUs lower it while idle to save power and raise it under load."""
    grp = tp_group(nvml, settings.world_size)
    out = Findings(per_gpu={label(d): {**(d.get("pcie") or {}), "bus": d.get("pci_bus_id")} for d in grp})
    widths, unsupported, unread = width_readings(grp)
    if unread:
        raise NotJudged.missing(f"the PCIe link width of {', '.join(unread)} was not read (fact nvml)", **out.details)
    if not widths:
        raise NotJudged.inapplicable("NVML reads no PCIe link width on these GPUs (NotSupported)", **out.details)
    narrow = [d for d in grp if label(d) in widths and widths[label(d)][0] < widths[label(d)][1]]
    if narrow:
        return warn_narrow(out, narrow, widths)
    also = f"; {', '.join(unsupported)}: NotSupported" if unsupported else ""
    lanes = sorted({f"x{top}" for _cur, top in widths.values()})
    return out.info("gpu.pcie_width.full", f"{len(widths)} GPU(s) with their PCIe link at full width "
                    f"({', '.join(lanes)}){also}")
