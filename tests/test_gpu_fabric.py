"""gpu.fabric readiness and its wait; gpu.fabric.manager (version against the driver); gpu.fabric.nvlsm (NVLink 5).

The wait takes a fact source: here sequences of recorded ``nvml`` facts (the synthetic B300 snapshots:
in progress, then completed; never completing), with a clock the test advances, and the real isolated
NVML collector in a child process answering from ``tests/fixtures/fakenvml`` through the CLI.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import doctor_env, fix_plan, make_context, run_doctor
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from doctor import app
from doctor.core.actions import RunCommand, WriteFile
from doctor.core.context import Context, FactUnavailable
from doctor.core.registry import load
from doctor.core.result import Result, Status
from doctor.core.settings import resolve
from doctor.facts.store import CollectOptions
from doctor.gpu import fabric, fabric_software
from doctor.gpu.facts import collect_fabric_software

SNAPS = Path(__file__).parent / "fixtures" / "snapshots"
FAKE_DIR = Path(__file__).parent / "fixtures" / "fakenvml"


def snap(name: str) -> dict[str, Any]:
    return json.loads((SNAPS / name).read_text())


def nvml(name: str) -> dict[str, Any]:
    return snap(name)["facts"]["nvml"]


APT_ALIGN = "sudo apt-get install --allow-downgrades nvidia-fabricmanager-580='580.159.04-*'"
IN_PROGRESS, COMPLETED = nvml("b300x8-fabric-in-progress.json"), nvml("b300x8-healthy.json")


class FakeClock:
    """Time that passes only when the wait sleeps (and a little per poll, as a real collector takes)."""

    def __init__(self, poll_cost: float = 0.4) -> None:
        self.now, self.poll_cost, self.sleeps = 1000.0, poll_cost, []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def source(seq: list[Any], clock: FakeClock) -> Any:
    """Each call returns the next recorded fact (the last one again once the list is used up); an exception
    in the list is raised, as a hung collector's FactUnavailable is."""
    it = iter(seq)
    last: list[Any] = [None]

    def read() -> Any:
        clock.now += clock.poll_cost
        try:
            last[0] = next(it)
        except StopIteration:
            pass
        if isinstance(last[0], BaseException):
            raise last[0]
        return copy.deepcopy(last[0])

    return read


# -- one reading ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,size,outcome", [
    ("b300x8-healthy.json", 8, "ready"),
    ("b300x8-fabric-in-progress.json", 8, "pending"),
    ("b300x8-fabric-not-started.json", 8, "pending"),
    ("h200x1-all-facts.json", 1, "no_fabric"),  # the real H200 recording: NotSupported
    ("h200x2-reference.json", 2, "unreadable"),  # the real recording whose fabric call failed (TypeError)
    ("rtxpro6000x8-pcie.json", 8, "no_fabric"),
])
def test_readiness_of_recorded_facts(name: str, size: int, outcome: str) -> None:
    assert fabric.readiness(nvml(name), size).outcome == outcome


def test_completed_with_an_error_is_failed_and_names_it() -> None:
    fact = copy.deepcopy(COMPLETED)
    fact["devices"][3]["fabric"].update(status=3, status_name="NotSupported")
    r = fabric.readiness(fact, 8)
    assert r.outcome == "failed" and r.failed == ["GPU3: NotSupported"]


def test_describe_groups_the_gpus() -> None:
    text = fabric.readiness(IN_PROGRESS, 8).describe()
    assert text == "in progress on GPU0-GPU7 (nvidia-fabricmanager is active)"


# -- the wait -------------------------------------------------------------------------------------

def test_in_progress_then_completed_is_ready() -> None:
    clk, said = FakeClock(), []
    res = fabric.wait_for_fabric(source([IN_PROGRESS, IN_PROGRESS, IN_PROGRESS, COMPLETED], clk), 8, 600,
                                 interval_s=5, progress=said.append, clock=clk.clock, sleep=clk.sleep)
    assert res.outcome == "ready" and res.polls == 4 and clk.sleeps == [5, 5, 5]
    assert [h["state"] for h in res.history] == ["in progress on GPU0-GPU7 (nvidia-fabricmanager is active)",
                                                 "completed on GPU0-GPU7 (nvidia-fabricmanager is active)"]
    assert said[0].startswith("waiting for the NVSwitch fabric (0 s of 600 s): in progress on GPU0-GPU7")
    assert said[-1] == f"NVSwitch fabric completed on 8 GPU(s) after {res.waited_s:.0f} s"
    assert res.last_fact["devices"][0]["fabric"]["state_name"] == "completed"
    fact = res.to_fact()
    assert fact["asked"] is True and fact["outcome"] == "ready" and fact["polls"] == 4
    json.dumps(fact)


def test_never_completing_times_out_with_the_state_and_the_fix() -> None:
    clk, said = FakeClock(), []
    res = fabric.wait_for_fabric(source([IN_PROGRESS], clk), 8, 60, interval_s=5, report_every_s=30,
                                 progress=said.append, clock=clk.clock, sleep=clk.sleep)
    assert res.outcome == "timeout" and 60 <= res.waited_s < 62
    assert sum(clk.sleeps) <= 60 and res.polls == len(clk.sleeps) + 1
    verdict = res.verdict()
    assert verdict.startswith("NVSwitch fabric not ready after 6") and "(limit 60 s)" in verdict
    assert "in progress on GPU0-GPU7" in verdict and "systemctl enable --now nvidia-fabricmanager" in verdict
    assert "NVLSM" in verdict and said[-1] == verdict
    assert 2 <= len(said) <= 4  # a line on change and every 30 s, not one per poll


def test_a_hung_poll_is_tried_again() -> None:
    clk = FakeClock()
    hung = FactUnavailable("nvml", "collector hung and was killed after 15s")
    res = fabric.wait_for_fabric(source([hung, IN_PROGRESS, COMPLETED], clk), 8, 600, interval_s=5,
                                 clock=clk.clock, sleep=clk.sleep)
    assert res.outcome == "ready" and res.poll_errors == [f"FactUnavailable: {hung}"]


def test_only_hung_polls_end_as_no_answer() -> None:
    clk = FakeClock()
    res = fabric.wait_for_fabric(source([FactUnavailable("nvml", "collector hung")], clk), 8, 20, interval_s=5,
                                 clock=clk.clock, sleep=clk.sleep)
    assert res.outcome == "no_answer" and "could not be read within" in res.verdict()


@pytest.mark.parametrize("name,outcome", [("h200x1-all-facts.json", "no_fabric"),
                                          ("b300x8-healthy.json", "ready"),
                                          ("h200x2-reference.json", "unreadable")])
def test_what_waiting_cannot_change_ends_at_once(name: str, outcome: str) -> None:
    clk = FakeClock()
    res = fabric.wait_for_fabric(source([nvml(name)], clk), 8, 600, clock=clk.clock, sleep=clk.sleep)
    assert res.outcome == outcome and res.polls == 1 and clk.sleeps == []


def test_the_wait_is_bounded_in_real_time() -> None:
    start = time.monotonic()
    res = fabric.wait_for_fabric(lambda: copy.deepcopy(IN_PROGRESS), 8, 0.3, interval_s=0.05)
    assert res.outcome == "timeout" and time.monotonic() - start < 2


# -- gpu.fabric after a wait -----------------------------------------------------------------------

def fabric_results(doc: dict[str, Any], profile: str = "b300-tp8-ddtree", **flags: Any) -> dict[str, Result]:
    settings_ = app.settings_from_flags({"profile": profile, "only": ["gpu.fabric*"], **flags})
    settings_.snapshot = doc
    return {r.id: r for r in app.run(settings_)[0].results}


def test_gpu_fabric_says_how_long_it_waited() -> None:
    clk = FakeClock()
    res = fabric.wait_for_fabric(source([IN_PROGRESS], clk), 8, 60, clock=clk.clock, sleep=clk.sleep)
    doc = snap("b300x8-fabric-in-progress.json")
    doc["facts"]["fabric_wait"] = res.to_fact()
    fab = fabric_results(doc)["gpu.fabric"]
    assert fab.status is Status.FAIL
    assert fab.summary.startswith("NVSwitch fabric not ready after waiting 6") and "(limit 60 s)" in fab.summary
    assert fab.details["fabric_wait"]["outcome"] == "timeout"
    plain = fabric_results(snap("b300x8-fabric-in-progress.json"))["gpu.fabric"]  # no wait recorded: as before
    assert plain.summary.startswith("NVSwitch fabric not ready: in progress on GPU0")


def _fake_machine(tmp_path: Path, state: int) -> Path:
    devs = [{"name": "NVIDIA B300 SXM6 AC", "uuid": f"GPU-0ee73c7c-ff49-1cbb-61c7-a88f2fc0f94{i}",
             "bus": f"00000000:{0x18 + i:02X}:00.0", "cc": [10, 3], "mem": [288045776896, 287416631296, 629145600],
             "links": [1] * 18, "link_version": 7, "fabric": {"state": state, "status": 0}} for i in range(2)]
    path = tmp_path / "machine.json"
    path.write_text(json.dumps({"driver": "580.159.04", "cuda": 13000, "devices": devs, "p2p": {"2": 0, "0": 0},
                                "topology": 30}))
    return path


def _doctor_with_fake_nvml(machine: Path) -> dict[str, str]:
    return doctor_env(PYTHONPATH=str(FAKE_DIR), FAKE_NVML_MACHINE=str(machine))


def test_check_waits_only_when_asked_then_judges_what_the_wait_saw(tmp_path: Path) -> None:
    """The real CLI, the real isolated NVML collector in child processes (answering from the fake NVML
    library): the fabric is in progress, then completes while ``check --wait-fabric`` waits."""
    machine = _fake_machine(tmp_path, state=2)
    env = _doctor_with_fake_nvml(machine)
    args = ["check", "--profile", "b300-tp8-ddtree", "--tp", "2", "--only", "gpu.fabric", "--skip", "gpu.fabric.*",
            "--format", "json"]
    now = run_doctor(*args, env=env)
    assert json.loads(now.stdout)["results"][0]["summary"].startswith("NVSwitch fabric not ready: in progress")
    assert "waiting for the NVSwitch fabric" not in now.stderr  # check does not wait unless asked

    proc = subprocess.Popen([sys.executable, "-m", "doctor", *args, "--wait-fabric", "20"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # printed after the first poll found the fabric in progress
    machine.write_text(machine.read_text().replace('"state": 2', '"state": 3'))  # the fabric manager finishes
    out, rest = proc.communicate(timeout=120)
    res = json.loads(out)["results"][0]
    assert first.startswith("k26-doctor: waiting for the NVSwitch fabric (") and "in progress on GPU0, GPU1" in first
    assert proc.returncode == 0 and res["status"] == "pass", (first, rest, res)
    assert res["summary"].startswith("NVSwitch fabric completed on all 2 GPU(s) (after waiting ")
    assert "NVSwitch fabric completed on 2 GPU(s) after" in rest
    assert res["details"]["fabric_wait"]["polls"] == 2 and res["details"]["fabric_wait"]["outcome"] == "ready"


def test_check_wait_runs_out_and_fails_with_the_state(tmp_path: Path) -> None:
    env = _doctor_with_fake_nvml(_fake_machine(tmp_path, state=2))
    start = time.monotonic()
    out = run_doctor("check", "--profile", "b300-tp8-ddtree", "--tp", "2", "--only", "gpu.fabric", "--skip",
                     "gpu.fabric.*", "--wait-fabric", "2", "--format", "json", env=env)
    took = time.monotonic() - start
    res = json.loads(out.stdout)["results"][0]
    assert out.returncode == 1 and res["status"] == "fail"
    # The last poll starts at the limit: the wait ends after it, within one collector deadline of the limit.
    assert re.match(r"NVSwitch fabric not ready after waiting \d+ s \(limit 2 s\): in progress on GPU0, GPU1",
                    res["summary"]), res["summary"]
    assert 2 <= res["details"]["fabric_wait"]["waited_s"] < 2 + 15
    assert "sudo systemctl start nvidia-fabricmanager" in res["remediation"]["commands"]
    assert re.search(r"NVSwitch fabric not ready after \d+ s \(limit 2 s\)", out.stderr) and took < 40


def test_launch_gate_waits_as_the_profile_says(tmp_path: Path) -> None:
    """``launch`` without --wait-fabric takes the profile's gpu.fabric_wait_s (here a config's 1 s): it waits,
    fails the gate with the state, and does not start the server."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('[gpu]\nfabric_wait_s = 1\n[doctor]\nprofile = "b300-tp8-ddtree"\n')
    env = _doctor_with_fake_nvml(_fake_machine(tmp_path, state=2))
    out = run_doctor("launch", "--config", str(cfg), "--tp", "2", "--only", "gpu.fabric", "--skip", "gpu.fabric.*",
                     "--no-flag-check", "--model-path", str(tmp_path), "--draft-model-path", str(tmp_path), env=env)
    assert out.returncode == 1
    assert re.search(r"NVSwitch fabric not ready after \d+ s \(limit 1 s\): in progress on GPU0, GPU1", out.stderr)
    assert "not launching: 1 check(s) failed: gpu.fabric." in out.stderr
    assert "exec:" not in out.stderr


def test_settings_fabric_wait() -> None:
    assert resolve({}, environ={}).wait_fabric is None  # check: no wait unless asked
    assert resolve({}, environ={}).fabric_wait_s == 600  # the B300 profile's
    assert resolve({"profile": "rtxpro6000-ep8"}, environ={}).fabric_wait_s == 0
    assert resolve({"wait_fabric": 45}, environ={}).wait_fabric == 45.0
    from doctor.core.settings import ConfigError

    with pytest.raises(ConfigError, match="must be a number of seconds between 0 and 604800"):
        resolve({"wait_fabric": -1}, environ={})


# -- the fabric software: readings -------------------------------------------------------------------

def test_parsers() -> None:
    dpkg = ("ii \tnvidia-fabricmanager-580\t580.126.09-1\nun \tnvidia-fabricmanager-570\t\n"
            "ii \tnvlsm\t2025.10.14-1\nii \tcuda-drivers-fabricmanager-580\t580.126.09-1\n")
    pkgs = fabric_software.parse_dpkg(dpkg)
    assert [(p["name"], p["upstream"]) for p in pkgs] == [("nvidia-fabricmanager-580", "580.126.09"),
                                                          ("nvlsm", "2025.10.14"),
                                                          ("cuda-drivers-fabricmanager-580", "580.126.09")]
    assert fabric_software.parse_rpm("nvidia-fabric-manager\t580.159.04\t1\n") == [
        {"name": "nvidia-fabric-manager", "version": "580.159.04-1", "upstream": "580.159.04"}]
    assert fabric_software.version_in("Fabric Manager version is : 580.159.04\n") == "580.159.04"
    assert fabric_software.upstream("1:580.159.04-0ubuntu0.24.04.1") == "580.159.04"
    shown = fabric_software.parse_systemctl_show(
        "Id=nvidia-fabricmanager.service\nLoadState=loaded\nActiveState=failed\nSubState=failed\n\n"
        "Id=nvlsm.service\nLoadState=not-found\nActiveState=inactive\n")
    assert shown["nvidia-fabricmanager.service"]["ActiveState"] == "failed"
    assert fabric_software.unit_active(shown["nvidia-fabricmanager.service"]) is False
    assert not fabric_software.unit_loaded(shown["nvlsm.service"])


def test_the_live_reader_answers_here() -> None:
    """On this machine: whatever is installed, an answer (JSON) in bounded time, nothing raised."""
    start = time.monotonic()
    out = collect_fabric_software(CollectOptions())
    json.dumps(out)
    assert time.monotonic() - start < 30
    assert set(out) >= {"package_manager", "fabric_manager", "nvlsm", "systemd", "proc"}
    assert out["proc"]["readable"] is True and isinstance(out["nvlsm"]["pids"], list)


def test_processes_are_found_by_comm(tmp_path: Path) -> None:
    for pid, comm in ((1, "systemd"), (2939, "nv-fabricmanage"), (2951, "nvlsm"), (3000, "bash")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "comm").write_text(comm + "\n")
    (tmp_path / "self").mkdir()
    out = fabric_software.processes(str(tmp_path), ("nv-fabricmanage", "nvlsm"))
    assert out["pids"] == {"nv-fabricmanage": [2939], "nvlsm": [2951]} and out["pid1"] == "systemd"


def test_a_hung_command_is_data(tmp_path: Path) -> None:
    """Every command the reader runs has a deadline: a fabric manager binary that never answers is recorded."""
    from doctor.core.proc import run

    fake = tmp_path / "nv-fabricmanager"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)

    def quick(argv: list[str], timeout: float, **kw: Any) -> Any:
        return run(argv, min(timeout, 1.0), **kw)

    old = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}{os.pathsep}{old}"
    try:
        start = time.monotonic()
        out = fabric_software.read_fabric_software(run=quick, proc_root=str(tmp_path / "none"))
    finally:
        os.environ["PATH"] = old
    assert time.monotonic() - start < 10
    fm = out["fabric_manager"]
    assert fm["binary"] == str(fake) and fm["binary_version"] is None and "did not finish" in fm["binary_error"]
    assert out["proc"]["readable"] is False


# -- gpu.fabric.manager / gpu.fabric.nvlsm on the synthetic snapshots ----------------------------------

def test_version_mismatch_names_the_package_and_the_exact_command() -> None:
    res = fabric_results(snap("b300x8-fabric-manager-mismatch.json"))
    fm = res["gpu.fabric.manager"]
    assert fm.status is Status.FAIL
    assert "differs from the driver 580.159.04" in fm.summary and "binary is 580.126.09" in fm.summary
    assert "package nvidia-fabricmanager-580 is 580.126.09" in fm.summary
    assert fm.remediation.commands[0] == APT_ALIGN
    assert "sudo systemctl restart nvidia-fabricmanager.service" in fm.remediation.commands
    nvlsm = res["gpu.fabric.nvlsm"]
    assert nvlsm.status is Status.FAIL and "installed but not running" in nvlsm.summary
    assert "nvidia-fabricmanager.service (which starts it) is failed" in nvlsm.summary
    assert nvlsm.remediation.commands == ["sudo systemctl enable --now nvidia-fabricmanager.service"]
    assert nvlsm.remediation.text.startswith("First align the fabric manager with the driver (see gpu.fabric.manager)")


def test_no_fixer_starts_a_fabric_manager_of_another_version() -> None:
    """It would refuse to start: the plans say why and change nothing; the check names the package command."""
    doc = snap("b300x8-fabric-manager-mismatch.json")
    for plan in (fix_plan("gpu.fabric", ctx_for(doc)), fix_plan("gpu.fabric.nvlsm", ctx_for(doc))):
        assert list(plan) == [] and "580.126.09" in plan.notes[0] and "gpu.fabric.manager" in plan.notes[0]
    started = fix_plan("gpu.fabric", ctx_for(snap("b300x8-fabric-not-started.json")))  # same version: start it
    assert [a.argv for a in started] == [["systemctl", "start", "nvidia-fabricmanager"]]


def test_missing_nvlsm_on_b300_fails_and_says_install_it() -> None:
    res = fabric_results(snap("b300x8-fabric-in-progress.json"))
    assert res["gpu.fabric.manager"].status is Status.PASS
    nvlsm = res["gpu.fabric.nvlsm"]
    assert nvlsm.status is Status.FAIL and "NVLSM is not installed" in nvlsm.summary
    assert nvlsm.remediation.commands[0] == "sudo apt-get install nvlsm infiniband-diags"
    assert nvlsm.remediation.commands[-1] == "sudo systemctl restart nvidia-fabricmanager.service"


def test_healthy_b300_and_rpm_commands() -> None:
    doc = snap("b300x8-healthy.json")
    res = fabric_results(doc)
    assert res["gpu.fabric.manager"].summary.startswith("fabric manager 580.159.04, the driver's version")
    assert res["gpu.fabric.nvlsm"].summary == "NVLSM 2025.10.14-1 running (PID 2951)"
    sw = doc["facts"]["fabric_software"]
    sw["package_manager"] = "rpm"
    sw["fabric_manager"]["packages"] = [{"name": "nvidia-fabricmanager", "version": "580.126.09-1",
                                         "upstream": "580.126.09"}]
    fm = fabric_results(doc)["gpu.fabric.manager"]
    assert fm.status is Status.FAIL and fm.remediation.commands[0] == "sudo dnf install nvidia-fabricmanager-580.159.04"


def test_not_installed_fabric_manager() -> None:
    doc = snap("b300x8-fabric-not-started.json")
    doc["facts"]["fabric_software"] = json.loads(json.dumps(snap("b300x8-healthy.json")["facts"]["fabric_software"]))
    sw = doc["facts"]["fabric_software"]
    sw["fabric_manager"].update(binary=None, binary_version=None, packages=[], pids=[])
    fm = fabric_results(doc)["gpu.fabric.manager"]
    assert fm.status is Status.FAIL and "not installed" in fm.summary
    assert fm.remediation.commands[0] == APT_ALIGN


def test_nvlsm_only_on_nvlink5_and_nvswitch_profiles() -> None:
    doc = snap("h200x8.json")
    res = fabric_results(doc, profile="h200-tp8")
    assert res["gpu.fabric.nvlsm"].status is Status.SKIP and "NVLink 4" in res["gpu.fabric.nvlsm"].summary
    assert res["gpu.fabric.manager"].status is Status.PASS
    pcie = fabric_results(snap("rtxpro6000x8-pcie.json"), profile="rtxpro6000-ep8")
    assert "expects no NVSwitch" in pcie["gpu.fabric.manager"].summary


def test_running_nvlsm_unit_of_its_own_is_running() -> None:
    doc = snap("b300x8-fabric-in-progress.json")
    nv = doc["facts"]["fabric_software"]["nvlsm"]
    nv.update(packages=[{"name": "nvlsm", "version": "2025.10.14-1", "upstream": "2025.10.14"}], pids=[])
    nv["units"]["nvidia-nvlsm.service"].update(LoadState="loaded", ActiveState="active", SubState="running")
    assert fabric_results(doc)["gpu.fabric.nvlsm"].summary == "NVLSM 2025.10.14-1 running (nvidia-nvlsm.service active)"


# -- the NVLSM fixer -------------------------------------------------------------------------------

def ctx_for(doc: dict[str, Any]) -> Context:
    return make_context({"profile": "b300-tp8-ddtree"}, facts=doc["facts"])


def test_nvlsm_plan_loads_ib_umad_and_starts_its_unit() -> None:
    doc = snap("b300x8-healthy.json")
    nv = doc["facts"]["fabric_software"]["nvlsm"]
    nv.update(ib_umad_loaded=False, pids=[])
    nv["units"]["nvlsm.service"].update(LoadState="loaded", ActiveState="inactive")
    plan = fix_plan("gpu.fabric.nvlsm", ctx_for(doc))
    kinds = [(type(a).__name__, getattr(a, "argv", None) or getattr(a, "path", None)) for a in plan]
    assert kinds == [("RunCommand", ["modprobe", "ib_umad"]), ("WriteFile", "/etc/modules-load.d/ib_umad.conf"),
                     ("RunCommand", ["systemctl", "enable", "--now", "nvlsm.service"])]
    assert all(a.needs_root for a in plan) and isinstance(plan[1], WriteFile) and plan[1].new_text == "ib_umad\n"


def test_nvlsm_plan_restarts_a_running_fabric_manager_and_leaves_packages_to_the_operator() -> None:
    doc = snap("b300x8-healthy.json")
    doc["facts"]["fabric_software"]["nvlsm"]["pids"] = []
    plan = fix_plan("gpu.fabric.nvlsm", ctx_for(doc))
    assert [a.argv for a in plan if isinstance(a, RunCommand)] == [["systemctl", "restart",
                                                                     "nvidia-fabricmanager.service"]]
    missing = fix_plan("gpu.fabric.nvlsm", ctx_for(snap("b300x8-fabric-in-progress.json")))
    assert list(missing) == [] and "install it by hand (sudo apt-get install nvlsm" in missing.notes[0]
    assert list(fix_plan("gpu.fabric.nvlsm", ctx_for(snap("b300x8-healthy.json")))) == []  # running: nothing to do


def test_registered() -> None:
    reg = load(plugins=False)
    assert {"fabric_wait", "fabric_software", "pcie"} <= set(reg.collectors)
    assert reg.fixers["gpu.fabric.nvlsm"].needs_root


# -- hostile facts never crash the new checks ---------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 2**20) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                    max_leaves=12)
SW_KEYS = ["package_manager", "packages_error", "fabric_manager", "nvlsm", "systemd", "proc"]
FM_KEYS = ["binary", "binary_version", "binary_error", "packages", "unit", "pids"]
NV_KEYS = ["packages", "binary", "units", "pids", "ib_umad_loaded"]
BASE_MISMATCH = snap("b300x8-fabric-manager-mismatch.json")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(top=st.fixed_dictionaries({}, optional={k: JSON for k in SW_KEYS}),
       fm=st.fixed_dictionaries({}, optional={k: JSON for k in FM_KEYS}),
       nv=st.fixed_dictionaries({}, optional={k: JSON for k in NV_KEYS}), wait=JSON)
@example(top={}, fm={"pids": []}, nv={"units": {"nvlsm.service": 3}}, wait={"waited_s": None})
def test_hostile_fabric_facts_never_crash(top: dict[str, Any], fm: dict[str, Any], nv: dict[str, Any],
                                          wait: Any) -> None:
    doc = copy.deepcopy(BASE_MISMATCH)
    sw = doc["facts"]["fabric_software"]
    sw["fabric_manager"].update(fm)
    sw["nvlsm"].update(nv)
    sw.update(top)
    doc["facts"]["fabric_wait"] = {"asked": True, **wait} if isinstance(wait, dict) else wait
    for res in fabric_results(doc).values():
        assert res.traceback is None, (res.summary, res.traceback)
        assert res.status is not Status.ERROR or "crashed" not in res.summary
