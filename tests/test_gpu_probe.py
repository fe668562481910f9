"""The bandwidth probe and its collector without a GPU: clear failures, never a hang or a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from interpreters import pyenv_versions

from doctor.core.proc import PROBES_DIR, run_probe
from doctor.facts.store import CollectOptions
from doctor.gpu.facts import collect_p2p_bandwidth, world_size

PYENV = pyenv_versions()


def _has_cuda_torch(python: str) -> bool:
    code = "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_probe_is_stdlib_only_at_import() -> None:
    text = (PROBES_DIR / "p2p_bandwidth.py").read_text()
    top = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    assert top == ["import argparse", "import json", "import sys", "import time"]


@pytest.mark.parametrize("version", ["3.10.13", "3.12.1", "3.13.0"])
def test_probe_without_torch_says_so(version: str) -> None:
    python = PYENV / version / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {python}")
    data, res = run_probe(str(python), "p2p_bandwidth", ["--devices", "0,1"], timeout=60)
    assert res.ok and data is not None, res.why()
    assert data["ok"] is False and "torch is not importable" in data["error"] and data["pairs"] == []


def test_probe_with_cpu_torch_says_no_cuda() -> None:
    if _has_cuda_torch(sys.executable):
        pytest.skip("this interpreter's torch sees a GPU")
    data, res = run_probe(sys.executable, "p2p_bandwidth", [], timeout=120)
    assert data is not None, res.why()
    assert data["ok"] is False and ("no usable CUDA device" in data["error"] or "not importable" in data["error"])


def test_collector_measures_only_with_deep() -> None:
    assert collect_p2p_bandwidth(CollectOptions(deep=False)) == {"measured": False,
                                                                 "reason": "measured only with --deep"}


def test_collector_reports_a_missing_interpreter_as_probe_failure() -> None:
    out = collect_p2p_bandwidth(CollectOptions(deep=True, python="/nonexistent/bin/python3", env={}))
    assert out["measured"] is False and out["probe_failed"] is True and "/nonexistent/bin/python3" in out["reason"]


def test_collector_reports_torch_missing_as_a_judgeable_failure() -> None:
    python = PYENV / "3.10.13" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {python}")
    out = collect_p2p_bandwidth(CollectOptions(deep=True, python=str(python), env={}, tp=2))
    assert out["measured"] is False and "probe_failed" not in out and "torch is not importable" in out["reason"]
    assert out["world_size"] == 2


def test_world_size_from_profile() -> None:
    assert world_size(CollectOptions(tp=4, profile={"parallel": {"pp": 2, "dp": 1}})) == 8
    assert world_size(CollectOptions(tp=8, profile={"parallel": {"pp": "x"}})) == 8


def test_probe_output_is_one_json_line() -> None:
    out = subprocess.run([sys.executable, str(PROBES_DIR / "p2p_bandwidth.py"), "--devices", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(doc) >= {"ok", "error", "pairs", "local", "device_count"}
