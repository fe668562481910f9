"""The bandwidth probe and its collector without a GPU: clear failures, never a hang or a traceback."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import nvidia_gpu_count
from file_modules import load_file
from interpreters import pyenv_versions

from doctor.core.proc import PROBES_DIR, run_probe
from doctor.facts.store import CollectOptions
from doctor.gpu.facts import collect_p2p_bandwidth, world_size

PYENV = pyenv_versions()


def _has_cuda_torch(python: str) -> bool:
    """Whether ``python``'s torch sees a CUDA device: never where NVML sees no GPU (no driver, or none), which
    conftest has asked once for the session; else asked of torch itself (an import of several seconds)."""
    if nvidia_gpu_count() == 0:
        return False
    code = "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_probe_is_stdlib_only_at_import() -> None:
    text = (PROBES_DIR / "p2p_bandwidth.py").read_text()
    top = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    assert top == ["import argparse", "import json", "import os", "import subprocess", "import sys", "import time"]


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


# -- one child per pair, under a hard deadline ------------------------------------------------------

def _probe_module() -> Any:
    return load_file(PROBES_DIR / "p2p_bandwidth.py", "p2p_bandwidth_probe", register=False)


def _children_running(marker: str) -> list[int]:
    """PIDs whose command line holds ``marker`` (the hung child, if it survived)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if marker in cmd and int(entry) != os.getpid():
                pids.append(int(entry))
    return pids


def test_a_hung_pair_fails_that_pair_and_the_others_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child of pair 0-1 really sleeps (the probe's test hook); it is killed at the pair deadline, named as
    hung, and pair 1-2 still runs in its own child (here it finds no torch: ``-S`` hides site-packages)."""
    mod = _probe_module()
    monkeypatch.setenv(mod.HANG_ENV, "0-1")
    args = argparse.Namespace(pair_timeout_s=2.0, budget_s=60.0, size_mib=1, iters=1)
    start = time.monotonic()
    measured, failed, skipped = mod.measure_pairs([(0, 1), (1, 2)], args, python=[sys.executable, "-S"])
    took = time.monotonic() - start
    assert measured == [] and skipped == []
    hung, other = failed
    assert (hung["a"], hung["b"], hung["timed_out"]) == (0, 1, True)
    assert hung["error"] == "no answer within 2 s: killed" and 2.0 <= hung["seconds"] < 8
    assert (other["a"], other["b"], other["timed_out"]) == (1, 2, False)
    assert "torch is not importable" in other["error"]
    assert took < 15, took  # bounded by the pair deadline, not by the child's hour of sleep
    assert _children_running("--pair 0,1") == []  # killed and reaped: nothing outlives the probe


def test_the_budget_leaves_later_pairs_unstarted(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _probe_module()
    monkeypatch.setenv(mod.HANG_ENV, "0-1")
    args = argparse.Namespace(pair_timeout_s=1.0, budget_s=0.5, size_mib=1, iters=1)
    measured, failed, skipped = mod.measure_pairs([(0, 1), (2, 3)], args, python=[sys.executable, "-S"])
    assert measured == []
    assert [f["timed_out"] for f in failed] == [True] and skipped == [[2, 3], [3, 2]]


def test_a_hung_device_query_ends_the_probe_with_a_clear_error() -> None:
    """The whole probe through run_probe, as the collector runs it: the devices child hangs and is killed."""
    env = dict(os.environ, K26_DOCTOR_P2P_TEST_HANG="devices")
    data, res = run_probe(sys.executable, "p2p_bandwidth", ["--devices", "0,1", "--setup-timeout-s", "2"],
                          timeout=60, env=env)
    assert data is not None, res.why()
    assert data["ok"] is False and data["setup_timed_out"] is True
    assert data["error"] == "reading the devices failed: no answer within 2 s: killed"
    assert data["pairs"] == [] and data["failed_pairs"] == [] and res.duration_s < 20
