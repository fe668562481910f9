"""bench/ddtree/trace_report.py on real SGLang torch-profiler traces (one decode step of DFLASH and of DDTREE
budget 16 with CUDA graphs, cut from the H200 traces of bench/results/ddtree-h200-rev5): the decode step is
found, its GPU busy time is the union of its kernels, and the two workers' Python functions line up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from file_modules import load_file

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "fixtures" / "traces"


tr = load_file(ROOT / "bench" / "ddtree" / "trace_report.py", "k26_trace_report")


def test_busy_time_is_the_union_of_overlapping_intervals() -> None:
    assert tr.busy_us([(0, 10), (5, 15), (20, 30)], 0, 100) == 25
    assert tr.busy_us([(0, 10), (5, 15), (20, 30)], 8, 25) == 12  # clipped to the window
    assert tr.busy_us([], 0, 10) == 0


@pytest.mark.parametrize(("name", "worker"), [("dflash-graph", "dflash_worker_v2.py"),
                                              ("ddtree-b16-graph", "ddtree_worker_v2.py")])
def test_a_real_decode_step_is_host_bound_at_c1(name: str, worker: str) -> None:
    r = tr.summarize(str(TRACES / f"{name}-c1.trace.json.gz"))
    assert r["steps"] == 1
    # the scheduler's step spans ~10 ms under the profiler; the GPU works well under a tenth of the cycle
    assert 1000 < r["host_us"] <= r["cycle_us"]
    assert 0 < r["gpu_busy_us"] < 0.1 * r["cycle_us"]
    assert any(worker in k and "forward_batch_generation" in k for k in r["incl_us"])


def test_the_command_line_sets_traces_side_by_side(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "ddtree" / "trace_report.py"),
                          str(TRACES / "dflash-graph-c1.trace.json.gz"),
                          str(TRACES / "ddtree-b16-graph-c1.trace.json.gz"),
                          "--top", "5", "--json", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "GPU busy" in out.stdout and "inclusive us per step" in out.stdout
    assert (tmp_path / "r.json").exists()
    bad = tmp_path / "empty.json"
    bad.write_text('{"traceEvents": []}')
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "ddtree" / "trace_report.py"), str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "no decode steps" in out.stdout
