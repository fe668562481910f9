"""/dev/shm against what the TP group puts there at start (host.shm).

NCCL's shared-memory transport, NCCL's per-rank segment and SGLang's broadcast queue live in /dev/shm; a
container's default of 64 MB is far too small for TP8 and the server dies in NCCL's init with "Error while
creating shared memory segment /dev/shm/nccl-... (size 9637888)" / "No space left on device". The estimate is
data (``doctor/data/shm_estimate.toml``: each part with its reason and source); the fix depends on where the
service runs (docker's ``--shm-size``, a Kubernetes ``emptyDir`` of ``medium: Memory``, a remount on a host),
and none is applied automatically: a remount of a host's /dev/shm, or a container's, is the operator's.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml
from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "shm_estimate.toml"
MIB = 1024**2
TOO_SMALL = "host.shm.too_small"
FULL = "host.shm.full"
SMALL = "host.shm.small"
READ_ONLY = "host.shm.read_only"
MISSING = "host.shm.missing"
ENOUGH = "host.shm.enough"


def estimate(tp: int, table: dict[str, Any] | None = None) -> tuple[int, dict[str, int]]:
    """Bytes the TP group needs in /dev/shm, and each part's share (``doctor/data/shm_estimate.toml``)."""
    data = table if table is not None else load_toml(DATA_FILE)
    parts: dict[str, int] = {}
    for part in data.get("part", []):
        per = part.get("per")
        count = tp if per == "rank" else 1 if per == "group" else \
            tp * int(part.get("channels", 1)) * int(part.get("peers", 1)) if per == "rank_channel_peer" else 0
        parts[str(part["name"])] = int(part["bytes"]) * count
    return sum(parts.values()), parts


def recommended(need: int, table: dict[str, Any] | None = None) -> int:
    data = table if table is not None else load_toml(DATA_FILE)
    return max(int(need * float(data.get("margin", 2.0))), int(data.get("min_recommended_mib", 0)) * MIB)


def environment(fact: dict[str, Any]) -> str:
    """``kubernetes``, ``container`` or ``host``: where the fix is made."""
    c = fact.get("container") or {}
    return "kubernetes" if c.get("kubernetes") else "container" if c.get("dockerenv") or c.get("containerenv") \
        else "host"


def size_fix(fact: dict[str, Any], want: int, what: str) -> Remediation:
    """How to give /dev/shm ``want`` bytes where the service runs (never done automatically)."""
    gib = max(1, -(-want // 1024**3))
    path = str(fact.get("path") or "/dev/shm")
    df = shlex.join(["df", "-h", path])
    where = environment(fact)
    if where == "kubernetes":
        return Remediation(f"{what} Mount a memory-backed emptyDir at {path} in the pod spec: volumes: - name: dshm, "
                           f"emptyDir: {{medium: Memory, sizeLimit: {gib}Gi}}; volumeMounts: - name: dshm, "
                           f"mountPath: {path} (the pod's memory limit must cover it).", [df])
    if where == "container":
        return Remediation(f"{what} Recreate the container with a larger /dev/shm: docker/podman run "
                           f"--shm-size={gib}g (compose: shm_size: {gib}gb), or --ipc=host.", [df])
    return Remediation(f"{what} Enlarge the host's /dev/shm (as root; it is shared with every process of the host, "
                       f"so the doctor does not do it): mount -o remount,size={gib}G {path}, and the same size in "
                       "/etc/fstab to keep it.", [df, shlex.join(["mount", "-o", f"remount,size={gib}G", path])])


def stale(fact: dict[str, Any]) -> str:
    seg = fact.get("segments") or {}
    if not seg.get("count"):
        return ""
    names = ", ".join(e["name"] for e in seg.get("largest", [])[:3])
    return f"; {seg['count']} leftover segment(s) hold {seg['bytes'] / MIB:.0f} MiB ({names})"


def judge_shm(fact: dict[str, Any], settings: Settings) -> Findings:
    """Size and free space of /dev/shm against the estimate for the profile's TP."""
    tp = settings.world_size  # every rank of the host shares its /dev/shm
    if tp <= 1:
        raise NotJudged.inapplicable("one rank (TP x PP x DP = 1): no shared-memory transport between ranks")
    need, parts = estimate(tp)
    want = recommended(need)
    path = fact.get("path") or "/dev/shm"
    if "error" in fact:
        return Findings(environment=environment(fact)).fail(
            MISSING, f"{path}: {fact['error']}: NCCL and SGLang cannot create their shared memory",
            size_fix(fact, want, f"Give the service a {path} (tmpfs)."))
    total, free = fact["total_bytes"], fact["free_bytes"]
    mount = fact.get("mount") or {}
    out = Findings(path=path, total_mib=round(total / MIB, 1), free_mib=round(free / MIB, 1),
                   need_mib=round(need / MIB, 1), recommended_mib=round(want / MIB), ranks=tp,
                   parts_mib={k: round(v / MIB, 1) for k, v in parts.items()}, environment=environment(fact),
                   fstype=mount.get("fstype"), mount_point=mount.get("mount_point"))
    head = f"{path}: {total / MIB:.0f} MiB"
    if fact["read_only"]:
        return out.fail(READ_ONLY, f"{head}, read-only: NCCL cannot create its segments",
                        size_fix(fact, want, f"Mount {path} read-write."))
    if total < need:
        return out.fail(TOO_SMALL, f"{head} < {need / MIB:.0f} MiB that {tp} ranks need (NCCL's shared-memory "
                                   "transport and segments, SGLang's broadcast queue): the server dies in NCCL's "
                                   "init (\"Error while creating shared memory segment\")",
                        size_fix(fact, want, f"Give {path} at least {want / MIB:.0f} MiB."))
    if free < need:
        seg = fact.get("segments") or {}
        rem = size_fix(fact, want, f"Free {path}: remove what a crashed server left there once no server runs "
                                   "(ls -la /dev/shm), or give it more room.")
        if seg.get("count"):
            rem = Remediation(rem.text, [shlex.join(["ls", "-la", str(path)]), *rem.commands])
        return out.fail(FULL, f"{path}: {free / MIB:.0f} MiB free of {total / MIB:.0f} MiB < {need / MIB:.0f} MiB "
                              f"that {tp} ranks need{stale(fact)}", rem)
    if total < want:
        return out.warn(SMALL, f"{head} ({free / MIB:.0f} MiB free) holds the {need / MIB:.0f} MiB {tp} ranks need, "
                               f"but less than the {want / MIB:.0f} MiB recommended (NCCL's buffer sizes vary "
                               "with NCCL_BUFFSIZE and its version)",
                        size_fix(fact, want, f"Give {path} {want / MIB:.0f} MiB."))
    return out.info(ENOUGH, f"{head}, {free / MIB:.0f} MiB free >= {want / MIB:.0f} MiB recommended for {tp} ranks "
                            f"(need {need / MIB:.0f} MiB)")
