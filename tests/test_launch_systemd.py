"""The generated unit: verified by systemd itself (``systemd-analyze verify``) when installed here,
and always parsed: ExecStartPre checks with the same config, ExecStart launches without checking
twice, restart policy, start timeout, environment file. Its command lines are run for real."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import doctor_env, run_doctor
from systemd_units import command, parse_unit

from doctor.core.settings import resolve
from doctor.service.systemd import (
    CHECKS_S,
    GRAPH_CAPTURE_S,
    MIN_READ_BYTES_PER_S,
    WEIGHTS_BYTES_DEFAULT,
    render_unit,
    start_timeout,
)

ANALYZE = shutil.which("systemd-analyze")


def verify(path: Path) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60)


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "etc" / "config.toml"
    path.parent.mkdir()
    path.write_text('[doctor]\nprofile = "b300-tp8-ddtree"\n[model]\npath = "/models/Kimi K2.6 %q"\n'
                    '[drafter]\npath = "/models/dflash"\n')
    return path


def unit_for(cfg: Path, tmp_path: Path, *extra: str) -> tuple[str, Path]:
    res = run_doctor("systemd-unit", "--config", str(cfg), "--doctor", f"{sys.executable} -m doctor", *extra)
    assert res.returncode == 0, res.stderr
    path = tmp_path / "sglang-k26-ddtree.service"
    path.write_text(res.stdout)
    return res.stdout, path


def test_unit_shape(cfg: Path, tmp_path: Path) -> None:
    text, _ = unit_for(cfg, tmp_path)
    unit = parse_unit(text)
    svc = unit["Service"]
    pre, start = command(svc["ExecStartPre"][0]), command(svc["ExecStart"][0])
    assert pre[:4] == [sys.executable, "-m", "doctor", "check"] and "--deep" not in pre
    assert pre[pre.index("--wait-fabric") + 1] == "600" and "--wait-fabric" not in start  # [gpu] fabric_wait_s
    assert start[3] == "launch" and "--no-check" in start and "--wait" in start
    for argv in (pre, start):  # the same config and profile on both sides
        assert argv[argv.index("--config") + 1] == str(cfg)
        assert argv[argv.index("--profile") + 1] == "b300-tp8-ddtree"
    assert svc["Type"] == ["notify"] and svc["NotifyAccess"] == ["main"]
    assert svc["Restart"] == ["on-failure"]
    assert svc["RestartPreventExitStatus"] == ["2 3"]
    assert svc["EnvironmentFile"] == ["-/etc/k26-doctor/sglang-k26.env"]
    assert f"K26_DOCTOR_CONFIG={cfg}" in svc["Environment"]
    timeout = int(svc["TimeoutStartSec"][0])
    assert timeout >= CHECKS_S + 595 + GRAPH_CAPTURE_S and timeout % 60 == 0
    assert int(start[start.index("--wait-timeout") + 1]) < timeout
    assert unit["Unit"]["StartLimitBurst"] == ["3"]
    assert "diagnose" in command(svc["ExecStopPost"][0]) and "%n" in svc["ExecStopPost"][0]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed (apt-get install systemd)")
def test_systemd_accepts_the_unit_and_would_reject_a_broken_one(cfg: Path, tmp_path: Path) -> None:
    text, path = unit_for(cfg, tmp_path)
    res = verify(path)
    assert res.returncode == 0, res.stderr
    about_us = [ln for ln in res.stderr.splitlines() if path.name in ln]
    assert about_us == [], about_us
    broken = tmp_path / "broken.service"
    assert f"ExecStart={sys.executable} " in text
    broken.write_text(text.replace(f"ExecStart={sys.executable}", "ExecStart=relative/python"))
    assert verify(broken).returncode != 0


def test_the_unit_command_lines_are_ones_the_doctor_accepts(cfg: Path, tmp_path: Path) -> None:
    text, _ = unit_for(cfg, tmp_path)
    svc = parse_unit(text)["Service"]
    env = doctor_env()
    pre = [*command(svc["ExecStartPre"][0]), "--only", "host.port"]
    res = subprocess.run(pre, capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode in (0, 1), res.stderr  # a verdict, not a usage error
    assert "host.port" in res.stdout
    start = [*command(svc["ExecStart"][0]), "--dry-run", "--no-flag-check"]
    res = subprocess.run(start, capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    argv = res.stdout.splitlines()
    assert argv[argv.index("--model-path") + 1] == "/models/Kimi K2.6 %q"  # quoting survived systemd escaping


def test_start_timeout_grows_with_the_weights(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for i in range(3):  # sparse: 3 x 700 GB of apparent size, nothing written
        with open(model / f"model-0000{i + 1}-of-000003.safetensors", "wb") as fh:
            fh.truncate(700 * 10**9)
    settings = resolve({"model_path": str(model), "draft_model_path": str(tmp_path / "none")}, environ={})
    seconds, why = start_timeout(settings)
    assert seconds >= CHECKS_S + 2100 + GRAPH_CAPTURE_S and "measured from the shards" in why
    small = resolve({"model_path": str(tmp_path / "absent"), "profile": "rtxpro6000-ep8"}, environ={})
    assert start_timeout(small)[0] == 1800  # the profile's floor; nominal K2.6 sizing (no fabric wait) is below it
    assert start_timeout(small, 600)[0] == 600
    # An NVSwitch profile waits up to [gpu] fabric_wait_s for the fabric in ExecStartPre: the start timeout covers it.
    hgx = resolve({"model_path": str(tmp_path / "absent")}, environ={})
    seconds, why = start_timeout(hgx)
    assert hgx.fabric_wait_s == 600 and "fabric wait 600s" in why
    assert seconds == math.ceil((CHECKS_S + 600 + WEIGHTS_BYTES_DEFAULT / MIN_READ_BYTES_PER_S + GRAPH_CAPTURE_S)
                                / 60) * 60


def test_render_without_config_carries_the_paths(tmp_path: Path) -> None:
    settings = resolve({"model_path": "/m", "draft_model_path": "/d", "python": "/opt/venv/bin/python", "tp": 4},
                       environ={})
    unit = parse_unit(render_unit(settings, config=None, doctor=["/usr/local/bin/k26-doctor"], user="sglang"))
    start = command(unit["Service"]["ExecStart"][0])
    for flag, value in (("--model-path", "/m"), ("--draft-model-path", "/d"), ("--python", "/opt/venv/bin/python"),
                        ("--tp", "4")):
        assert start[start.index(flag) + 1] == value
    assert unit["Service"]["User"] == ["sglang"]
    assert "Environment" not in unit["Service"] or all("K26_DOCTOR_CONFIG" not in e
                                                       for e in unit["Service"]["Environment"])


def test_the_service_finds_what_its_venv_installed_and_keeps_its_caches(tmp_path: Path) -> None:
    """FlashInfer's JIT runs `ninja` from PATH, which pip put beside the interpreter (flashinfer-python requires
    it); systemd's default PATH lacks the venv. The venv's bin (as given, not where its python links to) comes
    first; SGLang's cache (where it points FlashInfer's and Triton's) is the unit's cache directory."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    settings = resolve({"model_path": "/m", "python": str(venv / "bin" / "python")}, environ={})
    env = parse_unit(render_unit(settings, config=None, doctor=["/usr/local/bin/k26-doctor"]))["Service"]["Environment"]
    paths = [e for e in env if e.startswith("PATH=")]
    assert paths == [f"PATH={venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    assert "SGLANG_CACHE_DIR=%C/sglang-k26/sglang" in env
    bare = resolve({"model_path": "/m", "python": "python3"}, environ={})  # found on PATH: left as it is
    env = parse_unit(render_unit(bare, config=None, doctor=["/usr/local/bin/k26-doctor"]))["Service"]["Environment"]
    assert not [e for e in env if e.startswith("PATH=")]


def test_cli_output_file_and_bad_config(tmp_path: Path, cfg: Path) -> None:
    out = tmp_path / "unit.service"
    res = run_doctor("systemd-unit", "--config", str(cfg), "--output", str(out))
    assert res.returncode == 0 and out.read_text().startswith("# sglang-k26-ddtree.service")
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = 'http'\n")
    res = run_doctor("systemd-unit", "--config", str(bad))
    assert res.returncode == 2 and "[server] port = 'http'" in res.stderr
    assert os.path.exists(out)
