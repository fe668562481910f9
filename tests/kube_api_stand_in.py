"""A stand-in for the Kubernetes API at the wire level only, on 127.0.0.1: one Node, ``GET`` of it, a JSON merge
patch of it (RFC 7386, refused with 409 when ``metadata.resourceVersion`` is not the node's), a strategic merge
patch of its status (``status.conditions`` merged by ``type``, as the API's NodeStatus declares). Every request is
recorded (method, path, headers, body) for the tests to hold against the client's models and the RBAC role.

It implements only what the tests need of the API's behaviour; what the objects may hold is checked elsewhere,
with the official client's models and the published OpenAPI schemas (``kubernetes-validate``)."""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def node(name: str, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "100", "labels": {"kubernetes.io/hostname": name}},
            "spec": {"taints": list(taints or [])},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status",
                                       "lastHeartbeatTime": "2026-12-01T00:00:00Z",
                                       "lastTransitionTime": "2026-12-01T00:00:00Z"}]}}


class StandIn:
    """``with StandIn(node(...)) as api: api.url``; ``api.requests``, ``api.node``. ``interfere``: a function run
    once, on the next node patch, before it is applied (another writer changing the node in between)."""

    def __init__(self, obj: dict[str, Any], token: str = "t0ken") -> None:
        self.node = obj
        self.token = token
        self.requests: list[dict[str, Any]] = []
        self.interfere: Any = None
        self._lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _serve(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size) if size else b""
                body = json.loads(raw) if raw else None
                with stand_in._lock:
                    stand_in.requests.append({"method": self.command, "path": self.path,
                                              "headers": dict(self.headers), "body": body})
                    code, answer = stand_in.handle(self.command, self.path, self.headers, body)
                self._answer(code, answer)

            do_GET = do_PATCH = do_PUT = do_POST = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def handle(self, method: str, path: str, headers: Any, body: Any) -> tuple[int, dict[str, Any]]:
        name = self.node["metadata"]["name"]
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"kind": "Status", "message": "Unauthorized"}
        if path == f"/api/v1/nodes/{name}" and method == "GET":
            return 200, self.node
        if path == f"/api/v1/nodes/{name}" and method == "PATCH":
            if headers.get("Content-Type") != "application/merge-patch+json":
                return 415, {"message": f"unsupported media type {headers.get('Content-Type')}"}
            if self.interfere is not None:
                self.interfere, step = None, self.interfere
                step(self.node)
                self._bump()
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want is not None and want != self.node["metadata"]["resourceVersion"]:
                return 409, {"kind": "Status", "reason": "Conflict", "message": "the object has been modified"}
            patched = merge_patch(self.node, body)
            patched["metadata"]["resourceVersion"] = self.node["metadata"]["resourceVersion"]
            self.node = patched
            self._bump()
            return 200, self.node
        if path == f"/api/v1/nodes/{name}/status" and method == "PATCH":
            if headers.get("Content-Type") != "application/strategic-merge-patch+json":
                return 415, {"message": f"unsupported media type {headers.get('Content-Type')}"}
            conditions = {c["type"]: c for c in self.node["status"].get("conditions", [])}
            for cond in (body.get("status") or {}).get("conditions", []):
                conditions[cond["type"]] = {**conditions.get(cond["type"], {}), **cond}
            self.node["status"]["conditions"] = list(conditions.values())
            self._bump()
            return 200, self.node
        return 404, {"kind": "Status", "message": f"no route {method} {path}"}

    def _bump(self) -> None:
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)

    def condition(self, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.node["status"]["conditions"] if c["type"] == kind), None)

    def __enter__(self) -> StandIn:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
