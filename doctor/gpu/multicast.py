"""NVLink multicast for the TP group (gpu.multicast): what FlashInfer's all-reduce fusion, torch's and NCCL's
symmetric memory and NCCL's NVLS need at start, judged from facts only.

The facts: CUDA's ``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`` of every GPU the service sees (the ``multicast``
fact: ``cuInit`` and ``cuDeviceGetAttribute`` in a child with a deadline; no multicast object is ever created
to find out: ``cuMulticastCreate`` on a shared host can take NVSwitch multicast resources from others), NVML's
fabric state (the ``nvml`` fact gpu.fabric judges: ``doctor.gpu.fabric.readiness``), the server's arguments
and the flags the installed SGLang accepts (``sglang_flags``, else the flag history by version). Which flags
keep a multicast user off, and which ask for one, is data: ``doctor/data/multicast.toml``.

Whether another NVLS user already holds the host's multicast objects cannot be read without creating one: no
NVML or CUDA query reports them. The judgement says so, and warns when other processes hold GPUs of the group.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml
from doctor.core.registry import Applicability
from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.gpu import fabric
from doctor.gpu.group import compute_capability, label, tp_group
from doctor.stack.sglang_releases import load_history

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "multicast.toml"
UNSUPPORTED = "gpu.multicast.unsupported"
NOT_NEEDED = "gpu.multicast.not_needed"
SHARED = "gpu.multicast.shared"
SUPPORTED = "gpu.multicast.supported"
NOT_READY_INIT = 802  # CUDA_ERROR_SYSTEM_NOT_READY: the fabric manager has not registered the GPUs
UNREADABLE_OBJECTS = ("whether another NVLS user holds the host's multicast objects (no NVML or CUDA query "
                      "reports them without creating one)")


def rules() -> dict[str, Any]:
    return load_toml(DATA_FILE)


def bus_key(bus: Any) -> str | None:
    """``00000000:18:00.0`` (NVML) and ``0000:18:00.0`` (CUDA) as one key: ``0:18:00.0``."""
    m = re.fullmatch(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", str(bus or "").strip())
    return f"{int(m.group(1), 16):x}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower() if m else None


def accepted(flag: str, flags_fact: dict[str, Any] | None) -> bool | None:
    """Whether the installed SGLang accepts ``flag``: its flag table, else the history at its version; None when
    neither is known."""
    fact = flags_fact or {}
    table = fact.get("table")
    if isinstance(table, dict) and isinstance(table.get("options"), dict):
        return flag in table["options"]
    history = load_history()
    pos = history.position(fact.get("version"))
    if pos is None or pos != int(pos):
        return None
    return any(a <= pos <= b for a, b in history.runs(flag))


def probe_devices(mc: dict[str, Any], group: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each GPU of the group (by label) -> the probe's entry for it, matched by PCI bus id, else by CUDA index."""
    entries = mc.get("devices") or []
    by_bus = {bus_key(e.get("pci_bus_id")): e for e in entries if bus_key(e.get("pci_bus_id"))}
    by_ordinal = {e.get("ordinal"): e for e in entries}
    out = {}
    for d in group:
        e = by_bus.get(bus_key(d.get("pci_bus_id"))) or by_ordinal.get(d.get("cuda_index"))
        out[label(d)] = e or {}
    return out


def probe_problem(mc: dict[str, Any]) -> None:
    """``NotJudged`` when the probe read nothing: which check judges why, or the probe's own failure."""
    if mc.get("ok") is False or mc.get("timed_out"):
        raise NotJudged.failing(f"multicast not read: {mc.get('error') or 'the probe failed'}")
    if not mc.get("loaded"):
        raise NotJudged.blocked(f"multicast not read: libcuda.so.1 does not load ({mc.get('error')}) "
                                "(see cuda.libcuda)", "cuda.libcuda")
    rc = mc.get("cu_init")
    if rc == NOT_READY_INIT:
        raise NotJudged.blocked("multicast not read: cuInit says the system is not ready (802): the NVSwitch "
                                "fabric has not registered the GPUs (see gpu.fabric)", "gpu.fabric")
    if rc not in (0, None):
        raise NotJudged.blocked(f"multicast not read: cuInit failed ({mc.get('cu_init_error') or rc}) "
                                "(see cuda.libcuda)", "cuda.libcuda")


def off_remedy(flags_fact: dict[str, Any] | None, asked: list[dict[str, Any]]) -> Remediation:
    """The flags of the installed release that keep the multicast users off (never one it lacks)."""
    data = rules()
    fact = flags_fact or {}
    release = fact.get("version") or "the installed SGLang"
    off = [r for r in data.get("off", []) if accepted(r["flag"], flags_fact)]
    unknown = [r for r in data.get("off", []) if accepted(r["flag"], flags_fact) is None]
    parts = []
    if asked:
        parts.append("Remove " + ", ".join(r["flag"] for r in asked) + " from [server] args (they need multicast).")
    if off:
        parts.append(f"Add {off[0]['flag']} to [server] args ({off[0]['what']}; SGLang {release} accepts it).")
    elif unknown:
        parts.append("The installed SGLang's flags were not read (see sglang.flags): add "
                     f"{unknown[0]['flag']} to [server] args if it accepts it.")
    else:
        parts.append(f"SGLang {release} has no " + ", ".join(r["flag"] for r in data.get("off", []))
                     + ": leave --enable-flashinfer-allreduce-fusion out of [server] args.")
    nccl = data.get("nccl") or {}
    parts.append(f"NCCL skips NVLS by itself on such GPUs; {nccl.get('env')}={nccl.get('off')} in [server.env] "
                 "keeps it off outright. Or serve on an NVSwitch (HGX) host.")
    return Remediation(" ".join(parts), ["nvidia-smi topo -m", "nvidia-smi -q -d FABRIC"])


def auto_fusion(group: list[dict[str, Any]]) -> bool:
    """Whether SGLang would turn FlashInfer's all-reduce fusion on by itself on these GPUs (by compute capability;
    unknown counts as yes: the judgement then says what would fail)."""
    majors = set(rules().get("auto_fusion_cc_major", []))
    caps = [compute_capability(d.get("compute_capability")) for d in group]
    return any(c is None or c[0] in majors for c in caps)


def profile_flags(args: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``[[off]]`` flags the server's arguments give and the ``[[needs]]`` flags they ask for."""
    names = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    data = rules()
    return ([r for r in data.get("off", []) if r["flag"] in names],
            [r for r in data.get("needs", []) if r["flag"] in names])


def _probe_to_judge(ready: fabric.Readiness, mc: dict[str, Any] | None) -> dict[str, Any]:
    """The multicast probe's reading, or ``NotJudged`` when it is not to be judged: a fabric not ready yet
    (``gpu.fabric`` says so first), the fact not recorded, or the probe itself failed."""
    if ready.outcome in ("pending", "failed", "mixed"):
        raise NotJudged.blocked(f"multicast needs the NVSwitch fabric, which is not ready: {ready.describe()} "
                                "(see gpu.fabric)", "gpu.fabric")
    if mc is None:
        raise NotJudged.missing("multicast not read: the 'multicast' fact is not recorded (CUDA's attribute per GPU)")
    probe_problem(mc)
    return mc


def _lacking(out: Findings, lacking: list[str], outcome: str, group: list[dict[str, Any]],
             off: list[dict[str, Any]], asked: list[dict[str, Any]], flags_fact: dict[str, Any] | None) -> Findings:
    """GPUs without multicast: fine when the server's arguments keep its users off or nothing would ask for it,
    else a failure at start, with the flags of the installed release that keep them off."""
    where = fabric.span(lacking)
    why = "no NVSwitch fabric: PCIe or NVLink bridges" if outcome == "no_fabric" else \
        f"the fabric is {outcome}, yet the driver says no (confidential computing, NVLSM/IMEX)"
    if off and not asked:
        return out.info(NOT_NEEDED, f"NVLink multicast not supported on {where} ({why}); the server's "
                                    f"arguments keep its users off ({', '.join(r['flag'] for r in off)})")
    if not asked and not auto_fusion(group):
        return out.info(NOT_NEEDED, f"NVLink multicast not supported on {where} ({why}); SGLang turns the "
                                    "fusion on by itself only on SM90/SM100 and no server flag asks for a "
                                    "multicast user")
    users = ", ".join(r["flag"] for r in asked) if asked else "FlashInfer's all-reduce fusion (SGLang turns it " \
        "on by itself for DeepSeek-style models on SM90/SM100 at TP > 1)"
    return out.fail(UNSUPPORTED, f"NVLink multicast not supported on {where} ({why}): {users} fails at start "
                                 "(\"Device does not support multicasting\")", off_remedy(flags_fact, asked))


def all_reduces(settings: Settings) -> bool:
    """Multicast is judged only where GPUs all-reduce: more than one (TP x PP x DP > 1)."""
    return settings.world_size > 1


MULTICAST_APPLIES = Applicability(all_reduces, lambda _settings: "TP x PP x DP = 1: no all-reduce between GPUs, "
                                  "nothing needs multicast")  # gpu.multicast's applies_if


def judge_multicast(nvml: dict[str, Any], mc: dict[str, Any] | None, flags_fact: dict[str, Any] | None,
                    args: list[str], settings: Settings) -> Findings:
    """Multicast on every GPU of the TP group, the fabric it needs, and what the server will ask of it (more than
    one GPU: ``MULTICAST_APPLIES``, declared on the check)."""
    world = settings.world_size
    group = tp_group(nvml, world)
    ready = fabric.readiness(nvml, world)
    seen = probe_devices(_probe_to_judge(ready, mc), group)
    unread = [f"{g}: {e.get('error') or 'not seen by CUDA'}" for g, e in seen.items()
              if e.get("multicast_supported") is None]
    lacking = [g for g, e in seen.items() if e.get("multicast_supported") is False]
    off, asked = profile_flags(args)
    out = Findings(multicast={g: e.get("multicast_supported") for g, e in seen.items()}, fabric=ready.outcome,
                   disabled_by=[r["flag"] for r in off], asked_by=[r["flag"] for r in asked],
                   not_judged=UNREADABLE_OBJECTS)
    if lacking:
        return _lacking(out, lacking, ready.outcome, group, off, asked, flags_fact)
    if unread:
        raise NotJudged.failing("multicast not read on " + "; ".join(unread), **out.details)
    busy = [label(d) for d in group if d.get("processes")]
    if busy:
        return out.warn(SHARED, f"NVLink multicast supported on {fabric.span(list(seen))}, but other processes hold "
                                f"{fabric.span(busy)}: {UNREADABLE_OBJECTS}; a start can fail with \"Failed to "
                                "bind NVLink SHARP (NVLS) Multicast memory\" (see gpu.idle)",
                        Remediation("Stop the other processes on these GPUs (gpu.idle names them), or keep NCCL's "
                                    "NVLS off: NCCL_NVLS_ENABLE=0 in [server.env].",
                                    ["k26-doctor check --only gpu.idle"]))
    return out.info(SUPPORTED, f"NVLink multicast supported on {fabric.span(list(seen))}, fabric {ready.outcome}; "
                               f"not judged: {UNREADABLE_OBJECTS}, no other process holds these GPUs")
