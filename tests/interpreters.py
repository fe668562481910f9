"""Other Python interpreters on this machine for the tests that run probes under them (found, never assumed).

Looks in pyenv's versions (``$PYENV_ROOT``, else ``~/.pyenv``) and on ``PATH`` (``python3.X``).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def pyenv_versions() -> Path:
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"


def find_python(version: str) -> Path | None:
    """An interpreter of ``version`` ("3.10" or "3.10.13"): pyenv's first match, else ``python3.X`` on PATH."""
    root = pyenv_versions()
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.name == version or d.name.startswith(version + "."):
                exe = d / "bin" / "python"
                if exe.exists():
                    return exe
    minor = ".".join(version.split(".")[:2])
    found = shutil.which(f"python{minor}")
    return Path(found) if found else None


@functools.lru_cache(maxsize=1)
def bare_python() -> Path:
    """A venv of the running interpreter without its site-packages, made once per test session.

    For probes that must see an interpreter without torch, transformers or SGLang's dependencies: the test
    interpreter has them under CI (.ci/run installs them for the DDTree tests)."""
    d = Path(tempfile.mkdtemp(prefix="k26-bare-venv-"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True, timeout=300)
    return d / "bin" / "python"
