"""GPU host checks: driver, count, architecture, memory, idle, health, NVLink, NVSwitch fabric, the PCIe P2P path
and (with ``--deep``) measured GPU-to-GPU bandwidth. Each maps the facts ``nvml``, ``fabric_software``, ``pcie``,
``p2p_bandwidth`` and ``fabric_wait`` (``doctor/gpu/facts.py``) to the judgements of ``doctor/gpu/``.
"""

from __future__ import annotations

from doctor.core.context import Context
from doctor.core.registry import check
from doctor.core.result import Result
from doctor.gpu import bandwidth, fabric, fabric_software, health, inventory, multicast, nvlink, p2p_path, processes
from doctor.gpu.group import answered, available


@check("gpu.driver", "NVIDIA driver and NVML load", needs=("nvml",), timeout=30, failure="node")
def gpu_driver(ctx: Context) -> Result:
    """Loads NVML (nvidia-ml-py) and reads the driver version, the CUDA version the driver supports
    and the number of GPUs. Nothing else on the GPU side can work without it. When NVML does not
    load, the summary says why: no libnvidia-ml (driver not installed or not mounted into the
    container), kernel module not loaded, no permission on /dev/nvidia*, or a library/kernel
    version mismatch after a driver upgrade without a reboot. By hand: `nvidia-smi`,
    `cat /proc/driver/nvidia/version`."""
    return Result.of(inventory.judge_driver(ctx.fact("nvml")))


@check("gpu.count", "GPUs visible vs the parallel size", needs=("nvml",), depends=("gpu.driver",), failure="node")
def gpu_count(ctx: Context) -> Result:
    """Counts the GPUs the service will see (all GPUs NVML sees, narrowed by the service's
    CUDA_VISIBLE_DEVICES, indices or GPU-/MIG- UUIDs, as CUDA reads it) against the profile's
    TP x PP x DP. SGLang takes the first N visible GPUs. An invalid CUDA_VISIBLE_DEVICES entry
    hides it and every later one, as CUDA does. By hand: `nvidia-smi -L`, `echo $CUDA_VISIBLE_DEVICES`."""
    return Result.of(inventory.judge_count(ctx.fact("nvml"), ctx.settings))


@check("gpu.arch", "Compute capability of every GPU vs the profile", needs=("nvml",), depends=("gpu.driver",),
       failure="deployment")
def gpu_arch(ctx: Context) -> Result:
    """Compares each GPU's compute capability with the profile's (B300 is 10.3, sm_103; B200 10.0;
    H200 9.0; RTX PRO 6000 Blackwell 12.0). Kernels, the Triton backend and the patches are chosen
    for one architecture; mixed GPUs in one TP group fail. A mismatch names the built-in profile
    made for the GPUs found. By hand: `nvidia-smi --query-gpu=name,compute_cap --format=csv`."""
    return Result.of(inventory.judge_arch(ctx.fact("nvml"), ctx.settings))


@check("gpu.memory", "Per-GPU memory total and free", needs=("nvml",), depends=("gpu.driver",),
       failure="node", applies=("start",))
def gpu_memory(ctx: Context) -> Result:
    """Total memory of each GPU of the TP group against the profile's gpu.min_memory_gib, and free
    memory against what the server will reserve (server.mem_fraction_static of the total). The
    free figures (details.per_gpu, details.free_min_bytes) feed model.fit. Memory held by other
    processes: see gpu.idle. By hand: `nvidia-smi --query-gpu=memory.total,memory.free --format=csv`."""
    return Result.of(inventory.judge_memory(ctx.fact("nvml"), ctx.settings))


@check("gpu.idle", "No other process holds GPU memory", needs=("nvml",), depends=("gpu.driver",), fixer="gpu.idle",
       failure="node", applies=("start",))
def gpu_idle(ctx: Context) -> Result:
    """Lists the processes that hold memory on the GPUs of the TP group (NVML's compute and
    graphics process lists): PID, command line from /proc, memory. A stale server from an earlier
    start is the usual culprit; the new server then fails to allocate, minutes into its start.
    Fixer: a plan to stop exactly those PIDs (verified to be the same processes, holding
    /dev/nvidia*), applied only with `fix --apply`. By hand: `nvidia-smi`, then `kill PID`."""
    return Result.of(processes.judge_idle(ctx.fact("nvml"), ctx.settings))


@check("gpu.health", "ECC, row remapping, MIG mode, clock-event reasons", needs=("nvml",), depends=("gpu.driver",),
       failure="node")
def gpu_health(ctx: Context) -> Result:
    """Per GPU of the TP group: a lost GPU, uncorrected ECC errors since the driver loaded, row
    remapping pending (needs a GPU reset) or failed (RMA), retired pages pending, MIG mode on or
    pending (the service needs whole GPUs) fail; hardware slowdown, thermal or power-brake clock
    events, persistence mode off and ECC off warn. Readings a GPU does not support (NotSupported)
    are listed, not judged. By hand: `nvidia-smi -q -d ECC,ROW_REMAPPER,PERFORMANCE`."""
    return Result.of(health.judge_health(ctx.fact("nvml"), ctx.settings))


@check("gpu.pcie_width", "PCIe link of every GPU at its full width", needs=("nvml",), depends=("gpu.driver",),
       failure="node")
def gpu_pcie_width(ctx: Context) -> Result:
    """Per GPU of the TP group, the width its PCIe link trained at against the width it can do (NVML's current
    and max link width: the `nvml` fact). A link at x8 of x16 (a riser, retimer or slot fault, a card not seated)
    stays so until it is retrained, and every host-to-device copy runs at that fraction: the weights' load at
    start, and the all-reduce on hosts without NVLink. It warns; a node of the fleet that shows it is the one to
    send for repair. The generation is recorded, not judged (GPUs lower it while idle). A GPU whose width NVML
    cannot read (NotSupported) is listed. By hand: `sudo lspci -vv -s BUS | grep -E 'LnkCap:|LnkSta:'`."""
    return Result.of(health.judge_pcie_width(ctx.fact("nvml"), ctx.settings))


@check("gpu.nvlink", "NVLink P2P between every pair of the TP group; link counts equal", needs=("nvml",),
       depends=("gpu.driver",), failure="node")
def gpu_nvlink(ctx: Context) -> Result:
    """For every pair of GPUs in the TP group, NVLink P2P as NVML reports it
    (`nvmlDeviceGetP2PStatus` with the NVLINK index), and each GPU's active links
    (`nvmlDeviceGetNvLinkState`, up to the first link NVML calls invalid). Every pair must have
    NVLink and every GPU the same number of active links (a lower count is a link down), at least
    the profile's gpu.min_nvlinks. The PCIe topology level is not used to find NVLink (it says PHB
    for an NV18 pair). A host without NVLink under a TP profile fails with the measured advice: on
    PCIe this service ran TP8 at 26 tok/s and EP8 at 65 tok/s, so use the EP profile
    (rtxpro6000-ep8). details.matrix is a matrix like `nvidia-smi topo -m`, shown with a failure. By hand:
    `nvidia-smi topo -m`, `nvidia-smi nvlink -s`."""
    return Result.of(nvlink.judge_nvlink(ctx.fact("nvml"), ctx.settings))


@check("gpu.fabric", "NVSwitch fabric state (fabric manager); launch waits for it", needs=("nvml", "fabric_wait"),
       depends=("gpu.driver",), fixer="gpu.fabric", failure="node")
def gpu_fabric(ctx: Context) -> Result:
    """On NVSwitch hosts (HGX) every GPU must be registered with the NVLink fabric before CUDA can
    use it: `nvmlDeviceGetGpuFabricInfoV` (or the older call) must say completed with success.
    Not started or in progress means nvidia-fabricmanager is not running (or failed): CUDA then
    fails with "system not yet initialized". The fabric manager must be the same version as the
    driver (gpu.fabric.manager); NVLink 5 hosts also need NVLSM (gpu.fabric.nvlsm). GPUs without a
    fabric (NotSupported) skip. Registration takes minutes after boot: `launch` and the unit's
    ExecStartPre wait for it (the profile's gpu.fabric_wait_s), `check` reports the state it finds
    unless given `--wait-fabric SECONDS`. Fixer: `systemctl start nvidia-fabricmanager`. By hand:
    `systemctl status nvidia-fabricmanager`, `nvidia-smi -q | grep -A3 -i fabric`."""
    nvml = answered(ctx.fact("nvml"), ctx.settings.world_size)
    return Result.of(fabric.judge_fabric(nvml, ctx.optional("fabric_wait"), ctx.settings))


@check("gpu.fabric.manager", "Fabric manager installed, running, the driver's version (NVSwitch)",
       needs=("nvml", "fabric_software"), depends=("gpu.driver",), failure="node",
       applies_if=fabric_software.MANAGER_APPLIES)
def gpu_fabric_manager(ctx: Context) -> Result:
    """On NVSwitch hosts (profile gpu.nvswitch = true) the fabric manager must be installed at exactly
    the loaded driver's version: it checks the driver at start and refuses to run with another one,
    and the GPUs then never leave "In Progress". Compares the version of `nv-fabricmanager
    --version` and of its package (dpkg-query / rpm) with the driver's (NVML), and says which
    package to align with the exact apt/dnf command; then that it runs (systemd unit or process).
    Hosts whose GPUs report no fabric skip. By hand: `nv-fabricmanager --version`, `nvidia-smi`,
    `dpkg -l 'nvidia-fabricmanager*'` or `rpm -qa 'nvidia-fabric*'`."""
    nvml = fabric_software.fabric_host(ctx.fact("nvml"), ctx.settings, "fabric manager")
    return Result.of(fabric_software.judge_manager(nvml, ctx.fact("fabric_software"), ctx.settings))


@check("gpu.fabric.nvlsm", "NVLSM (NVLink subnet manager) installed and running (NVLink 5)",
       needs=("nvml", "fabric_software"), depends=("gpu.driver",), fixer="gpu.fabric.nvlsm", failure="node",
       applies_if=fabric_software.NVLSM_APPLIES)
def gpu_fabric_nvlsm(ctx: Context) -> Result:
    """NVLink 5 systems (HGX B200/B300: profile gpu.nvlink_generation = 5) program their NVSwitches
    through NVLSM, the NVLink subnet manager (package `nvlsm`, /opt/nvidia/nvlsm/sbin/nvlsm, kernel
    module ib_umad for the switches' management ports). The fabric manager's start script runs it
    (some builds ship an `nvlsm` / `nvidia-nvlsm` unit instead). Without it the fabric manager
    fails with NV_WARN_NOTHING_TO_DO, the GPUs stay "In Progress" and CUDA reports
    CUDA_ERROR_SYSTEM_NOT_READY. Checks the package or binary, and the running process or unit
    (read-only). Fixer: `modprobe ib_umad` and `systemctl enable --now` of the unit that runs it.
    By hand: `pgrep -x nvlsm`, `dpkg -l nvlsm`, `journalctl -u nvidia-fabricmanager`."""
    nvml = fabric_software.nvlsm_host(ctx.fact("nvml"), ctx.settings)
    return Result.of(fabric_software.judge_nvlsm(nvml, ctx.fact("fabric_software"), ctx.settings))


@check("gpu.multicast", "NVLink multicast for all-reduce fusion and symmetric memory (TP > 1)",
       needs=("nvml", "multicast", "sglang_flags"), depends=("gpu.driver",), failure="deployment",
       applies_if=multicast.MULTICAST_APPLIES)
def gpu_multicast(ctx: Context) -> Result:
    """CUDA's multicast-supported attribute of every GPU of the TP group (cuInit and cuDeviceGetAttribute in a
    child with a deadline; never a multicast object created to find out), the NVSwitch fabric's state (NVML,
    as gpu.fabric reads it) and the server's arguments.

    Why: FlashInfer's all-reduce fusion (SGLang turns it on by itself for DeepSeek-style models on SM90/SM100
    at TP > 1), torch's and NCCL's symmetric memory and NCCL's NVLS need NVSwitch multicast. Without it (PCIe,
    NVLink bridges, confidential computing) the server dies at start with "[SymmDeviceMemory] Device does not
    support multicasting"; with a fabric that is not ready, or multicast objects held by another NVLS user,
    with "Failed to bind NVLink SHARP (NVLS) Multicast memory ... CUDA error 401" or a rendezvous that hangs.
    Who holds multicast objects cannot be read without creating one: the check says so, and warns when other
    processes hold GPUs of the group.
    Fix by hand: on a host without multicast, add the installed release's flag that turns the fusion off
    (--enforce-disable-flashinfer-allreduce-fusion where SGLang accepts it; the check names the one your
    release has) to [server] args and drop --enable-symm-mem / --enable-torch-symm-mem / --enable-nccl-nvls;
    NCCL_NVLS_ENABLE=0 keeps NCCL's NVLS off. On NVSwitch hosts: `systemctl status nvidia-fabricmanager`,
    `nvidia-smi -q -d FABRIC`."""
    nvml = answered(ctx.fact("nvml"), ctx.settings.world_size)
    args, _problem = ctx.server_args
    return Result.of(multicast.judge_multicast(nvml, ctx.optional("multicast"), ctx.optional("sglang_flags"), args,
                                               ctx.settings))


@check("gpu.p2p", "P2P path: ACS redirect on the PCIe bridges, IOMMU translation (PCIe pairs)",
       needs=("nvml", "pcie"), depends=("gpu.driver",), failure="node")
def gpu_p2p(ctx: Context) -> Result:
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
    return Result.of(p2p_path.judge_p2p_path(ctx.fact("nvml"), lambda: ctx.fact("pcie"), ctx.settings))


@check("gpu.p2p_bandwidth", "Measured GPU-to-GPU copy bandwidth of every pair, each under a deadline (--deep)",
       needs=("nvml", "p2p_bandwidth"), depends=("gpu.driver", "python.venv"), deep=True, timeout=330, failure="node")
def gpu_p2p_bandwidth(ctx: Context) -> Result:
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
    nvml = available(ctx.fact("nvml"))
    return Result.of(bandwidth.judge_bandwidth(nvml, ctx.fact("p2p_bandwidth"), ctx.settings))
