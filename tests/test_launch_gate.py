"""The launch gate, run as a user runs it (a child process): a failing check means no exec; passing
checks exec exactly the command ``--dry-run`` prints. The "service interpreter" is a script that
records its argv when asked to start the server and otherwise hands over to a real Python (so the
doctor's probes run for real against real SGLang sources on its path)."""

from __future__ import annotations

import socket
import stat
import sys
import time
from pathlib import Path

import pytest
import sglang_wheels
from conftest import ROOT, doctor_env, run_doctor
from sglang_stand_in import free_port

STAND_IN = ROOT / "tests" / "sglang_stand_in.py"


@pytest.fixture(scope="session")
def ddtree_sglang(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sglang_wheels.ddtree_site(tmp_path_factory)


@pytest.fixture(scope="session")
def plain_sglang(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sglang_wheels.site("0.5.23", tmp_path_factory)


def fake_python(tmp_path: Path, server: str | None = None) -> Path:
    """A service interpreter: ``-m sglang.launch_server`` leaves a mark (its argv, one per line) and
    runs ``server`` if given; anything else (the doctor's probes) runs under a real Python."""
    script = tmp_path / "venv" / "bin" / "python"
    script.parent.mkdir(parents=True)
    run_server = f'exec {sys.executable} {server} "$@"' if server else "exit 0"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then
  for a in "$0" "$@"; do printf '%s\\n' "$a"; done > "$K26_TEST_MARK"
  shift 2
  {run_server}
fi
exec {sys.executable} "$@"
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def config(tmp_path: Path, port: int, extra: str = "") -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[server]\nhost = "127.0.0.1"\nport = {port}\nenv_file = "{tmp_path}/absent.env"\n'
                   f'args = ["--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2"]\n{extra}'
                   f'[server.env]\nNCCL_CUMEM_ENABLE = "1"\nK26_PROFILE_VAR = "from-profile"\n')
    return cfg


def common(tmp_path: Path, python: Path, port: int, extra: str = "") -> list[str]:
    return ["--config", str(config(tmp_path, port, extra)), "--python", str(python),
            "--model-path", str(tmp_path / "model"), "--draft-model-path", str(tmp_path / "drafter")]


def env_for(site: Path, mark: Path, **extra: str) -> dict[str, str]:
    return doctor_env(PYTHONPATH=str(site), K26_TEST_MARK=str(mark), **extra)


@pytest.mark.network
def test_passing_checks_exec_exactly_the_printed_command(tmp_path: Path, ddtree_sglang: Path) -> None:
    py, port, mark = fake_python(tmp_path), free_port(), tmp_path / "mark"
    env = env_for(ddtree_sglang, mark, K26_PROFILE_VAR="pinned-by-site")
    args = common(tmp_path, py, port)
    dry = run_doctor("launch", *args, "--dry-run", "--", "--log-level", "debug", env=env)
    assert dry.returncode == 0, dry.stderr
    assert not mark.exists(), "--dry-run must not start anything"
    printed = dry.stdout.splitlines()
    assert printed[:3] == [str(py), "-m", "sglang.launch_server"]
    assert printed[-2:] == ["--log-level", "debug"]
    assert ["--speculative-algorithm", "DDTREE"] == printed[printed.index("--speculative-algorithm"):][:2]
    assert "K26_PROFILE_VAR=pinned-by-site pinned by the site is kept" in dry.stderr

    res = run_doctor("launch", *args, "--only", "host.port", "--", "--log-level", "debug", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert mark.read_text().splitlines() == printed


@pytest.mark.network
def test_failing_check_means_no_exec(tmp_path: Path, ddtree_sglang: Path) -> None:
    py, mark = fake_python(tmp_path), tmp_path / "mark"
    with socket.socket() as holder:  # someone else holds the server port: host.port fails
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        res = run_doctor("launch", *common(tmp_path, py, port), "--only", "host.port",
                         env=env_for(ddtree_sglang, mark))
    assert res.returncode == 1, res.stdout + res.stderr
    assert not mark.exists()
    assert "not launching" in res.stderr and "host.port" in res.stderr


@pytest.mark.network
def test_a_flag_sglang_rejects_means_no_exec(tmp_path: Path, plain_sglang: Path, ddtree_sglang: Path) -> None:
    py, port, mark = fake_python(tmp_path), free_port(), tmp_path / "mark"
    # unpatched 0.5.23: the DDTree budget flag is unknown
    res = run_doctor("launch", *common(tmp_path, py, port), "--only", "host.port", env=env_for(plain_sglang, mark))
    assert res.returncode == 1 and not mark.exists()
    assert "--speculative-ddtree-budget" in res.stderr and "patches apply" in res.stderr
    # patched, but a flag 0.5.20 removed, given after --
    res = run_doctor("launch", *common(tmp_path, py, port), "--only", "host.port", "--",
                     "--cuda-graph-max-bs", "160", env=env_for(ddtree_sglang, mark))
    assert res.returncode == 1 and not mark.exists()
    assert "--cuda-graph-max-bs-decode" in res.stderr
    # --no-check skips the checks, never the flag check
    res = run_doctor("launch", *common(tmp_path, py, port), "--no-check", env=env_for(plain_sglang, mark))
    assert res.returncode == 1 and not mark.exists()


@pytest.mark.network
def test_invalid_configuration_exits_2(tmp_path: Path, ddtree_sglang: Path) -> None:
    py, mark = fake_python(tmp_path), tmp_path / "mark"
    res = run_doctor("launch", *common(tmp_path, py, 70000), "--dry-run", env=env_for(ddtree_sglang, mark))
    assert res.returncode == 2 and "[server] port = 70000" in res.stderr
    res = run_doctor("launch", "--config", str(config(tmp_path, 1234)), "--model-path", "", "--python", str(py),
                     "--draft-model-path", "", "--profile", str(tmp_path / "nope.toml"),
                     env=env_for(ddtree_sglang, mark))
    assert res.returncode == 2
    assert not mark.exists()


def _notify_socket(tmp_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(0.1)
    return sock


def _drain(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except TimeoutError:
            return out


@pytest.mark.network
def test_wait_supervises_until_ready_and_tells_systemd(tmp_path: Path, ddtree_sglang: Path) -> None:
    """launch --wait against the stand-in for a starting SGLang (refuses, 503, then 200)."""
    py, port, mark = fake_python(tmp_path, server=str(STAND_IN)), free_port(), tmp_path / "mark"
    sock = _notify_socket(tmp_path)
    env = env_for(ddtree_sglang, mark, NOTIFY_SOCKET=str(tmp_path / "notify.sock"))
    # The stand-in gets SGLang's whole argv and takes its own knobs from it (given after --).
    extra = ["--", "--port", str(port), "--refuse", "0.6", "--warm", "0.6", "--serve-for", "0.5", "--exit-code", "0"]
    start = time.monotonic()
    res = run_doctor("launch", *common(tmp_path, py, port), "--no-check", "--no-flag-check", "--wait",
                     "--wait-interval", "0.1", *extra, env=env, timeout=60)
    took = time.monotonic() - start
    assert res.returncode == 0, res.stderr
    assert "server ready" in res.stderr
    assert "not listening yet" in res.stderr and "warming up" in res.stderr
    messages = "\n".join(_drain(sock))
    assert "READY=1" in messages and "STATUS=" in messages
    assert took < 30


@pytest.mark.network
def test_wait_reports_a_server_that_dies_while_loading(tmp_path: Path, ddtree_sglang: Path) -> None:
    py, port, mark = fake_python(tmp_path, server=str(STAND_IN)), free_port(), tmp_path / "mark"
    res = run_doctor("launch", *common(tmp_path, py, port), "--no-check", "--no-flag-check", "--wait",
                     "--wait-interval", "0.1", "--", "--port", str(port), "--die-after", "0.3", "--exit-code", "7",
                     env=env_for(ddtree_sglang, mark), timeout=60)
    assert res.returncode == 7, res.stderr
    assert "exited (status 7) before it was ready" in res.stderr and "diagnose" in res.stderr


def test_wait_ready_command(tmp_path: Path) -> None:
    from sglang_stand_in import StandIn

    port = free_port()
    srv = StandIn(port, refuse_s=0.3, warm_s=0.3, warm_polls=2).start()
    try:
        res = run_doctor("wait-ready", "--url", f"http://127.0.0.1:{port}/health", "--timeout", "20",
                         "--interval", "0.1")
    finally:
        srv.stop()
    assert res.returncode == 0, res.stderr
    assert 503 in srv.polls and srv.polls[-1] == 200
    res = run_doctor("wait-ready", "--url", f"http://127.0.0.1:{free_port()}/health", "--timeout", "0.5",
                     "--interval", "0.1")
    assert res.returncode == 1 and "not ready after" in res.stderr


@pytest.mark.network
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_wait_forwards_the_signal_and_dies_by_it(tmp_path: Path, ddtree_sglang: Path, sig: str) -> None:
    """systemctl stop (SIGTERM) or Ctrl-C from a script (SIGINT, stdin not a terminal) to the doctor reaches the
    server; the doctor then dies by the same signal (a clean stop for systemd, not exit status 143). The doctor is
    started with SIGINT ignored, as `nohup ... &` and CI runners start it: the server must not inherit that."""
    import signal
    import subprocess

    signum = getattr(signal, sig)
    py, port, mark = fake_python(tmp_path, server=str(STAND_IN)), free_port(), tmp_path / "mark"
    argv = [sys.executable, "-m", "doctor", "launch", *common(tmp_path, py, port), "--no-check", "--no-flag-check",
            "--wait", "--wait-interval", "0.1", "--", "--port", str(port), "--refuse", "0.2", "--warm", "0.2",
            "--serve-for", "60"]

    def ignoring_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(argv, env=env_for(ddtree_sglang, mark), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignoring_sigint)
    try:
        assert proc.stderr is not None
        said = []
        while not any("server ready" in ln for ln in said):  # the doctor has seen 200 and is supervising
            line = proc.stderr.readline()
            assert line, "".join(said)
            said.append(line)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signum, "".join(said) + err
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # the server is gone too


@pytest.mark.network
def test_the_gate_imports_sglang_where_check_reads_its_files(tmp_path: Path, ddtree_sglang: Path) -> None:
    """A failed start costs the weights' load: launch's gate imports SGLang (as --import-sglang), while the
    default tier of check only reads its files."""
    py, port, mark = fake_python(tmp_path), free_port(), tmp_path / "mark"
    env = env_for(ddtree_sglang, mark)
    args = common(tmp_path, py, port)
    # Not all of SGLang's requirements are installed in this environment: its files say so.
    checked = run_doctor("check", *args, "--only", "sglang.install", env=env)
    assert "of its requirements are not" in checked.stdout, checked.stdout + checked.stderr
    launched = run_doctor("launch", *args, "--only", "sglang.install", env=env)
    out = launched.stdout + launched.stderr
    # The gate's verdict comes from importing it (this tree holds the sources the tests read, not all of SGLang).
    assert ("`import sglang` fails" in out or "sglang 0.5.23 imports" in out) and "of its requirements" not in out, out
    assert not mark.exists()
