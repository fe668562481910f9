"""Real environments for the stack checks' tests: interpreters, venvs, distributions, ptxas, libcuda.

Everything here is built once per test process (``functools.cache``) in one temporary directory:
a pyenv interpreter prefix copied without ``Python.h`` (the B300 failure), venvs made from it with
the real ``venv`` module, dist-info directories with real METADATA read by the real probe, a
``libcuda.so.1`` built with the real gcc, Triton's real ptxas binaries unpacked from its wheel.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import downloads
import pytest
from conftest import make_context, run_check  # noqa: F401 - run_check: the stack tests run checks through it
from interpreters import pyenv_versions
from sglang_wheels import fetch_wheel

from doctor.core.context import Context

PYENV = pyenv_versions()
REFERENCE = Path(__file__).resolve().parent / "fixtures" / "snapshots" / "reference" / "h200x2-nvml.json"
IDS = ("cuda.compat", "torch.arch", "stack.versions", "triton.jit", "triton.ptxas", "python.venv", "sglang.install")


@functools.cache
def workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="k26-stack-tests-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def pyenv_python(version: str = "3.12.1") -> Path:
    exe = PYENV / version / "bin" / f"python{version.rsplit('.', 1)[0]}"
    if not exe.exists():
        pytest.skip(f"pyenv interpreter {exe} not installed")
    return exe


@functools.cache
def headless_prefix(version: str = "3.12.1", under: str = ".pyenv/versions", conda: bool = False) -> Path:
    """A copy of a pyenv prefix without ``include/python3.X/Python.h``, under ``.../.pyenv/versions/``.

    Only the interpreter binary is copied; the standard library and shared library are symlinked, the
    other headers too: a few MB, built in milliseconds. ``sys.prefix`` is the copy (the binary finds
    its landmark ``lib/python3.X/os.py`` there), so sysconfig's include dir is the copy's.
    """
    src = PYENV / version
    pyenv_python(version)
    mm = version.rsplit(".", 1)[0]
    dst = workdir() / under / version
    (dst / "bin").mkdir(parents=True)
    if conda:
        (dst / "conda-meta").mkdir()
    shutil.copy2(src / "bin" / f"python{mm}", dst / "bin" / f"python{mm}")
    os.symlink(f"python{mm}", dst / "bin" / "python3")
    (dst / "lib").mkdir()
    for entry in (src / "lib").iterdir():
        os.symlink(entry, dst / "lib" / entry.name)
    inc = dst / "include" / f"python{mm}"
    inc.mkdir(parents=True)
    for entry in (src / "include" / f"python{mm}").iterdir():
        if entry.name != "Python.h":
            os.symlink(entry, inc / entry.name)
    return dst


def make_venv(base_python: Path, dest: Path) -> Path:
    """``python -m venv --without-pip`` (the real venv module); returns the venv's bin/python."""
    subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(dest)], check=True, timeout=60)
    return dest / "bin" / "python"


@functools.cache
def headless_venv() -> Path:
    return make_venv(headless_prefix() / "bin" / "python3.12", workdir() / "venv-headless")


@functools.cache
def healthy_venv() -> Path:
    return make_venv(pyenv_python(), workdir() / "venv-healthy")


@functools.cache
def fake_libcuda_dir() -> Path:
    """A real shared object named libcuda.so.1 built with gcc: what Triton links with -l:libcuda.so.1."""
    d = workdir() / "libcuda"
    d.mkdir()
    src = d / "cuda.c"
    src.write_text("int cuInit(unsigned int flags) { return flags ? 1 : 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(d / "libcuda.so.1"), str(src)],
                   check=True, timeout=60)
    return d


LIBCUDA_C = """
int cuDriverGetVersion(int *v) { *v = CUDA_VERSION; return 0; }
int cuInit(unsigned int flags) { return CUINIT_RC; }
"""


@functools.cache
def fake_libcuda(version: str, cuda: int = 13000, cuinit_rc: int = 0) -> Path:
    """For cuda.libcuda: a directory holding libcuda.so.1 -> libcuda.so.VERSION, a real shared object (gcc)
    whose soname is libcuda.so.1, reporting CUDA ``cuda`` and returning ``cuinit_rc`` from cuInit."""
    d = workdir() / f"libcuda-{version}-{cuinit_rc}"
    d.mkdir()
    (d / "cuda.c").write_text(LIBCUDA_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", f"-DCUDA_VERSION={cuda}",
                    f"-DCUINIT_RC={cuinit_rc}", "-o", str(d / f"libcuda.so.{version}"), str(d / "cuda.c")],
                   check=True, timeout=60)
    os.symlink(f"libcuda.so.{version}", d / "libcuda.so.1")
    return d


@functools.cache
def fake_libcuda_stub(cuinit_rc: int = 34) -> Path:
    """For cuda.libcuda: the CUDA toolkit's link stub as it ends up on a service's path, ``.../lib64/stubs/``
    holding libcuda.so.1 with no version in its name, whose cuInit returns 34 (CUDA_ERROR_STUB_LIBRARY)."""
    d = workdir() / f"cuda-13.0-{cuinit_rc}" / "lib64" / "stubs"
    d.mkdir(parents=True)
    (d / "cuda.c").write_text(LIBCUDA_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-DCUDA_VERSION=13000",
                    f"-DCUINIT_RC={cuinit_rc}", "-o", str(d / "libcuda.so.1"), str(d / "cuda.c")],
                   check=True, timeout=60)
    return d


def write_dist(site: Path, name: str, version: str, requires: list[str] = (), top_level: str | None = None,
               metadata: str | None = None) -> None:
    """A real ``.dist-info`` (METADATA, RECORD, INSTALLER) and, if asked, an empty top-level package."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    text = metadata or ("Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"
                        + "".join(f"Requires-Dist: {r}\n" for r in requires))
    (info / "METADATA").write_text(text)
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")
    if top_level:
        pkg = site / top_level
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").write_text("raise ImportError('the stack probe must not import this')\n")


def stack_site(dest: Path, *, torch: str = "2.14.1+cu130", triton: str | None = "3.8.0",
               sglang: str | None = "0.5.23", kernel: str | None = "0.4.10", flashinfer: str | None = "0.7.2",
               torch_triton_pin: str = "~=3.8.0") -> Path:
    """A site dir holding the stack's distributions (their Requires-Dist as the real wheels have them)."""
    dest.mkdir(parents=True, exist_ok=True)
    pin = torch_triton_pin if not torch_triton_pin[0].isdigit() else f"=={torch_triton_pin}"
    write_dist(dest, "torch", torch, [f'triton{pin}; platform_system == "Linux" and python_version < "3.15"',
                                      "filelock", 'optree>=0.13.0; extra == "optree"'], top_level="torch")
    if triton:
        write_dist(dest, "triton", triton, ['importlib-metadata; python_version < "3.10"'], top_level="triton")
    if sglang:
        write_dist(dest, "sglang", sglang, ["torch==2.14.1", f"sglang-kernel=={kernel or '0.4.10'}",
                                            "flashinfer_python[cu13]==0.7.2", "numpy",
                                            'av==16.1.0; platform_machine == "aarch64"'], top_level="sglang")
    if kernel:
        write_dist(dest, "sglang-kernel", kernel, ["torch==2.14.1"] if kernel == "0.4.10" else [],
                   top_level="sgl_kernel")
    if flashinfer:
        write_dist(dest, "flashinfer-python", flashinfer, ["torch", "numpy"], top_level="flashinfer")
    return dest


@downloads.reads("the triton 3.6.0 wheel")
def triton_wheel() -> Path:
    """Triton 3.6.0's wheel (its real ptxas binaries), found like every test wheel (``sglang_wheels.fetch_wheel``)."""
    return fetch_wheel("triton", "3.6.0")


@downloads.reads("the triton 3.6.0 wheel")
def triton_package(flavour: str = "3.6") -> Path:
    """A site dir with a Triton whose nvidia backend is the real one's ptxas + compiler.py.

    ``3.6``: as released (ptxas 12.8 and ptxas-blackwell 12.9, ``ptxas_blackwell if arch >= 100``).
    ``3.5``: what 3.5.x ships: only ptxas 12.8, one ptxas for every arch.
    """
    site = workdir() / f"site-triton-{flavour}"
    nv = site / "triton" / "backends" / "nvidia"
    (nv / "bin").mkdir(parents=True)
    (site / "triton" / "__init__.py").write_text("raise ImportError('the probes must not import triton')\n")
    wanted = ["triton/backends/nvidia/bin/ptxas", "triton/backends/nvidia/compiler.py"]
    if flavour == "3.6":
        wanted.append("triton/backends/nvidia/bin/ptxas-blackwell")
    with zipfile.ZipFile(triton_wheel()) as zf:
        for name in wanted:
            with zf.open(name) as src, open(site / name, "wb") as dst:
                shutil.copyfileobj(src, dst)
    for tool in ("ptxas", "ptxas-blackwell"):
        if (nv / "bin" / tool).exists():
            os.chmod(nv / "bin" / tool, 0o755)
    if flavour == "3.5":
        (nv / "compiler.py").write_text("def get_ptxas():\n    return knobs.nvidia.ptxas\n")
    write_dist(site, "triton", "3.5.1" if flavour == "3.5" else "3.6.0")
    return site


def load_reference() -> dict[str, Any]:
    import json

    if not REFERENCE.is_file():
        pytest.skip(f"{REFERENCE} not present")
    return json.loads(REFERENCE.read_text())


def nvml_fact(ccs: list[tuple[int, int]], driver: str = "580.159.04", cuda: int = 13000,
              name: str = "NVIDIA B300 SXM6 AC") -> dict[str, Any]:
    """An ``nvml`` fact in the shape the GPU engineer's collector records."""
    return {"available": True, "error": None, "driver_version": driver, "cuda_driver_version": cuda,
            "device_count_total": len(ccs), "visible": {"cuda_visible_devices": None},
            "devices": [{"index": i, "name": name, "uuid": f"GPU-{i}", "compute_capability": list(cc),
                         "memory": {"total": 1, "free": 1, "used": 0}} for i, cc in enumerate(ccs)]}


NO_NVML = {"available": False, "error": "nvmlInit failed: no NVIDIA driver on this host"}


def make_ctx(python: str | os.PathLike[str], *, profile: str = "b300-tp8-ddtree", env: dict[str, str] | None = None,
             facts: dict[str, Any] | None = None, deep: bool = False, env_file: str | None = None) -> Context:
    """A live run for ``python`` (``conftest.make_context``) with a clean environment; ``facts`` are recorded
    values (e.g. ``nvml``) mixed in."""
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
                "LANG": "C.UTF-8"}
    base_env.update(env or {})
    ctx = make_context({"python": str(python), "profile": profile, "deep": deep}, facts=facts, live=True,
                       env=base_env)
    ctx.settings.profile.setdefault("server", {})["env_file"] = env_file or str(workdir() / "absent.env")
    return ctx
