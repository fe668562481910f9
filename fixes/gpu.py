"""Fixers of the GPU checks: stop the stale processes ``gpu.idle`` found; start the fabric manager; get NVLSM
running (``gpu.fabric.nvlsm``: ib_umad, then the unit that runs it; a missing package is left to the operator).

``gpu.idle`` plans one ``StopProcess`` per PID that NVML reported on the TP group's GPUs, never
a process name. A PID is planned only when it is still the process that was seen (same start
time), it is in this PID namespace, and it holds /dev/nvidia* open; every other PID is left out
with the reason in the plan's notes (``Plan.notes``), so nothing unexpected is ever signalled.
"""

from __future__ import annotations

import os
from typing import Any

from doctor.core.actions import Action, Plan, RunCommand, StopProcess, WriteFile, process_start_ticks
from doctor.core.context import Context
from doctor.core.registry import fixer
from doctor.core.result import Result
from doctor.gpu import fabric_software, links
from doctor.gpu.fabric import FABRIC_DOWN
from doctor.gpu.processes import HELD

PROTECTED_PIDS = {0, 1}


def idle_candidates(nvml: dict[str, Any], size: int, proc_start: Any = process_start_ticks
                    ) -> tuple[list[dict[str, Any]], list[str]]:
    """The processes that may be stopped, and why each other one may not."""
    keep: dict[int, dict[str, Any]] = {}
    refused: list[str] = []
    me = {os.getpid(), os.getppid()}
    for dev in links.group(nvml, size):
        for p in dev.get("processes") or []:
            pid = p.get("pid") if isinstance(p, dict) else None
            if not isinstance(pid, int) or pid in keep:
                continue
            why = None
            if pid in PROTECTED_PIDS or pid in me:
                why = "it is init or the doctor itself"
            elif not p.get("in_namespace"):
                why = "it is not visible from this PID namespace (another container or the host)"
            elif p.get("holds_nvidia_device") is False:
                why = "it holds no /dev/nvidia* file: the PID may belong to another namespace's process"
            elif p.get("start_ticks") is None:
                why = "its start time could not be read, so a reused PID could not be told apart"
            elif proc_start(pid) != p.get("start_ticks"):
                why = "it has exited or its PID now belongs to another process"
            if why:
                refused.append(f"PID {pid}: not planned, {why}")
                continue
            keep[pid] = p
    return [keep[k] for k in sorted(keep)], refused


@fixer("gpu.idle", "Stop the processes holding GPU memory (exact PIDs)")
def plan_idle(ctx: Context, result: Result) -> Plan:
    """Only when gpu.idle found processes holding the GPUs (``gpu.idle.processes``)."""
    if not result.has(HELD):
        return Plan()
    nvml = ctx.fact("nvml")
    procs, refused = idle_candidates(nvml, ctx.settings.world_size)
    actions: list[Action] = []
    uid = os.getuid()
    for p in procs:
        cmd = p.get("cmdline") or "?"
        actions.append(StopProcess(
            summary=f"stop PID {p['pid']} ({cmd[:60]}), holding {_gib(p.get('used_memory'))} of GPU memory",
            needs_root=p.get("uid") not in (None, uid) and uid != 0,
            pid=p["pid"], start_ticks=p.get("start_ticks"), cmdline=cmd))
    return Plan(actions, notes=refused)


@fixer("gpu.fabric", "Start the NVIDIA fabric manager", needs_root=True)
def plan_fabric(ctx: Context, result: Result) -> Plan:
    """Only when gpu.fabric found GPUs not started / in progress (``gpu.fabric.not_ready``): anything else is
    not a fabric manager that is down, and starting it would not help."""
    if not result.has(FABRIC_DOWN):
        return Plan()
    nvml = ctx.fact("nvml")
    fm = nvml.get("fabric_manager") or {}
    wrong = fabric_software.version_mismatch({"installed": fm["version"]} if isinstance(fm.get("version"), str)
                                             else {}, nvml.get("driver_version"))
    if wrong:  # it would refuse to start: starting it is not a fix
        return Plan(notes=[f"not starting nvidia-fabricmanager: its {wrong.replace('installed is', 'version is')}, "
                           f"the driver {nvml.get('driver_version')}; it refuses to start until they are the same "
                           f"(see gpu.fabric.manager for the exact package command)"])
    return Plan([RunCommand(summary="start nvidia-fabricmanager (it must be the driver's version)", needs_root=True,
                       argv=["systemctl", "start", "nvidia-fabricmanager"], timeout=120.0)])


MODULES_LOAD_IB_UMAD = "/etc/modules-load.d/ib_umad.conf"


@fixer("gpu.fabric.nvlsm", "Load ib_umad and start NVLSM (its unit, or the fabric manager that runs it)",
       needs_root=True)
def plan_nvlsm(ctx: Context, result: Result) -> Plan:
    """When gpu.fabric.nvlsm found NVLSM installed and not running (``gpu.fabric.nvlsm.stopped``): ``modprobe
    ib_umad`` (kept across reboots in modules-load.d), then ``systemctl enable --now`` of its own unit when this
    build ships one, else of the fabric manager (restarted if already active: its start script runs NVLSM).
    Installing the package (``gpu.fabric.nvlsm.missing``) is not planned: the plan's notes give the command."""
    if not result.has(fabric_software.NVLSM_DOWN, "gpu.fabric.nvlsm.missing"):
        return Plan()
    sw = ctx.fact("fabric_software")
    nv, fm = sw.get("nvlsm") or {}, sw.get("fabric_manager") or {}
    wrong = fabric_software.version_mismatch(fabric_software.fm_versions(fm), ctx.fact("nvml").get("driver_version"))
    if wrong:
        return Plan(notes=[f"not starting NVLSM: the fabric manager that runs it differs from the driver ({wrong}) "
                           f"and refuses to start; align it first (gpu.fabric.manager gives the exact command)"])
    if result.has("gpu.fabric.nvlsm.missing"):
        cmds = fabric_software.install_nvlsm_commands(sw.get("package_manager"))
        return Plan(notes=[f"nvlsm is not installed: install it by hand ({'; '.join(cmds)}), then run "
                           f"`k26-doctor fix` again (packages are not installed automatically)"])
    actions: list[Action] = []
    for argv in fabric_software.nvlsm_start_plan(nv, fm):
        what = {"modprobe": "load the ib_umad module (NVLSM reaches the NVSwitches through it)",
                "systemctl": f"{' '.join(argv[1:-1])} {argv[-1]}"}[argv[0]]
        actions.append(RunCommand(summary=what, needs_root=True, argv=argv, timeout=120.0))
        if argv[0] == "modprobe":
            actions.append(WriteFile(summary="load ib_umad at every boot", needs_root=True,
                                     path=MODULES_LOAD_IB_UMAD, new_text=fabric_software.IB_UMAD + "\n"))
    return Plan(actions)


def _gib(n: Any) -> str:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, (int, float)) else "? GiB"
