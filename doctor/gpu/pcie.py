"""Why GPU-to-GPU traffic over PCIe is slow or hangs: ACS on the bridges above each GPU, and the IOMMU.

With ACS (Access Control Services) P2P Request/Completion Redirect or Egress Control enabled on a
PCIe switch port or root port, a peer-to-peer write from one GPU to another is sent up to the root
complex instead of across the switch; with the IOMMU translating DMA (not passthrough) it is
translated there too. NCCL's first all-reduce then hangs or crawls while ``nvidia-smi topo -p2p r``
still says OK. NVLink traffic never crosses PCIe, so none of this matters for a pair joined by
NVLink: only pairs whose P2P path is PCIe are judged.

Read-only, from sysfs (the root is a parameter so tests build a tree in a temporary directory):

* ``<sys>/bus/pci/devices/<bdf>`` is a link into ``<sys>/devices/pci<dom>:<bus>/<root port>/.../<bdf>``:
  the path components between the root bus and the GPU are its upstream bridges, nearest last;
* ``<sys>/bus/pci/devices/<bdf>/config`` is the configuration space: 4096 bytes for root, 64 for
  everyone else (the extended capabilities, where ACS lives, need root);
* the ACS extended capability (ID 0x000D) is found by walking the extended capability list from
  offset 0x100; its Control register is at capability + 6;
* ``<sys>/bus/pci/devices/<bdf>/iommu_group`` -> ``<sys>/kernel/iommu_groups/N/type`` says
  ``identity`` (passthrough) or ``DMA`` / ``DMA-FQ`` (translated); ``<sys>/class/iommu`` names the
  IOMMU (``dmar*`` Intel VT-d, ``ivhd*`` AMD-Vi); ``/proc/cmdline`` the kernel parameters.
"""

from __future__ import annotations

import os
import re
from typing import Any

from doctor.core.fileio import open_regular

EXT_CAP_START = 0x100
CONFIG_SPACE_SIZE = 4096
STANDARD_SIZE = 256
ACS_CAP_ID = 0x000D
ACS_CAPABILITY_OFFSET = 4  # 16-bit ACS Capability register, from the capability's start
ACS_CONTROL_OFFSET = 6  # 16-bit ACS Control register
MAX_EXT_CAPS = (CONFIG_SPACE_SIZE - EXT_CAP_START) // 4  # a list longer than this has a loop

# ACS Control (and Capability) bits, PCIe Base Specification 7.7.8.
ACS_BITS = {0: ("source_validation", "Source Validation"), 1: ("translation_blocking", "Translation Blocking"),
            2: ("p2p_request_redirect", "P2P Request Redirect"),
            3: ("p2p_completion_redirect", "P2P Completion Redirect"),
            4: ("upstream_forwarding", "Upstream Forwarding"), 5: ("p2p_egress_control", "P2P Egress Control"),
            6: ("direct_translated_p2p", "Direct Translated P2P")}
# The bits that send peer-to-peer requests up to the root complex instead of across the switch.
REDIRECT_BITS = ("p2p_request_redirect", "p2p_completion_redirect", "p2p_egress_control")

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA compatible, 3D controller (an NVSwitch is 0x0680)
BDF_RE = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
PASSTHROUGH_TYPES = ("identity",)
TRANSLATED_TYPES = ("DMA", "DMA-FQ")
MAX_CONFIG_READ = CONFIG_SPACE_SIZE


# -- configuration space --------------------------------------------------------------------------

def u16(data: bytes, off: int) -> int | None:
    return int.from_bytes(data[off:off + 2], "little") if 0 <= off and off + 2 <= len(data) else None


def u32(data: bytes, off: int) -> int | None:
    return int.from_bytes(data[off:off + 4], "little") if 0 <= off and off + 4 <= len(data) else None


def ext_capabilities(config: bytes) -> tuple[list[tuple[int, int, int]], str | None]:
    """The extended capability list: ``[(offset, id, version)]`` and a problem with the list, if any.

    The list starts at 0x100; each header is ``id (16 bits) | version (4) | next offset (12)``; a
    header of 0 ends it (no extended capability), all ones means the device did not answer. A next
    offset below 0x100, past the end, or one already seen (a loop) ends the walk with the problem
    named, never an endless loop.
    """
    if len(config) < EXT_CAP_START + 4:
        return [], f"the extended configuration space is not readable ({len(config)} bytes read)"
    caps: list[tuple[int, int, int]] = []
    seen: set[int] = set()
    off = EXT_CAP_START
    while off:
        if off in seen:
            return caps, f"the extended capability list loops back to 0x{off:03x}"
        if off < EXT_CAP_START or off + 4 > len(config) or len(seen) >= MAX_EXT_CAPS:
            return caps, f"the extended capability list points outside the configuration space (0x{off:x})"
        seen.add(off)
        header = u32(config, off)
        assert header is not None
        if header == 0xFFFFFFFF:  # a device that does not answer reads as all ones
            return caps, "the configuration space reads all ones: the device does not answer (gone or powered off)"
        if header == 0:
            break
        caps.append((off, header & 0xFFFF, (header >> 16) & 0xF))
        off = (header >> 20) & 0xFFC
    return caps, None


def decode_acs(bits: int) -> dict[str, bool]:
    return {name: bool(bits >> bit & 1) for bit, (name, _) in ACS_BITS.items()}


def acs_names(flags: dict[str, bool], only: tuple[str, ...] | None = None) -> list[str]:
    """The human names of the set bits (``P2P Request Redirect``...)."""
    return [label for _, (name, label) in sorted(ACS_BITS.items())
            if flags.get(name) and (only is None or name in only)]


def read_acs(config: bytes) -> dict[str, Any]:
    """The ACS capability of one device: where it is, what it supports, what is enabled.

    ``{"present": bool, "offset", "control_offset", "capability", "control", "enabled": {bit: bool},
    "redirects": [names], "error"}``; ``present`` is None when the extended space could not be read.
    """
    caps, problem = ext_capabilities(config)
    out: dict[str, Any] = {"present": None, "offset": None, "control_offset": None, "capability": None,
                           "control": None, "enabled": None, "redirects": [], "error": problem}
    for off, cap_id, _ in caps:
        if cap_id == ACS_CAP_ID:
            capability, control = u16(config, off + ACS_CAPABILITY_OFFSET), u16(config, off + ACS_CONTROL_OFFSET)
            if capability is None or control is None:
                out["error"] = f"the ACS capability at 0x{off:03x} is cut short"
                return out
            enabled = decode_acs(control)
            out.update(present=True, offset=off, control_offset=off + ACS_CONTROL_OFFSET, capability=capability,
                       control=control, enabled=enabled, redirects=[n for n in REDIRECT_BITS if enabled[n]],
                       error=None)
            return out
    if caps or problem is None:
        out["present"] = False
    return out


def header_info(config: bytes) -> dict[str, Any]:
    """Vendor, device, class and header type from the standard header (readable by everyone)."""
    vendor, device = u16(config, 0), u16(config, 2)
    cls = (config[0x0B] << 16 | config[0x0A] << 8 | config[0x09]) if len(config) > 0x0B else None
    htype = config[0x0E] & 0x7F if len(config) > 0x0E else None
    return {"vendor": f"0x{vendor:04x}" if vendor is not None else None,
            "device": f"0x{device:04x}" if device is not None else None,
            "class": f"0x{cls:06x}" if cls is not None else None, "header_type": htype}


# -- sysfs -----------------------------------------------------------------------------------------

def norm_bdf(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` or lspci's ``18:00.0`` as sysfs names it: ``0000:18:00.0``."""
    text = str(bus_id).strip().lower()
    parts = text.split(":")
    if len(parts) == 2:
        return "0000:" + text
    if len(parts) == 3:
        return f"{parts[0][-4:].rjust(4, '0')}:{parts[1]}:{parts[2]}"
    return text


def _read_text(path: str) -> str | None:
    try:
        with open_regular(path) as fh:
            return fh.read(4096).decode("ascii", "replace").strip()
    except OSError:
        return None


def _read_config(path: str) -> tuple[bytes | None, str | None]:
    try:
        with open_regular(path) as fh:
            return fh.read(MAX_CONFIG_READ), None
    except OSError as exc:
        return None, f"{exc.strerror or exc}"


def upstream_bridges(sys_root: str, bdf: str) -> tuple[list[str], str | None]:
    """The PCI devices between the root bus and ``bdf`` (root port first, nearest bridge last)."""
    link = os.path.join(sys_root, "bus", "pci", "devices", bdf)
    real = os.path.realpath(link)
    if not os.path.exists(real):
        return [], f"{link} does not exist"
    parts = real.replace("\\", "/").split("/")
    if bdf not in parts:
        return [], f"{link} resolves to {real}, which does not name the device"
    chain = [p for p in parts[:parts.index(bdf)] if BDF_RE.match(p)]
    return chain, None


def find_gpus(sys_root: str) -> list[str]:
    """NVIDIA display / 3D controllers on the PCI bus (NVSwitches and audio functions excluded)."""
    base = os.path.join(sys_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for name in names:
        if _read_text(os.path.join(base, name, "vendor")) == NVIDIA_VENDOR and \
                (_read_text(os.path.join(base, name, "class")) or "").startswith(GPU_CLASSES):
            out.append(name)
    return out


def read_bridge(sys_root: str, bdf: str) -> dict[str, Any]:
    path = os.path.join(sys_root, "bus", "pci", "devices", bdf, "config")
    config, err = _read_config(path)
    out: dict[str, Any] = {"bdf": bdf, "config_bytes": None if config is None else len(config)}
    if config is None:
        out.update(header_info(b""), acs={"present": None, "error": f"cannot read {path}: {err}", "redirects": []})
        return out
    out.update(header_info(config))
    acs = read_acs(config)
    if acs["present"] is None and len(config) <= 64:
        acs["error"] = (f"only the first {len(config)} bytes of the configuration space are readable: the ACS "
                        f"capability is in the extended space, which needs root")
        acs["needs_root"] = True
    out["acs"] = acs
    return out


def iommu_group(sys_root: str, bdf: str) -> tuple[str | None, str | None]:
    """The device's IOMMU group and its default domain type (``identity``, ``DMA``, ``DMA-FQ``...)."""
    link = os.path.join(sys_root, "bus", "pci", "devices", bdf, "iommu_group")
    try:
        group = os.path.basename(os.readlink(link))
    except OSError:
        return None, None
    return group, _read_text(os.path.join(sys_root, "kernel", "iommu_groups", group, "type"))


CMDLINE_KEYS = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict")


def cmdline_iommu(cmdline: str) -> dict[str, str]:
    """The IOMMU kernel parameters on a command line (the last one given wins, as the kernel reads them)."""
    out: dict[str, str] = {}
    for word in cmdline.split():
        if word == "--":
            break
        key, _, value = word.partition("=")
        if key in CMDLINE_KEYS:
            out[key] = value
    return out


def iommu_mode(params: dict[str, str], units: list[str], groups: int, types: list[str | None]) -> tuple[str, str]:
    """``passthrough``, ``translated``, ``off`` or ``unknown``, and how that was decided.

    The GPUs' IOMMU group type is the kernel's own answer; without it (kernels before 5.11) the
    command line decides only when it is explicit.
    """
    known = [t for t in types if t]
    if known:
        if all(t in PASSTHROUGH_TYPES for t in known):
            return "passthrough", f"IOMMU group type {sorted(set(known))[0]}"
        bad = sorted({t for t in known if t not in PASSTHROUGH_TYPES})
        return "translated", f"IOMMU group type {', '.join(bad)}"
    if not units and groups == 0:
        return "off", "no IOMMU is active (/sys/class/iommu and /sys/kernel/iommu_groups are empty)"
    off_words = (params.get("intel_iommu") == "off" and any(u.startswith("dmar") for u in units)) or \
        params.get("iommu") == "off" or params.get("amd_iommu") == "off"
    if off_words and groups == 0:
        return "off", "the IOMMU is turned off on the kernel command line"
    if params.get("iommu") == "pt" or params.get("iommu.passthrough") == "1":
        return "passthrough", "iommu=pt on the kernel command line"
    if params.get("iommu") == "nopt" or params.get("iommu.passthrough") == "0":
        return "translated", "iommu=nopt / iommu.passthrough=0 on the kernel command line"
    return "unknown", ("an IOMMU is active but neither the GPUs' group type nor the command line says whether DMA is "
                       "translated")


def iommu_vendor(units: list[str], cpu_vendor: str | None) -> str | None:
    if any(u.startswith("dmar") for u in units) or cpu_vendor == "GenuineIntel":
        return "intel"
    if any(u.startswith("ivhd") for u in units) or cpu_vendor == "AuthenticAMD":
        return "amd"
    return None


def cpu_vendor(proc_root: str) -> str | None:
    try:
        with open_regular(os.path.join(proc_root, "cpuinfo")) as fh:
            for line in fh.read(1 << 16).decode("ascii", "replace").splitlines()[:64]:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def read_pcie(sys_root: str = "/sys", proc_root: str = "/proc", gpus: list[str] | None = None) -> dict[str, Any]:
    """Every NVIDIA GPU's upstream bridges with their ACS control, and the IOMMU mode. JSON, read-only."""
    found = find_gpus(sys_root) if gpus is None else [norm_bdf(g) for g in gpus]
    out: dict[str, Any] = {"sysfs_root": sys_root, "gpus": [], "bridges": {}, "iommu": {}, "errors": []}
    if not os.path.isdir(os.path.join(sys_root, "bus", "pci", "devices")):
        out["errors"].append(f"{os.path.join(sys_root, 'bus', 'pci', 'devices')} does not exist (no sysfs here)")
    types: list[str | None] = []
    for bdf in found:
        chain, err = upstream_bridges(sys_root, bdf)
        group, gtype = iommu_group(sys_root, bdf)
        types.append(gtype)
        out["gpus"].append({"bdf": bdf, "upstream": chain, "error": err, "iommu_group": group,
                            "iommu_group_type": gtype})
        for br in chain:
            if br not in out["bridges"]:
                out["bridges"][br] = read_bridge(sys_root, br)
    try:
        units = sorted(os.listdir(os.path.join(sys_root, "class", "iommu")))
    except OSError:
        units = []
    try:
        groups = len(os.listdir(os.path.join(sys_root, "kernel", "iommu_groups")))
    except OSError:
        groups = 0
    cmdline = _read_text(os.path.join(proc_root, "cmdline")) or ""
    params = cmdline_iommu(cmdline)
    mode, why = iommu_mode(params, units, groups, types)
    out["iommu"] = {"mode": mode, "why": why, "units": units, "groups": groups, "cmdline": params,
                    "vendor": iommu_vendor(units, cpu_vendor(proc_root))}
    return out


# -- judging a pair --------------------------------------------------------------------------------

def path_bridges(upstream_a: list[str], upstream_b: list[str]) -> list[str]:
    """The bridges a P2P request between two devices crosses below their common ancestor: there an
    ACS redirect sends it up to the root complex instead of across."""
    k = 0
    while k < min(len(upstream_a), len(upstream_b)) and upstream_a[k] == upstream_b[k]:
        k += 1
    return list(dict.fromkeys(upstream_a[k:] + upstream_b[k:]))


def setpci_command(acs: dict[str, Any]) -> str | None:
    """``setpci`` that clears ACS control on a bridge (``bridge_acs``), at the offset read from its configuration
    space (the same register as ``ECAP_ACS+6.w``)."""
    off = acs.get("control_offset")
    if not isinstance(off, int) or isinstance(off, bool) or not BDF_RE.match(str(acs.get("bdf"))):
        return None
    return f"sudo setpci -s {acs['bdf']} 0x{off:x}.w=0000"


def iommu_fix(vendor: str | None) -> tuple[str, list[str]]:
    """The kernel parameters that put the IOMMU in passthrough, and how to set them."""
    params = "intel_iommu=on iommu=pt" if vendor == "intel" else "iommu=pt"
    cmds = [f"sudo grubby --update-kernel=ALL --args='{params}'   # RHEL/Rocky/Alma",
            f"sudo sed -i 's/^GRUB_CMDLINE_LINUX=\"/&{params} /' /etc/default/grub && sudo update-grub   # Debian",
            "sudo reboot"]
    return params, cmds


# -- reading a recorded fact (a snapshot may be hand-edited: every value is checked before use) -------

def bridge_acs(fact: dict[str, Any], bdf: str) -> dict[str, Any]:
    """The ACS reading of one bridge of a ``pcie`` fact, with every field of the type the judgement needs."""
    bridges = fact.get("bridges") if isinstance(fact.get("bridges"), dict) else {}
    info = bridges.get(bdf) if isinstance(bridges.get(bdf), dict) else {}
    acs = info.get("acs") if isinstance(info.get("acs"), dict) else {}
    present = acs.get("present") if isinstance(acs.get("present"), bool) else None
    redirects = [r for r in acs.get("redirects") or [] if r in REDIRECT_BITS] \
        if isinstance(acs.get("redirects"), list) else []
    enabled = {k: bool(v) for k, v in acs["enabled"].items() if isinstance(k, str)} \
        if isinstance(acs.get("enabled"), dict) else {}
    off = acs.get("control_offset")
    return {"bdf": bdf, "present": present, "redirects": redirects, "enabled": enabled,
            "control_offset": off if isinstance(off, int) and not isinstance(off, bool) else None,
            "error": str(acs["error"]) if acs.get("error") is not None else None}


def gpu_upstream(gpu: dict[str, Any]) -> list[str]:
    ups = gpu.get("upstream")
    return [u for u in ups if isinstance(u, str)] if isinstance(ups, list) else []
