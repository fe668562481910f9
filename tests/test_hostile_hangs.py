"""Issue 21, hangs: the doctor never waits on a FIFO, a hung interpreter, a server that drips, a ``nan``
deadline or a backtracking pattern; every command ends within its deadline and leaves no process behind.

Real FIFOs (``os.mkfifo``, no writer: ``open()`` of one blocks forever), a real shell script as the service's
interpreter that blocks in ``sleep``, real HTTP servers on 127.0.0.1 (``hostile_support``), real signals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import doctor_env, interruptible, run_doctor
from hostile_support import hung_python, kill_left, misbehaving_server, model_with, running, small_model, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_model(tmp_path_factory.mktemp("hostile-model") / "model")


def check_json(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = run_doctor("check", "--format", "json", "--timeout", "20", *args, timeout=timeout)
    return out, json.loads(out.stdout) if out.stdout.startswith("{") else {}


def by_id(report: dict) -> dict[str, dict]:
    return {r["id"]: r for r in report.get("results", [])}


@pytest.mark.parametrize("name, check_id", [
    ("model.safetensors.index.json", "model.shards"),
    ("config.json", "model.config"),
    ("tokenizer_config.json", "model.tokenizer"),
    ("tiktoken.model", "model.tokenizer"),
    ("tokenization_kimi.py", "model.tokenizer"),  # the remote-code module auto_map names
])
def test_a_fifo_in_the_model_directory_is_named_not_waited_on(base_model: Path, tmp_path: Path, name: str,
                                                              check_id: str) -> None:
    model = model_with(base_model, tmp_path / "m", **{name: "fifo"})
    start = time.monotonic()
    _, report = check_json("--model-path", str(model), "--only", check_id, "--python", "/bin/true")
    took = time.monotonic() - start
    res = by_id(report)[check_id]
    assert res["status"] == "fail", res
    assert "FIFO" in json.dumps(res), res["summary"]
    assert "timed out" not in res["summary"] and took < 15, (took, res["summary"])


def test_a_fifo_as_config_or_snapshot_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for args in (["--config", str(fifo)], ["--from-snapshot", str(fifo)]):
        out = run_doctor("check", "--only", "host.port", *args, timeout=30)
        assert out.returncode == 2 and "is a FIFO (named pipe), not a regular file" in out.stderr, out.stderr
    env = doctor_env(K26_DOCTOR_CONFIG=str(fifo))
    out = run_doctor("check", "--only", "host.port", env=env, timeout=30)
    assert out.returncode == 2 and "FIFO" in out.stderr and "does not exist" not in out.stderr


@pytest.mark.network  # reads the released SGLang 0.5.23 wheel (a first-run download)
def test_a_fifo_where_a_patch_target_is(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    from patches_install import FIXTURE_SETS, fresh_venv

    from doctor.sglang.patching import manifest, record
    from doctor.sglang.patching.engine import Engine

    venv = fresh_venv("0.5.23", tmp_path_factory, tmp_path / "venv")
    target = venv.site_packages / "sglang/srt/layers/attention/triton_backend.py"
    target.unlink()
    os.mkfifo(target)
    eng = Engine(manifest.resolve("t-0.5.23", str(FIXTURE_SETS)), record.installed_in(venv.site_packages),
                 state_dir=str(tmp_path / "state"))
    plan = eng.plan_apply()
    assert not plan.ok and any("FIFO" in r for r in plan.refusals), plan.refusals
    assert eng.status().files, "status reads every target without blocking"


def test_timeout_is_the_deadline_of_the_whole_run(base_model: Path, tmp_path: Path) -> None:
    """A service interpreter that never answers: every probe hangs; --timeout 3 ends the run (fix planning and
    its probes included) by then, and no probe outlives the doctor."""
    python, pids = hung_python(tmp_path)
    start = time.monotonic()
    try:
        out = run_doctor("check", "--python", str(python), "--model-path", str(base_model), "--timeout", "3",
                         "--format", "json", timeout=60)
        took = time.monotonic() - start
        report = json.loads(out.stdout)
        assert out.returncode == 1 and took < 12, took
        late = [r for r in report["results"] if "deadline (--timeout 3s) passed" in r["summary"]]
        assert late and any("while it waited for the fact" in r["summary"] for r in late), late
        assert not any("hung driver call" in json.dumps(r) for r in late)
        assert any("no fix was planned" in n for n in report["doctor"]["notes"])
        assert pids.exists() and wait_for(lambda: not running(pids), 5), f"left running: {running(pids)}"
    finally:
        kill_left(pids)


def test_fix_planning_is_bounded_by_the_run(base_model: Path, tmp_path: Path) -> None:
    python, pids = hung_python(tmp_path)
    start = time.monotonic()
    try:
        out = run_doctor("fix", "--python", str(python), "--model-path", str(base_model), "--timeout", "3",
                         timeout=60)
        assert time.monotonic() - start < 12 and out.returncode == 1, out.stdout[-2000:]
        assert wait_for(lambda: not running(pids), 5), f"left running: {running(pids)}"
    finally:
        kill_left(pids)


def test_ctrl_c_during_a_hung_check_ends_at_once(base_model: Path, tmp_path: Path) -> None:
    """``check --deep`` with a service interpreter that never answers, a real SIGINT as a terminal sends it: exit
    130 at once, a short report of what finished with one line for every check that was stopped, no next step
    (the run judged too little to name one), no probe left running."""
    python, pids = hung_python(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "doctor", "check", "--deep", "--python", str(python),
                             "--model-path", str(base_model)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=doctor_env(COLUMNS="80"), stdin=subprocess.DEVNULL,
                            preexec_fn=interruptible)  # whatever SIGINT was when the suite started
    try:
        # (python.venv probes the interpreter first and blocks every check that runs it until it answers: one
        # hung probe at least)
        assert wait_for(lambda: len(running(pids)) >= 1, 30), "the probes did not start"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - sent < 8, "Ctrl-C took too long"
        lines = stdout.splitlines()
        assert proc.returncode == 130, (proc.returncode, stdout[-1500:], stderr[-1500:])
        stopped = [ln for ln in lines if "interrupted before they finished" in ln]
        assert len(stopped) == 1 and "INTERRUPTED (Ctrl-C), a partial report:" in stdout, stdout
        assert not [ln for ln in lines if ln.startswith("next:")] and lines[-1].startswith("interrupted: "), stdout
        assert not [ln for ln in lines if "interrupted (Ctrl-C) before it finished" in ln], stdout  # not one each
        assert len(lines) <= 40 and "Traceback" not in stderr, stdout
        assert wait_for(lambda: not running(pids), 5), f"left running: {running(pids)}"
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_left(pids)


@pytest.mark.parametrize("mode", ["drip", "endless", "slow-headers"])
def test_wait_ready_and_smoke_keep_their_deadline_against_a_server_that_never_finishes(mode: str) -> None:
    with misbehaving_server(mode) as base:
        start = time.monotonic()
        out = run_doctor("wait-ready", "--url", base + "/health", "--timeout", "2", "--interval", "0.2", timeout=30)
        assert out.returncode == 1 and time.monotonic() - start < 8, (time.monotonic() - start, out.stderr)
        assert "not ready after 2s" in out.stderr
        start = time.monotonic()
        out = run_doctor("smoke", "--url", base, "--timeout", "2", "--format", "json", timeout=30)
        assert out.returncode == 1 and time.monotonic() - start < 8, (time.monotonic() - start, out.stdout)
        assert "timed out" in json.loads(out.stdout)["summary"]


@pytest.mark.parametrize("args", [
    ["check", "--only", "host.port", "--timeout", "nan"],
    ["check", "--only", "host.port", "--timeout", "inf"],
    ["check", "--only", "host.port", "--timeout=-1"],
    ["check", "--only", "host.port", "--wait-fabric", "nan"],
    ["wait-ready", "--url", "http://127.0.0.1:9/health", "--timeout", "nan"],
    ["wait-ready", "--url", "http://127.0.0.1:9/health", "--interval", "nan"],
    ["smoke", "--url", "http://127.0.0.1:9", "--timeout", "nan"],
    ["smoke", "--url", "http://127.0.0.1:9", "--fail-below", "nan"],
    ["launch", "--dry-run", "--wait-timeout", "nan"],
    ["systemd-unit", "--start-timeout=-5"],
    ["systemd-unit", "--start-timeout", "nan"],
    ["diagnose", "-", "--timeout", "inf"],
])
def test_a_duration_that_is_no_duration_is_refused(args: list[str]) -> None:
    out = run_doctor(*args, timeout=20)
    assert out.returncode == 2, (out.returncode, out.stdout[-500:], out.stderr[-500:])


def test_a_nan_duration_in_the_config_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[doctor]\ntimeout = nan\n[server]\nstart_timeout_s = inf\n")
    out = run_doctor("check", "--only", "host.port", "--config", str(cfg), timeout=20)
    assert out.returncode == 2 and "finite" in out.stderr, out.stderr


def test_signatures_that_backtrack_catastrophically_are_bounded(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("a" * 40 + "b\n")
    nested = tmp_path / "nested.toml"
    nested.write_text('[[signature]]\nid = "evil"\ntitle = "evil"\npatterns = ["^(a+)+$"]\n')
    out = run_doctor("diagnose", str(log), "--signatures", str(nested), timeout=30)
    assert out.returncode == 2 and "catastrophic backtracking" in out.stderr and "evil" in out.stderr, out.stderr
    overlap = tmp_path / "overlap.toml"  # not a repeated repeat: only the deadline can stop it
    overlap.write_text('[[signature]]\nid = "slow"\ntitle = "slow"\npatterns = ["^(a|aa)+$"]\n')
    start = time.monotonic()
    out = run_doctor("diagnose", str(log), "--signatures", str(overlap), "--timeout", "2", timeout=30)
    assert out.returncode == 2 and time.monotonic() - start < 10, out.stderr
    assert "did not finish within 2s" in out.stderr and "'slow'" in out.stderr
    fine = tmp_path / "fine.toml"
    fine.write_text('[[signature]]\nid = "fine"\ntitle = "fine"\npatterns = ["a{8}b"]\n')
    out = run_doctor("diagnose", str(log), "--signatures", str(fine), "--format", "json", timeout=30)
    assert out.returncode == 0 and json.loads(out.stdout)["findings"][0]["id"] == "fine"


def test_hostile_signature_files_are_refused_at_once_and_clearly(tmp_path: Path) -> None:
    """Sizes that would take minutes to parse or compile, and files that are not files, are refused by name."""
    from doctor.service.diagnose import SignatureError, load_signatures

    def sig(i: int, pattern: str) -> str:
        return f'[[signature]]\nid = "s{i}"\ntitle = "t"\npatterns = ["{pattern}"]\n'

    cases = {
        "big.toml": ("# " + "x" * (2 << 20) + "\n", "larger than 1 MiB"),
        "many.toml": ("".join(sig(i, f"x{i}y") for i in range(2001)), "more than 2000"),
        "long.toml": (sig(0, "a" * 5000), "longer than 4096"),
        "total.toml": ("".join(sig(i, "|".join(f"w{i}z{j}" for j in range(100))) for i in range(60)),
                       "characters of patterns"),
        "alts.toml": ('[[signature]]\nid = "a"\ntitle = "t"\npatterns = [' + ",".join(['"x"'] * 201) + "]\n",
                      "more than 200"),
        "binary.toml": (b"\xff\xfe\x00binary", "not UTF-8"),
    }
    for name, (body, reason) in cases.items():
        path = tmp_path / name
        path.write_bytes(body if isinstance(body, bytes) else body.encode())
        start = time.monotonic()
        with pytest.raises(SignatureError, match=reason):
            load_signatures([path])
        assert time.monotonic() - start < 10, name
    fifo = tmp_path / "sigs.fifo"
    os.mkfifo(fifo)
    log = tmp_path / "server.log"
    log.write_text("ERROR x\n")
    out = run_doctor("diagnose", str(log), "--signatures", str(fifo), timeout=30)  # nobody writes: never blocks
    assert out.returncode == 2 and "FIFO" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_every_builtin_signature_passes_the_backtracking_refusal() -> None:
    from doctor.service.diagnose import load_signatures, nested_repeat

    assert all(nested_repeat(p) is None for s in load_signatures() for p in s.patterns)


def test_a_log_that_is_a_pipe_is_read_to_its_end_and_a_fifo_without_writer_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    out = run_doctor("diagnose", str(fifo), timeout=30)  # nobody writes: empty at once
    assert out.returncode == 1, out.stderr
    shell = subprocess.run(["bash", "-c", f"{sys.executable} -m doctor diagnose <(printf 'Failed to initialize "
                            "NVML\\n') --format json"], capture_output=True, text=True, env=doctor_env(), timeout=60)
    assert shell.returncode == 0 and json.loads(shell.stdout)["lines"] == 1, shell.stderr
