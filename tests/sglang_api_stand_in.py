"""A stand-in for a running SGLang server's HTTP API, for the failures a real server cannot be made to show
here (no GPU): a drafter that never matches (accept length 1.0), internal errors (HTTP 500), a server that
stops answering (timeouts), one still warming up (503). The shapes of the answers are SGLang 0.5.23's
(``entrypoints/http_server.py``, ``managers/tokenizer_manager.py`` ``meta_info`` with ``spec_verify_ct``,
``observability/metrics_collector.py`` ``sglang:spec_accept_length``). A real HTTP server on a real socket.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ApiStandIn:
    """``behaviour``: ``mismatch`` (every verify commits one token), ``error500`` (/generate fails),
    ``slow`` (/generate answers after ``delay_s``), ``starting`` (/health 503)."""

    def __init__(self, behaviour: str, *, delay_s: float = 30.0, algorithm: str | None = "DDTREE",
                 skip_tokenizer_init: bool = False, metrics: bool = True) -> None:
        self.behaviour, self.delay_s, self.algorithm = behaviour, delay_s, algorithm
        self.skip_tokenizer_init, self.metrics = skip_tokenizer_init, metrics
        self.seen: list[tuple[str, str, Any]] = []
        self._stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self) -> None:
                owner.seen.append(("GET", self.path, None))
                if self.path == "/health":
                    if owner.behaviour == "starting":
                        return self._send(503, {"detail": "not ready"})
                    return self._send(200, "", "text/plain")
                if self.path == "/server_info":
                    return self._send(200, {"speculative_algorithm": owner.algorithm, "tp_size": 1,
                                            "skip_tokenizer_init": owner.skip_tokenizer_init,
                                            "speculative_num_draft_tokens": 17, "version": "0.5.23"})
                if self.path == "/v1/models":
                    return self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
                if self.path == "/metrics":
                    if not owner.metrics:
                        return self._send(404, {"detail": "Not Found"})
                    return self._send(200, '# HELP sglang:spec_accept_length The average acceptance length.\n'
                                           '# TYPE sglang:spec_accept_length gauge\n'
                                           'sglang:spec_accept_length{model_name="tiny"} 1.0\n', "text/plain")
                return self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(n) or b"{}")
                except ValueError:
                    body = None
                owner.seen.append(("POST", self.path, body))
                if self.path in ("/v1/chat/completions", "/v1/completions"):
                    if owner.skip_tokenizer_init:
                        return self._send(400, {"object": "error", "message": "no tokenizer", "code": 400})
                    usage = {"prompt_tokens": 7, "completion_tokens": body.get("max_tokens", 8), "total_tokens": 15}
                    choice = ({"index": 0, "message": {"role": "assistant", "content": "Paris"}}
                              if "chat" in self.path else {"index": 0, "text": "Paris"})
                    return self._send(200, {"id": "x", "object": "chat.completion", "choices": [choice],
                                            "usage": usage})
                if self.path == "/generate":
                    if owner.behaviour == "error500":
                        return self._send(500, "Internal Server Error", "text/plain")
                    if owner.behaviour == "slow":
                        owner._stop.wait(owner.delay_s)
                    if owner.skip_tokenizer_init and "input_ids" not in (body or {}):
                        return self._send(400, {"error": {"message": "input_ids required", "code": 400}})
                    ct = int(((body or {}).get("sampling_params") or {}).get("max_new_tokens", 16))
                    meta: dict[str, Any] = {"prompt_tokens": 16, "completion_tokens": ct, "e2e_latency": 0.01}
                    if owner.algorithm:
                        # Mismatch: the first token comes from prefill, every verify commits one more.
                        meta.update(spec_verify_ct=ct - 1, spec_accept_length=ct / (ct - 1),
                                    spec_num_correct_drafts=0, spec_accept_rate=0.0)
                    out = {"output_ids": list(range(ct))} if owner.skip_tokenizer_init else {"text": "x" * ct}
                    return self._send(200, {**out, "meta_info": meta})
                return self._send(404, {"detail": "Not Found"})

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self) -> ApiStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        time.sleep(0.01)
