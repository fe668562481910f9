"""``k26-doctor validate``'s sequence against real child processes: the launcher's argv run as
``python -m sglang.launch_server`` (the fake SGLang of tests/fake_sglang, for the sequencing only), started,
waited healthy, measured, stopped; state kept per server and resumed; the time budget; killed and never-healthy
servers; a configuration change discarding the state; no server outliving the run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import validate_support as vs

from doctor.service.validation.run import Options, Stopped, Validation, judge_state, run_key
from doctor.service.validation.servers import OPT_IN, Role, role_plan
from doctor.sglang.validation import prompts


@pytest.fixture(autouse=True)
def _fake_on_path(monkeypatch):
    """The fake ``sglang`` first on the servers' path (a PYTHONPATH the environment has wins over the profile's)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(vs.FAKE), os.environ.get("PYTHONPATH")) if p))


IDS = {"greedy": [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]], "sampled": [[3, 4, 5]]}


def small(budgets=(16,), **kw) -> Options:
    base = dict(budgets=list(budgets), concurrency=4, port_base=vs.free_port_base(), start_timeout_s=20,
                request_timeout_s=30, max_new_tokens=16, greedy={"c1": 3, "c8": 8}, speed_requests=2,
                samples=120, sampled_tokens=4)  # enough to run the sampled phases; the tests that judge them: 300
    base.update(kw)
    return Options(**base)


def prompt_set(tmp: Path) -> dict:
    path = tmp / "ids.json"
    path.write_text(json.dumps(IDS))
    return prompts.load(str(path))


def validation(tmp: Path, opts: Options, faults: str = "", lines: list | None = None, **kw) -> Validation:
    settings = vs.settings(tmp, faults=faults)
    ps = prompt_set(tmp)
    key = run_key(settings, opts, ps, {b: {"ddtree_budget": b} for b in opts.budgets})
    return Validation(settings, opts, ps, key, (lines if lines is not None else []).append, **kw)


def pids_alive(v: Validation) -> list[int]:
    out = []
    for rec in v.log_dir.glob("*.log"):
        for line in rec.read_text().splitlines():
            if line.startswith("fake sglang") and " pid " in line:
                pid = int(line.split(" pid ")[1].split()[0])
                try:
                    os.kill(pid, 0)
                    out.append(pid)
                except ProcessLookupError:
                    pass
    return out


def test_the_servers_are_launchs_own_command_with_the_opt_in_on_ddtree_alone(tmp_path):
    from doctor.service.launcher import build_plan

    settings = vs.settings(tmp_path)
    launch = build_plan(settings)
    ddtree = role_plan(settings, Role("ddtree-16", "DDTREE", 16), 30000)
    assert ddtree.argv == launch.argv  # the profile's own server, exactly
    assert ddtree.env[OPT_IN] == "1" and OPT_IN not in launch.env
    base = role_plan(settings, Role("base", None), 30001)
    assert "--speculative-algorithm" not in base.argv and OPT_IN not in base.env
    assert base.argv[base.argv.index("--port") + 1] == "30001"
    dflash = role_plan(settings, Role("dflash", "DFLASH"), 30002)
    assert dflash.argv[dflash.argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert "--speculative-ddtree-budget" not in dflash.argv and OPT_IN not in dflash.env


def test_a_lossless_run_passes_and_leaves_no_server(tmp_path):
    lines: list[str] = []
    v = validation(tmp_path, small(budgets=(16, 64), samples=300), lines=lines)
    v.measure()
    result = v.judge()
    assert set(v.state["roles"]) == {"base", "dflash", "ddtree-16", "ddtree-64"}
    for b in ("16", "64"):
        got = result["budgets"][b]
        assert got["greedy"]["outcome"] == "pass", got
        assert got["refusals"]["outcome"] == "pass", got
        assert got["sampled"]["outcome"] == "pass", got  # the control (base at T 1.0) rejected at n 300
    assert result["outcome"] in ("pass", "lossless-not-faster")
    assert not pids_alive(v)
    assert any("base: stopped" in line for line in lines)


def test_killed_after_the_base_phase_resumes_without_repeating_it(tmp_path):
    """A server that failed (DFLASH crashing at start) is kept as failed, not as measured: the same command again
    starts it alone -- the base and DDTREE, measured, are not started again."""
    opts = small()
    v = validation(tmp_path, opts, faults="dflash:crash-at-start")
    v.measure()
    roles = v.state["roles"]
    assert roles["dflash"]["problems"] and not roles["dflash"]["done"] and roles["base"]["done"]
    assert v.judge()["budgets"]["16"]["outcome"] == "fail"  # judged on what failed
    lines: list[str] = []
    again = validation(tmp_path, opts, lines=lines)
    again.measure()
    started = [line.split(":")[0] for line in lines if ": started (pid" in line]
    assert started == ["dflash"] and any(line.startswith("resuming") for line in lines)
    assert again.state["roles"]["base"] == roles["base"]
    assert again.judge()["budgets"]["16"]["greedy"]["outcome"] == "pass"


def test_a_changed_configuration_discards_the_state(tmp_path):
    v = validation(tmp_path, small())
    v.measure()
    changed = validation(tmp_path, small(max_new_tokens=12))
    assert changed.key != v.key
    changed.load_state()
    assert {r.name for r in changed.pending()} == {"base", "dflash", "ddtree-16"}


def test_a_server_that_never_becomes_healthy_fails_and_is_stopped(tmp_path):
    v = validation(tmp_path, small(start_timeout_s=3), faults="ddtree-16:never-healthy")
    v.measure()
    result = v.judge()
    assert result["budgets"]["16"]["outcome"] == "fail"
    assert "never became healthy" in " ".join(result["budgets"]["16"]["why"])
    assert not pids_alive(v)


def test_a_server_killed_during_the_measurements_fails(tmp_path):
    v = validation(tmp_path, small(), faults="ddtree-16:exit-after-5")
    v.measure()
    result = v.judge()
    assert result["budgets"]["16"]["outcome"] == "fail", result["budgets"]["16"]
    assert not pids_alive(v)


def test_the_time_budget_stops_cleanly(tmp_path):
    v = validation(tmp_path, small(time_budget_s=0.5, start_timeout_s=5), faults="base:never-healthy")
    with pytest.raises(Stopped):
        v.measure()
    assert not pids_alive(v)
    assert judge_state(v.state, v.opts)["outcome"] == "undecided"


def test_parallel_servers_side_by_side(tmp_path):
    v = validation(tmp_path, small(parallel=True))
    v.measure()
    assert v.judge()["budgets"]["16"]["greedy"]["outcome"] == "pass"
    assert not pids_alive(v)


def test_a_diverging_ddtree_fails_greedy(tmp_path):
    v = validation(tmp_path, small(), faults="ddtree-16:diverge")
    v.measure()
    got = v.judge()["budgets"]["16"]
    assert got["outcome"] == "fail" and got["greedy"]["outcome"] == "fail"
    assert got["greedy"]["not_near_ties"] > 0


def test_ddtree_serving_what_it_cannot_serve_exactly_fails(tmp_path):
    v = validation(tmp_path, small(), faults="ddtree-16:serves-refusals")
    v.measure()
    got = v.judge()["budgets"]["16"]
    assert got["refusals"]["outcome"] == "fail" and got["outcome"] == "fail"


def test_a_biased_sampler_fails_the_sampled_test(tmp_path):
    v = validation(tmp_path, small(samples=300), faults="ddtree-16:biased")
    v.measure()
    got = v.judge()["budgets"]["16"]
    assert got["sampled"]["outcome"] == "fail", got["sampled"]


def test_ctrl_c_stops_every_server(tmp_path):
    """A KeyboardInterrupt in the middle of a server's measurements (here: raised by the progress line of its
    first phase) leaves no server behind, and the servers measured before it stay in the state."""
    def progress(line: str) -> None:
        if line.startswith("dflash: warm-up"):
            raise KeyboardInterrupt

    opts = small()
    settings = vs.settings(tmp_path)
    ps = prompt_set(tmp_path)
    v = Validation(settings, opts, ps, run_key(settings, opts, ps, {}), progress)
    with pytest.raises(KeyboardInterrupt):
        v.measure()
    assert not pids_alive(v) and not v.live
    assert list(v.state["roles"]) == ["base"]


def test_stopping_a_server_ends_its_whole_process_group(tmp_path):
    """A child the server started in its group (as SGLang's scheduler processes are), still running after its
    leader left on SIGTERM, is killed too."""
    import subprocess
    import sys
    import time

    from doctor.service.validation.servers import Server

    pidfile = tmp_path / "child.pid"
    child_code = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  f"open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(600)")
    script = (f"import subprocess, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
              f"subprocess.Popen([sys.executable, '-c', {child_code!r}]); time.sleep(600)")
    settings = vs.settings(tmp_path)
    server = Server(Role("base", None), role_plan(settings, Role("base", None), 1), 1, "127.0.0.1",
                    tmp_path / "s.log")
    server.plan.argv = [sys.executable, "-c", script]
    server.start()
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert server.stop(grace_s=10) == 0
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        try:  # reaped by init; a zombie still answers kill 0
            if open(f"/proc/{child}/stat").read().split(")")[1].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.05)
    else:
        subprocess.run(["kill", "-9", str(child)], check=False)
        raise AssertionError("the server's child outlived its stop")
