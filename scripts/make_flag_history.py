#!/usr/bin/env python3
"""Regenerate ``doctor/data/sglang_flag_history.json``: every server flag of every SGLang release.

For each release from ``--first`` to ``--last`` (``pip index versions sglang``; pre-releases left
out) the released wheel is fetched with ``pip download --no-deps`` into a cache
(``~/.cache/k26-doctor-flaghist`` by default; wheels already there are reused), its Python sources
are unpacked into a temporary directory, and the flags are read with the doctor's own AST reader
(``doctor.sglang.flag_reader.read_flags``: ``add_argument`` calls in older releases, the annotated fields
of ``sglang/srt/arg_groups/fields/`` in 0.5.2x); the unpacked tree is deleted after reading.

Forks published on PyPI (``--fork sglang-kt==0.7.2=ktransformers``) are read the same way; their
flags that no upstream release ever had are recorded as that fork's.

The table this writes is what ``sglang.flags`` and ``k26-doctor launch`` use to say, for a flag
the installed SGLang rejects, in which release it was added or removed. It is not runtime code:
run it by hand (network to the package index needed), review the diff, commit the JSON.

    python scripts/make_flag_history.py                      # 0.4.0 .. 0.5.23
    python scripts/make_flag_history.py --last 0.5.24 --fork sglang-kt==0.7.2=ktransformers
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.sglang.flag_reader import FlagSourceError, FlagTable, read_flags  # noqa: E402

OUT = ROOT / "doctor" / "data" / "sglang_flag_history.json"
CACHE = Path(os.environ.get("K26_FLAGHIST_CACHE", Path.home() / ".cache" / "k26-doctor-flaghist"))
SCHEMA = 1


def released_versions(first: str, last: str) -> list[str]:
    """Every final release of ``sglang`` on the index between ``first`` and ``last`` (inclusive)."""
    res = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "sglang"], capture_output=True,
                         text=True, timeout=300)
    match = re.search(r"Available versions:\s*(.+)", res.stdout)
    if not match:
        raise SystemExit(f"pip index versions sglang gave no version list: {res.stderr[-500:]}")
    lo, hi = Version(first), Version(last)
    out = []
    for text in match.group(1).split(","):
        try:
            v = Version(text.strip())
        except InvalidVersion:
            continue
        if not v.is_prerelease and not v.is_devrelease and lo <= v <= hi:
            out.append(v)
    return [str(v) for v in sorted(out)]


def fetch(name: str, version: str, cache: Path) -> Path:
    """The release's wheel (or sdist) in ``cache``; downloaded when absent."""
    stem = name.replace("-", "_")
    for pattern in (f"{stem}-{version}-*.whl", f"{name}-{version}-*.whl", f"{stem}-{version}.tar.gz",
                    f"{name}-{version}.tar.gz"):
        found = sorted(cache.glob(pattern))
        if found:
            return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache),
                          f"{name}=={version}"], capture_output=True, text=True, timeout=1800)
    for pattern in (f"{stem}-{version}-*.whl", f"{name}-{version}-*.whl", f"{stem}-{version}.tar.gz",
                    f"{name}-{version}.tar.gz"):
        found = sorted(cache.glob(pattern))
        if found:
            return found[0]
    raise FileNotFoundError(f"pip download {name}=={version} failed: {res.stderr.strip()[-400:]}")


def unpack_sources(archive: Path, dest: Path) -> Path:
    """Unpack the ``sglang`` package's Python files; returns the directory holding ``sglang/``."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n.startswith("sglang/") and n.endswith(".py")]
            zf.extractall(dest, names)
        return dest
    with tarfile.open(archive) as tf:
        members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith(".py") and "/sglang/" in m.name
                   and ".." not in m.name.split("/")]
        # Names checked above; the "data" filter (where tarfile has it) refuses links and devices too.
        tf.extractall(dest, members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    for candidate in sorted(dest.glob("**/sglang/srt/server_args.py"), key=lambda p: len(p.parts)):
        return candidate.parents[2]
    return dest


def read_release(name: str, version: str, cache: Path) -> FlagTable:
    archive = fetch(name, version, cache)
    with tempfile.TemporaryDirectory(prefix=f"flaghist-{version}-") as tmp:
        site = unpack_sources(archive, Path(tmp))
        return read_flags(site / "sglang", version)


def spans(indices: list[int]) -> list[list[int]]:
    """Sorted indices -> ``[[first, last], ...]`` runs."""
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def build(tables: dict[str, FlagTable], unreadable: dict[str, str], forks: dict[str, tuple[str, FlagTable]]
          ) -> dict[str, Any]:
    releases = sorted(tables, key=Version)
    present: dict[str, list[int]] = {}
    dests: dict[str, str] = {}
    deprecated: dict[str, dict[str, Any]] = {}
    for i, version in enumerate(releases):
        for opt, spec in tables[version].options.items():
            present.setdefault(opt, []).append(i)
            dests[opt] = str(spec.get("dest", ""))
            if spec.get("deprecated") is not None and opt not in deprecated:
                deprecated[opt] = {"since": version, "use": spec.get("deprecated") or ""}
    flags: dict[str, Any] = {}
    for opt in sorted(present):
        entry: dict[str, Any] = {"in": spans(present[opt]), "dest": dests[opt]}
        if opt in deprecated:
            entry["deprecated"] = deprecated[opt]
        flags[opt] = entry
    fork_out: dict[str, Any] = {}
    for package, (label, table) in forks.items():
        only = sorted(o for o in table.options if o not in present)
        fork_out[package] = {"name": label, "version": table.version, "flags": only}
    return {"schema": SCHEMA, "generated_by": "scripts/make_flag_history.py",
            "note": "flags of every SGLang release read from the released wheels' sources; 'in' lists runs of "
                    "indices into 'releases' (inclusive); a release in 'unreadable' was not read",
            "releases": releases, "unreadable": unreadable, "flags": flags, "forks": fork_out}


def dump(data: dict[str, Any]) -> str:
    """One flag per line: compact, and a new release shows as a readable diff."""
    head = {k: v for k, v in data.items() if k not in ("flags", "forks")}
    lines = ["{"]
    for key, value in head.items():
        lines.append(f"{json.dumps(key)}: {json.dumps(value)},")
    lines.append('"forks": {')
    forks = list(data["forks"].items())
    for n, (key, value) in enumerate(forks):
        lines.append(f"{json.dumps(key)}: {json.dumps(value)}" + ("," if n < len(forks) - 1 else ""))
    lines.append("},")
    lines.append('"flags": {')
    items = list(data["flags"].items())
    for n, (key, value) in enumerate(items):
        lines.append(f"{json.dumps(key)}: {json.dumps(value, separators=(',', ':'))}"
                     + ("," if n < len(items) - 1 else ""))
    lines.append("}}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--first", default="0.4.0")
    ap.add_argument("--last", default="0.5.23")
    ap.add_argument("--versions", nargs="*", help="exactly these releases instead of the index's list")
    ap.add_argument("--fork", action="append", default=[], metavar="PKG==VER=NAME",
                    help="a fork published on the index, e.g. sglang-kt==0.7.2=ktransformers")
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    versions = args.versions or released_versions(args.first, args.last)
    tables: dict[str, FlagTable] = {}
    unreadable: dict[str, str] = {}
    start = time.monotonic()
    for version in versions:
        try:
            tables[version] = read_release("sglang", version, args.cache)
            print(f"{version:>14}  {len(tables[version].options):4d} options  ({tables[version].style})",
                  flush=True)
        except (FlagSourceError, FileNotFoundError, OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
            unreadable[version] = str(exc)[:300]
            print(f"{version:>14}  unreadable: {exc}", flush=True)
    forks: dict[str, tuple[str, FlagTable]] = {}
    for spec in args.fork:
        package, _, rest = spec.partition("==")
        version, _, label = rest.partition("=")
        forks[package] = (label or package, read_release(package, version, args.cache))
        print(f"fork {package} {version}: {len(forks[package][1].options)} options", flush=True)
    data = build(tables, unreadable, forks)
    args.out.write_text(dump(data), encoding="utf-8")
    json.loads(args.out.read_text(encoding="utf-8"))  # what was written parses
    print(f"{len(tables)} releases read, {len(unreadable)} unreadable, {len(data['flags'])} flags -> {args.out} "
          f"({args.out.stat().st_size} bytes, {time.monotonic() - start:.0f} s)")
    return 0 if tables else 1


if __name__ == "__main__":
    raise SystemExit(main())
