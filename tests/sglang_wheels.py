"""Released wheels for tests: SGLang's sources (unpacked, never imported) and binary wheels' files.

A wheel is taken from ``$SGLANG_WHEELS`` when that directory is set, else from a per-user cache
(``$K26_TEST_WHEEL_CACHE``, default ``~/.cache/k26-doctor-tests``), else fetched once into that cache
with ``pip download --no-deps`` (CI has network); without network the tests that need it skip,
saying so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

WHEELS = Path(os.environ["SGLANG_WHEELS"]) if os.environ.get("SGLANG_WHEELS") else None
CACHE = Path(os.environ.get("K26_TEST_WHEEL_CACHE", Path.home() / ".cache" / "k26-doctor-tests"))
VERSIONS = ("0.5.23", "0.5.13.post1")


def fetch_wheel(project: str, version: str, pip_args: tuple[str, ...] = ()) -> Path:
    """The released wheel of ``project==version``: from ``$SGLANG_WHEELS``, the per-user cache, or
    ``pip download`` into that cache (``pip_args`` pick one platform's wheel, e.g. ``--platform``);
    else the test skips saying why."""
    stem = re.sub(r"[-_.]+", "_", project).lower()
    pattern = f"{stem}-{version}-*.whl"
    for where in (WHEELS, CACHE):
        found = sorted(where.glob(pattern)) if where is not None and where.is_dir() else []
        if found:
            return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(CACHE), *pip_args,
                          f"{project}=={version}"], capture_output=True, text=True, timeout=1800)
    found = sorted(CACHE.glob(pattern))
    if not found:
        pytest.skip(f"no {project} {version} wheel in {WHEELS or '$SGLANG_WHEELS (unset)'} or {CACHE}, and pip "
                    f"download failed: {res.stderr[-300:]}")
    return found[0]


def release_requires(project: str, version: str) -> list[str]:
    """The ``Requires-Dist`` of a released wheel as the index serves its METADATA (``pip install --dry-run
    --report``: no wheel download), kept in the cache once read. ``===``: never a local build (torch +cpu)."""
    import json

    stem = re.sub(r"[-_.]+", "_", project).lower()
    cached = CACHE / "metadata" / f"{stem}-{version}.json"
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        res = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                              "--quiet", "--report", str(tmp), f"{project}==={version}"], capture_output=True,
                             text=True, timeout=600)
        if res.returncode != 0 or not tmp.is_file():
            pytest.skip(f"cannot read {project} {version}'s metadata with pip: {res.stderr[-300:]}")
        tmp.replace(cached)
    doc = json.loads(cached.read_text())
    return list(doc["install"][0]["metadata"].get("requires_dist") or [])


def wheel_for(version: str) -> Path:
    """SGLang's released wheel (the one pip picks for this interpreter)."""
    return fetch_wheel("sglang", version)


def unpacked(wheel: Path, keep) -> Path:
    """The members of ``wheel`` that ``keep(name)`` selects, extracted once into the cache and reused.

    A half-extracted tree (an interrupted run) is never reused: the ``.complete`` mark is written last.
    """
    dest = CACHE / "unpacked" / wheel.name[:-len(".whl")]
    if (dest / ".complete").is_file():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if keep(n)])
    (dest / ".complete").write_text(wheel.name + "\n")
    return dest


# The parts of the package the server's parser definition lives in (and imports its choices from);
# the rest (models, kernels: most of the 2,000 files) only costs unpacking time.
PARSER_PARTS = ("sglang/srt/arg_groups/", "sglang/srt/parser/", "sglang/srt/function_call/", "sglang/srt/utils/",
                "sglang/srt/speculative/", "sglang/srt/model_executor/", "sglang/srt/entrypoints/",
                "sglang/srt/managers/scheduler.py")  # the patch set hooks the scheduler too


def unpack(version: str, dest: Path, whole: bool = False, also: tuple[str, ...] = ()) -> Path:
    """Unpack the wheel's parser sources (``whole``: every Python file), the files ``also`` names and the
    metadata into ``dest``."""
    with zipfile.ZipFile(wheel_for(version)) as zf:
        names = [n for n in zf.namelist()
                 if (n.endswith(".py") and (whole or n.startswith(PARSER_PARTS) or (n.count("/") == 2 and
                                            n.startswith("sglang/srt/"))))
                 or n in ("sglang/__init__.py", "sglang/launch_server.py") or n in also
                 or n.startswith(f"sglang-{version}.dist-info/")]
        zf.extractall(dest, names)
    return dest


PATCH_SET = Path(__file__).resolve().parents[1] / "sglang_patches" / "ddtree-0.5.23"
FLAG_PATCHES = ("0001-ddtree-utils.patch", "0002-ddtree-algorithm-and-flags.patch")
_SITES: dict[str, Path] = {}


def patched_files(patches: tuple[str, ...] = FLAG_PATCHES) -> tuple[str, ...]:
    """The files of the wheel that ``patches`` change (their ``+++ b/`` lines)."""
    return tuple(sorted({line[len("+++ b/"):].strip() for patch in patches
                         for line in (PATCH_SET / patch).read_text().splitlines() if line.startswith("+++ b/")}))


def site(version: str, factory: pytest.TempPathFactory) -> Path:
    """A site-packages holding the real sources of ``version``, unpacked once per session."""
    if version not in _SITES:
        _SITES[version] = unpack(version, factory.mktemp(f"sglang-{version}"))
    return _SITES[version]


def ddtree_site(factory: pytest.TempPathFactory) -> Path:
    """0.5.23 with the project's real DDTree patches applied (git apply, as a user would patch by hand)."""
    if "ddtree" not in _SITES:
        # the parser's sources and every file the patches change (some lie outside the parser's parts)
        dest = unpack("0.5.23", factory.mktemp("sglang-0.5.23-ddtree"), also=patched_files())
        for patch in FLAG_PATCHES:
            res = subprocess.run(["git", "apply", "-p1", str(PATCH_SET / patch)], cwd=dest, capture_output=True,
                                 text=True, timeout=60)
            assert res.returncode == 0, f"{patch}: {res.stderr}"
        _SITES["ddtree"] = dest
    return _SITES["ddtree"]
