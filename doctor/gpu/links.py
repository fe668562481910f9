"""How the GPUs of the TP group are joined: NVLink per pair, the ``nvidia-smi topo -m`` matrix,
and what copy bandwidth the links should give. Pure functions of the ``nvml`` fact.

NVLink is read from ``nvmlDeviceGetP2PStatus(.., NVLINK)`` and the link states, never from the
topology common ancestor: that describes the PCIe path only (it says PHB for an NV18 pair).
"""

from __future__ import annotations

from typing import Any

NO_REMOTE_PCI = "FFFFFFFF:FF:FF.0"

# Data rate of one link, one direction, GB/s, by NVLink version (NVML's version 6 is NVLink 4.0).
NVLINK_GBPS_PER_LINK = {"1.0": 20.0, "2.0": 25.0, "2.2": 25.0, "3.0": 25.0, "3.1": 25.0, "4.0": 25.0,
                        "5.0": 50.0, "6.0": 50.0}
NVML_NVLINK_VERSION = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
PROFILE_GENERATION = {2: "2.0", 3: "3.0", 4: "4.0", 5: "5.0", 6: "6.0"}
# PCIe data rate per lane, one direction, GB/s (after line coding), by generation.
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def group(nvml: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """The GPUs of the TP group: the first ``size`` GPUs the service sees (CUDA order)."""
    devices = nvml.get("devices") or []
    return [d for d in devices if isinstance(d, dict)][:size]


def _links(dev: dict[str, Any]) -> list[Any] | None:
    """The GPU's link readings: [] on a PCIe card (NVLink NotSupported), None when not read."""
    nv = dev.get("nvlink")
    if not isinstance(nv, dict):
        return None
    if nv.get("supported") is False:
        return []
    links = nv.get("links")
    return links if isinstance(links, list) else None


def active_links(dev: dict[str, Any]) -> int | None:
    links = _links(dev)
    return None if links is None else sum(1 for link in links if isinstance(link, dict) and link.get("active"))


def link_slots(dev: dict[str, Any]) -> int | None:
    """How many links the GPU has (active or not); 0 on a PCIe card."""
    links = _links(dev)
    return None if links is None else len(links)


def _switched(dev: dict[str, Any]) -> bool:
    links = (dev.get("nvlink") or {}).get("links") or []
    for link in links:
        if isinstance(link, dict) and link.get("active"):
            if link.get("remote_type") == "switch" or str(link.get("remote_pci_bus_id") or "").upper() == NO_REMOTE_PCI:
                return True
    return False


def pair_links(a: dict[str, Any], b: dict[str, Any]) -> int | None:
    """NVLinks carrying traffic between ``a`` and ``b``: through NVSwitch every active link of the
    narrower GPU; direct links, those whose far end is the other GPU."""
    if _switched(a) and _switched(b):
        na, nb = active_links(a), active_links(b)
        return None if na is None or nb is None else min(na, nb)
    bus_b = str(b.get("pci_bus_id") or "").upper()
    links = (a.get("nvlink") or {}).get("links")
    if not isinstance(links, list) or not bus_b:
        return None
    return sum(1 for link in links if isinstance(link, dict) and link.get("active")
               and str(link.get("remote_pci_bus_id") or "").upper() == bus_b)


def find_pair(nvml: dict[str, Any], a: int, b: int) -> dict[str, Any] | None:
    for p in nvml.get("pairs") or []:
        if isinstance(p, dict) and {p.get("a"), p.get("b")} == {a, b}:
            return p
    return None


def pair_label(nvml: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> str:
    """The ``nvidia-smi topo -m`` cell: ``NV18``, or the PCIe path (PIX/PXB/PHB/NODE/SYS), or ``?``."""
    pair = find_pair(nvml, a.get("index"), b.get("index"))
    if pair is None:
        return "?"
    if pair.get("p2p_nvlink") == "ok":
        n = pair_links(a, b)
        return f"NV{n}" if n else "NV?"
    return str(pair.get("topology") or "?")


def matrix(nvml: dict[str, Any], devices: list[dict[str, Any]]) -> list[str]:
    """Rows like ``nvidia-smi topo -m``, plus each GPU's active/total links."""
    names = [f"GPU{d.get('cuda_index', i)}" for i, d in enumerate(devices)]
    width = max([6, *(len(n) + 2 for n in names)])
    head = " " * width + "".join(n.ljust(width) for n in names) + "NVLinks"
    rows = [head.rstrip()]
    for i, a in enumerate(devices):
        cells = []
        for j, b in enumerate(devices):
            cells.append(" X " if i == j else pair_label(nvml, a, b))
        act, slots = active_links(a), link_slots(a)
        links = "-" if slots == 0 else f"{'?' if act is None else act}/{'?' if slots is None else slots}"
        rows.append(names[i].ljust(width) + "".join(c.ljust(width) for c in cells) + links)
    rows += ["", "Legend: X = self, NV# = NVLink P2P over # links, PIX/PXB/PHB/NODE/SYS = PCIe path only "
             "(no NVLink), ? = unknown; NVLinks = active/present per GPU (NVML index "
             + ", ".join(f"GPU{d.get('cuda_index', i)}={d.get('index')}" for i, d in enumerate(devices)) + ")"]
    return rows


def nvlink_version(dev: dict[str, Any]) -> str | None:
    for link in (dev.get("nvlink") or {}).get("links") or []:
        if isinstance(link, dict) and link.get("active") and isinstance(link.get("version"), int):
            return NVML_NVLINK_VERSION.get(link["version"])
    return None


def expected_pair_gbps(nvml: dict[str, Any], a: dict[str, Any], b: dict[str, Any],
                       profile_generation: int | None) -> tuple[float | None, str]:
    """What a one-direction copy between ``a`` and ``b`` should reach at best, and how that was worked out."""
    pair = find_pair(nvml, a.get("index"), b.get("index"))
    if pair is not None and pair.get("p2p_nvlink") == "ok":
        n = pair_links(a, b)
        ver = nvlink_version(a) or nvlink_version(b) or PROFILE_GENERATION.get(profile_generation or 0)
        per = NVLINK_GBPS_PER_LINK.get(ver or "")
        if n and per:
            return n * per, f"{n} x NVLink {ver} at {per:g} GB/s per direction"
        return None, "NVLink P2P but the link count or version is unknown"
    gens = [(d.get("pcie") or {}).get("gen_max") for d in (a, b)]
    widths = [(d.get("pcie") or {}).get("width_max") for d in (a, b)]
    if all(isinstance(g, int) and g in PCIE_GBPS_PER_LANE for g in gens) and all(isinstance(w, int) and w > 0
                                                                                 for w in widths):
        gen, width = min(gens), min(widths)
        return PCIE_GBPS_PER_LANE[gen] * width, f"PCIe Gen{gen} x{width} at {PCIE_GBPS_PER_LANE[gen]:g} GB/s per lane"
    return None, "neither NVLink nor a known PCIe link"
