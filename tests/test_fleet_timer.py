"""Periodic checks on a node: ``systemd-unit --timer`` (a oneshot service that runs the checks, not the server,
and refreshes node_exporter's textfile, and its timer), verified by ``systemd-analyze verify`` and run for real;
``--while-serving``, which leaves out the checks that judge a host before a start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import doctor_env, run_doctor
from systemd_units import command, parse_unit

from doctor.core.datafile import read_toml
from doctor.service.fleet import DATA_FILE, serving_skips

ANALYZE = shutil.which("systemd-analyze")
PROMTOOL = shutil.which("promtool")


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "etc" / "config.toml"
    path.parent.mkdir()
    path.write_text('[doctor]\nprofile = "b300-tp8-ddtree"\n[model]\npath = "/models/Kimi K2.6"\n'
                    '[server]\nhost = "127.0.0.1"\n')
    return path


def units(tmp_path: Path, cfg: Path, *extra: str) -> tuple[dict, dict, Path]:
    out = tmp_path / "units" / "k26-doctor-check.service"
    out.parent.mkdir(exist_ok=True)
    textfile = tmp_path / "textfile" / "k26-doctor.prom"
    textfile.parent.mkdir(exist_ok=True)
    res = run_doctor("systemd-unit", "--timer", "--config", str(cfg), "--doctor", f"{sys.executable} -m doctor",
                     "--textfile", str(textfile), "--output", str(out), *extra)
    assert res.returncode == 0, res.stderr
    assert "systemctl enable --now k26-doctor-check.timer" in res.stderr
    timer = out.with_suffix(".timer")
    assert sorted(p.name for p in out.parent.iterdir()) == ["k26-doctor-check.service", "k26-doctor-check.timer"]
    return parse_unit(out.read_text()), parse_unit(timer.read_text()), out


def test_the_oneshot_runs_the_checks_into_the_textfile_and_the_timer_starts_it(tmp_path: Path, cfg: Path) -> None:
    service, timer, _ = units(tmp_path, cfg)
    svc = service["Service"]
    assert svc["Type"] == ["oneshot"]
    argv = command(svc["ExecStart"][0])
    assert argv[:4] == [sys.executable, "-m", "doctor", "check"] and "launch" not in argv
    assert argv[argv.index("--config") + 1] == str(cfg)
    assert argv[argv.index("--format") + 1] == "openmetrics"
    textfile = tmp_path / "textfile" / "k26-doctor.prom"
    assert argv[argv.index("--output") + 1] == str(textfile)
    assert "--while-serving" in argv  # beside the running server
    assert svc["SuccessExitStatus"] == ["1"]  # a failing check is a verdict, not a failed unit
    assert svc["ReadWritePaths"] == [f"-{textfile.parent}"] and svc["ProtectSystem"] == ["strict"]
    assert int(svc["TimeoutStartSec"][0]) == read_toml(DATA_FILE)["timer"]["run_timeout_s"]
    assert "User" not in svc  # root, as Debian's textfile collectors (the directory is root's)
    assert "ExecStartPre" not in svc and "Restart" not in svc
    t = timer["Timer"]
    assert t["Unit"] == ["k26-doctor-check.service"]
    assert t["OnUnitActiveSec"] == ["300"] and t["OnBootSec"] == ["600"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]


def test_the_flags_of_the_timer(tmp_path: Path, cfg: Path) -> None:
    service, timer, _ = units(tmp_path, cfg, "--idle-node", "--interval", "120", "--user", "k26mon",
                              "--skip", "host.exposure")
    argv = command(service["Service"]["ExecStart"][0])
    assert "--while-serving" not in argv  # a node without a server: every check
    assert argv[argv.index("--skip") + 1] == "host.exposure"
    assert service["Service"]["User"] == ["k26mon"]
    assert timer["Timer"]["OnUnitActiveSec"] == ["120"]
    printed = run_doctor("systemd-unit", "--timer", "--config", str(cfg))
    assert printed.returncode == 0 and "# ---- k26-doctor-check.timer ----" in printed.stdout
    for bad in (["--output", str(tmp_path / "units.txt")], ["--textfile", str(tmp_path / "k26.txt")],
                ["--", "--log-level", "debug"]):
        res = run_doctor("systemd-unit", "--timer", "--config", str(cfg), *bad)
        assert res.returncode == 2, (bad, res.stderr)
        assert "Traceback" not in res.stderr


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed (apt-get install systemd)")
def test_systemd_accepts_both_units_and_would_reject_a_broken_one(tmp_path: Path, cfg: Path) -> None:
    _, _, service = units(tmp_path, cfg)
    timer = service.with_suffix(".timer")
    assert ANALYZE is not None
    res = subprocess.run([ANALYZE, "verify", str(service), str(timer)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert [ln for ln in res.stderr.splitlines() if "k26-doctor-check" in ln] == []
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / service.name).write_text(service.read_text().replace(f"ExecStart={sys.executable}",
                                                                   "ExecStart=relative/python"))
    (broken / timer.name).write_text("\n".join(ln for ln in timer.read_text().splitlines()
                                               if not ln.startswith("On")))  # a timer that never elapses
    for unit, why in ((broken / service.name, "absolute path"), (broken / timer.name, "lacks value setting")):
        bad = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and why in bad.stderr, (unit, bad.stderr)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_the_oneshot_command_runs_and_refreshes_the_textfile(tmp_path: Path, cfg: Path) -> None:
    service, _, _ = units(tmp_path, cfg)
    argv = [*command(service["Service"]["ExecStart"][0]), "--only", "host.*"]
    res = subprocess.run(argv, capture_output=True, text=True, env=doctor_env(), timeout=120)
    assert res.returncode in (0, 1), res.stderr  # a verdict
    assert "--while-serving: left out" in res.stdout and "host.port" in res.stdout
    text = (tmp_path / "textfile" / "k26-doctor.prom").read_text()
    assert 'check="host.disk"' in text and 'check="host.port"' not in text
    assert subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=30).returncode == 0


# -- --while-serving ------------------------------------------------------------------------------------------
def test_while_serving_leaves_out_the_pre_start_checks_and_says_so(tmp_path: Path) -> None:
    res = run_doctor("check", "--while-serving", "--only", "host.*", "--format", "json")
    assert res.returncode in (0, 1), res.stderr
    import json

    report = json.loads(res.stdout)
    ids = [r["id"] for r in report["results"]]
    assert "host.port" not in ids and "host.disk" in ids
    note = next(n for n in report["doctor"]["notes"] if n.startswith("--while-serving"))
    assert "host.port (the running server listens on the port)" in note
    assert "gpu.idle" in note  # registered, so left out even though --only did not select it
    # the same from the config file
    cfg = tmp_path / "c.toml"
    cfg.write_text("[doctor]\nwhile_serving = true\n")
    res = run_doctor("check", "--config", str(cfg), "--only", "host.*", "--format", "json")
    assert "host.port" not in [r["id"] for r in json.loads(res.stdout)["results"]]
    # a selection that only names pre-start checks runs nothing: an invalid invocation, not a pass
    res = run_doctor("check", "--while-serving", "--only", "host.port")
    assert res.returncode == 2 and "runs no check" in res.stderr


def test_the_skip_lists_come_from_the_checks_declarations_and_every_one_has_its_reason() -> None:
    from doctor.core.registry import Check, load
    from doctor.core.result import Result

    checks = load(collectors=False).checks.values()
    serving = serving_skips(checks, "serving")
    pod = serving_skips(checks, "node-pod")
    assert serving == ["gpu.idle", "gpu.memory", "host.port", "model.fit"]  # judged before a start only
    # ... and what a pod of its own sees
    assert pod == sorted([*serving, "host.env", "host.exposure", "host.jit_cache", "host.shm"])
    assert serving_skips(checks, "start") == []
    data = read_toml(DATA_FILE)
    # every check left out somewhere has its reason in the data file, and the data file names no other check
    assert set(data["serving"]["why"]) == set(serving)
    assert set(data["kubernetes"]["daemonset"]["why"]) == set(pod) - set(serving)
    mine = Check("x.one", "One", run=lambda ctx: Result.passed(""), applies=("start",))
    assert serving_skips([mine], "serving") == ["x.one"] and serving_skips([], "node-pod") == []


def test_the_unit_user_can_be_given_and_the_doctor_path_is_absolute(tmp_path: Path, cfg: Path) -> None:
    rel = os.path.relpath(sys.executable, tmp_path)
    res = subprocess.run([sys.executable, "-m", "doctor", "systemd-unit", "--timer", "--config", str(cfg),
                          "--doctor", f"{rel} -m doctor"], capture_output=True, text=True, cwd=tmp_path,
                         env=doctor_env(), timeout=120)
    assert res.returncode == 0, res.stderr
    exec_start = next(ln for ln in res.stdout.splitlines() if ln.startswith("ExecStart="))
    assert command(exec_start.split("=", 1)[1])[0] == os.path.abspath(os.path.join(tmp_path, rel))
