"""Fixers of the GPU checks: exact PIDs only (verified live), fabric manager only when it is down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import fix_plan, make_context

from doctor.core.actions import RunCommand, StopProcess, process_start_ticks
from doctor.core.context import Context
from doctor.core.registry import load
from fixes.gpu import idle_candidates

SNAPS = Path(__file__).parent / "fixtures" / "snapshots"


def ctx_for(doc: dict[str, Any], profile: str = "b300-tp8-ddtree", tp: int | None = None) -> Context:
    return make_context({"profile": profile, "tp": tp}, facts=doc["facts"])


def snap(name: str) -> dict[str, Any]:
    return json.loads((SNAPS / name).read_text())


def test_fixers_registered() -> None:
    assert {"gpu.idle", "gpu.fabric"} <= set(load(plugins=False).fixers)
    assert load(plugins=False).fixers["gpu.fabric"].needs_root


def test_idle_plan_stops_exactly_the_live_pid_and_applies(tmp_path: Path) -> None:
    # A grandchild (its parent exits at once), so that it is reaped by init like a real stale server and not
    # left a zombie of this test.
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)' stale-gpu-server "
                          ">/dev/null 2>&1 & echo $!"], capture_output=True, text=True, timeout=10)
    child = _Pid(int(out.stdout.strip()))
    try:
        time.sleep(0.1)
        doc = snap("b300x8-stale-process.json")
        dev0 = doc["facts"]["nvml"]["devices"][0]
        dev0["processes"] = [{"pid": child.pid, "used_memory": 70 * 2**30, "types": ["compute"], "in_namespace": True,
                              "cmdline": "python -c ... stale-gpu-server", "uid": os.getuid(),
                              "start_ticks": process_start_ticks(child.pid), "holds_nvidia_device": True}]
        ctx = ctx_for(doc)
        actions = fix_plan("gpu.idle", ctx)
        assert [type(a) for a in actions] == [StopProcess] and actions[0].pid == child.pid
        assert actions[0].start_ticks == process_start_ticks(child.pid) and not actions[0].needs_root
        notes = actions.notes  # the other 8 recorded PIDs do not exist here
        assert any("PID 41231: not planned" in n for n in notes)
        assert any("3912877" in n and "PID namespace" in n for n in notes)
        assert f"kill -TERM {child.pid}" in actions[0].details()[0]
        actions[0].grace_s = 5.0
        done = actions[0].apply(tmp_path)
        assert "stopped" in done or "killed" in done
        assert process_start_ticks(child.pid) != dev0["processes"][0]["start_ticks"]
    finally:
        child.kill()


class _Pid:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass


def test_idle_refuses_reused_pid_and_no_device_evidence() -> None:
    me_child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ticks = process_start_ticks(me_child.pid)
        dev = {"index": 0, "cuda_index": 0, "processes": [
            {"pid": me_child.pid, "in_namespace": True, "holds_nvidia_device": True, "start_ticks": (ticks or 0) + 1},
            {"pid": me_child.pid + 10**6, "in_namespace": True, "holds_nvidia_device": False, "start_ticks": 1},
            {"pid": 1, "in_namespace": True, "holds_nvidia_device": True, "start_ticks": 1},
            {"pid": os.getpid(), "in_namespace": True, "holds_nvidia_device": True, "start_ticks": 1},
        ]}
        keep, refused = idle_candidates({"devices": [dev]}, 8)
        assert keep == []
        text = "\n".join(refused)
        assert "exited or its PID now belongs to another process" in text
        assert "holds no /dev/nvidia" in text and "init or the doctor itself" in text
    finally:
        me_child.kill()
        me_child.wait()


def test_fabric_plan_only_when_fabric_is_down() -> None:
    down = fix_plan("gpu.fabric", ctx_for(snap("b300x8-fabric-not-started.json")))
    assert len(down) == 1 and isinstance(down[0], RunCommand)
    assert down[0].argv == ["systemctl", "start", "nvidia-fabricmanager"] and down[0].needs_root
    assert fix_plan("gpu.fabric", ctx_for(snap("b300x8-healthy.json"))) == []
    assert fix_plan("gpu.fabric", ctx_for(snap("h200x2-reference.json"), "h200-tp8")) == []
