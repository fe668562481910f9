"""Judging the GPU code of the service's kernel packages against its GPUs (the facts: ``doctor.stack.scan``).

CUDA's rules (``doctor.cuda_arch``; NVIDIA's "Blackwell and CUDA 12.9 introduce family-specific
architecture features"): SASS ``sm_XY`` runs on the same major with minor >= Y (``sm_100`` on 10.3);
``sm_XYa`` only on exactly X.Y (``sm_100a`` not on 10.3); ``sm_XYf`` on its family, the same major
with minor >= Y (``sm_100f`` on 10.0 and 10.3); PTX ``compute_XY`` is JIT-compiled for any
capability >= X.Y, provided the driver knows its PTX ISA version (``.version 9.0`` needs a CUDA 13.0
driver: doctor/data/compat.toml ``[ptx.isa_min_cuda]``).

A package often ships alternatives and loads one per GPU: sgl-kernel's ``sm90/`` and ``sm100/``
builds, flashinfer-cubin's ``..._sm100a.cubin`` beside ``..._sm103a.cubin``. Files whose paths differ
only in such an architecture token form one group; a group runs on a GPU when one of its files does.
A package none of whose groups runs on a GPU is unusable there (fail); one where some groups do not
run has kernels missing for that GPU (warn, named); one that runs only through PTX JIT-compiles
every kernel at first use (warn).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from doctor import compat
from doctor.cuda_arch import cc_str, parse_target
from doctor.stack.fatbin import arch_key

# "sm90", "sm_100a", "_sm100f" and, inside CamelCase names, "fmhaSm103aKernel"; not "asm123".
ARCH_TOKEN = re.compile(r"(?:(?<![A-Za-z0-9])[sS][mM]|(?<=[a-z])Sm)_?(\d{2,3})([af]?)(?![0-9])")
RUNS_SASS, RUNS_PTX = "sass", "ptx"


def group_key(path: str) -> str:
    """``sgl_kernel/sm90/common_ops.abi3.so`` -> ``sgl_kernel/{arch}/common_ops.abi3.so``."""
    return ARCH_TOKEN.sub("{arch}", path)


def driver_ptx_isa(driver_cuda: str | None) -> tuple[int, int] | None:
    """The newest PTX ISA a driver of CUDA ``driver_cuda`` (NVML, e.g. "13.0") JIT-compiles, or None.

    From the PTX ISA release history (doctor/data/compat.toml ``[ptx.isa_min_cuda]``); a driver newer
    than the table's newest release is credited with the newest ISA the table knows.
    """
    cuda = compat.version_tuple(driver_cuda)
    if not cuda:
        return None
    table = compat.load().get("ptx", {}).get("isa_min_cuda", {})
    known = [(compat.version_tuple(isa), compat.version_tuple(need)) for isa, need in table.items()]
    ok = [isa[:2] for isa, need in known if isa and need and need[:2] <= cuda[:2]]
    return max(ok) if ok else None


@dataclass
class FileRun:
    """How a GPU runs one file: ``how`` sass / ptx / None, with the target used and why not."""

    how: str | None
    target: str | None = None
    note: str = ""


def file_runs(record: dict[str, Any], cc: tuple[int, int], max_isa: tuple[int, int] | None) -> FileRun:
    """The best way a GPU of capability ``cc`` runs a file: its SASS, else its PTX (if the driver can)."""
    for name in reversed(record.get("sass") or []):  # newest first, as the runtime picks
        target = parse_target(name)
        if target is not None and target.runs_on(cc):
            return FileRun(RUNS_SASS, name)
    isa = record.get("ptx_isa") or {}
    too_new = []
    for name in reversed(record.get("ptx") or []):
        target = parse_target("compute_" + name[3:]) if name.startswith("sm_") else None
        if target is None or not target.runs_on(cc):
            continue
        version = compat.version_tuple(isa.get(name))
        if max_isa is not None and version is not None and version[:2] > max_isa:
            too_new.append(f"{name} PTX (ISA {isa.get(name)})")
            continue
        note = "" if max_isa is not None else f"assumes the driver JIT-compiles PTX ISA {isa.get(name) or '?'}"
        return FileRun(RUNS_PTX, name, note)
    if too_new and max_isa is not None:
        return FileRun(None, None, f"{', '.join(too_new)} is newer than the driver's PTX ISA {max_isa[0]}.{max_isa[1]}")
    return FileRun(None)


@dataclass
class Coverage:
    """One package on one GPU architecture."""

    cc: str
    status: str  # "ok" | "jit" | "partial" | "none"
    groups: int
    without: list[str] = field(default_factory=list)  # groups with no runnable code (their keys)
    same_major: list[str] = field(default_factory=list)  # of those, groups built for this GPU's generation
    ptx_only: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"cc": self.cc, "status": self.status, "groups": self.groups, "without": self.without[:50],
                "without_count": len(self.without), "same_generation": self.same_major[:50],
                "same_generation_count": len(self.same_major), "ptx_only": self.ptx_only[:50],
                "notes": self.notes[:10]}


def runtime_files(pkg: dict[str, Any]) -> list[dict[str, Any]]:
    """The package's files with code the CUDA runtime loads (relocatable-only objects are not)."""
    return [f for f in pkg.get("files") or [] if f.get("sass") or f.get("ptx")]


def _majors(f: dict[str, Any]) -> set[int]:
    targets = [parse_target(n) for n in f.get("sass") or []]
    targets += [parse_target("compute_" + n[3:]) for n in f.get("ptx") or [] if n.startswith("sm_")]
    return {t.major for t in targets if t is not None}


def coverage(pkg: dict[str, Any], cc: tuple[int, int], max_isa: tuple[int, int] | None) -> Coverage:
    """Which of the package's kernel groups run on ``cc``: natively, only through PTX, or not at all.

    ``same_major`` names the groups without code here that carry code for another GPU of this
    generation (``sm_100a`` only, on a 10.3 GPU): built for this generation but not for this chip.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for f in runtime_files(pkg):
        groups.setdefault(group_key(str(f.get("path"))), []).append(f)
    without, same_major, ptx_only, notes = [], [], [], []
    for key, files in sorted(groups.items()):
        runs = [file_runs(f, cc, max_isa) for f in files]
        hows = {r.how for r in runs}
        if RUNS_SASS in hows:
            continue
        if RUNS_PTX in hows:
            ptx_only.append(key)
            notes.extend(r.note for r in runs if r.how == RUNS_PTX and r.note)
            continue
        without.append(key)
        notes.extend(r.note for r in runs if r.note)
        if any(cc[0] in _majors(f) for f in files):
            same_major.append(key)
    if groups and len(without) == len(groups):
        status = "none"
    elif without:
        status = "partial"
    elif ptx_only:
        status = "jit"
    else:
        status = "ok"
    return Coverage(cc_str(cc), status, len(groups), without, same_major, ptx_only, sorted(set(notes)))


def kernel_packages(fact: dict[str, Any]) -> list[dict[str, Any]]:
    """The scanned packages that carry GPU code the runtime loads."""
    return [p for p in fact.get("packages") or [] if runtime_files(p)]


def details_packages(fact: dict[str, Any]) -> list[dict[str, Any]]:
    """``details.packages[] = {name, version, files: [{path, sass, ptx}]}`` (the contract's shape)."""
    return [{"name": p.get("name"), "version": p.get("version"),
             "files": [{"path": f.get("path"), "sass": list(f.get("sass") or []), "ptx": list(f.get("ptx") or [])}
                       for f in runtime_files(p)]}
            for p in kernel_packages(fact)]


def abi_missing(fact: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """``{package: {file: [mangled symbols torch does not define]}}`` for packages with any."""
    out = {}
    for p in fact.get("packages") or []:
        missing = (p.get("abi") or {}).get("missing") or {}
        if missing:
            out[f"{p.get('name')} {p.get('version')}"] = {k: list(v) for k, v in missing.items()}
    return out


def torch_targets(fact: dict[str, Any]) -> tuple[list[str], str | None]:
    """torch's compiled targets as ``torch.arch`` names them (``sm_90``, ``compute_90``), from its CUDA library.

    ``torch/lib/libtorch_cuda.so`` holds torch's own kernels; the other CUDA libraries of the torch
    wheel (linalg, NVSHMEM) are read only when it is absent. Returns ``(targets, file read)``.
    """
    torch = next((p for p in fact.get("packages") or [] if str(p.get("name", "")).lower() == "torch"), None)
    if torch is None:
        return [], None
    files = runtime_files(torch)
    main = [f for f in files if str(f.get("path", "")).endswith("/libtorch_cuda.so")] or files
    sass: set[str] = set()
    ptx: set[str] = set()
    for f in main:
        sass.update(f.get("sass") or [])
        ptx.update(f.get("ptx") or [])
    targets = sorted(sass, key=arch_key) + ["compute_" + n[3:] for n in sorted(ptx, key=arch_key)]
    return targets, ", ".join(str(f.get("path")) for f in main) or None
