"""CUDA toolkit layouts built in a test's directory from real parts: the real headers of the installed
``nvidia-cuda-runtime`` distribution (torch's CUDA dependency: cuda.h, cuda_runtime.h, cuda_runtime_api.h with
their real release macros) and an nvcc: NVIDIA's real one from the nvidia-cuda-nvcc wheel
(``kernel_wheels.nvcc``, a download) or, where a test needs a release no wheel here has, a script that answers
``--version`` as nvcc does."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from pathlib import Path

import pytest

HEADERS = ("cuda.h", "cuda_runtime.h", "cuda_runtime_api.h")


def runtime_headers() -> dict[str, Path]:
    """The real headers of the installed nvidia-cuda-runtime (what a pip-installed torch brings)."""
    try:
        dist = importlib.metadata.distribution("nvidia-cuda-runtime")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nvidia-cuda-runtime (torch's CUDA runtime wheel, installed by .ci/run) is not installed")
    found = {f.name: Path(dist.locate_file(f)) for f in dist.files or [] if f.name in HEADERS}
    missing = sorted(set(HEADERS) - set(found))
    assert not missing, f"nvidia-cuda-runtime {dist.version} lacks {missing}"
    return found


def runtime_release() -> str:
    """The release the real cuda_runtime_api.h declares ("13.0" for CUDART_VERSION 13000)."""
    text = runtime_headers()["cuda_runtime_api.h"].read_text(errors="replace")
    v = int(re.search(r"^#define CUDART_VERSION\s+(\d+)", text, re.M).group(1))
    return f"{v // 1000}.{v % 1000 // 10}"


def nvcc_script(release: str) -> str:
    """What ``nvcc --version`` prints, for a release no real nvcc here has."""
    return ("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
            f"echo 'Cuda compilation tools, release {release}, V{release}.88'\n")


# The lines of the nvidia-cuda-nvcc wheel's bin/nvcc.profile that place its headers (the rest sets tool paths).
WHEEL_PROFILE = 'TOP              = $(_HERE_)/..\nINCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)\n'


def toolkit(root: Path, *, nvcc: Path | str | None, headers: tuple[str, ...] = HEADERS, profile: bool = True) -> Path:
    """``root`` laid out as a toolkit: ``bin/nvcc`` (a copy of a real nvcc given as a Path, with the real
    ``nvcc.profile`` beside it; a script given as text, with the wheel profile's include lines unless
    ``profile=False``, as a wrapper script has none; none for None) and ``include/`` with copies of the real
    headers named."""
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "include").mkdir(exist_ok=True)
    if isinstance(nvcc, Path):
        shutil.copyfile(nvcc, root / "bin" / "nvcc")
        shutil.copyfile(nvcc.parent / "nvcc.profile", root / "bin" / "nvcc.profile")
    elif isinstance(nvcc, str):
        (root / "bin" / "nvcc").write_text(nvcc)
        if profile:
            (root / "bin" / "nvcc.profile").write_text(WHEEL_PROFILE)
    if nvcc is not None:
        (root / "bin" / "nvcc").chmod(0o755)
    real = runtime_headers()
    for name in headers:
        shutil.copyfile(real[name], root / "include" / name)
    return root
