"""What the hostile-input tests share: a small real model to plant bad files in, a service interpreter that
hangs (and says which processes it left), and real HTTP servers on 127.0.0.1 that misbehave in bounded ways.

Everything here is real: FIFOs made with ``os.mkfifo``, symlink loops, a shell script as ``--python`` that
blocks in ``sleep``, a ``ThreadingHTTPServer`` whose handlers drip bytes or never end a body; every server
stops by itself (a handler ends after ``MAX_HANDLER_S``) and when its context exits.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from model_replica import K26Spec, build_k26_replica

MAX_HANDLER_S = 20.0


def small_model(dest: Path) -> Path:
    """The K2.6 layout at unit-test scale (4 shards, tokenizer and remote code files), real headers."""
    build_k26_replica(str(dest), K26Spec.small())
    return dest


def model_with(base: Path, dest: Path, **planted: str) -> Path:
    """A model directory of symlinks to ``base``'s files, with ``planted`` files replaced: ``fifo``, ``dir``,
    ``loop`` (a symlink loop), ``dangling`` (a link to nothing) or ``absent`` (left for the test to write)."""
    dest.mkdir()
    for entry in base.iterdir():
        if entry.name not in planted:
            (dest / entry.name).symlink_to(entry)
    for name, kind in planted.items():
        path = dest / name
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dir":
            path.mkdir()
        elif kind == "loop":
            path.symlink_to(dest / (name + ".loop"))
            (dest / (name + ".loop")).symlink_to(path)
        elif kind == "dangling":
            path.symlink_to(dest / "nowhere")
        elif kind != "absent":
            raise ValueError(kind)
    return dest


def hung_python(where: Path) -> tuple[Path, Path]:
    """A ``--python`` that never answers (it execs ``sleep``), recording each process id it ran as."""
    pids = where / "hung.pids"
    script = where / "hung-python"
    script.write_text(f"#!/bin/sh\necho $$ >> '{pids}'\nexec sleep 600\n")
    script.chmod(0o755)
    return script, pids


def running(pid_file: Path) -> list[int]:
    """The processes of ``pid_file`` still alive (zombies count as gone)."""
    if not pid_file.exists():
        return []
    alive = []
    for word in pid_file.read_text().split():
        try:
            state = Path(f"/proc/{word}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(int(word))
    return alive


def kill_left(pid_file: Path) -> None:
    """Kill what a failing test left running (by the ids it recorded), so the suite goes on clean."""
    import signal

    for pid in running(pid_file):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_for(predicate, timeout: float = 30.0, step: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextlib.contextmanager
def misbehaving_server(mode: str) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a server that answers every GET/POST by ``mode``:

    ``drip``: a 200 with ``Content-Length: 100000`` whose body comes one byte every 0.2 s;
    ``endless``: a chunked 200 that never sends its last chunk;
    ``slow-headers``: the status line, then a header line every 0.2 s, never the blank line.
    """
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args: object) -> None:  # quiet
            pass

        def _answer(self) -> None:
            end = time.monotonic() + MAX_HANDLER_S
            try:
                if mode == "slow-headers":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    while not stop.is_set() and time.monotonic() < end:
                        self.wfile.write(b"X-Slow: 1\r\n")
                        self.wfile.flush()
                        time.sleep(0.2)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if mode == "drip":
                    self.send_header("Content-Length", "100000")
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while not stop.is_set() and time.monotonic() < end:
                    self.wfile.write(b" " if mode == "drip" else b"1\r\n \r\n")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:  # the client went away: what a bounded client does
                pass

        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self._answer()

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def raw_server(payload: bytes) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a server that reads a request and answers every one with ``payload``, byte for
    byte (a status line and headers of its own, or none: whatever a hostile server sends), then closes."""
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    head = b""
                    while b"\r\n\r\n" not in head and len(head) < 65536:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        head += chunk
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":", 1)[1])
                    body = head.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in head else b""
                    while len(body) < length:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        body += chunk
                    conn.sendall(payload)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def http_answer(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    """A complete HTTP/1.1 answer (``status`` such as ``"500 Internal Server Error"``) with ``body``."""
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def cli_run(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> tuple[int, str, str]:
    """``k26-doctor ARGS`` in this process (``doctor.cli.run_cli``: the redacting streams, the exit code), its
    stdout and stderr captured by click's runner: for the many runs a property test makes."""
    from click.testing import CliRunner

    from doctor.cli import run_cli

    runner = CliRunner()
    with runner.isolation(input=stdin, env={"NO_COLOR": "1", "K26_DOCTOR_CONFIG": None, "COLUMNS": "100",
                                            **(env or {})}) as (out, err, _):
        code = run_cli(list(args))
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        return code, out.getvalue().decode("utf-8", "replace"), err.getvalue().decode("utf-8", "replace")
