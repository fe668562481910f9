"""Real SGLang installs for the patch-engine tests: a venv with the released wheel unpacked into its
site-packages (dist-info and RECORD included), never imported.

One pristine install per version per session (``pristine_venv``); each test gets its own copy made
of hard links (``fresh_venv``), which is cheap and safe because the engine only ever replaces files
by rename, never writes into an existing inode. Tests that edit a file by hand use ``rewrite``
(also a rename) for the same reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import downloads
import pytest
from packaging.version import Version
from sglang_wheels import WHEELS, wheel_for  # noqa: F401 - wheel_for is used by the patch tests

FIXTURE_SETS = Path(__file__).resolve().parent / "fixtures" / "patchsets"
_PRISTINE: dict[str, Path] = {}


@dataclass
class Venv:
    root: Path
    python: str
    site_packages: Path


def pip_venv(version: str, dest: Path) -> Venv:
    """A venv with the wheel installed by pip itself (``pip --python VENV install --no-deps``)."""
    res = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], capture_output=True, text=True,
                         timeout=120)
    if res.returncode != 0:
        pytest.skip(f"cannot create a venv: {res.stderr[-300:]}")
    wheel = wheel_for(version, for_install=True)  # a wheel tagged for this Python (cp312 on 3.12, not cp311)
    res = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, timeout=60)
    pip = res.stdout.split()[1] if res.returncode == 0 and len(res.stdout.split()) > 1 else "?"
    if Version(pip if pip != "?" else "0") < Version("22.3"):
        pytest.skip(f"pip {pip} of {sys.executable} cannot install into another interpreter (--python needs pip "
                    ">= 22.3)")
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(dest / "bin" / "python"), "install", "-q",
                          "--no-deps", "--no-compile", str(wheel)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"pip {pip} could not install {wheel.name} into {dest}: {res.stderr[-600:]}"
    return Venv(dest, str(dest / "bin" / "python"), _site_packages(dest))


def _site_packages(root: Path) -> Path:
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return root / "lib" / ver / "site-packages"


def _make(root: Path, version: str) -> Venv:
    res = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], capture_output=True, text=True,
                         timeout=120)
    if res.returncode != 0:
        pytest.skip(f"cannot create a venv: {res.stderr[-300:]}")
    sp = _site_packages(root)
    with zipfile.ZipFile(wheel_for(version)) as zf:
        zf.extractall(sp)
    return Venv(root, str(root / "bin" / "python"), sp)


def pristine_venv(version: str, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The session's untouched install of ``version`` (do not modify it)."""
    downloads.used(f"the sglang {version} wheel")
    if version not in _PRISTINE:
        _PRISTINE[version] = tmp_path_factory.mktemp(f"sglang-{version}")
        _make(_PRISTINE[version] / "venv", version)
    root = _PRISTINE[version] / "venv"
    return Venv(root, str(root / "bin" / "python"), _site_packages(root))


def fresh_venv(version: str, tmp_path_factory: pytest.TempPathFactory, dest: Path) -> Venv:
    """A private copy of the pristine install (hard links; ``cp -al``)."""
    src = pristine_venv(version, tmp_path_factory)
    res = subprocess.run(["cp", "-al", str(src.root), str(dest)], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:  # another filesystem: copy for real
        shutil.copytree(src.root, dest, symlinks=True)
    return Venv(dest, str(dest / "bin" / "python"), _site_packages(dest))


def rewrite(path: Path, data: bytes) -> None:
    """Change a file as a person's editor would, without touching the hard-linked original."""
    tmp = path.with_name(path.name + ".edit")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def private_copy(path: Path) -> None:
    """Give a hard-linked file its own inode (before chmod/chattr on it)."""
    rewrite(path, path.read_bytes())


def purelib_matches() -> bool:
    return sysconfig.get_paths()["purelib"].endswith("site-packages")
