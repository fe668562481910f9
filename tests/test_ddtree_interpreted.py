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
import sglang_wheels
from ddtree_support import SET_DIR, require_wheel
from interpreters import probe_env, run_identity

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)

HERE = Path(__file__).resolve().parent
GPU_TEST = HERE / "ddtree_gpu_harness.py"


def harness_inputs() -> list[Path]:
    """What the harness runs besides the wheel and the interpreter: itself, every module of the checkout it
    imports (``project_sources``), the patch set and the engine that applies it."""
    return [*sglang_wheels.project_sources(GPU_TEST), SET_DIR, HERE.parent / "doctor" / "sglang" / "patching"]


@pytest.fixture(scope="module")
def interpreted() -> dict:
    """The harness's run in Triton's interpreter (exit code, output): computed once per harness, patch set, wheel
    and interpreter (``computed_once``), reused by later runs until one of them changes."""
    python = os.environ.get("K26_SGLANG_ARGS_PYTHON", sys.executable)
    ci_requirements.require("torch", "triton", python=python, needed_for="to run SGLang's kernels in Triton's "
                            "interpreter")
    wheel = require_wheel()  # the kernel sources (located, or downloaded, before the interpreter child looks)
    env = probe_env(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")

    def run() -> tuple[dict, bool]:
        proc = subprocess.run([python, str(GPU_TEST), "--interpret"], capture_output=True, text=True, timeout=600,
                              env=env, cwd=GPU_TEST.parent)
        return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-3000:]}, \
            proc.returncode == 0

    key = {"wheel": wheel.name, **run_identity(python, env)}
    return sglang_wheels.computed_once("ddtree-interpreted", harness_inputs(), key, run)


def test_kernels_in_the_triton_interpreter(interpreted: dict):
    assert interpreted["returncode"] == 0, interpreted["stdout"][-3000:] + interpreted["stderr"][-3000:]
    lines = [ln for ln in interpreted["stdout"].splitlines() if ln.endswith((" OK", " FAIL"))]
    # 2 shapes x (compact bool, compact uint8, FULL_MASK bool), greedy verify, the draft top-k (SGLang's helper and
    # the set's), the step loop
    assert len(lines) == 10 and all(ln.endswith(" OK") for ln in lines), interpreted["stdout"]
