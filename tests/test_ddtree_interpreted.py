"""SGLang 0.5.23's Triton tree-verify kernels on DDTree trees, run on the CPU by Triton's interpreter.

The GPU test (tests/test_ddtree_gpu.py) is the real check; this runs its harness (ddtree_gpu_harness.py) with
``TRITON_INTERPRET=1`` (float32, short prefixes) so the mask layout, the kernel call and the float64
reference are exercised wherever triton is importable, GPU or not. Interpreter: ``$K26_SGLANG_ARGS_PYTHON``
or this one; skips when it has no triton.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ci_requirements
import pytest
from ddtree_support import require_wheel

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)

GPU_TEST = Path(__file__).resolve().parent / "ddtree_gpu_harness.py"


def test_kernels_in_the_triton_interpreter():
    python = os.environ.get("K26_SGLANG_ARGS_PYTHON", sys.executable)
    ci_requirements.require("torch", "triton", python=python, needed_for="to run SGLang's kernels in Triton's "
                            "interpreter")
    require_wheel()  # the kernel sources (located, or downloaded, before the interpreter child looks)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([python, str(GPU_TEST), "--interpret"], capture_output=True, text=True, timeout=600,
                          env=env, cwd=GPU_TEST.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.endswith((" OK", " FAIL"))]
    # 2 shapes x (compact bool, compact uint8, FULL_MASK bool), greedy verify, the draft top-k, the step loop
    assert len(lines) == 9 and all(ln.endswith(" OK") for ln in lines), proc.stdout
