"""The ``nvml`` fact, typed: what ``doctor.gpu.facts.read_nvml`` records and every GPU judgement reads.

One declaration serves twice: the area's functions are annotated with these types, and the collector's
``shape=NvmlFact`` makes the fact store refuse a value that does not have them (a hand-edited or corrupt
snapshot) with "the fact 'nvml' is malformed: WHERE", before any check sees it. Every key a judgement
reads is here, with the type it relies on; readings NVML could not make are ``None`` (the reason is in the
``errors`` of the device or the host).
"""

from __future__ import annotations

from typing import Any, TypedDict


class Memory(TypedDict, total=False):
    total: int | None
    free: int | None
    used: int | None


class Pcie(TypedDict, total=False):
    gen_max: int | None
    width_max: int | None
    gen_current: int | None
    width_current: int | None


class Mode(TypedDict, total=False):
    current: int | None
    pending: int | None


class Ecc(TypedDict, total=False):
    volatile: int | None
    aggregate: int | None


class RowRemap(TypedDict, total=False):
    correctable: int | None
    uncorrectable: int | None
    pending: bool | None
    failure: bool | None


class Process(TypedDict, total=False):
    pid: int
    used_memory: int | None
    types: list[str] | None
    in_namespace: bool | None
    cmdline: str | None
    uid: int | None
    start_ticks: int | None
    holds_nvidia_device: bool | None


class Link(TypedDict, total=False):
    link: int | None
    active: bool | None
    version: int | None
    remote_pci_bus_id: str | None
    remote_type: str | int | None


class NvLink(TypedDict, total=False):
    supported: bool | None
    active: int | None
    error: str | None
    links: list[Link] | None


class Fabric(TypedDict, total=False):
    api: str | None
    struct: str | None
    state: int | None
    state_name: str | None
    status: int | None
    status_name: str | None
    clique_id: int | None
    cluster_uuid: str | None
    health_mask: int | None
    health_summary: str | None
    error: str | None
    tried: list[str] | None


class Device(TypedDict, total=False):
    index: int
    cuda_index: int | None
    lost: bool | None
    errors: dict[str, str] | None
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    compute_capability: list[int] | str | None
    memory: Memory | None
    pcie: Pcie | None
    persistence_mode: int | None
    mig_mode: Mode | None
    ecc_mode: Mode | None
    ecc_uncorrected: Ecc | None
    row_remap: RowRemap | None
    retired_pages_pending: bool | None
    clock_event_reasons: int | None
    clock_event_names: list[str] | None
    temperature_c: int | float | None
    processes: list[Process] | None
    nvlink: NvLink | None
    fabric: Fabric | None


class Pair(TypedDict, total=False):
    a: int
    b: int
    errors: dict[str, str] | None
    p2p_nvlink: str | None
    p2p_read: str | None
    topology: str | None
    lost: bool | None


class Visible(TypedDict, total=False):
    cuda_visible_devices: str | None
    cuda_device_order: str | None
    indices: list[int] | None
    entries: list[str] | None
    ignored: list[str] | None
    problems: list[str] | None
    mig_entries: list[str] | None
    source: dict[str, Any] | None


class FabricManager(TypedDict, total=False):
    systemctl_is_active: str | None
    systemctl_error: str | None
    version: str | None
    version_error: str | None


class _Answered(TypedDict):
    available: bool


class NvmlFact(_Answered, total=False):
    """The host as NVML saw it: ``available`` False with ``error`` (and ``error_kind``) when NVML did not load.
    ``devices`` may be absent when NVML did not load (what an older doctor recorded, and hand-made facts)."""

    devices: list[Device]
    error: str | None
    error_kind: str | None
    driver_version: str | None
    cuda_driver_version: int | None
    nvml_version: str | None
    kernel_module_version: str | None
    pynvml_version: str | None
    device_count_total: int | None
    errors: dict[str, str] | None
    visible: Visible | None
    pairs: list[Pair] | None
    fabric_manager: FabricManager | None
    nvml_calls: int | None
    elapsed_s: float | None
