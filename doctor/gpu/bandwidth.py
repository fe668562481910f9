"""Measured GPU-to-GPU copy bandwidth (gpu.p2p_bandwidth, --deep) against what the links should carry.

Copy-engine copies on healthy links reach 80-90% of the link rate; a link down costs only 1/18 (gpu.nvlink
catches that), while traffic falling back to PCIe or staged through the host reaches under 15% of NVLink:
50% of the rate (gpu.min_p2p_bandwidth_fraction) separates the two with room for noise; below 70% warns."""

from __future__ import annotations

import shlex
from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.gpu import links
from doctor.gpu.group import available, label
from doctor.gpu.nvml_fact import NvmlFact

LOOK = ["nvidia-smi topo -m", "nvidia-smi nvlink -s", "nvidia-smi -q | grep -i -A3 fabric"]


class Rates:
    """Every pair of the TP group: its measured rate against the expected one, and the pairs that fell short."""

    def __init__(self, nvml: NvmlFact, grp: list[Any], bw: dict[str, Any], gen: Any, min_frac: float,
                 warn_frac: float) -> None:
        measured: dict[tuple[int, int], dict[str, Any]] = {}
        for p in bw.get("pairs") or []:
            if isinstance(p, dict) and isinstance(p.get("src"), int) and isinstance(p.get("dst"), int):
                measured[(p["src"], p["dst"])] = p
        self.rows: list[dict[str, Any]] = []
        self.low: list[str] = []
        self.warn: list[str] = []
        self.missing: list[str] = []
        self.corrupt: list[str] = []
        self.unjudged: list[str] = []
        for i, a in enumerate(grp):
            for b in grp[i + 1:]:
                ca, cb = a.get("cuda_index", i), b.get("cuda_index", grp.index(b))
                got = [measured.get((ca, cb)), measured.get((cb, ca))]
                self.add(nvml, a, b, got, gen, min_frac, warn_frac)

    def add(self, nvml: NvmlFact, a: Any, b: Any, got: list[Any], gen: Any, min_frac: float, warn_frac: float) -> None:
        name = f"{label(a)}-{label(b)}"
        if any(g is None for g in got):
            self.missing.append(name)
            return
        rate = min(float(g.get("gb_per_s") or 0) for g in got)
        if any(g.get("data_ok") is False for g in got):
            self.corrupt.append(name)
        expect, how = links.expected_pair_gbps(nvml, a, b, gen if isinstance(gen, int) else None)
        frac = rate / expect if expect else None
        self.rows.append({"pair": name, "gb_per_s": rate, "expected_gb_per_s": expect, "basis": how,
                          "fraction": round(frac, 3) if frac is not None else None,
                          "peer_access": all(g.get("peer_access") for g in got)})
        if frac is None:
            self.unjudged.append(name)
        elif frac < min_frac:
            self.low.append(f"{name} {rate:.0f} GB/s ({frac:.0%} of {expect:.0f})")
        elif frac < warn_frac:
            self.warn.append(f"{name} {rate:.0f} GB/s ({frac:.0%} of {expect:.0f})")


def failed_pairs(bw: dict[str, Any], grp: list[Any], rates: Rates) -> list[str]:
    """The pairs whose copy never completed (hung or failed in their child), named; they are not "missing"."""
    by_cuda = {d.get("cuda_index", i): label(d) for i, d in enumerate(grp)}
    failed = []
    for f in bw.get("failed_pairs") or []:
        if isinstance(f, dict) and isinstance(f.get("a"), int) and isinstance(f.get("b"), int):
            name = f"{by_cuda.get(f['a'], 'GPU' + str(f['a']))}-{by_cuda.get(f['b'], 'GPU' + str(f['b']))}"
            failed.append(f"{name} ({'hung: ' if f.get('timed_out') else ''}{f.get('error') or 'failed'})")
            rates.missing = [m for m in rates.missing if m != name]
    return failed


def not_measured(bw: dict[str, Any], out: Findings) -> Findings:
    reason = bw.get("reason") or bw.get("error") or "not measured"
    if bw.get("probe_failed"):
        raise NotJudged.failing(str(reason), **out.details)
    if "only with --deep" in str(reason):
        raise NotJudged.inapplicable(str(reason), **out.details)
    return out.fail("gpu.p2p_bandwidth.unmeasured", f"could not measure: {reason}",
                    Remediation("The service's torch must see the GPUs and copy between them.",
                                [f"{shlex.quote(str(bw.get('python') or 'python3'))} -c 'import torch; "
                                 f"print(torch.cuda.device_count())'"]))


def judge_bandwidth(nvml: NvmlFact, bw: dict[str, Any], settings: Settings) -> Findings:
    grp = links.group(available(nvml), settings.world_size)
    out = Findings(local_copy=bw.get("local"), torch=bw.get("torch"), python=bw.get("python"))
    if not bw.get("measured"):
        return not_measured(bw, out)
    if len(grp) < 2:
        raise NotJudged.inapplicable(f"{len(grp)} GPU in the TP group: no pair to measure", **out.details)
    min_frac = float(settings.gpu.min_p2p_bandwidth_fraction)
    warn_frac = float(settings.gpu.warn_p2p_bandwidth_fraction)
    rates = Rates(nvml, grp, bw, settings.gpu.nvlink_generation, min_frac, warn_frac)
    failed = failed_pairs(bw, grp, rates)
    out.details.update(pairs=rates.rows, min_fraction=min_frac, warn_fraction=warn_frac, missing=rates.missing,
                       failed_pairs=bw.get("failed_pairs") or [])
    if failed:
        return out.fail("gpu.p2p_bandwidth.hung", f"GPU-to-GPU copies did not complete for {len(failed)} pair(s): "
                        + ", ".join(failed[:6]) + (" ..." if len(failed) > 6 else ""),
                        Remediation("A copy that never completes is P2P routed through the root complex (ACS "
                                    "redirect, an IOMMU translating DMA: see gpu.p2p) or a fabric that is not up "
                                    "(gpu.fabric). Do not start the service: its first all-reduce would hang.",
                                    ["k26-doctor check --only gpu.p2p --only 'gpu.fabric*' -v", *LOOK]))
    if rates.corrupt:
        return out.fail("gpu.p2p_bandwidth.corrupt", "GPU-to-GPU copies returned wrong data: "
                        + ", ".join(rates.corrupt),
                        Remediation("Do not run the service on these GPUs; check the kernel log for Xid errors.",
                                    ["sudo dmesg | grep -i xid"]))
    if rates.low:
        return out.fail("gpu.p2p_bandwidth.low", f"copy bandwidth below {min_frac:.0%} of the links' rate: "
                        + ", ".join(rates.low[:6]),
                        Remediation("Traffic is not taking the links it should (P2P off, PCIe fallback, degraded "
                                    "fabric).", LOOK))
    return judged_rates(rates, warn_frac, out)


def judged_rates(rates: Rates, warn_frac: float, out: Findings) -> Findings:
    if not rates.rows:
        raise NotJudged.failing("no pair of the TP group was measured", **out.details)
    if len(rates.unjudged) == len(rates.rows):
        raise NotJudged.missing("measured, but the links' expected rate is unknown: "
                                + ", ".join(f"{r['pair']} {r['gb_per_s']:.0f} GB/s" for r in rates.rows[:6]),
                                **out.details)
    worst = min((r for r in rates.rows if r["fraction"] is not None), key=lambda r: r["fraction"])
    out.info("gpu.p2p_bandwidth.rate", f"{len(rates.rows)} pair(s), lowest {worst['pair']} {worst['gb_per_s']:.0f} "
             f"GB/s ({worst['fraction']:.0%} of {worst['expected_gb_per_s']:.0f} GB/s, {worst['basis']})")
    if rates.warn or rates.missing:
        extra = ([f"below {warn_frac:.0%}: " + ", ".join(rates.warn[:6])] if rates.warn else []) + (
            [f"not measured (probe budget): {', '.join(rates.missing[:6])}"] if rates.missing else [])
        out.warn("gpu.p2p_bandwidth.slow", "; ".join(extra), Remediation("Lower than a healthy link gives.", LOOK))
    return out
