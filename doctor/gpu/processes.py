"""Who holds the GPUs: the processes NVML lists on the TP group (gpu.idle), each with its command line from /proc."""

from __future__ import annotations

from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.gpu.group import gib, label, short, tp_group
from doctor.gpu.nvml_fact import NvmlFact

HELD = "gpu.idle.processes"  # the finding the gpu.idle fixer acts on


def holders(grp: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """PID -> the process with the GPUs it is on and the memory it holds on all of them."""
    procs: dict[int, dict[str, Any]] = {}
    for d in grp:
        for p in d.get("processes") or []:
            if not isinstance(p.get("pid"), int):
                continue
            entry = procs.setdefault(p["pid"], {**p, "gpus": [], "used_memory_total": 0})
            entry["gpus"].append(label(d))
            entry["used_memory_total"] += p.get("used_memory") or 0
    return procs


def judge_idle(nvml: NvmlFact, settings: Settings) -> Findings:
    """No process holds memory on the GPUs of the TP group."""
    grp = tp_group(nvml, settings.world_size)
    unread = [f"{label(d)}: {(d.get('errors') or {}).get('processes.compute', 'not read')}" for d in grp
              if not isinstance(d.get("processes"), list)]
    if len(unread) == len(grp):
        raise NotJudged.missing("process lists not available: " + ", ".join(unread))
    procs = holders(grp)
    out = Findings(processes=sorted(procs.values(), key=lambda e: e["pid"]), unread=unread)
    if not procs:
        if unread:
            return out.warn("gpu.idle.unread", "no process on the GPUs that could be read; not read: "
                            + ", ".join(unread))
        return out.info("gpu.idle.idle", f"no process holds memory on the {len(grp)} GPU(s)")
    parts = []
    for p in out.details["processes"]:
        cmd = p.get("cmdline") or ("not visible from this PID namespace" if not p.get("in_namespace") else "?")
        parts.append(f"PID {p['pid']} ({short(cmd)}) {gib(p['used_memory_total'])} on {','.join(p['gpus'])}")
    sglang = any("sglang" in (p.get("cmdline") or "") for p in out.details["processes"])
    text = ("Stop them (`k26-doctor fix --apply` plans exactly these PIDs)."
            + (" One looks like an SGLang server: if it is the service itself, stop its unit instead."
               if sglang else ""))
    unit = settings.server.unit
    cmds = ["nvidia-smi", "kill " + " ".join(str(p["pid"]) for p in out.details["processes"])]
    if sglang and unit:
        cmds.insert(1, f"sudo systemctl stop {unit}")
    return out.fail(HELD, f"{len(procs)} process(es) hold GPU memory: " + "; ".join(parts), Remediation(text, cmds))
