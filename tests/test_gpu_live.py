"""On a real NVIDIA GPU (``pytest -m gpu``): the collector, CUDA_VISIBLE_DEVICES, the checks, a real
process holding GPU memory found and stopped by PID, the bandwidth probe. Skipped without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import make_context, run_check

from doctor import app
from doctor.core.actions import StopProcess
from doctor.core.context import Context
from doctor.core.registry import load
from doctor.core.result import Result, Status
from doctor.facts.store import CollectOptions
from doctor.gpu.facts import collect_p2p_bandwidth

pytestmark = pytest.mark.gpu
DEFAULT_GPU = ["gpu.driver", "gpu.count", "gpu.arch", "gpu.memory", "gpu.idle", "gpu.health", "gpu.nvlink",
               "gpu.fabric"]


def live(env: dict[str, str] | None = None, tp: int = 1, profile: str = "h200-tp8") -> Context:
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",)}
    return make_context({"profile": profile, "tp": tp}, live=True, env={**base, **(env or {})})


def smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30).stdout


def test_live_fact_matches_nvidia_smi() -> None:
    nvml = live().fact("nvml")
    assert nvml["available"] is True, nvml.get("error")
    rows = [r.split(", ") for r in smi("--query-gpu=index,uuid,driver_version,pci.bus_id,memory.total",
                                       "--format=csv,noheader,nounits").strip().splitlines()]
    assert nvml["device_count_total"] == len(rows)
    assert nvml["driver_version"] == rows[0][2]
    for d, r in zip(nvml["devices"], rows, strict=True):
        assert d["uuid"] == r[1] and d["pci_bus_id"].upper().endswith(r[3].upper()[-12:])
        assert abs(d["memory"]["total"] / 2**20 - int(r[4])) <= 1
        assert isinstance(d["compute_capability"], list) and d["lost"] is False
        assert d["nvlink"]["error"] is None and d["fabric"] is not None
    assert isinstance(nvml["cuda_driver_version"], int) and nvml["cuda_driver_version"] >= 12000
    assert nvml["elapsed_s"] < 5


def test_live_cuda_visible_devices_forms() -> None:
    full = live().fact("nvml")
    uuid = full["devices"][0]["uuid"]
    by_uuid = live({"CUDA_VISIBLE_DEVICES": uuid[:12]}).fact("nvml")
    assert [d["uuid"] for d in by_uuid["devices"]] == [uuid]
    assert live({"CUDA_VISIBLE_DEVICES": ""}).fact("nvml")["devices"] == []
    bad = live({"CUDA_VISIBLE_DEVICES": f"0,{full['device_count_total'] + 5}"}).fact("nvml")
    assert [d["index"] for d in bad["devices"]] == [0] and bad["visible"]["problems"]
    mig = live({"CUDA_VISIBLE_DEVICES": "MIG-00000000-0000-0000-0000-000000000000"}).fact("nvml")
    assert mig["devices"] == [] and "no MIG device" in mig["visible"]["problems"][0]


def test_live_default_checks_judge_without_error() -> None:
    settings = app.settings_from_flags({"profile": "h200-tp8", "tp": 1, "only": ["gpu.*"]})
    start = time.monotonic()
    report = app.run(settings)[0]
    wall = time.monotonic() - start
    res = {r.id: r for r in report.results}
    assert set(DEFAULT_GPU) <= set(res)
    for cid in DEFAULT_GPU:
        assert res[cid].status is not Status.ERROR or cid == "gpu.fabric", (cid, res[cid].summary)
    assert res["gpu.driver"].status is Status.PASS
    assert wall < 10, wall


def _torch_python() -> str | None:
    for py in (sys.executable, os.environ.get("K26_GPU_PYTHON")):
        if not py:
            continue
        try:
            if subprocess.run([py, "-c", "import torch; assert torch.cuda.is_available()"], capture_output=True,
                              timeout=120).returncode == 0:
                return py
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def test_live_stale_process_found_and_stopped_by_pid(tmp_path: Path) -> None:
    py = _torch_python()
    if py is None:
        pytest.skip("no interpreter with CUDA torch")
    ready = tmp_path / "ready"
    code = ("import torch,time,pathlib,sys; x=torch.empty(2**30, dtype=torch.uint8, device='cuda:0'); "
            "torch.cuda.synchronize(); pathlib.Path(sys.argv[1]).write_text('1'); time.sleep(120)")
    child = subprocess.Popen([py, "-c", code, str(ready), "k26-stale-marker"])
    try:
        deadline = time.monotonic() + 90
        while not ready.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
        assert ready.exists(), "the torch child did not start"
        ctx = live()
        nvml = ctx.fact("nvml")
        procs = [p for d in nvml["devices"] for p in d["processes"] or []]
        mine = [p for p in procs if p["pid"] == child.pid]
        if not mine:
            pytest.skip(f"NVML does not report this PID namespace's processes here (saw {procs})")
        p = mine[0]
        assert "k26-stale-marker" in p["cmdline"] and p["used_memory"] >= 2**30
        assert p["holds_nvidia_device"] is True and p["start_ticks"]
        result: Result = run_check("gpu.idle", ctx)
        assert result.status is Status.FAIL and f"PID {child.pid}" in result.summary
        actions = load(plugins=False).fixers["gpu.idle"].plan(ctx, result)
        assert [a.pid for a in actions if isinstance(a, StopProcess)] == [child.pid]
        actions[0].grace_s = 5
        actions[0].apply(tmp_path)
        child.wait(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_live_bandwidth_probe() -> None:
    py = _torch_python()
    if py is None:
        pytest.skip("no interpreter with CUDA torch")
    n = live().fact("nvml")["device_count_total"]
    out: dict[str, Any] = collect_p2p_bandwidth(CollectOptions(deep=True, python=py, tp=n, env=dict(os.environ)))
    print(json.dumps({k: out.get(k) for k in ("measured", "local", "pairs", "duration_s", "error")}))
    assert out["measured"] is True, out.get("reason")
    assert len(out["pairs"]) == n * (n - 1)
    assert all(x["gb_per_s"] > 100 for x in out["local"])
    assert all(p["data_ok"] for p in out["pairs"])


def test_live_cli_check_then_fix_stops_the_stale_process(tmp_path: Path, doctor: Any) -> None:
    """The whole user path: `check` names the PID, `fix --apply --yes` stops exactly it, `check` passes."""
    run_doctor = doctor
    py = _torch_python()
    if py is None:
        pytest.skip("no interpreter with CUDA torch")
    ready = tmp_path / "ready"
    sel = ["--only", "gpu.idle", "--profile", "h200-tp8", "--tp", "1", "--state-dir", str(tmp_path / "state")]
    # The fixer stops every process holding GPU memory: never run it while another one (this test runner,
    # if an earlier test made a CUDA context in it) holds any.
    before = json.loads(run_doctor("check", "--format", "json", *sel).stdout)["results"][0]
    if before["status"] != "pass":
        pytest.skip(f"GPU not idle before the test, fix would stop more than our child: {before['summary']}")
    code = ("import torch,time,pathlib,sys; x=torch.empty(2**30, dtype=torch.uint8, device='cuda:0'); "
            "torch.cuda.synchronize(); pathlib.Path(sys.argv[1]).write_text('1'); time.sleep(120)")
    child = subprocess.Popen([py, "-c", code, str(ready), "k26-cli-stale-marker"])
    try:
        deadline = time.monotonic() + 90
        while not ready.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
        assert ready.exists(), "the torch child did not start"
        first = run_doctor("check", *sel)
        if f"PID {child.pid}" not in first.stdout:
            pytest.skip(f"NVML does not report this PID namespace's processes here: {first.stdout[-300:]}")
        # The summary shows the command line's head and tail; the JSON details hold all of it.
        assert first.returncode == 1 and "k26-cli-stale-marker" in first.stdout
        as_json = json.loads(run_doctor("check", "--format", "json", *sel).stdout)
        procs = as_json["results"][0]["details"]["processes"]
        assert [p["pid"] for p in procs] == [child.pid] and "k26-cli-stale-marker" in procs[0]["cmdline"]
        fixed = run_doctor("fix", "--apply", "--yes", *sel, timeout=120)
        assert f"PID {child.pid}" in fixed.stdout, fixed.stdout + fixed.stderr
        child.wait(timeout=20)
        again = run_doctor("check", *sel)
        assert again.returncode == 0, again.stdout
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
