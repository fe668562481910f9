"""The P2P path of the GPU pairs that talk over PCIe (gpu.p2p): ACS redirect on the bridges between them and an
IOMMU that translates their DMA send P2P through the root complex, where NCCL's first all-reduce hangs or crawls
although ``nvidia-smi topo -p2p r`` says OK. NVLink pairs never cross PCIe and are not judged. Readings from the
``pcie`` fact (``doctor.gpu.pcie``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from doctor.core.context import FactUnavailable, MalformedFact
from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.gpu import links, pcie
from doctor.gpu.group import label, tp_group
from doctor.gpu.nvml_fact import NvmlFact

ROOT_COMPLEX = ("P2P over PCIe then goes through the root complex: the first all-reduce hangs or crawls although "
                "`nvidia-smi topo -p2p r` says OK. ")


def split_pairs(nvml: NvmlFact, grp: list[Any]) -> tuple[list[Any], list[Any]]:
    """The pairs of the TP group joined by NVLink, and those whose P2P goes over PCIe."""
    nv_pairs, pcie_pairs = [], []
    for i, a in enumerate(grp):
        for b in grp[i + 1:]:
            pair = links.find_pair(nvml, a.get("index"), b.get("index"))
            (nv_pairs if (pair or {}).get("p2p_nvlink") == "ok" else pcie_pairs).append((a, b))
    return nv_pairs, pcie_pairs


def readings(fact: Any) -> dict[str, Any]:
    """A short account of the PCIe readings, for a verdict that did not need them."""
    if not isinstance(fact, dict):
        return {}
    bridges = [str(b) for b in fact["bridges"]] if isinstance(fact.get("bridges"), dict) else []
    acs = [pcie.bridge_acs(fact, b) for b in bridges]
    iommu = fact.get("iommu") if isinstance(fact.get("iommu"), dict) else {}
    return {"iommu": iommu.get("mode"), "bridges": len(bridges),
            "bridges_with_acs_redirect": sorted(a["bdf"] for a in acs if a["redirects"]),
            "bridges_unread": sorted(a["bdf"] for a in acs if a["present"] is None)}


class PathReading:
    """The bridges on each PCIe pair's path with their ACS state, and the pairs not found in sysfs."""

    def __init__(self, fact: dict[str, Any], pcie_pairs: list[Any]) -> None:
        by_bdf = {g.get("bdf"): g for g in fact.get("gpus") or [] if isinstance(g, dict)
                  and isinstance(g.get("bdf"), str)}
        self.redirect: dict[str, list[str]] = {}  # bridge -> pairs
        self.unread: dict[str, str] = {}
        self.acs_of: dict[str, dict[str, Any]] = {}
        self.not_found: list[str] = []
        self.rows: list[dict[str, Any]] = []
        for a, b in pcie_pairs:
            name = f"{label(a)}-{label(b)}"
            ga, gb = (by_bdf.get(pcie.norm_bdf(d.get("pci_bus_id") or "")) for d in (a, b))
            if ga is None or gb is None:
                self.not_found.append(name)
                continue
            path = pcie.path_bridges(pcie.gpu_upstream(ga), pcie.gpu_upstream(gb))
            row: dict[str, Any] = {"pair": name, "bridges": path, "redirect": [], "unread": []}
            for br in path:
                acs = self.acs_of.setdefault(br, pcie.bridge_acs(fact, br))
                if acs["redirects"]:
                    self.redirect.setdefault(br, []).append(name)
                    row["redirect"].append(br)
                elif acs["present"] is None:
                    self.unread[br] = acs["error"] or "not read"
                    row["unread"].append(br)
            self.rows.append(row)

    def redirect_finding(self) -> tuple[str, list[str]]:
        """The problem line of the redirecting bridges and the setpci commands that clear them."""
        bits: set[str] = set()
        cmds = []
        for br in self.redirect:
            bits.update(pcie.acs_names(self.acs_of[br]["enabled"], pcie.REDIRECT_BITS) or
                        [n.replace("_", " ") for n in self.acs_of[br]["redirects"]])
            cmd = pcie.setpci_command(self.acs_of[br])
            if cmd:
                cmds.append(cmd)
        hit = sorted({p for pairs in self.redirect.values() for p in pairs})
        names = list(self.redirect)
        return (f"ACS {' + '.join(sorted(bits))} on {len(names)} bridge(s) ({', '.join(names[:4])}"
                f"{' ...' if len(names) > 4 else ''}) under {len(hit)} pair(s)"), cmds


def judge_p2p_path(nvml: NvmlFact, pcie_fact: Callable[[], Any], settings: Settings) -> Findings:
    """``pcie_fact()`` reads the ``pcie`` fact: only when a pair goes over PCIe is it needed (its absence then
    leaves the check not judged); for NVLink pairs its readings are only reported."""
    grp = tp_group(nvml, settings.world_size)
    if len(grp) < 2:
        raise NotJudged.inapplicable(f"{len(grp)} GPU in the TP group: no pair")
    nv_pairs, pcie_pairs = split_pairs(nvml, grp)
    out = Findings(nvlink_pairs=len(nv_pairs), pcie_pairs=[f"{label(a)}-{label(b)}" for a, b in pcie_pairs])
    if not pcie_pairs:
        try:
            out.details["readings"] = readings(pcie_fact())
        except MalformedFact:
            raise
        except FactUnavailable as exc:
            out.details["readings"] = f"not read: {exc.reason}"
        return out.info("gpu.p2p.nvlink", f"all {len(nv_pairs)} pair(s) use NVLink: ACS and the IOMMU do not affect "
                        "NVLink P2P (PCIe readings in details)")
    return judge_pcie_pairs(pcie_fact(), pcie_pairs, out)


def judge_pcie_pairs(fact: dict[str, Any], pcie_pairs: list[Any], out: Findings) -> Findings:
    iommu = fact.get("iommu") if isinstance(fact.get("iommu"), dict) else {}
    mode = iommu.get("mode") if iommu.get("mode") in ("passthrough", "translated", "off") else "unknown"
    path = PathReading(fact, pcie_pairs)
    out.details.update(pairs=path.rows, iommu=iommu, bridges=path.acs_of)
    problems, cmds = [], []
    if path.redirect:
        line, setpci = path.redirect_finding()
        problems.append(line)
        cmds += setpci
        out.details["redirecting_bridges"] = path.redirect
    if mode == "translated":
        problems.append(f"the IOMMU translates the GPUs' DMA ({iommu.get('why')})")
        cmds += pcie.iommu_fix(iommu.get("vendor"))[1]
    if problems:
        fix = ROOT_COMPLEX
        if path.redirect:
            fix += ("Clear ACS control on the bridges named (setpci at the ACS capability's control register, "
                    "ECAP_ACS+6; lost at reboot: run it from a boot unit, or disable ACS in the BIOS). ")
        if mode == "translated":
            fix += (f"Put the IOMMU in passthrough: add `{pcie.iommu_fix(iommu.get('vendor'))[0]}` to the kernel "
                    f"command line and reboot.")
        return out.fail("gpu.p2p.root_complex", f"P2P of {len(pcie_pairs)} PCIe pair(s) goes through the root "
                        "complex: " + "; ".join(problems), Remediation(fix.strip(), cmds))
    if path.not_found and len(path.not_found) == len(pcie_pairs):
        errors = [str(e) for e in fact.get("errors") or []] if isinstance(fact.get("errors"), list) else []
        raise NotJudged.missing("the GPUs were not found in sysfs" + (f" ({'; '.join(errors)})" if errors else "")
                                + ": cannot read their PCIe path", **out.details)
    if path.unread:
        why = next(iter(path.unread.values()))
        raise NotJudged.missing(f"ACS of {len(path.unread)} bridge(s) on the PCIe P2P path not readable ({why}); "
                                f"IOMMU {mode}; run `sudo k26-doctor check --only gpu.p2p` to judge it",
                                **out.details)
    seen = len(out.details["bridges"])
    where = (f"no ACS redirect on the {seen} bridge(s) between them" if seen else
             "no PCIe bridge is visible between them (a virtual machine shows none of the host's bridges)")
    if mode == "unknown":
        return out.warn("gpu.p2p.iommu_unknown", f"{len(pcie_pairs)} PCIe pair(s): {where}, but the IOMMU mode is "
                        f"unknown ({iommu.get('why')})")
    return out.info("gpu.p2p.direct", f"{len(pcie_pairs)} PCIe pair(s): {where}; IOMMU {mode}")
