"""Stack checks on a real GPU host (recorded on an H200: Python 3.12, torch 2.11.0+cu130, triton 3.6.0).

Run there with::

    K26_GPU_PYTHON=<venv with torch and triton>/bin/python3 python3 -m pytest -q -m gpu tests/test_stack_gpu.py

``test_b300_failure_reproduced_on_gpu`` moves the interpreter's ``Python.h`` aside for the duration
of the test (restored in ``finally``), shows that a one-kernel Triton program fails exactly as the
B300 service did, that triton.jit predicts it, and that both work again once the header is back.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from stack_support import make_ctx, run_check

from doctor.core.result import Status
from doctor.triton.facts import collect_triton_build

GPU_PYTHON = os.environ.get("K26_GPU_PYTHON", "")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not GPU_PYTHON or not os.path.exists(GPU_PYTHON),
                                 reason="set K26_GPU_PYTHON to the interpreter of a venv with torch and triton")]

KERNEL = """
import torch, triton, triton.language as tl

@triton.jit
def add(x, y, o, n, B: tl.constexpr):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

x = torch.ones(1000, device="cuda")
o = torch.empty_like(x)
add[(4,)](x, x, o, 1000, B=256)
torch.cuda.synchronize()
print("ok", float(o.sum()))
"""


def gpu_ctx(deep: bool = False, env: dict[str, str] | None = None):
    return make_ctx(GPU_PYTHON, profile="h200-tp8", deep=deep, env={**os.environ, **(env or {})})


def run_kernel(cache_dir: str) -> subprocess.CompletedProcess[str]:
    """A one-kernel Triton program with an empty Triton cache (so its C helpers are really built)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(KERNEL)
    try:
        env = {**os.environ, "TRITON_CACHE_DIR": cache_dir}
        return subprocess.run([GPU_PYTHON, fh.name], capture_output=True, text=True, timeout=300, env=env)
    finally:
        os.unlink(fh.name)


def test_triton_jit_passes_on_the_gpu_host():
    res = run_check("triton.jit", gpu_ctx())
    assert res.status is Status.PASS, res.summary
    assert res.details["linked_libcuda"] is True


def test_b300_failure_reproduced_on_gpu(tmp_path):
    build = collect_triton_build(gpu_ctx().facts.options)
    header = Path(build["py_include"]) / "Python.h"
    if not header.is_file():
        pytest.skip(f"{header} absent before the test: nothing to move")
    if not os.access(header.parent, os.W_OK):
        pytest.skip(f"{header.parent} not writable: cannot move Python.h aside")
    aside = header.with_name("Python.h.k26-doctor-test")
    os.rename(header, aside)
    try:
        res = run_check("triton.jit", gpu_ctx())
        assert res.status is Status.FAIL
        assert "Python.h: No such file or directory" in res.summary
        assert str(header.parent) in res.summary
        broken = run_kernel(str(tmp_path / "cache-broken"))
        assert broken.returncode != 0
        assert "Python.h: No such file or directory" in broken.stderr + broken.stdout
        assert "compile_module_from_src" in broken.stderr
    finally:
        os.rename(aside, header)
    assert header.is_file()
    assert run_check("triton.jit", gpu_ctx()).status is Status.PASS
    fixed = run_kernel(str(tmp_path / "cache-fixed"))
    assert fixed.returncode == 0 and "ok 2000.0" in fixed.stdout, fixed.stderr[-2000:]


def test_torch_arch_deep_matmul_on_every_gpu():
    res = run_check("torch.arch", gpu_ctx(deep=True))
    assert res.status is Status.PASS, res.summary
    assert "matmul ran on every GPU" in res.summary
    runs = res.details["matmul"]
    assert runs and all(r["ok"] for r in runs)
    assert res.details["source"] == "nvml"


def test_cuda_compat_on_the_gpu_host():
    res = run_check("cuda.compat", gpu_ctx())
    assert res.status is Status.PASS, res.summary
    assert res.details["torch_cuda"] == "13.0"


def test_triton_ptxas_on_h200():
    res = run_check("triton.ptxas", gpu_ctx())
    assert res.status is Status.PASS, res.summary
    assert "sm_90a" in res.summary
