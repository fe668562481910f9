"""Kubernetes: the node marked by what the checks found (``k26-doctor kube-node``).

Two conventions a cluster already has, both driven by the same verdict (``node_mark``):

* node-problem-detector's custom plugin protocol: the program exits 0 (OK), 1 (NonOK: the problem is there) or
  anything else (Unknown), and its standard output, trimmed and cut at ``max_output_length`` bytes (80), is the
  condition's message: one line, the root cause first (``plugin_line``). ``deploy/kubernetes/k26-doctor-npd.json``
  is the plugin monitor's config.
* ``--mark`` (the DaemonSet): the doctor writes the same through the API itself: a node condition
  (``status.conditions``, strategic merge by ``type``), a taint that moves the server's pod off a broken node
  and a label naming the failing check; both removed once the node's checks pass again. The calls are
  ``KubeApi``'s (``GET`` and ``PATCH`` of ``nodes``, ``PATCH`` of ``nodes/status``): the RBAC ClusterRole in
  ``deploy/kubernetes/k26-doctor-node.yaml`` grants exactly those (``tests/test_fleet_kubernetes.py`` compares).

Only a failure of the node (``@check(failure="node")``) marks it: a failure of the deployment's configuration
is the same on every node (moving the pod would not help), is said in the message, and writes no taint. An
interrupted run (Ctrl-C before every check finished) is no verdict on the node: nothing is written, the one line
says so, and the exit status is 130 (node-problem-detector: Unknown).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import ssl
from dataclasses import dataclass, field
from typing import Any

from doctor.core.decision import decide_node
from doctor.core.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NPD_UNKNOWN, EXIT_OK
from doctor.facts.redaction import redact_text
from doctor.service import http
from doctor.service.fleet import fleet_data, root_causes, split_by_failure

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # the API's syntax of a label value
OK, PROBLEM, UNKNOWN, INTERRUPTED = "ok", "problem", "unknown", "interrupted"
REASONS = {OK: "K26DoctorNodeHealthy", PROBLEM: "K26DoctorNodeFailing", UNKNOWN: "K26DoctorNotJudged"}
CONDITION_STATUS = {OK: "False", PROBLEM: "True", UNKNOWN: "Unknown"}  # the condition names a problem
# An interrupted run is no verdict: nothing is written on the node, and its exit (130, every command's Ctrl-C) is
# node-problem-detector's Unknown as any status but 0 and 1 is.
EXIT = {OK: EXIT_OK, PROBLEM: EXIT_FAILED, UNKNOWN: EXIT_NPD_UNKNOWN, INTERRUPTED: EXIT_INTERRUPTED}


class KubeError(Exception):
    """The API refused or did not answer; the message says which call and why."""


def node_table() -> dict[str, Any]:
    return fleet_data()["kubernetes"]["node"]


def max_output() -> int:
    return int(fleet_data()["kubernetes"]["npd"]["max_output_length"])


@dataclass
class NodeMark:
    """What the run says of the node: ``state`` (ok, problem, unknown, interrupted: no verdict, nothing written),
    the first failing check of the node's own
    (``check``), one line (``message``) and the deployment's configuration failures it does not act on."""

    state: str
    message: str
    check: str | None = None
    configuration: list[str] = field(default_factory=list)


def one_line(text: str, limit: int) -> str:
    """``text`` on one line, redacted, in ASCII (NPD cuts bytes), at most ``limit`` characters."""
    line = " ".join(redact_text(str(text)).split()).encode("ascii", "replace").decode("ascii")
    return line if len(line) <= limit else line[: max(0, limit - 3)].rstrip() + "..."


def node_mark(report: Any, limit: int | None = None) -> NodeMark:
    """The node's state from the run's report (pure), by the one table ``slurm-health`` reads too
    (``doctor.core.decision.decide_node``, checks not judged counted as ``--drain-unjudged`` counts them, since
    Unknown is what node-problem-detector and the condition have for them): a failure of the node's own (its root
    cause first, the others counted), else checks of the node's not judged for want of facts (unknown), else OK;
    the configuration's failures named, never acted on. An interrupted run comes first and is no verdict: the
    node is left as it is."""
    limit = limit or max_output()
    verdict = decide_node(report.results, lambda failed: split_by_failure(report, failed),
                          interrupted=report.outcome.interrupted, strict=bool(report.settings.strict),
                          drain_unjudged=True)
    configuration = verdict.configuration
    config_ids = [cid for cid, _ in root_causes(report, configuration)] if configuration else []
    if verdict.state == "failed":
        causes = root_causes(report, verdict.node)
        more = f" (+{len(causes) - 1} more)" if len(causes) > 1 else ""
        first, summary = causes[0]
        head = f"{first}: "
        return NodeMark(PROBLEM, head + one_line(summary, limit - len(head) - len(more)) + more, first,
                        config_ids)
    if verdict.state == "interrupted":
        return NodeMark(INTERRUPTED, one_line("interrupted before it finished: nothing was changed", limit), None,
                        config_ids)
    if verdict.state == "not_judged":
        why = "not judged: " + ", ".join(r.id for r in verdict.unjudged)
        return NodeMark(UNKNOWN, one_line(why, limit), None, config_ids)
    said = "node healthy" + (f"; config fails {', '.join(config_ids)}" if config_ids else "")
    return NodeMark(OK, one_line(said, limit), None, config_ids)


def plugin_line(verdict: NodeMark) -> tuple[int, str]:
    """node-problem-detector's answer: the exit status and the one line of standard output."""
    return EXIT[verdict.state], verdict.message


# -- the node, as the API has it -----------------------------------------------------------------------------------
def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def label_value(text: str) -> str:
    """``text`` as a label (and taint) value: at most 63 characters of ``[A-Za-z0-9-_.]``, alphanumeric ends."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:63].strip("-_.")
    return value if LABEL_VALUE.match(value) else ""


def condition_patch(verdict: NodeMark, node: dict[str, Any], now: str) -> dict[str, Any]:
    """The ``nodes/status`` strategic merge patch (conditions merge by ``type``): the doctor's condition, its
    transition time kept while its status stays."""
    kind = node_table()["condition"]
    old = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)
    status = CONDITION_STATUS[verdict.state]
    since = old.get("lastTransitionTime") if old and old.get("status") == status and old.get(
        "lastTransitionTime") else now
    return {"status": {"conditions": [{"type": kind, "status": status, "reason": REASONS[verdict.state],
                                       "message": verdict.message, "lastHeartbeatTime": now,
                                       "lastTransitionTime": since}]}}


def node_patch(verdict: NodeMark, node: dict[str, Any], effect: str | None = None) -> dict[str, Any] | None:
    """The ``nodes`` merge patch that sets (a node failure) or removes (the node's checks pass) the doctor's taint
    and label, or None when nothing is to change (an unknown verdict leaves both as they are). The whole taint
    list is written (a merge patch replaces lists), guarded by the node's ``resourceVersion``: another writer's
    taint in between is a conflict, never lost."""
    table = node_table()
    key, label = table["taint_key"], table["label_key"]
    if verdict.state == UNKNOWN:
        return None
    taints = list((node.get("spec") or {}).get("taints") or [])
    labels = (node.get("metadata") or {}).get("labels") or {}
    others = [t for t in taints if t.get("key") != key]
    want_taints, want_label = others, None
    if verdict.state == PROBLEM:
        value = label_value(verdict.check or "")
        mine = {"key": key, "value": value, "effect": effect or table["taint_effect"]}
        kept = next((t for t in taints if t.get("key") == key and t.get("value") == value
                     and t.get("effect") == mine["effect"]), None)
        want_taints, want_label = [*others, kept or mine], value
    if want_taints == taints and labels.get(label) == want_label:
        return None
    return {"metadata": {"resourceVersion": (node.get("metadata") or {}).get("resourceVersion"),
                         "labels": {label: want_label}},
            "spec": {"taints": want_taints}}


# -- the API ---------------------------------------------------------------------------------------------------
@dataclass
class KubeApi:
    """The Kubernetes API as a pod reaches it: its service account's token and CA, each call under a deadline.
    Every call is one ``_call`` with a literal method and path: the RBAC test reads them from this file."""

    base: str
    token: str | None = None
    ca_file: str | None = None
    timeout: float = 10.0

    @classmethod
    def in_cluster(cls, base: str | None = None, token_file: str | None = None, ca_file: str | None = None,
                   timeout: float | None = None) -> KubeApi:
        """The API server of the pod's cluster (``KUBERNETES_SERVICE_HOST``/``_PORT``, the service account's
        token and CA), or the one given; ``KubeError`` when there is none."""
        if not base:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise KubeError("not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST); give --kube-api URL")
            base = f"https://{'[' + host + ']' if ':' in host else host}:{port}"
        token_file = token_file or os.path.join(SERVICE_ACCOUNT, "token")
        token = None
        try:
            from doctor.core.fileio import read_text

            token = read_text(token_file, 64 << 10, "the service account token", errors="replace").strip()
        except OSError as exc:
            if not base.startswith("http://"):
                raise KubeError(f"cannot read the service account token {token_file}: {exc.strerror or exc}") \
                    from None
        ca = ca_file or os.path.join(SERVICE_ACCOUNT, "ca.crt")
        return cls(base.rstrip("/"), token, ca if os.path.exists(ca) else None,
                   float(timeout or node_table()["api_timeout_s"]))

    def _context(self) -> ssl.SSLContext | None:
        if not self.base.startswith("https://"):
            return None
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              content_type: str = "application/json") -> dict[str, Any]:
        heads = {"Accept": "application/json"}
        if self.token:
            heads["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data, heads["Content-Type"] = json.dumps(body).encode(), content_type
        reply = http.request(self.base + path, self.timeout, method=method, body=data, headers=heads,
                             context=self._context())
        if reply.error is not None or reply.status is None:
            raise KubeError(f"{method} {path}: {reply.error or 'no answer'}")
        if reply.status == 409:
            raise Conflict(f"{method} {path}: 409 conflict")
        if not 200 <= reply.status < 300:
            raise KubeError(f"{method} {path}: HTTP {reply.status}: {_api_message(reply.body)}")
        try:
            return json.loads(reply.body or b"{}")
        except ValueError:
            raise KubeError(f"{method} {path}: the answer is not JSON") from None

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/nodes/{name}")

    def patch_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", f"/api/v1/nodes/{name}", body, "application/merge-patch+json")

    def patch_node_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", f"/api/v1/nodes/{name}/status", body, "application/strategic-merge-patch+json")


class Conflict(KubeError):
    """The node changed between the read and the write (its ``resourceVersion``)."""


def _api_message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("message") or "")[:300]
    except (ValueError, AttributeError):
        return body[:300].decode("utf-8", "replace")


def mark(api: KubeApi, name: str, verdict: NodeMark, effect: str | None = None) -> list[str]:
    """Write the verdict on the node: its condition always, the taint and label when they change (one retry
    after a conflict, on the node read again). Returns what was done, one line each; ``KubeError`` on failure. An
    interrupted run's verdict writes nothing: the node is left as it is."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name or ""):
        raise KubeError(f"{name!r} is not a node name (give --node, or NODE_NAME from the downward API)")
    if verdict.state == INTERRUPTED:
        return []
    done = []
    for attempt in (1, 2):
        node = api.get_node(name)
        patch = node_patch(verdict, node, effect)
        if patch is None:
            break
        try:
            api.patch_node(name, patch)
        except Conflict:
            if attempt == 2:
                raise
            continue
        table = node_table()
        done.append(f"{name}: taint {table['taint_key']}={patch['metadata']['labels'][table['label_key']]}:"
                    f"{effect or table['taint_effect']} set" if verdict.state == PROBLEM
                    else f"{name}: taint {table['taint_key']} and its label removed")
        break
    api.patch_node_status(name, condition_patch(verdict, node, now_rfc3339()))
    done.append(f"{name}: condition {node_table()['condition']}={CONDITION_STATUS[verdict.state]}: {verdict.message}")
    return done
