"""Readiness polling against a stand-in for a starting SGLang (it cannot run here: no GPU)."""

from __future__ import annotations

import io
import socket
import subprocess
import sys

from sglang_stand_in import StandIn, free_port

from doctor.service.readiness import READY, REFUSED, STARTING, health_url, probe, sd_notify, wait_ready


def test_health_url_reaches_wildcard_binds_on_loopback() -> None:
    assert health_url("0.0.0.0", 30000) == "http://127.0.0.1:30000/health"
    assert health_url("::", 30000) == "http://[::1]:30000/health"
    assert health_url("10.0.0.5", 8000, "ready") == "http://10.0.0.5:8000/ready"


def test_states_while_starting() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    assert probe(url).state == REFUSED
    srv = StandIn(port, refuse_s=0.0, warm_s=30).start()
    try:
        assert srv.listening.wait(30)
        got = probe(url)
        assert (got.state, got.http_status) == (STARTING, 503)
    finally:
        srv.stop()


def test_wait_goes_refused_starting_ready() -> None:
    """Each phase is seen whatever the machine's load: the stand-in refuses until wait-ready has said so, then
    answers 503 to two polls, then 200 (no phase is a span of time a slow poll could miss)."""
    port = free_port()
    srv = StandIn(port, refuse_s=120, warm_s=0, warm_polls=2).start()
    out = io.StringIO()
    statuses: list[str] = []

    def notify(status: str) -> None:
        statuses.append(status)
        if status.startswith("not listening yet"):
            srv.open()

    try:
        res = wait_ready(f"http://127.0.0.1:{port}/health", 120, interval_s=0.05, progress=out, notify=notify)
    finally:
        srv.stop()
    assert res.ready and res.state == READY
    text = out.getvalue()
    assert text.index("not listening yet") < text.index("warming up") < text.index("ready after")
    assert statuses[:2] == ["not listening yet (loading weights)", "up, not ready (warming up)"]
    assert 503 in srv.polls and srv.polls[-1] == 200


def test_timeout_when_never_warm() -> None:
    port = free_port()
    srv = StandIn(port, refuse_s=0.0, warm_s=60).start()
    try:
        res = wait_ready(f"http://127.0.0.1:{port}/health", 2, interval_s=0.05)  # (2 s: 2 polls, however loaded)
    finally:
        srv.stop()
    assert not res.ready and "not ready after" in res.reason
    assert res.polls >= 2


def test_gives_up_when_the_server_exits() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(4)"])
    proc.wait()
    res = wait_ready(f"http://127.0.0.1:{free_port()}/health", 60, interval_s=0.05, exited=proc.poll)
    assert not res.ready and res.exit_code == 4 and res.elapsed_s < 5
    res = wait_ready(f"http://127.0.0.1:{free_port()}/health", 60, interval_s=0.05, pid=proc.pid)
    assert not res.ready and res.state == "exited"


def test_sd_notify(tmp_path) -> None:
    path = str(tmp_path / "n.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        assert sd_notify("READY=1", {"NOTIFY_SOCKET": path})
        assert sock.recv(100) == b"READY=1"
    assert not sd_notify("READY=1", {})
    assert not sd_notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "absent.sock")})
