"""Triton's toolchain as the triton checks and fixers both see it: the interpreter's kind, whether there is a driver,
Triton's target name for a GPU, the ptxas Triton would pick, and the ptxas binaries that know an arch."""

from __future__ import annotations

import re
from typing import Any

from doctor.python.headers import interpreter_kind as headers_kind


def interpreter_kind(stack: Any, build: dict[str, Any]) -> dict[str, Any]:
    """Where the interpreter's headers come from: system package, pyenv, uv, conda or a source build. ``stack``:
    the ``stack`` fact, or None when it cannot be had."""
    stack = stack if isinstance(stack, dict) and stack.get("ok") else {}
    py = stack.get("python") or {}
    include = str(build.get("py_include") or py.get("include") or "")
    m = re.search(r"python(\d+)\.(\d+)", include)
    ver = py.get("version") or (f"{m.group(1)}.{m.group(2)}" if m else "3")
    mm = ".".join(str(ver).split(".")[:2])
    base = str(py.get("base_prefix") or (include.split("/include/")[0] if "/include/" in include else ""))
    kind = headers_kind(base, bool(py.get("base_is_conda")))
    return {"kind": kind, "base_prefix": base, "version": str(ver), "major_minor": mm}


def no_driver(libcuda: Any) -> bool:
    """Whether this host has no NVIDIA driver at all (no kernel module), as the ``libcuda`` fact (or None: not
    recorded) read it: then a missing libcuda.so.1 is the driver's absence, which ``gpu.driver`` judges, not a
    problem of Triton's."""
    kmd = libcuda.get("kernel_module") if isinstance(libcuda, dict) else None
    return isinstance(kmd, dict) and kmd.get("present") is False


def triton_arch(cc: tuple[int, int]) -> str:
    """Triton's target name for a GPU (``sm_arch_from_capability``): ``sm_XYa`` from 9.0 on."""
    n = cc[0] * 10 + cc[1]
    return f"sm_{n}{'a' if n >= 90 else ''}"


def ptxas_choice(fact: dict[str, Any], cc: tuple[int, int]) -> dict[str, Any]:
    """The ptxas Triton uses for ``cc``: its env override if that binary answers ``--version``, else bundled."""
    triton = fact.get("triton") or {}
    n = cc[0] * 10 + cc[1]
    from_arch = triton.get("blackwell_ptxas_from_arch")
    blackwell = from_arch is not None and n >= int(from_arch)
    var = "TRITON_PTXAS_BLACKWELL_PATH" if blackwell else "TRITON_PTXAS_PATH"
    tool = "ptxas-blackwell" if blackwell else "ptxas"
    cands = {c.get("path"): c for c in fact.get("candidates") or []}
    override = (fact.get("env") or {}).get(var)
    chosen = None
    if override and cands.get(override, {}).get("release"):
        chosen = cands[override]
    if chosen is None:
        bundled = next((c for c in cands.values() if c.get("source") == f"triton bundled {tool}"), None)
        if bundled and bundled.get("release"):
            chosen = bundled
    return {"var": var, "tool": tool, "override": override, "chosen": chosen}


def good_ptxas(fact: dict[str, Any], archs: list[str]) -> list[str]:
    """ptxas binaries on this host that know every arch needed (proof compile passed where it ran)."""
    out = []
    for c in fact.get("candidates") or []:
        if not c.get("release") or not all(a in (c.get("targets") or []) for a in archs):
            continue
        proof = c.get("proof") or {}
        if proof.get("arch") in archs and not proof.get("ok"):
            continue
        out.append(c["path"])
    return out


