"""NVLink between the GPUs of the TP group (gpu.nvlink): every pair linked, every GPU with the same number of active
links. TP8 over NVLink is the whole design of this deployment: on PCIe the same service ran TP8 at 26 tok/s and EP8
at 65 tok/s (../shared/DEPLOYMENT.md), so a TP profile on a host without NVLink fails pointing at the EP profile."""

from __future__ import annotations

from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.gpu import links
from doctor.gpu.group import available, label
from doctor.gpu.nvml_fact import NvmlFact

EP_PROFILE = "rtxpro6000-ep8"
PCIE_TP8_TOK_S, PCIE_EP8_TOK_S = 26, 65  # DEPLOYMENT.md, concurrency 1, 8x RTX PRO 6000
LINK_DOWN_FIX = Remediation("A link down costs bandwidth on every all-reduce of TP. Check the links, reseat or service "
                            "the GPU/baseboard; on NVSwitch hosts check the fabric manager.",
                            ["nvidia-smi nvlink -s", "nvidia-smi topo -m", "sudo dmesg | grep -i -E 'nvlink|xid'"])


def pairs_of(nvml: NvmlFact, grp: list[Any]) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """Every pair with its NVLink P2P status; the pairs without NVLink and those not read, named."""
    pairs, no_nv, unknown = [], [], []
    for i, a in enumerate(grp):
        for b in grp[i + 1:]:
            pair = links.find_pair(nvml, a.get("index"), b.get("index"))
            status = pair.get("p2p_nvlink") if pair else None
            pair_label = links.pair_label(nvml, a, b)
            pairs.append({"a": label(a), "b": label(b), "p2p_nvlink": status, "label": pair_label,
                          "errors": (pair or {}).get("errors") or {}})
            name = f"{label(a)}-{label(b)}"
            if status == "ok":
                continue
            if status is None:
                unknown.append(f"{name} ({((pair or {}).get('errors') or {}).get('p2p_nvlink', 'not read')})")
            else:
                no_nv.append(f"{name} ({pair_label}, {status})")
    return pairs, no_nv, unknown


def judge_nvlink(nvml: NvmlFact, settings: Settings) -> Findings:
    """NVLink P2P for every pair and equal active link counts; the matrix (``nvidia-smi topo -m``) as the exhibit."""
    nvml = available(nvml)
    grp = links.group(nvml, settings.world_size)
    out = Findings(matrix=links.matrix(nvml, grp))
    out.exhibit = "\n".join(str(r) for r in out.details["matrix"]) or None  # shown with a failure, once under -v
    if len(grp) < 2:
        raise NotJudged.inapplicable(f"{len(grp)} GPU in the TP group: no pair to link", out.exhibit, **out.details)
    pairs, no_nv, unknown = pairs_of(nvml, grp)
    counts = {label(d): links.active_links(d) for d in grp}
    slots = {label(d): links.link_slots(d) for d in grp}
    out.details.update(pairs=pairs, active_links=counts, links_present=slots)
    pcie_only = all(s == 0 for s in slots.values())
    if not bool(settings.gpu.nvlink_required):
        if pcie_only or no_nv:
            return out.info("gpu.nvlink.not_required", f"no NVLink between {len(no_nv)} of {len(pairs)} pair(s); the "
                            f"profile does not need it ({settings.profile_name})")
        return out.info("gpu.nvlink.linked", f"NVLink P2P between all {len(pairs)} pair(s) (not required by the "
                        "profile)")
    if pcie_only or (no_nv and len(no_nv) == len(pairs) and not any(counts.values())):
        unlinked = no_links(grp, pcie_only, settings, out)
        if unlinked is not None:
            return unlinked
    return link_counts(no_nv, unknown, len(pairs), counts, slots, grp, settings, out)


def no_links(grp: list[Any], pcie_only: bool, settings: Settings, out: Findings) -> Findings | None:
    """No active NVLink at all: the fabric not up (links present), or a PCIe host under a TP profile."""
    fabric_down = [label(d) for d in grp if (d.get("fabric") or {}).get("state_name") in ("not_started",
                                                                                          "in_progress")]
    if not pcie_only and fabric_down:
        return out.fail("gpu.nvlink.fabric_down", f"NVLinks are present but none is active on {len(grp)} GPUs: the "
                        f"NVSwitch fabric is not up on {', '.join(fabric_down)} (see gpu.fabric)",
                        Remediation("Start nvidia-fabricmanager (same version as the driver).",
                                    ["sudo systemctl start nvidia-fabricmanager", "nvidia-smi nvlink -s"]))
    if pcie_only and int(settings.parallel.ep or 1) == 1:
        out.details.update(ep_profile=EP_PROFILE, measured_tok_s={"tp8_pcie": PCIE_TP8_TOK_S,
                                                                  "ep8_pcie": PCIE_EP8_TOK_S})
        return out.fail(
            "gpu.nvlink.pcie_only",
            f"PCIe only: no NVLink between the {len(grp)} GPUs, but profile {settings.profile_name} runs "
            f"TP{settings.tp} over NVLink. On PCIe this service measured TP8 {PCIE_TP8_TOK_S} tok/s vs EP8 "
            f"{PCIE_EP8_TOK_S} tok/s: use expert parallelism (--profile {EP_PROFILE})",
            Remediation(f"Use the EP profile on this host: --profile {EP_PROFILE} (EP8 avoids the MoE all-reduce "
                        f"over PCIe; {PCIE_EP8_TOK_S} vs {PCIE_TP8_TOK_S} tok/s measured at concurrency 1).",
                        [f"k26-doctor check --profile {EP_PROFILE}", "nvidia-smi topo -m"]))
    return None


def link_counts(no_nv: list[str], unknown: list[str], n_pairs: int, counts: dict[str, int | None],
                slots: dict[str, int | None], grp: list[Any], settings: Settings, out: Findings) -> Findings:
    """Pairs without NVLink, unequal or too few active links; else every pair linked."""
    if no_nv:
        out.fail("gpu.nvlink.unlinked_pairs", f"no NVLink P2P between {len(no_nv)} of {n_pairs} pair(s): "
                 + ", ".join(no_nv[:8]) + (" ..." if len(no_nv) > 8 else ""), LINK_DOWN_FIX)
    known = {g: c for g, c in counts.items() if isinstance(c, int)}
    if known and len(set(known.values())) > 1:
        top = max(known.values())
        low = [f"{g} {c}/{slots.get(g)}" for g, c in known.items() if c < top]
        out.fail("gpu.nvlink.link_down", f"unequal active link counts (degraded link): {', '.join(low)} vs {top} on "
                 "the others", LINK_DOWN_FIX)
    min_links = settings.gpu.min_nvlinks or 0
    if isinstance(min_links, int) and min_links > 0:
        few = [f"{g} {c}" for g, c in known.items() if c < min_links]
        if few and not (len(set(known.values())) > 1):
            out.fail("gpu.nvlink.few_links", f"fewer active links than the profile's {min_links}: {', '.join(few)}",
                     LINK_DOWN_FIX)
    if out.failing:
        return out
    if unknown:
        raise NotJudged.failing("NVLink P2P could not be read for " + ", ".join(unknown[:8]), **out.details)
    n = min(known.values()) if known else None
    return out.info("gpu.nvlink.linked", f"NVLink P2P between all {n_pairs} pair(s) of {len(grp)} GPUs"
                    + (f", {n} active links each (NV{n})" if n else ""))
