"""Real SGLang sources for tests: the released wheels, unpacked (sources only), never imported.

The wheels live in ``$SGLANG_WHEELS`` or a per-user cache. When one is absent, CI fetches it
with ``pip download --no-deps sglang==VERSION``; without network the tests that need it skip, saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

WHEELS = Path(os.environ["SGLANG_WHEELS"]) if os.environ.get("SGLANG_WHEELS") else None
VERSIONS = ("0.5.23", "0.5.13.post1")


def wheel_for(version: str) -> Path:
    """The released wheel: from ``$SGLANG_WHEELS``, else a per-user cache, else
    ``pip download`` into that cache (CI has network), else the test skips saying why."""
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl")) if WHEELS else []
    if found:
        return found[0]
    cache = Path(os.environ.get("K26_TEST_WHEEL_CACHE", Path.home() / ".cache" / "k26-doctor-tests"))
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache),
                              f"sglang=={version}"], capture_output=True, text=True, timeout=600)
        found = sorted(cache.glob(f"sglang-{version}-*.whl"))
        if not found:
            pytest.skip(f"no sglang {version} wheel in {WHEELS} or {cache}, and pip download failed: "
                        f"{res.stderr[-300:]}")
    return found[0]


# The parts of the package the server's parser definition lives in (and imports its choices from);
# the rest (models, kernels: most of the 2,000 files) only costs unpacking time.
PARSER_PARTS = ("sglang/srt/arg_groups/", "sglang/srt/parser/", "sglang/srt/function_call/", "sglang/srt/utils/",
                "sglang/srt/speculative/", "sglang/srt/model_executor/", "sglang/srt/entrypoints/",
                "sglang/srt/managers/scheduler.py")  # the patch set hooks the scheduler too


def unpack(version: str, dest: Path, whole: bool = False) -> Path:
    """Unpack the wheel's parser sources (``whole``: every Python file) and metadata into ``dest``."""
    with zipfile.ZipFile(wheel_for(version)) as zf:
        names = [n for n in zf.namelist()
                 if (n.endswith(".py") and (whole or n.startswith(PARSER_PARTS) or (n.count("/") == 2 and
                                            n.startswith("sglang/srt/"))))
                 or n in ("sglang/__init__.py", "sglang/launch_server.py")
                 or n.startswith(f"sglang-{version}.dist-info/")]
        zf.extractall(dest, names)
    return dest


PATCH_SET = Path(__file__).resolve().parents[1] / "sglang_patches" / "ddtree-0.5.23"
_SITES: dict[str, Path] = {}


def site(version: str, factory: pytest.TempPathFactory) -> Path:
    """A site-packages holding the real sources of ``version``, unpacked once per session."""
    if version not in _SITES:
        _SITES[version] = unpack(version, factory.mktemp(f"sglang-{version}"))
    return _SITES[version]


def ddtree_site(factory: pytest.TempPathFactory) -> Path:
    """0.5.23 with the project's real DDTree patches applied (git apply, as a user would patch by hand)."""
    if "ddtree" not in _SITES:
        dest = factory.mktemp("sglang-0.5.23-ddtree")
        shutil.copytree(site("0.5.23", factory), dest, dirs_exist_ok=True)
        for patch in ("0001-ddtree-utils.patch", "0002-ddtree-algorithm-and-flags.patch"):
            res = subprocess.run(["git", "apply", "-p1", str(PATCH_SET / patch)], cwd=dest, capture_output=True,
                                 text=True, timeout=60)
            assert res.returncode == 0, f"{patch}: {res.stderr}"
        _SITES["ddtree"] = dest
    return _SITES["ddtree"]
