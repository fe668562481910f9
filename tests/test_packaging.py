"""``pip install .`` gives a working ``k26-doctor`` with every data file it needs (profiles, schema,
probes, compatibility tables, patch sets), and ``python -m doctor`` works the same."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, source_copy


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a clean copy of the checkout (as CI's fresh clone): the build writes build/ and *.egg-info
    src = source_copy(ROOT, tmp_path_factory.mktemp("source") / "k26-doctor")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (whl,) = out.glob("k26_doctor-*.whl")
    return whl


def test_wheel_carries_packages_and_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("doctor/cli.py", "checks/host.py", "doctor/core/actions.py", "sglang_patches/__init__.py",
                     "doctor/profiles/b300-tp8-ddtree.toml", "doctor/profiles/rtxpro6000-ep8.toml",
                     "doctor/report/report.schema.json", "doctor/data/env_rules.toml"):
        assert required in names, required
    # Every data file of the source tree that the code reads must be in the wheel.
    for pattern in ("doctor/profiles/*.toml", "doctor/data/*", "doctor/probes/*.py", "sglang_patches/**/*.json",
                    "sglang_patches/**/*.patch"):
        for path in ROOT.glob(pattern):
            if path.is_file() and "__pycache__" not in path.parts:
                assert str(path.relative_to(ROOT)) in names, f"{path.relative_to(ROOT)} missing from the wheel"
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    for dep in ("click", "packaging", "safetensors", "nvidia-ml-py"):
        assert f"Requires-Dist: {dep}" in text


def test_installed_console_script_runs(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    # Then the dependencies, from the interpreter running the tests (no network needed): a .pth file. Only
    # after the install, or pip would see this checkout's own distribution there and install nothing.
    import sysconfig

    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run([str(py), "-c", "import doctor; print(doctor.__file__)"], capture_output=True, text=True,
                           cwd=tmp_path)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    out = subprocess.run([str(venv / "bin" / "k26-doctor"), "list", "--format", "json"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert '"host.env"' in out.stdout
    out = subprocess.run([str(py), "-m", "doctor", "check", "--only", "host.disk"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.returncode in (0, 1) and "host.disk" in out.stdout
