"""Judging the GPU code of the service's kernel packages against its GPUs (the facts: ``doctor.stack.scan``).

CUDA's rules (``doctor.stack.cuda_arch``; NVIDIA's "Blackwell and CUDA 12.9 introduce family-specific
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

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.stack import compat
from doctor.stack.cuda_arch import cc_str, parse_target
from doctor.stack.distributions import norm
from doctor.stack.fatbin import arch_key
from doctor.stack.service_probe import probe_failure

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


def required_packages() -> set[str]:
    """Packages the server cannot start without (compat.toml ``[kernels] required``), normalized names."""
    return {norm(n) for n in compat.load().get("kernels", {}).get("required", [])}


# The name a requirement starts with, as packaging's parser reads it (its IDENTIFIER, after optional blanks).
REQUIREMENT_NAME = re.compile(r"[ \t]*\b([a-zA-Z0-9][a-zA-Z0-9._-]*)\b")


def unmet_requirements(fact: dict[str, Any], markers: dict[str, str] | None) -> list[str]:
    """Every installed distribution's ``Requires-Dist`` that the installed version of its target does not
    meet (what ``pip check`` reports as a conflict; a requirement on something not installed is not judged)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version

    env = dict(markers or default_environment())
    env["extra"] = ""
    dists = fact.get("distributions") or {}
    out = []
    for key in sorted(dists):
        dist = dists[key]
        for text in dist.get("requires") or []:
            try:
                head = REQUIREMENT_NAME.match(text)
                if head is None or norm(head.group(1)) not in dists:
                    continue  # on something not installed: not judged, so not parsed (about half of them)
                req = Requirement(text)
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
            except Exception:  # an unparsable requirement or an unknown marker variable: not judged
                continue
            have = dists.get(norm(req.name))
            if have is None or not str(req.specifier):
                continue
            try:
                ok = req.specifier.contains(Version(str(have.get("version"))), prereleases=True)
            except InvalidVersion:
                ok = False
            if not ok:
                out.append(f"{dist.get('name')} {dist.get('version')} requires {req.name}{req.specifier}, "
                           f"installed {have.get('version')}")
    return out


def _kernel_for_torch(torch_version: str | None) -> list[str]:
    """SGLang releases built for this torch and the sglang-kernel each pins (compat.toml), newest first."""
    if not torch_version:
        return []
    base = compat.base_version(torch_version)
    rows = [(v, p.get("sglang_kernel")) for v, p in compat.load().get("sglang", {}).items()
            if isinstance(p, dict) and p.get("torch") == base and p.get("sglang_kernel")]
    return [f"sglang {v} with sglang-kernel {k}" for v, k in rows]


def _first(items: list[str], n: int = 3) -> str:
    return "; ".join(items[:n]) + (f"; and {len(items) - n} more" if len(items) > n else "")


@dataclass
class Said:
    """What the ``stack.kernels`` judgement has to say, gathered part by part (GPU code, ABI, files, pins) so that
    each part is a function of its own; ``verdict`` turns it into the one finding."""

    fails: list[str] = field(default_factory=list)
    warns: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)

    def remediation(self) -> Remediation | None:
        text, cmds = " ".join(dict.fromkeys(self.fixes)), list(dict.fromkeys(self.commands))
        return Remediation(text, cmds) if text or cmds else None


def _coverage_lines(label: str, cc: tuple[int, int], c: Coverage, archs: list[str], is_required: bool,
                    max_isa: tuple[int, int] | None, said: Said) -> None:
    """What one package's coverage of one GPU says: no code (a failure for a required package or one built for
    this GPU's generation, else a note), kernels missing for it, kernels it runs only through PTX."""
    if c.status == "none" and (is_required or c.same_major):
        (said.fails if is_required else said.warns).append(
            f"{label} has no code that runs on {c.cc} ({', '.join(archs[:8]) or 'PTX only'}"
            f"{', ...' if len(archs) > 8 else ''})" + (f": {c.notes[0]}" if c.notes else ""))
    elif c.status == "none":
        said.notes.append(f"{label} carries no code for {c.cc}: built for other GPUs")
    elif c.status == "partial" and c.same_major:
        said.warns.append(f"{label}: {len(c.same_major)} of {c.groups} kernel files have code for other "
                          f"{cc[0]}.x GPUs but not {c.cc} (e.g. {c.same_major[0]})")
    elif c.status == "partial":
        said.notes.append(f"{label}: {len(c.without)} of {c.groups} kernel files not built for {cc[0]}.x "
                          f"(e.g. {c.without[0]})")
    if c.ptx_only:
        said.warns.append(f"{label}: {len(c.ptx_only)} kernel files run on {c.cc} only by JIT-compiling PTX at "
                          f"first use (e.g. {c.ptx_only[0]})")
    if max_isa is None and c.ptx_only:
        said.notes.append(f"the driver's PTX ISA is unknown: assumed it JIT-compiles {label}'s PTX")


def judge_coverage(pkgs: list[dict[str, Any]], ccs: list[tuple[int, int]], max_isa: tuple[int, int] | None,
                   said: Said) -> dict[str, list[dict[str, Any]]]:
    """Every kernel package against every GPU capability: the coverage table (the result's details), with what
    it says added to ``said``."""
    required = required_packages()
    cover: dict[str, list[dict[str, Any]]] = {}
    for p in pkgs:
        label = f"{p.get('name')} {p.get('version')}"
        for cc in ccs:
            c = coverage(p, cc, max_isa)
            cover.setdefault(label, []).append(c.to_dict())
            archs = sorted({n for f in runtime_files(p) for n in f.get("sass") or []}, key=arch_key)
            _coverage_lines(label, cc, c, archs, norm(str(p.get("name"))) in required, max_isa, said)
    if any(c["status"] == "none" for cs in cover.values() for c in cs) and said.fails:
        said.fixes.append("Install builds of those packages with code for this GPU (a release built for its "
                          "architecture), or run them on the GPUs they were built for.")
    return cover


def judge_abi(fact: dict[str, Any], missing: dict[str, dict[str, list[str]]], python: str, said: Said) -> None:
    """Libraries that need torch symbols the installed torch does not define (import fails with 'undefined
    symbol'): the pin each package asks for, and the sglang-kernel builds made for this torch."""
    torch_version = (fact.get("torch") or {}).get("version")
    dists = fact.get("distributions") or {}
    for label, files in missing.items():
        count = len({s for syms in files.values() for s in syms})
        first_file, syms = next(iter(sorted(files.items())))
        said.fails.append(f"{label}: {len(files)} of its libraries need {count} torch symbol(s) torch "
                          f"{torch_version} does not define (e.g. {syms[0]} in {first_file}): import fails with "
                          "'undefined symbol'")
        name = label.rsplit(" ", 1)[0]
        wants = [r for r in (dists.get(norm(name)) or {}).get("requires") or [] if norm(r).startswith("torch")]
        if wants:
            said.commands.append(f"{python} -m pip install '{wants[0].split(';')[0].replace(' ', '')}'")
        built_for = _kernel_for_torch(torch_version)
        said.fixes.append(f"{name} was built against another torch"
                          + (f" ({wants[0].split(';')[0]})" if wants else "")
                          + (f"; for torch {torch_version}: {', '.join(built_for[:3])}" if built_for else "") + ".")
    for p in fact.get("packages") or []:
        err = (p.get("abi") or {}).get("error")
        if err:
            said.warns.append(f"{p.get('name')} {p.get('version')}: libtorch ABI not checked: {err}")


def judge_files(fact: dict[str, Any], said: Said) -> tuple[list[str], list[str]]:
    """Broken shared objects or cubins (a failure: reinstall) and files that could not be read (a warning)."""
    malformed = [f"{p.get('name')}: {e.get('path')}: {e.get('error')}" for p in fact.get("packages") or []
                 for e in p.get("errors") or [] if e.get("kind") == "malformed"]
    unreadable = [f"{p.get('name')}: {e.get('path')}: {e.get('error')}" for p in fact.get("packages") or []
                  for e in p.get("errors") or [] if e.get("kind") != "malformed"]
    if malformed:
        said.fails.append(f"{len(malformed)} broken shared object(s) or cubin(s): {_first(malformed, 2)}")
        said.fixes.append("Reinstall the packages whose files are broken (pip install --force-reinstall --no-deps).")
    if unreadable:
        said.warns.append(f"{len(unreadable)} file(s) could not be read: {_first(unreadable, 2)}")
    return malformed, unreadable


def judge(fact: dict[str, Any], ccs: list[tuple[int, int]], where: str, driver_cuda: str | None,
          markers: dict[str, str] | None, python: str) -> Findings:
    """The ``stack.kernels`` verdict: GPU code per package and GPU, the libtorch ABI, Requires-Dist pins."""
    pkgs = kernel_packages(fact)
    max_isa = driver_ptx_isa(driver_cuda)
    said = Said()
    cover = judge_coverage(pkgs, ccs, max_isa, said)
    missing = abi_missing(fact)
    judge_abi(fact, missing, python, said)
    malformed, unreadable = judge_files(fact, said)
    unmet = unmet_requirements(fact, markers)
    if unmet:
        said.warns.append(f"{len(unmet)} installed package(s) pin versions other than installed: {_first(unmet, 2)}")
    torch_version = (fact.get("torch") or {}).get("version")
    details: dict[str, Any] = {
        "packages": details_packages(fact), "gpus": where, "compute_capabilities": [f"{a}.{b}" for a, b in ccs],
        "driver_cuda": driver_cuda, "driver_ptx_isa": f"{max_isa[0]}.{max_isa[1]}" if max_isa else None,
        "coverage": cover, "abi_missing": missing, "unmet_requirements": unmet, "malformed": malformed,
        "unreadable": unreadable, "notes": said.notes, "scan_s": fact.get("scan_s"),
        "files_read": fact.get("files_read"), "torch": torch_version}
    if not ccs:
        said.notes.append("no GPU to judge the GPU code against: NVML sees none and the profile names no "
                          "compute_capability")
    if not pkgs:
        said.fails.append("no installed package carries GPU code (no CUDA build of torch, no kernel package)")
        said.fixes.append("Install the CUDA build of torch and the kernel packages the profile pins.")
    return verdict(fact, pkgs, ccs, where, said, details)


def verdict(fact: dict[str, Any], pkgs: list[dict[str, Any]], ccs: list[tuple[int, int]], where: str, said: Said,
            details: dict[str, Any]) -> Findings:
    """The one finding: the failures, else the warnings (one line for many packages: the first three, and how
    many more), else what runs where; with no GPU to judge against, not judged."""
    out = Findings(**details)
    torch_version = details["torch"]
    if said.fails:
        if not pkgs and torch_version is None:  # nothing installed: stack.versions names what is missing
            out.cause = "stack.versions"
        return out.fail("stack.kernels.no_code", _first(said.fails), said.remediation())
    if said.warns:
        return out.warn("stack.kernels.partial", _first(said.warns), said.remediation())
    if not ccs:
        raise NotJudged.missing(f"{len(pkgs)} kernel packages read; " + said.notes[-1], **details)
    files = sum(len(runtime_files(p)) for p in pkgs)
    checked = sum(len((p.get("abi") or {}).get("checked") or []) for p in fact.get("packages") or [])
    abi_text = (f"the torch symbols of {checked} libraries resolve in torch {torch_version}" if checked
                else "no library needs torch symbols")
    return out.info("stack.kernels.run", f"{len(pkgs)} kernel packages ({files} files with GPU code) run on {where}; "
                    f"{abi_text}")


def judge_kernels(fact: dict[str, Any], gpus: tuple[list[tuple[int, int]], str, dict[str, Any]], nvml: Any,
                  stack: Any, python: str) -> Findings:
    """stack.kernels from its facts: ``gpus`` to judge (``doctor.stack.cuda_arch.judged_ccs``); ``nvml`` and
    ``stack`` only refine (the driver's CUDA for PTX, the interpreter's markers for requirements), None without."""
    if not fact.get("ok"):
        return probe_failure(python, fact, "read the installed packages' binaries")
    ccs, where, _source = gpus
    driver_cuda = compat.cuda_from_nvml(nvml.get("cuda_driver_version")) if isinstance(nvml, dict) else None
    markers = ((stack.get("python") or {}).get("markers") or None) if isinstance(stack, dict) else None
    return judge(fact, ccs, where, driver_cuda, markers, python)
