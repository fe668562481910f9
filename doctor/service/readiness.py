"""Waiting until a starting SGLang server answers ready, and telling systemd when it does.

SGLang refuses connections while it loads weights (the HTTP server starts last), then answers
``GET /health`` with 503 while its status is Starting (until the warm-up request has run), then 200;
in 0.5.23 a ready server's /health runs a one-token generation first, which may take up to
``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s), so a poll waits that long for its answer. ``wait_ready`` polls through
those states with a deadline, shows progress on a terminal, and gives up early when the server
process has died (no point waiting 30 minutes for a crashed start).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from doctor.core.fileio import open_regular
from doctor.service import http

READY, STARTING, REFUSED, UNREACHABLE, BAD = "ready", "starting", "refused", "unreachable", "unexpected"
POLL_TIMEOUT_S = 25.0  # SGLang's health generation answers within SGLANG_HEALTH_CHECK_TIMEOUT (20 s)
_DESCRIBE = {
    REFUSED: "not listening yet (loading weights)",
    STARTING: "up, not ready (warming up)",
    UNREACHABLE: "no answer",
    BAD: "unexpected answer",
    READY: "ready",
}


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be polled (an invalid invocation), or None: http(s), a host, a valid port."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "is not an http:// or https:// URL (e.g. http://127.0.0.1:30000/health)"
    if not parts.hostname:
        return "has no host (e.g. http://127.0.0.1:30000/health)"
    if port is not None and not 0 < port < 65536:
        return f"has an invalid port {port}"
    return None


def health_url(host: str, port: int, path: str = "/health") -> str:
    """The URL to poll: a wildcard bind address is reached on loopback."""
    if host in ("", "0.0.0.0", "*"):
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}{path if path.startswith('/') else '/' + path}"


@dataclass
class Probe:
    state: str
    detail: str = ""
    http_status: int | None = None


def probe(url: str, timeout: float = 5.0) -> Probe:
    """One poll, bounded as a whole by ``timeout`` (a server that drips or never ends its answer included:
    ``doctor.service.http``). Never raises for network conditions."""
    reply = http.request(url, timeout, limit=4096)
    if reply.kind == http.REFUSED:
        return Probe(REFUSED, "connection refused")
    if reply.kind == http.TIMEOUT:
        return Probe(UNREACHABLE, "timed out")
    if reply.status is None:  # reset or closed mid-answer: the server is coming up or going down
        return Probe(UNREACHABLE, reply.error or "no answer")
    if reply.status == 200 and reply.error is None:
        return Probe(READY, "HTTP 200", 200)
    if reply.status in (502, 503, 504):
        return Probe(STARTING, f"HTTP {reply.status}", reply.status)
    return Probe(BAD, f"HTTP {reply.status}" + (f" ({reply.error})" if reply.error else ""), reply.status)


@dataclass
class ReadyOutcome:
    ready: bool
    state: str
    elapsed_s: float
    polls: int
    reason: str
    exit_code: int | None = None  # the server's, when it died while we waited


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts); 0 and negative ids name groups, not a process."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass
    try:  # a zombie has exited: only its parent has not collected its status yet
        with open_regular(f"/proc/{pid}/stat") as fh:
            return fh.read(1 << 16).rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def wait_ready(url: str, timeout_s: float, *, interval_s: float = 2.0,
               exited: Callable[[], int | None] | None = None, pid: int | None = None,
               progress: IO[str] | None = None, notify: Callable[[str], None] | None = None,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
               ) -> ReadyOutcome:
    """Poll ``url`` until HTTP 200, the deadline, or the server's death.

    ``exited()`` returns the server's exit code once it is gone (``Popen.poll``); ``pid`` is the
    alternative for a process we did not start. ``progress``: a terminal gets one rewritten status
    line, anything else a line per state change. ``notify(status)``: e.g. systemd STATUS=.
    """
    start = clock()
    shown = http.shown_url(url)  # never the URL's credentials in a progress line
    tty = bool(progress is not None and hasattr(progress, "isatty") and progress.isatty())
    last_state = None
    polls = 0
    state = UNREACHABLE
    detail = ""
    while True:
        code = exited() if exited is not None else None
        if code is not None:
            _finish(progress, tty)
            return ReadyOutcome(False, "exited", clock() - start, polls,
                                f"the server exited (status {code}) before it was ready", code)
        if pid is not None and not alive(pid):  # not our child: its exit status is its parent's to see
            _finish(progress, tty)
            return ReadyOutcome(False, "exited", clock() - start, polls,
                                f"the server process {pid} exited before it was ready (its exit status is known "
                                "only to its parent: see its log or `journalctl`)")
        remaining = timeout_s - (clock() - start)
        result = probe(url, timeout=max(0.5, min(POLL_TIMEOUT_S, remaining)))
        polls += 1
        state, detail = result.state, result.detail
        elapsed = clock() - start
        if state == READY:
            _show(progress, tty, f"{shown}: ready after {elapsed:.0f}s", final=True)
            return ReadyOutcome(True, READY, elapsed, polls, f"{shown} answered 200 after {elapsed:.1f}s")
        line = f"waiting for {shown}: {_DESCRIBE.get(state, state)} ({detail}) {elapsed:.0f}s / {timeout_s:.0f}s"
        if tty or state != last_state:
            _show(progress, tty, line)
            if notify is not None and state != last_state:
                notify(_DESCRIBE.get(state, state))
        last_state = state
        if elapsed >= timeout_s:
            _finish(progress, tty)
            return ReadyOutcome(False, state, elapsed, polls,
                                f"not ready after {timeout_s:.0f}s: last answer {detail or state}")
        sleep(max(0.0, min(interval_s, timeout_s - elapsed)))


def _show(stream: IO[str] | None, tty: bool, line: str, final: bool = False) -> None:
    if stream is None:
        return
    if tty:
        stream.write("\r\033[K" + line + ("\n" if final else ""))
    else:
        stream.write(line + "\n")
    stream.flush()


def _finish(stream: IO[str] | None, tty: bool) -> None:
    if stream is not None and tty:
        stream.write("\n")
        stream.flush()


def sd_notify(message: str, environ: dict[str, str] | None = None) -> bool:
    """Send ``message`` (e.g. ``READY=1``) to systemd's ``NOTIFY_SOCKET``; False when not under systemd."""
    path = (os.environ if environ is None else environ).get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode("utf-8"))
    except OSError:
        return False
    return True
