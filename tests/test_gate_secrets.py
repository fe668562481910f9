"""Secrets and exposure (issue 13): credentials in URLs and query strings never recorded or printed, the
API key kept out of logs, host.exposure, and a hardened systemd unit measured by systemd itself."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import doctor_env, run_doctor
from systemd_units import parse_unit

from doctor.facts.redaction import redact, redact_argv, redact_text
from doctor.host.exposure import bind_scope, exposure

ANALYZE = shutil.which("systemd-analyze")
PROXY = "http://alice:pa55word@proxy:3128"


@pytest.mark.parametrize("text, want", [
    (PROXY, "http://<redacted>@proxy:3128"),
    ("socks5h://bob:p%40ss@10.0.0.1:1080", "socks5h://<redacted>@10.0.0.1:1080"),
    ("https://hub/x?token=abc123&rev=main", "https://hub/x?token=<redacted>&rev=main"),
    ("https://s3/o?X-Amz-Credential=AKIA/x&X-Amz-Signature=deadbeef", "https://s3/o?X-Amz-Credential=<redacted>"
     "&X-Amz-Signature=<redacted>"),
    ("https://blob/c?sv=2020&sig=Zm9v%3D", "https://blob/c?sv=2020&sig=<redacted>"),
    ("--api-key s3cret --port 1", "--api-key <redacted> --port 1"),
    ("--api-key=s3cret", "--api-key=<redacted>"),
    ("HF token hf_abcdefghijklmnopqrstuvwxyz1234", "HF token <redacted>"),
])
def test_redact_text(text: str, want: str) -> None:
    assert redact_text(text) == want


@pytest.mark.parametrize("text", ["http://proxy:3128", "git@github.com:org/repo.git", "mail alice@example.com",
                                  "https://hub/x?revision=main&keyword=a", "--tp-size 8"])
def test_redact_text_leaves_what_is_not_secret(text: str) -> None:
    assert redact_text(text) == text


def test_redact_values_everywhere() -> None:
    data = {"vars": {"HTTPS_PROXY": PROXY, "PIP_INDEX_URL": "https://u:tok@pypi.example/simple"},
            "mask_token_id": 163838, "argv": ["--api-key", "k"]}
    out = json.dumps(redact(data))
    assert "pa55word" not in out and "u:tok" not in out and "163838" in out
    assert redact_argv(["python", "--api-key", "k", "--admin-api-key=a", "--host", "0.0.0.0"]) == [
        "python", "--api-key", "<redacted>", "--admin-api-key=<redacted>", "--host", "0.0.0.0"]


def test_snapshot_and_reports_never_record_url_credentials(tmp_path: Path) -> None:
    env = doctor_env(HTTPS_PROXY=PROXY, K26_TEST_URL="https://mirror.example/m?token=t0k3nvalue&x=1")
    snap = tmp_path / "host.json"
    out = subprocess.run([sys.executable, "-m", "doctor", "snapshot", "--fact", "env", "--output", str(snap)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    text = snap.read_text()
    assert "pa55word" not in text and "t0k3nvalue" not in text
    assert json.loads(text)["facts"]["env"]["vars"]["HTTPS_PROXY"] == "http://<redacted>@proxy:3128"


def test_report_renderers_redact(tmp_path: Path) -> None:
    from doctor.app import Report, render
    from doctor.core.result import Remediation, Result
    from doctor.core.runner import RunOutcome
    from doctor.core.settings import resolve

    res = Result.failed(f"cannot reach {PROXY}", Remediation("retry", [f"curl -x {PROXY} https://hf.co"]),
                        url="https://hub/x?token=abc123")
    res.id, res.title = "site.reach", "reach"
    report = Report(resolve({}, environ={}), RunOutcome([res], 0.1))
    for fmt in ("text", "json", "junit"):
        path = tmp_path / f"r.{fmt}"
        with open(path, "w", encoding="utf-8") as fh:
            render(report, fmt, 1, fh, color=False)
        body = path.read_text()
        assert "pa55word" not in body and "abc123" not in body and "<redacted>" in body, fmt


def api_key_config(tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "k26.toml"
    cfg.write_text(f'[server]\napi_key = "sk-live-0123456789abcdefghij"\n{extra}')
    return cfg


def test_the_api_key_reaches_the_server_but_no_log(tmp_path: Path) -> None:
    cfg = api_key_config(tmp_path)
    dry = run_doctor("launch", "--dry-run", "--no-flag-check", "--config", str(cfg), "--model-path", str(tmp_path))
    argv = dry.stdout.splitlines()
    assert dry.returncode == 0 and argv[argv.index("--api-key") + 1] == "<redacted>"
    assert "0123456789" not in dry.stdout + dry.stderr and "shown as <redacted>" in dry.stderr
    server = tmp_path / "fake-python"
    record = tmp_path / "argv.txt"
    server.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}\n")
    server.chmod(0o755)
    out = run_doctor("launch", "--no-check", "--no-flag-check", "--config", str(cfg), "--model-path", str(tmp_path),
                     "--python", str(server))
    assert out.returncode == 0, out.stderr
    assert "exec: " in out.stderr and "--api-key '<redacted>'" in out.stderr and "0123456789" not in out.stderr
    got = record.read_text().splitlines()
    assert got[got.index("--api-key") + 1] == "sk-live-0123456789abcdefghij"  # the server gets the real key


def test_bind_scope() -> None:
    assert [bind_scope(h) for h in ("0.0.0.0", "::", "", "127.0.0.1", "::1", "localhost", "10.1.2.3", "gpu-node-7",
                                    "127.0.0.53")] == ["all", "all", "all", "loopback", "loopback", "loopback",
                                                       "network", "network", "loopback"]
    assert exposure(["--host", "0.0.0.0", "--port", "30000", "--api-key=k"])["api_key"] is True
    assert exposure(["--port", "30000"])["scope"] == "loopback"  # SGLang's default host


@pytest.mark.parametrize("toml, status", [
    ("", "warn"),
    ('[server]\nhost = "127.0.0.1"\n', "pass"),
    ('[server]\nhost = "::1"\n', "pass"),
    ('[server]\nhost = "::"\n', "warn"),
    ('[server]\nhost = "10.1.2.3"\n', "warn"),
    ('[server]\napi_key = "k-123"\n', "pass"),
    ('[server]\nargs = ["--api-key", "k-123"]\n', "pass"),
])
def test_host_exposure(tmp_path: Path, toml: str, status: str) -> None:
    cfg = tmp_path / "k26.toml"
    cfg.write_text(toml)
    out = run_doctor("check", "--config", str(cfg), "--only", "host.exposure", "--format", "json")
    (res,) = json.loads(out.stdout)["results"]
    assert res["status"] == status, res["summary"]
    if status == "warn":
        assert "without --api-key" in res["summary"] and "api_key" in res["remediation"]["text"]
        assert '[server] host = "127.0.0.1"' in res["remediation"]["text"]
        assert run_doctor("check", "--config", str(cfg), "--only", "host.exposure", "--strict").returncode == 1
    assert "k-123" not in out.stdout


def unit(tmp_path: Path, *extra: str) -> tuple[str, Path]:
    env_file = tmp_path / "site.env"
    env_file.write_text("TRITON_CACHE_DIR=/srv/cache/triton\nHF_HOME=/srv/hf\n")
    cfg = tmp_path / "k26.toml"
    cfg.write_text(f'[server]\nenv_file = "{env_file}"\nread_write_paths = ["/srv/spool"]\n'
                   f'[doctor]\nstate_dir = "/srv/k26-state"\n')
    out = run_doctor("systemd-unit", "--config", str(cfg), "--doctor", "/usr/bin/true", *extra)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "unit" / "sglang-k26-ddtree.service"
    path.parent.mkdir(exist_ok=True)
    path.write_text(out.stdout)
    return out.stdout, path


def test_the_unit_runs_unprivileged_in_a_sandbox_a_gpu_server_survives(tmp_path: Path) -> None:
    text, _ = unit(tmp_path)
    svc = parse_unit(text)["Service"]
    assert svc["User"] == ["sglang"]
    for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
                       ("DevicePolicy", "closed"), ("DeviceAllow", "char-nvidia* rw"), ("CapabilityBoundingSet", ""),
                       ("ProtectKernelModules", "yes"), ("RestrictSUIDSGID", "yes")):
        assert svc[key] == [value], key
    rw = svc["ReadWritePaths"][0].split()
    assert {"-/srv/cache/triton", "-/srv/hf", "-/srv/k26-state", "-/srv/spool"} <= set(rw)
    assert "MemoryDenyWriteExecute" not in svc and "PrivateDevices" not in svc  # CUDA JIT and /dev/nvidia*
    assert any(e.startswith("TRITON_CACHE_DIR=%C/") for e in svc["Environment"])
    assert parse_unit(unit(tmp_path, "--user", "svc-k26")[0])["Service"]["User"] == ["svc-k26"]
    cfg_user = tmp_path / "u.toml"
    cfg_user.write_text('[server]\nuser = "llm"\n')
    out = run_doctor("systemd-unit", "--config", str(cfg_user), "--doctor", "/usr/bin/true")
    assert parse_unit(out.stdout)["Service"]["User"] == ["llm"]
    assert "User" not in parse_unit(unit(tmp_path, "--no-hardening")[0])["Service"]


def exposure_score(path: Path) -> float:
    res = subprocess.run([ANALYZE, "security", "--offline=yes", str(path)], capture_output=True, text=True,
                         timeout=60, cwd=path.parent)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", res.stdout + res.stderr)
    assert match, res.stdout + res.stderr
    return float(match.group(1))


def offline_security_supported() -> bool:
    if ANALYZE is None:
        return False
    res = subprocess.run([ANALYZE, "security", "--help"], capture_output=True, text=True, timeout=30)
    return "--offline" in res.stdout


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed (.ci/run installs systemd)")
def test_systemd_verifies_the_hardened_unit(tmp_path: Path) -> None:
    _, path = unit(tmp_path)
    res = subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert [ln for ln in res.stderr.splitlines() if path.name in ln] == []


@pytest.mark.skipif(not offline_security_supported(), reason="systemd-analyze security --offline needs systemd >= 250")
def test_systemd_rates_the_hardened_unit_safe(tmp_path: Path) -> None:
    text, path = unit(tmp_path)
    hardened = tmp_path / "hardened" / path.name  # each in its own directory: the name must be the unit's
    hardened.parent.mkdir()
    hardened.write_text(text)
    _, plain = unit(tmp_path, "--no-hardening")
    after, before = exposure_score(hardened), exposure_score(plain)
    assert before >= 9.0 and after <= 3.0, (before, after)
