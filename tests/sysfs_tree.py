"""Build a sysfs tree in a directory, as the kernel lays it out, with binary configuration spaces.

Each PCI device is a directory under ``<root>/devices/pci<dom>:<bus>/<root port>/.../<bdf>`` holding
``config`` (4096 bytes, or 64 as a non-root reader sees it), ``vendor`` and ``class``;
``<root>/bus/pci/devices/<bdf>`` is a relative symlink to it, ``iommu_group`` a link into
``<root>/kernel/iommu_groups/N`` whose ``type`` says the DMA domain. A configuration space carries a
real capability chain: the PCI Express capability from the capabilities pointer (0x34), then the
extended list from 0x100: AER (0x0001) -> ACS (0x000D) when the port has one -> Secondary PCIe
(0x0019). Used by the PCIe tests and by ``fixtures/snapshots/scenarios.py`` (whose ``pcie`` facts
are what ``doctor.gpu.pcie.read_pcie`` reads from such a tree).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

NVIDIA = 0x10DE
BRIDGE_VENDOR = 0x1000  # a PCIe switch vendor id (Broadcom/PLX style)
PORT_TYPES = {"root_port": 4, "upstream": 5, "downstream": 6, "endpoint": 0}
AER_AT, ACS_AT, SEC_AT = 0x100, 0x148, 0x158
ACS_CAPS_ALL = 0x005F  # SV, TB, RR, CR, UF, DT supported (no egress control vector)
ACS_REDIRECT_ON = 0x001D  # SV | RR | CR | UF: what a BIOS with ACS enabled leaves set


def ext_header(cap_id: int, version: int, next_off: int) -> bytes:
    return struct.pack("<I", cap_id | version << 16 | next_off << 20)


def config_space(*, vendor: int, device: int, class_code: int, bridge: bool, port: str,
                 acs_control: int | None = None, acs_capability: int = ACS_CAPS_ALL, acs_at: int = ACS_AT) -> bytes:
    """4096 bytes of configuration space with a real capability chain (ACS only when ``acs_control`` is given,
    at ``acs_at``: 0x148 by default, anywhere after AER and before 0xF00)."""
    cfg = bytearray(4096)
    struct.pack_into("<HH", cfg, 0, vendor, device)
    struct.pack_into("<H", cfg, 0x06, 0x0010)  # status: capabilities list
    cfg[0x09], cfg[0x0A], cfg[0x0B] = class_code & 0xFF, class_code >> 8 & 0xFF, class_code >> 16 & 0xFF
    cfg[0x0E] = 0x01 if bridge else 0x00
    cfg[0x34] = 0x40
    cfg[0x40], cfg[0x41] = 0x10, 0x00  # PCI Express capability, last in the standard list
    struct.pack_into("<H", cfg, 0x42, 0x0002 | PORT_TYPES[port] << 4)
    if acs_control is None:
        cfg[AER_AT:AER_AT + 4] = ext_header(0x0001, 2, SEC_AT)
        cfg[SEC_AT:SEC_AT + 4] = ext_header(0x0019, 1, 0)
    elif acs_at == ACS_AT:
        cfg[AER_AT:AER_AT + 4] = ext_header(0x0001, 2, ACS_AT)
        cfg[ACS_AT:ACS_AT + 4] = ext_header(0x000D, 1, SEC_AT)
        struct.pack_into("<HH", cfg, ACS_AT + 4, acs_capability, acs_control)
        cfg[SEC_AT:SEC_AT + 4] = ext_header(0x0019, 1, 0)
    else:  # AER -> Secondary PCIe -> ACS at the given offset, last
        cfg[AER_AT:AER_AT + 4] = ext_header(0x0001, 2, SEC_AT)
        cfg[SEC_AT:SEC_AT + 4] = ext_header(0x0019, 1, acs_at)
        cfg[acs_at:acs_at + 4] = ext_header(0x000D, 1, 0)
        struct.pack_into("<HH", cfg, acs_at + 4, acs_capability, acs_control)
    return bytes(cfg)


class SysfsTree:
    """A sysfs root in a directory: add devices along their paths, IOMMU groups, IOMMU units."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        (self.root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
        (self.root / "kernel" / "iommu_groups").mkdir(parents=True, exist_ok=True)
        (self.root / "class" / "iommu").mkdir(parents=True, exist_ok=True)

    def add(self, path: list[str], config: bytes, *, iommu_group: str | None = None,
            group_type: str | None = None) -> Path:
        """``path``: ``["pci0000:15", "0000:15:01.0", ..., bdf]``, the device last."""
        bdf = path[-1]
        d = self.root / "devices" / Path(*path)
        d.mkdir(parents=True, exist_ok=True)
        (d / "config").write_bytes(config)
        vendor, cls = struct.unpack_from("<H", config, 0)[0], config[0x0B] << 16 | config[0x0A] << 8 | config[0x09]
        (d / "vendor").write_text(f"0x{vendor:04x}\n")
        (d / "class").write_text(f"0x{cls:06x}\n")
        link = self.root / "bus" / "pci" / "devices" / bdf
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(d, link.parent))
        if iommu_group is not None:
            g = self.root / "kernel" / "iommu_groups" / iommu_group
            g.mkdir(parents=True, exist_ok=True)
            if group_type is not None:
                (g / "type").write_text(group_type + "\n")
            (d / "iommu_group").symlink_to(os.path.relpath(g, d))
        return d

    def iommu_unit(self, name: str) -> None:
        (self.root / "class" / "iommu" / name).mkdir(parents=True, exist_ok=True)


def gpu_config() -> bytes:
    return config_space(vendor=NVIDIA, device=0x2901, class_code=0x030200, bridge=False, port="endpoint")


def bridge_config(port: str, acs_control: int | None) -> bytes:
    return config_space(vendor=BRIDGE_VENDOR, device=0xC010, class_code=0x060400, bridge=True, port=port,
                        acs_control=acs_control)


def switched_host(root: Path, gpu_bdfs: list[str], *, acs_control: int | None, group_type: str | None,
                  iommu_unit: str | None = "dmar0", per_switch: int = 2, root_port_acs: int | None = 0) -> SysfsTree:
    """GPUs two per PCIe switch, each switch under its own root port: root port -> switch upstream port ->
    one downstream port per GPU -> GPU. ``acs_control`` is every downstream port's ACS Control (None: no
    ACS capability); ``root_port_acs`` the root ports'; ``group_type`` every GPU's IOMMU group type
    (None: no IOMMU group)."""
    tree = SysfsTree(root)
    if iommu_unit:
        tree.iommu_unit(iommu_unit)
    for i, bdf in enumerate(gpu_bdfs):
        gbus = int(bdf.split(":")[1], 16)
        sw = i // per_switch
        first = gpu_bdfs[sw * per_switch]
        base = int(first.split(":")[1], 16) - 3  # root bus, switch upstream bus, downstream bus, then the GPUs
        rbus = f"{base:02x}"
        rp = f"0000:{rbus}:01.0"
        usp = f"0000:{base + 1:02x}:00.0"
        dsp = f"0000:{base + 2:02x}:{i % per_switch:02x}.0"
        chain = [f"pci0000:{rbus}", rp, usp, dsp]
        tree.add(chain[:2], bridge_config("root_port", root_port_acs))
        tree.add(chain[:3], bridge_config("upstream", None))
        tree.add(chain, bridge_config("downstream", acs_control))
        assert gbus > base + 2, "GPU bus numbers must leave room for the switch above it"
        tree.add([*chain, bdf], gpu_config(), iommu_group=str(20 + i) if group_type else None, group_type=group_type)
    return tree
