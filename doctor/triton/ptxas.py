"""The ptxas Triton will use (triton.ptxas): it assembles every kernel for ``sm_<cc>a``, with ``TRITON_PTXAS_PATH``
(or, from Triton 3.6 for arch >= 100, ``TRITON_PTXAS_BLACKWELL_PATH``) when that binary runs, else the one bundled.
Triton 3.5.x bundles only ptxas 12.8, which rejects ``sm_103a`` (B300); 3.6 adds a 12.9 ptxas-blackwell."""

from __future__ import annotations

import shlex
from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.stack import compat
from doctor.stack.cuda_arch import cc_str
from doctor.triton.toolchain import good_ptxas, ptxas_choice, triton_arch

REJECTS_ARCH = "triton.ptxas.rejects_arch"  # what the ptxas fixer answers (TRITON_PTXAS_*PATH in the env file)


def verdict_for(fact: dict[str, Any], cc: tuple[int, int], triton: dict[str, Any], where: str
                ) -> tuple[dict[str, Any], str | None]:
    """One GPU architecture: the ptxas Triton picks for it and whether it knows the arch; the failure, if any."""
    arch = triton_arch(cc)
    pick = ptxas_choice(fact, cc)
    chosen = pick["chosen"]
    item: dict[str, Any] = {"cc": cc_str(cc), "arch": arch, "var": pick["var"], "override": pick["override"],
                            "ptxas": chosen and chosen.get("path"), "release": chosen and chosen.get("release")}
    if chosen is None:
        return item, f"Triton {triton.get('version')} finds no working {pick['tool']} for {arch}"
    proof = chosen.get("proof") or {}
    knows = arch in (chosen.get("targets") or [])
    if proof.get("arch") == arch and not proof.get("ok"):
        knows = False
        item["proof_error"] = proof.get("error")
    item["knows"] = knows
    label = f"{chosen.get('source')} (CUDA {chosen.get('release')})"
    if pick["override"] and chosen.get("path") != pick["override"]:
        label += f"; {pick['var']}={pick['override']} does not run, so Triton falls back to it"
    if not knows:
        return item, f"Triton {triton.get('version')} uses {label}, which rejects {arch} ({where})"
    item["label"] = label
    return item, None


def judge_ptxas(fact: dict[str, Any], judged: tuple[list[tuple[int, int]], str, dict[str, Any]],
                settings: Settings) -> Findings:
    """``judged``: the GPUs to judge (``doctor.stack.cuda_arch.judged_ccs``)."""
    triton = fact.get("triton") or {}
    if not triton.get("dir"):
        if fact.get("error"):
            return Findings().fail("triton.ptxas.unread", f"cannot look for Triton's ptxas: {fact['error']}")
        raise NotJudged.blocked(f"Triton is not installed in {settings.python}; stack.versions judges that",
                                "stack.versions")
    ccs, where, source = judged
    if not ccs:
        raise NotJudged.missing("no GPU to judge: NVML sees none and the profile names no compute_capability",
                                **source)
    verdicts, failures = [], []
    for cc in ccs:
        item, failure = verdict_for(fact, cc, triton, where)
        verdicts.append(item)
        if failure:
            failures.append(failure)
    good = good_ptxas(fact, [v["arch"] for v in verdicts])
    out = Findings(gpus=where, **source, triton=triton, verdicts=verdicts, usable=good,
                   candidates=fact.get("candidates"))
    if failures:
        fix = upgrade_remedy(verdicts, good, settings)
        for failure in failures:
            out.fail(REJECTS_ARCH, failure, fix)
        return out
    summary = "; ".join(f"{v['arch']}: {v['label']}" for v in verdicts)
    if source.get("source") == "profile":
        summary += f" (judged for the profile's GPU; NVML unavailable: {source.get('nvml')})"
    return out.info("triton.ptxas.knows_arch", summary)


def upgrade_remedy(verdicts: list[dict[str, Any]], good: list[str], settings: Settings) -> Remediation:
    need = {compat.ptxas_min_cuda(v["arch"]) for v in verdicts if not v.get("knows")} - {None}
    cmds = [shlex.join([settings.python, "-m", "pip", "install", "triton>=3.6"])]
    var = verdicts[0]["var"]
    if good:
        cmds.append(f"echo '{var}={good[0]}' >> {settings.server.env_file or '<service env file>'}")
    text = (f"Upgrade Triton (3.6 bundles a ptxas that knows Blackwell Ultra; it comes with torch >= 2.10), or set "
            f"{var} to a ptxas from CUDA >= {min(need) if need else '12.9'}"
            + (f": usable here: {', '.join(good)}" if good else ": none found on this host")
            + ". `k26-doctor fix --apply` writes it into the service's environment file.")
    return Remediation(text, cmds)
