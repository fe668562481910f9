"""The GPUs a check judges: NVML's reading (or why there is none) and the TP group in it, and how they are named.

Every GPU check starts here: with NVML unavailable the cause is gpu.driver's to judge, with no GPU visible
gpu.count's (``NotJudged.blocked``), so a host without a driver says it once."""

from __future__ import annotations

from typing import Any

from doctor.core.result import NotJudged
from doctor.core.settings import ConfigError, load_profile, profile_names
from doctor.gpu import links

GIB = 2**30


def available(nvml: dict[str, Any]) -> dict[str, Any]:
    """The fact, when NVML answered; else gpu.driver judges why (``NotJudged.blocked``)."""
    if not nvml.get("available"):
        raise NotJudged.blocked(f"NVML is not available: {nvml.get('error') or 'unknown reason'} (see gpu.driver)",
                                "gpu.driver")
    return nvml


def tp_group(nvml: dict[str, Any], world_size: int) -> list[dict[str, Any]]:
    """The GPUs of the TP group, when NVML answered and sees any; else the check that judges why."""
    grp = links.group(available(nvml), world_size)
    if not grp:
        raise NotJudged.blocked("no GPU visible (see gpu.count)", "gpu.count")
    return grp


def label(d: dict[str, Any]) -> str:
    """``GPU3`` (the CUDA index the service sees), with the NVML index when it differs."""
    cuda, idx = d.get("cuda_index"), d.get("index")
    return f"GPU{cuda}" if cuda == idx or cuda is None else f"GPU{cuda} (NVML {idx})"


def gib(n: Any) -> str:
    return f"{n / GIB:.1f} GiB" if isinstance(n, (int, float)) else "?"


def short(text: str, limit: int = 100) -> str:
    """Head and tail of a long command line: the interpreter and the script's own arguments both show."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    return text[:head] + " ... " + text[-(limit - head - 5):]


def compute_capability(value: Any) -> tuple[int, int] | None:
    """``"10.3"`` or ``[10, 3]`` as ``(10, 3)``; None for anything else."""
    try:
        if isinstance(value, str):
            major, minor = value.strip().split(".")
            return int(major), int(minor)
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return int(value[0]), int(value[1])
    except (TypeError, ValueError):
        return None
    return None


def profiles_for(cc: tuple[int, int], name: str | None) -> list[str]:
    """Built-in profiles made for this GPU (same compute capability; name first)."""
    hits: list[tuple[int, str]] = []
    for pname in profile_names():
        try:
            prof = load_profile(pname)
        except ConfigError:
            continue
        gpu = prof.get("gpu") or {}
        if compute_capability(gpu.get("compute_capability")) == cc:
            named = bool(name and gpu.get("name_contains") and str(gpu["name_contains"]) in name)
            hits.append((0 if named else 1, pname))
    return [p for _, p in sorted(hits)]


def answered(nvml: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The fact, when NVML answered and sees a GPU of the TP group (else ``NotJudged`` naming the check that
    judges why): what a check reads first, before any other fact."""
    tp_group(nvml, world_size)
    return nvml
