"""Real SGLang sources for tests: the released wheels, unpacked (sources only), never imported.

One place finds a release's wheel (``locate_wheel``): the directory ``$SGLANG_WHEELS`` if set, else the
per-user cache ``$XDG_CACHE_HOME/k26-doctor-tests`` (``~/.cache/k26-doctor-tests``). A wheel absent there is
fetched into that directory with ``pip download --no-deps sglang==VERSION`` (CI has PyPI). Without network
a test that needs it skips, saying why -- except under CI (``$CI`` set), where a missing wheel is a failure:
CI reaches PyPI, so a skip there would hide a test that never ran.

Importable without pytest (tests/ddtree_gpu_harness.py runs as a plain script).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSIONS = ("0.5.23", "0.5.13.post1")


def wheel_dir() -> Path:
    """Where the wheels are looked for and downloaded to."""
    env = os.environ.get("SGLANG_WHEELS")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "k26-doctor-tests"


WHEELS = wheel_dir()


def _found(d: Path, version: str, package: str) -> Path | None:
    hits = sorted(d.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    return hits[0] if hits else None


def locate_wheel(version: str, download: bool = True, package: str = "sglang") -> tuple[Path | None, str]:
    """``(wheel, "")``, or ``(None, why)``: looked for in ``wheel_dir()``, else downloaded into it.

    The download goes to a temporary directory beside the target and is moved in by rename, so a
    concurrent or interrupted run never sees half a wheel.
    """
    d = wheel_dir()
    hit = _found(d, version, package)
    if hit is not None or not download:
        return hit, "" if hit else f"no {package} {version} wheel in {d}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=d))
    except OSError as exc:
        return None, f"no {package} {version} wheel in {d}, and it cannot be written: {exc}"
    try:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp),
                              f"{package}=={version}"], capture_output=True, text=True, timeout=900)
        got = _found(tmp, version, package)
        if got is None:
            return None, (f"no {package} {version} wheel in {d}, and pip download failed "
                          f"(rc {res.returncode}): {res.stderr.strip()[-300:]}")
        os.replace(got, d / got.name)
    except subprocess.TimeoutExpired:
        return None, f"no {package} {version} wheel in {d}, and pip download did not finish in 900 s"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _found(d, version, package), ""


def wheel_for(version: str, package: str = "sglang") -> Path:
    """The released wheel, for a test: located (downloaded if need be), else skip -- fail under CI."""
    import pytest

    wheel, why = locate_wheel(version, package=package)
    if wheel is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI reaches PyPI, so this must not skip: {why}")
        pytest.skip(why)
    return wheel


# The parts of the package the server's parser definition lives in (and imports its choices from);
# the rest (models, kernels: most of the 2,000 files) only costs unpacking time.
PARSER_PARTS = ("sglang/srt/arg_groups/", "sglang/srt/parser/", "sglang/srt/function_call/", "sglang/srt/utils/",
                "sglang/srt/speculative/", "sglang/srt/model_executor/", "sglang/srt/entrypoints/")


def pinned(version: str, dependency: str) -> str | None:
    """The exact version sglang ``version`` pins ``dependency`` to (``Requires-Dist: dep==X``), if it does."""
    with zipfile.ZipFile(wheel_for(version)) as zf:
        meta = zf.read(f"sglang-{version}.dist-info/METADATA").decode()
    for line in meta.splitlines():
        head, _, spec = line.partition("Requires-Dist: ")
        if not head and spec.split(";")[0].strip().lower().startswith(f"{dependency.lower()}=="):
            return spec.split(";")[0].split("==", 1)[1].strip()
    return None


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


def site(version: str, factory) -> Path:
    """A site-packages holding the real sources of ``version``, unpacked once per session."""
    if version not in _SITES:
        _SITES[version] = unpack(version, factory.mktemp(f"sglang-{version}"))
    return _SITES[version]


def ddtree_site(factory) -> Path:
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
