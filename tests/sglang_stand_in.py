"""A stand-in for an SGLang server while it starts (SGLang itself cannot run here: no GPU).

It behaves as SGLang does on the wire: the port refuses connections while "weights load"
(``refuse_s``), then ``GET /health`` answers 503 while "warming up" (``warm_s``), then 200.
Importable (``StandIn``, a thread) and runnable as a script (a child process, like the server).
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandIn:
    def __init__(self, port: int, refuse_s: float = 0.5, warm_s: float = 0.5, host: str = "127.0.0.1",
                 warm_polls: int = 0) -> None:
        """``warm_polls``: answer 503 to at least that many health polls too, however late the first one comes
        (a client that starts slowly on a loaded machine still sees the warm-up)."""
        self.port, self.refuse_s, self.warm_s, self.host = port, refuse_s, warm_s, host
        self.warm_polls = warm_polls
        self.server: ThreadingHTTPServer | None = None
        self.listening_at: float | None = None
        self.listening = threading.Event()  # set once the port accepts connections
        self.polls: list[int] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = threading.Event()
        self._open = threading.Event()

    def start(self) -> StandIn:
        self._thread.start()
        return self

    def open(self) -> None:
        """Listen now, whatever is left of ``refuse_s``: a test that has seen the refusal moves the start on
        (a loaded machine never turns the phases into a race)."""
        self._open.set()

    def _run(self) -> None:
        until = time.monotonic() + self.refuse_s
        while not self._open.is_set() and time.monotonic() < until:
            if self._stop.wait(min(0.01, max(0.0, until - time.monotonic()))):
                return
        if self._stop.is_set():
            return
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/health":
                    code = 404
                elif (time.monotonic() - (owner.listening_at or 0) < owner.warm_s
                      or owner.polls.count(503) < owner.warm_polls):
                    code = 503
                else:
                    code = 200
                owner.polls.append(code)
                body = b"" if code == 200 else b'{"detail":"not ready"}'
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((self.host, self.port), Handler)
        self.listening_at = time.monotonic()
        self.listening.set()
        self.server.serve_forever(poll_interval=0.05)

    def stop(self) -> None:
        self._stop.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def main() -> int:
    # It is started with SGLang's whole argv (as the real server would be): take what it knows.
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--refuse", type=float, default=0.5)
    ap.add_argument("--warm", type=float, default=0.5)
    ap.add_argument("--serve-for", type=float, default=1.0, help="seconds after ready, then exit")
    ap.add_argument("--exit-code", type=int, default=0)
    ap.add_argument("--die-after", type=float, default=None, help="exit before listening (a crashed start)")
    args, _ = ap.parse_known_args()
    if args.die_after is not None:
        time.sleep(args.die_after)
        print("RuntimeError: stand-in crashed while loading", file=sys.stderr)
        return args.exit_code
    srv = StandIn(args.port, args.refuse, args.warm).start()
    deadline = time.monotonic() + args.refuse + args.warm + args.serve_for + 30
    while time.monotonic() < deadline:
        if srv.listening_at and time.monotonic() - srv.listening_at > args.warm + args.serve_for:
            break
        time.sleep(0.05)
    srv.stop()
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
