"""A CLI that survives real terminals (issue 13): closed pipes, non-UTF-8 streams, an unwritable --output,
bad URLs and config values, wrapped descriptions, the NVLink matrix once, absolute paths in the unit, the
problems-only view with one root line per cause, and ``env`` for bug reports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, doctor_env, run_doctor

from doctor.report.text import unfold_ids

SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
LINK_DOWN = SNAPS / "b300x8-link-down.json"
NO_DRIVER = "nvmlInit failed: LibraryNotFound: libnvidia-ml.so.1 was not found"


def closed_pipe(*args: str) -> tuple[int, str]:
    """Run the doctor with its stdout a pipe whose reader is already gone (what `| head -1` ends in)."""
    proc = subprocess.Popen([sys.executable, "-m", "doctor", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=doctor_env(), stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


def test_list_into_head_exits_quietly() -> None:
    script = f"{sys.executable} -m doctor list | head -1; echo \"rc=${{PIPESTATUS[0]}}\""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=doctor_env(), timeout=120)
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and lines[0].split()[0] == "cuda.compat"
    assert lines[1] in ("rc=0", "rc=141"), out.stdout
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr and "internal error" not in out.stderr


@pytest.mark.parametrize("args, verdict", [
    (["list"], 141),
    (["explain", "gpu.nvlink"], 141),
    (["check", "--only", "host.env"], 0),  # check keeps its verdict as the exit code
    (["check", "--from-snapshot", str(LINK_DOWN), "--only", "gpu.nvlink"], 1),
])
def test_a_reader_that_went_away_is_not_a_crash(args: list[str], verdict: int) -> None:
    rc, err = closed_pipe(*args)
    assert rc == verdict and err == "", err


def test_an_ascii_terminal_gets_ascii_glyphs_and_the_verdict() -> None:
    env = doctor_env(PYTHONIOENCODING="ascii")
    out = subprocess.run([sys.executable, "-m", "doctor", "check", "--from-snapshot", str(LINK_DOWN), "--only",
                          "gpu"], capture_output=True, env=env, timeout=120)
    text = out.stdout.decode("ascii")  # every byte is ASCII
    assert out.returncode == 1 and "Traceback" not in out.stderr.decode()
    assert "XX gpu.nvlink" in text and re.search(r"^ok passed \(\d+\): gpu\.arch, ", text, re.M)
    assert any(ln.startswith("FAIL: ") for ln in text.splitlines())
    assert "k26-doctor | b300-tp8-ddtree" in text
    js = subprocess.run([sys.executable, "-m", "doctor", "check", "--from-snapshot", str(LINK_DOWN), "--only", "gpu",
                         "--format", "json"], capture_output=True, env=env, timeout=120)
    assert json.loads(js.stdout.decode("ascii"))["summary"]["status"] == "fail"


@pytest.mark.parametrize("command", [["check"], ["fix"], ["snapshot"], ["launch", "--no-flag-check"],
                                     ["systemd-unit"]])
def test_an_unwritable_output_is_refused_before_anything_runs(command: list[str], tmp_path: Path) -> None:
    start = time.monotonic()
    out = run_doctor(*command, "--output", "/nonexistent/dir/x.json")
    assert out.returncode == 2 and "/nonexistent/dir does not exist" in out.stderr, out.stderr
    assert out.stdout == "" and time.monotonic() - start < 30
    assert run_doctor("check", "--output", str(tmp_path)).returncode == 2  # a directory is not a file name


@pytest.mark.parametrize("url", ["notaurl", "http://", "ftp://host/health", "http://h:99999/health"])
def test_wait_ready_with_a_bad_url_is_a_plain_usage_error(url: str) -> None:
    out = run_doctor("wait-ready", "--url", url, "--timeout", "1")
    assert out.returncode == 2 and out.stderr.startswith("k26-doctor: --url ")
    assert "Traceback" not in out.stderr and "Usage:" not in out.stderr


@pytest.mark.parametrize("toml, needle", [
    ('[server]\nport = "abc"\n', "[server] port = 'abc'"),
    ("[server]\nmem_fraction_static = 2\n", "[server] mem_fraction_static = 2"),
    ('[parallel]\ntp = "8"\n', "[parallel] tp = '8'"),
    ('[gpu]\nnvlink_required = "yes"\n', "[gpu] nvlink_required = 'yes'"),
    ('[stack]\ntorch = "2.11 or newer"\n', "[stack] torch = '2.11 or newer'"),
])
def test_a_config_value_of_the_wrong_type_is_invalid_configuration(toml: str, needle: str, tmp_path: Path) -> None:
    cfg = tmp_path / "k26.toml"
    cfg.write_text(toml)
    for cmd in (["check", "--only", "host.port"], ["wait-ready", "--timeout", "1"], ["systemd-unit"]):
        out = run_doctor(*cmd, "--config", str(cfg))
        assert out.returncode == 2 and "invalid configuration: " + needle in out.stderr, (cmd, out.stderr)


def test_the_nvlink_matrix_is_shown_with_a_failure_and_once_under_v() -> None:
    plain = run_doctor("check", "--from-snapshot", str(LINK_DOWN), "--only", "gpu.nvlink")
    assert plain.returncode == 1 and plain.stdout.count("Legend:") == 1
    assert re.search(r"GPU5\s+NV17\s+NV17", plain.stdout)
    verbose = run_doctor("check", "--from-snapshot", str(LINK_DOWN), "--only", "gpu.nvlink", "-v")
    assert verbose.stdout.count("Legend:") == 1 and verbose.stdout.count("GPU5  NV17") == 1
    healthy = run_doctor("check", "--from-snapshot", str(SNAPS / "b300x8-healthy.json"), "--only", "gpu.nvlink")
    assert "Legend:" not in healthy.stdout  # a pass stays one line
    assert run_doctor("check", "--from-snapshot", str(SNAPS / "b300x8-healthy.json"), "--only", "gpu.nvlink",
                      "-v").stdout.count("Legend:") == 1


def test_systemd_unit_makes_relative_paths_absolute(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "k26.toml").write_text("")
    out = subprocess.run([sys.executable, "-m", "doctor", "systemd-unit", "--model-path", "models/k2",
                          "--draft-model-path", "../dflash", "--python", "venv/bin/python",
                          "--doctor", "bin/k26-doctor"],
                         capture_output=True, text=True, env=doctor_env(), cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    pre = next(ln for ln in out.stdout.splitlines() if ln.startswith("ExecStartPre="))
    argv = pre.split("=", 1)[1].split()
    assert argv[0] == str(tmp_path / "bin" / "k26-doctor")
    assert argv[argv.index("--model-path") + 1] == str(tmp_path / "models" / "k2")
    assert argv[argv.index("--draft-model-path") + 1] == str(tmp_path.parent / "dflash")
    assert argv[argv.index("--python") + 1] == str(tmp_path / "venv" / "bin" / "python")
    with_config = subprocess.run([sys.executable, "-m", "doctor", "systemd-unit", "--config", "conf/k26.toml"],
                                 capture_output=True, text=True, env=doctor_env(), cwd=tmp_path, timeout=120)
    assert f"--config {tmp_path / 'conf' / 'k26.toml'}" in with_config.stdout


def no_driver_snapshot(tmp_path: Path) -> Path:
    """A host without libnvidia-ml, recorded: the one cause of many checks."""
    snap = {"kind": "k26-doctor-snapshot", "schema_version": 1, "options": {}, "facts": {
        "nvml": {"available": False, "error": f"{NO_DRIVER}: the NVIDIA driver is not installed",
                 "error_kind": "LibraryNotFound", "devices": []}}}
    path = tmp_path / "no-driver.json"
    path.write_text(json.dumps(snap))
    return path


def test_one_root_line_when_one_cause_fails_many_checks(tmp_path: Path) -> None:
    snap = no_driver_snapshot(tmp_path)
    args = ["check", "--from-snapshot", str(snap), "--only", "gpu", "--only", "cuda.compat", "--only", "model.fit"]
    default = run_doctor(*args, env=doctor_env(COLUMNS="300"))
    assert default.returncode == 1 and default.stdout.count(NO_DRIVER) == 1
    assert "not judged" not in default.stdout  # blocked by a cause that failed: judged, by that cause
    for out in (default, run_doctor(*args, "-q", env=doctor_env(COLUMNS="300"))):
        lines = out.stdout.splitlines()
        assert out.stdout.count(NO_DRIVER) == 1 and not any(ln.startswith("✔") for ln in lines)
        root = next(i for i, ln in enumerate(lines) if ln.startswith("✘ gpu.driver"))
        deps = unfold_ids(next(ln for ln in lines[root:] if "same cause (" in ln).split("): ", 1)[1])
        for dep in ("cuda.compat", "gpu.arch", "gpu.count", "gpu.nvlink", "model.fit"):
            assert dep in deps
            assert not any(ln.startswith(("-", "✘")) and f" {dep} " in ln for ln in lines)
    js = json.loads(run_doctor(*args, "--format", "json").stdout)
    assert {r["id"]: r.get("cause") for r in js["results"]}["cuda.compat"] == "gpu.driver"


def test_problems_view_hides_passes_and_not_applicable() -> None:
    out = run_doctor("check", "--from-snapshot", str(LINK_DOWN), "--only", "gpu", "--skip", "gpu.fabric.*",
                     "--skip", "gpu.multicast", "--problems")
    # (the fabric software and multicast readings postdate this snapshot: not judged, which --problems shows)
    assert out.returncode == 1
    shown = [ln.split()[1] for ln in out.stdout.splitlines() if ln[:1] in ("✔", "✘", "!", "-", "‼")
             and len(ln.split()) > 1]
    assert shown == ["gpu.nvlink"]


def test_env_is_a_short_redacted_summary(tmp_path: Path) -> None:
    env = doctor_env(HTTPS_PROXY="http://alice:pa55word@proxy:3128", NCCL_DEBUG="INFO")
    out = subprocess.run([sys.executable, "-m", "doctor", "env"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("```\nk26-doctor ") and text.rstrip().endswith("```")
    for label in ("driver:", "GPUs:", "python:", "packages:", "verdict:"):
        assert label in text
    assert "pa55word" not in text and "HTTPS_PROXY=http://<redacted>@proxy:3128" in text and "NCCL_DEBUG=INFO" in text
    assert len(text.splitlines()) < 40
    snap = subprocess.run([sys.executable, "-m", "doctor", "env", "--from-snapshot",
                           str(SNAPS / "b300x8-healthy.json")], capture_output=True, text=True, env=doctor_env(),
                          timeout=120)
    assert "8x NVIDIA B300 SXM6 AC (sm_103, 268.3 GiB)" in snap.stdout and "driver:    580.159.04" in snap.stdout
    assert snap.stdout.count("NV18") == 56  # the topology: 8 x 7 pairs
    js = json.loads(subprocess.run([sys.executable, "-m", "doctor", "env", "--format", "json", "--from-snapshot",
                                    str(SNAPS / "b300x8-link-down.json")], capture_output=True, text=True, env=env,
                                   timeout=300).stdout)
    assert js["verdict"]["status"] == "fail" and "gpu.nvlink" in js["verdict"]["failed"]
    assert [g["nvlinks_active"] for g in js["gpus"]].count(17) == 1


@pytest.mark.network
def test_patches_status_wraps_descriptions_by_whole_words(tmp_path_factory: pytest.TempPathFactory,
                                                          tmp_path: Path) -> None:
    from patches_install import fresh_venv

    venv = fresh_venv("0.5.23", tmp_path_factory, tmp_path / "venv")
    out = run_doctor("patches", "status", "--python", venv.python, "--profile", "b300-tp8-ddtree",
                     "--state-dir", str(tmp_path / "state"), env=doctor_env(COLUMNS="80"))
    assert out.returncode in (0, 1), out.stderr
    manifest = json.loads((ROOT / "sglang_patches" / "ddtree-0.5.23" / "manifest.json").read_text())
    flowing = " ".join(ln.strip() for ln in out.stdout.splitlines())
    for patch in manifest["patches"]:
        assert " ".join(patch["description"].split()) in flowing, patch["id"]
    wrapped = [ln for ln in out.stdout.splitlines() if ln.startswith(" " * 12) and not ln.strip().startswith("sha256")]
    assert len(wrapped) >= 5 and max(len(ln) for ln in wrapped) <= 80  # wrapped to the terminal, not cut

