"""Real SGLang sources for tests: the released wheels, unpacked (sources only), never imported.

The wheels live in ``$SGLANG_WHEELS`` (default ``/tmp/wheels``). When one is absent, CI fetches it
with ``pip download --no-deps sglang==VERSION``; without network the tests that need it skip, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

WHEELS = Path(os.environ.get("SGLANG_WHEELS", "/tmp/wheels"))
VERSIONS = ("0.5.23", "0.5.13.post1")


def wheel_for(version: str) -> Path:
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(WHEELS),
                              f"sglang=={version}"], capture_output=True, text=True, timeout=600)
        found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
        if not found:
            pytest.skip(f"sglang {version} wheel not in {WHEELS} and pip download failed: {res.stderr[-300:]}")
    return found[0]


def unpack(version: str, dest: Path) -> Path:
    """Unpack the wheel's Python sources and metadata into ``dest`` (a site-packages); returns it."""
    with zipfile.ZipFile(wheel_for(version)) as zf:
        names = [n for n in zf.namelist()
                 if (n.startswith("sglang/srt/") and n.endswith(".py"))
                 or n in ("sglang/__init__.py", "sglang/launch_server.py")
                 or n.startswith(f"sglang-{version}.dist-info/")]
        zf.extractall(dest, names)
    return dest
