"""Every installed package's GPU code and libtorch ABI, read from its files (the ``kernels`` probe's work).

Runs under the service's interpreter, inside the ``kernels`` probe: which distributions it has
(``importlib.metadata``, nothing imported), which of their files are shared objects or cubins (their
``RECORD``, so no directory walk), then for each such file the fatbin headers (``doctor.stack.fatbin``)
and, for the libraries of packages that carry GPU code or require torch, the torch symbols they need
against those torch's own libraries define (``doctor.stack.abi``). Headers only: a whole stack
(torch, sgl-kernel, flashinfer's cubins, NVIDIA's libraries) is read in well under two seconds.

Paths are relative to the distribution's location (site-packages). A file that cannot be read or
is malformed is reported with the reason, never skipped silently. Stdlib only, Python 3.8 compatible.
"""

from __future__ import annotations

import csv
import os
import re
import time
from typing import Any

from doctor.stack import abi, fatbin
from doctor.stack.elf import EM_CUDA, ElfError, ElfFile

try:
    from importlib import metadata
except ImportError:  # pragma: no cover - Python < 3.8
    metadata = None  # type: ignore[assignment]

MAX_FILES = 200000


def norm(name: str) -> str:
    """distributions.norm, here again: this module runs in the service's interpreter (probes/kernels.py), which
    need not have ``packaging``."""
    return re.sub(r"[-_.]+", "-", name or "").lower()


def is_candidate(path: str) -> bool:
    """A shared object (``x.so``, ``x.so.12``) or a cubin, by its name."""
    base = path.rsplit("/", 1)[-1]
    return base.endswith((".so", ".cubin")) or ".so." in base


def record_files(dist: Any) -> list[str] | None:
    """The dist's shared objects and cubins as RECORD lists them (relative paths), None without a file list."""
    base = getattr(dist, "_path", None)  # importlib's PathDistribution: its dist-info directory
    try:
        if base is not None and not os.path.isfile(os.path.join(str(base), "RECORD")):
            text = None  # absent, or not a regular file (a FIFO would block the read below)
        else:
            text = dist.read_text("RECORD")
    except (OSError, UnicodeDecodeError, ValueError):
        text = None
    if text is None:
        try:
            files = dist.files
        except Exception:  # a broken installed-files.txt must not stop the scan
            return None
        return None if files is None else [str(f) for f in files if is_candidate(str(f))]
    out = []
    lines = [line for line in text.splitlines() if (".so" in line or ".cubin" in line)]
    for row in csv.reader(lines):
        if row and is_candidate(row[0]) and not row[0].startswith(("/", "..")):
            out.append(row[0])
    return out


def requires_torch(requires: list[str]) -> bool:
    return any(norm(re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0]) == "torch" for r in requires)


UNREADABLE, MALFORMED = "unreadable", "malformed"


def read_file(path: str, symbols: bool) -> tuple[fatbin.FileCode | None, list[str] | None, dict[str, str] | None]:
    """``(GPU code, torch symbols needed, error)`` of one file; the symbols only if asked, for shared objects.

    The error says what kind it is: ``unreadable`` (permissions, vanished, not a regular file) or
    ``malformed`` (headers that contradict themselves: the loader would refuse the file too).
    """
    try:
        with ElfFile(path) as elf:
            if elf.machine == EM_CUDA:
                return fatbin.FileCode(True, fatbin.cubin_code(elf), None), None, None
            code = fatbin.FileCode(False, fatbin.shared_object_code(elf, ".nv_fatbin"),
                                   fatbin.shared_object_code(elf, "__nv_relfatbin"))
            return code, abi.needed_torch_symbols(elf) if symbols else None, None
    except ElfError as exc:
        text = str(exc)
        if text in ("not an ELF file", "shorter than an ELF header"):
            return None, None, None  # a linker script or text file named .so: no GPU code, nothing to load
        if text == "not a regular file":
            return None, None, {"kind": UNREADABLE, "error": text}
        return None, None, {"kind": MALFORMED, "error": f"malformed ELF: {text}"}
    except fatbin.FatbinError as exc:
        return None, None, {"kind": MALFORMED, "error": f"malformed fat binary: {exc}"}
    except OSError as exc:
        return None, None, {"kind": UNREADABLE, "error": f"{type(exc).__name__}: {exc.strerror or exc}"}


def needed_symbols(path: str) -> list[str] | None:
    try:
        with ElfFile(path) as elf:
            return None if elf.machine == EM_CUDA else abi.needed_torch_symbols(elf)
    except (OSError, ElfError):
        return None  # already reported by read_file


def code_record(rel: str, code: fatbin.GpuCode | None, relocatable: fatbin.GpuCode | None) -> dict[str, Any]:
    out: dict[str, Any] = {"path": rel, "sass": list(code.sass) if code else [], "ptx": list(code.ptx) if code else []}
    if code and code.ptx_isa:
        out["ptx_isa"] = dict(code.ptx_isa)
    if relocatable is not None and not relocatable.empty:
        out["relocatable"] = {"sass": list(relocatable.sass), "ptx": list(relocatable.ptx)}
    return out


def torch_libraries(torch_dist: dict[str, Any]) -> list[str]:
    """torch's own shared libraries (``torch/lib``), as its RECORD lists them."""
    return [os.path.join(torch_dist["location"], rel) for rel in torch_dist["candidates"]
            if rel.startswith("torch/lib/") and not rel.endswith(".cubin")]


def scan(path: list[str] | None = None) -> dict[str, Any]:
    """The whole scan: every distribution (name, version, Requires-Dist), the kernel packages' files."""
    start = time.monotonic()
    out: dict[str, Any] = {"ok": True, "distributions": {}, "packages": [], "no_file_list": [], "errors": []}
    if metadata is None:
        return {"ok": False, "error": "importlib.metadata is unavailable (Python < 3.8)"}
    dists = _distributions(path, out)
    torch = next((d for d in dists if d["key"] == "torch"), None)
    libs = abi.TorchLibraries(torch_libraries(torch) if torch is not None else [])
    if torch is not None:
        out["torch"] = {"location": torch["location"], "version": torch["version"],
                        "libraries": [os.path.relpath(f.path, torch["location"]) for f in libs.files],
                        "errors": {os.path.relpath(k, torch["location"]): v for k, v in libs.errors.items()}}
    scanned = 0
    for d in dists:
        pkg, read = _scan_package(d, torch is not None, libs)
        scanned += read
        if pkg["files"] or pkg["errors"] or pkg["abi"]:
            out["packages"].append(pkg)
    libs.close()
    out["files_read"] = scanned
    out["scan_s"] = round(time.monotonic() - start, 3)
    return out


def _distributions(path: list[str] | None, out: dict[str, Any]) -> list[dict[str, Any]]:
    """Every distribution on ``path`` (the first of a name: a later copy is shadowed) recorded in ``out``, and those
    with a file list, with the files to read; a broken METADATA is an error of its own, never hiding the rest."""
    dists: list[dict[str, Any]] = []
    for dist in metadata.distributions(**({"path": path} if path is not None else {})):
        try:
            meta = dist.metadata  # parsed once: dist.version and dist.requires would each parse METADATA again
            name = meta["Name"]
            key = norm(name)
            if not key or key in out["distributions"]:  # a later copy on sys.path is shadowed
                continue
            version = meta["Version"]
            requires = list(meta.get_all("Requires-Dist") or dist.requires or [])  # dist-info's, else egg-info's
            out["distributions"][key] = {"name": name, "version": version, "requires": requires}
            location = str(dist.locate_file(""))
        except Exception as exc:  # one broken METADATA must not hide the rest
            out["errors"].append(f"{getattr(dist, '_path', 'a distribution')}: {type(exc).__name__}: {exc}")
            continue
        files = record_files(dist)
        if files is None:
            out["no_file_list"].append(name)
            continue
        dists.append({"name": name, "key": key, "version": version, "location": location,
                      "candidates": files[:MAX_FILES], "requires_torch": requires_torch(requires)})
    return dists


def _scan_package(d: dict[str, Any], has_torch: bool, libs: Any) -> tuple[dict[str, Any], int]:
    """(one package's record, the files read): its GPU code, unreadable or malformed files, and the torch symbols
    its libraries need that the installed torch does not define. A torch extension's symbols are read in the same
    pass; a package found to carry GPU code has its libraries read for them after."""
    pkg: dict[str, Any] = {"name": d["name"], "version": d["version"], "location": d["location"], "files": [],
                           "errors": [], "abi": {}}
    needs: dict[str, list[str]] = {}
    early = d["requires_torch"] and d["key"] != "torch"  # a torch extension: read its symbols in the same pass
    for rel in d["candidates"]:
        code, needed, err = read_file(os.path.join(d["location"], rel), early)
        if err:
            pkg["errors"].append(dict(err, path=rel))
        if code is not None and (code.code is not None or code.relocatable is not None):
            pkg["files"].append(code_record(rel, code.code, code.relocatable))
        if needed:
            needs[rel] = needed
    gpu = any(f["sass"] or f["ptx"] for f in pkg["files"])
    if gpu and not early and d["key"] != "torch":  # a package with GPU code: its libraries' torch symbols too
        for rel in d["candidates"]:
            if not rel.endswith(".cubin"):
                needed = needed_symbols(os.path.join(d["location"], rel))
                if needed:
                    needs[rel] = needed
    if needs:
        pkg["abi"] = _abi(needs, has_torch, libs)
    return pkg, len(d["candidates"])


def _abi(needs: dict[str, list[str]], has_torch: bool, libs: Any) -> dict[str, Any]:
    """The libraries checked against torch and the symbols each needs that torch does not define."""
    if not has_torch:
        return {"checked": sorted(needs), "error": "torch is not installed: nothing defines the torch symbols these "
                                                   "libraries need"}
    missing = {rel: libs.missing(syms) for rel, syms in needs.items()}
    return {"checked": sorted(needs), "missing": {k: v for k, v in missing.items() if v}}
