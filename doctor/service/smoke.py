"""``k26-doctor smoke``: after the start, a few real requests against the running server, judged.

A server that answers ``/health`` can still serve nothing useful: a drafter that does not match the target
makes every speculative step verify one token (accept length ~1.0: slower than no speculation, silently), a
broken chat template fails every chat completion, a stuck scheduler times out. In bounded time (one deadline
for everything) this sends, against SGLang 0.5.23's HTTP API:

* ``GET /health``, ``GET /server_info`` (the resolved server arguments: the speculative algorithm,
  ``skip_tokenizer_init``; ``/get_server_info`` on older releases), ``GET /v1/models``;
* ``POST /v1/chat/completions`` and ``POST /v1/completions`` (the OpenAI-compatible API), unless the server
  runs ``--skip-tokenizer-init`` (it has no tokenizer to apply a chat template with);
* ``POST /generate`` a few times, greedy, with ``text`` (or ``input_ids`` under ``--skip-tokenizer-init``);
* ``GET /metrics`` when the server exports it (``sglang:spec_accept_length``).

The accept length is SGLang's own: ``completion_tokens / spec_verify_ct`` from each ``/generate`` answer's
``meta_info`` (tokens committed per target verify pass, the bonus token included), summed over the requests.
Verdicts: ``fail`` for an unreachable or unready server, any HTTP error or timeout, a speculative server
whose accept length is below ``fail_below`` (the drafter does not match the target); ``warn`` below
``warn_below`` or when the speculative counters are missing; else ``pass``. The status and the exit code come
from the table every run is decided by (``doctor.core.decision``), as ``check``'s.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from doctor.core.decision import Decision, decide
from doctor.core.printable import printable
from doctor.core.result import Findings, Result, Severity
from doctor.service import http

PROMPTS = ("The capital of France is", "Write a Python function that returns the sum of a list.",
           "List three prime numbers greater than ten.", "Explain in one sentence what a hash table is.")
DEFAULT_INPUT_IDS = tuple(range(5, 21))  # small ids: valid in any vocabulary the smoke meets (the tiny one: 64)
METRIC = re.compile(r"^sglang:spec_accept_length(?:\{[^}]*\})?\s+([0-9.eE+-]+|NaN)\s*$", re.M)


@dataclass
class SmokeOptions:
    base_url: str
    timeout_s: float = 60.0
    requests: int = 3
    max_tokens: int = 64
    api_key: str | None = None
    fail_below: float = 1.1
    warn_below: float | None = None
    input_ids: tuple[int, ...] = DEFAULT_INPUT_IDS


@dataclass
class Call:
    """One HTTP exchange: what was asked, what came back, how long it took."""

    method: str
    path: str
    status: int | None = None
    seconds: float = 0.0
    body: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    def describe(self) -> str:
        if self.error:
            return f"{self.method} {self.path}: {self.error}"
        return f"{self.method} {self.path}: HTTP {self.status}{': ' + _error_text(self.body) if not self.ok else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "status": self.status, "seconds": round(self.seconds, 3),
                "error": self.error or (None if self.ok else _error_text(self.body))}


def _error_text(body: Any) -> str:
    """What a failed call's body says, on one line, escaped: the server's words, never its control characters."""
    return printable(_body_text(body))


def _body_text(body: Any) -> str:
    """SGLang's error bodies: {"error": {"message": ...}}, OpenAI's {"object": "error", "message": ...},
    FastAPI's {"detail": ...}, or text."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])[:300]
        return json.dumps(body)[:300]
    return str(body or "")[:300]


class Deadline:
    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.end = clock() + seconds

    def left(self) -> float:
        return self.end - self.clock()


class Client:
    """JSON over HTTP with the remaining time as every call's timeout; never raises for network conditions."""

    def __init__(self, base_url: str, deadline: Deadline, api_key: str | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.deadline = deadline
        self.api_key = api_key
        self.calls: list[Call] = []

    def request(self, method: str, path: str, payload: Any = None, *, raw: bool = False) -> Call:
        call = Call(method, path)
        self.calls.append(call)
        left = self.deadline.left()
        if left <= 0:
            call.error = "not sent: the smoke's deadline had passed"
            return call
        headers = {"Accept": "application/json"}
        data = None
        if payload is not None:
            data = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        reply = http.request(self.base + path, max(0.1, left), method=method, body=data, headers=headers)
        call.status, call.seconds = reply.status, reply.seconds
        text = reply.body.decode("utf-8", errors="replace")
        if reply.kind == http.REFUSED:
            call.error = "connection refused (is the server running and listening on this port?)"
        elif reply.error:  # timed out (a server that drips or never ends its answer too), reset, too large
            call.error = reply.error
        if raw:
            call.body = text
        else:
            try:
                call.body = json.loads(text) if text else None
            except ValueError:
                call.body = text[:500]
                if call.status == 200:
                    call.error = "the answer is not JSON"
        return call


@dataclass
class SmokeReport:
    """What the requests showed. ``found`` holds the findings (``fail`` problems, ``warn`` warnings, ``info``
    notes); the status follows from them as a check's does (core.result)."""

    summary: str
    url: str
    found: Findings = field(default_factory=Findings)
    speculative: str | None = None
    accept_length: float | None = None
    accept_length_metrics: float | None = None
    completion_tokens: int = 0
    verify_ct: int = 0
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    seconds: float = 0.0

    def result(self) -> Result:
        """The smoke as one check's result, by the table every check's findings go through (``Result.of``). A
        smoke with nothing to remark (every request answered, no speculation to measure) passed: for a check no
        finding is a bug, for the smoke it is the quiet success."""
        res = Result.of(self.found) if self.found else Result.passed(self.summary)
        res.id = "smoke"
        return res

    def decision(self, strict: bool = False) -> Decision:
        """Status and exit code from the run's one table (``doctor.core.decision.decide``), as ``check``'s:
        a failure exits 1, a warning too under ``--strict``."""
        return decide([self.result()], strict=strict)

    @property
    def status(self) -> str:
        """pass | warn | fail, as reported (``--strict`` changes the exit code, not the status shown)."""
        return self.decision().status.value

    @property
    def problems(self) -> list[str]:
        return [f.message for f in self.found.of(Severity.FAIL)]

    @property
    def warnings(self) -> list[str]:
        return [f.message for f in self.found.of(Severity.WARN)]

    @property
    def notes(self) -> list[str]:
        return [f.message for f in self.found.of(Severity.INFO)]

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "summary": self.summary, "url": self.url, "problems": self.problems,
                "warnings": self.warnings, "notes": self.notes, "speculative_algorithm": self.speculative,
                "accept_length": self.accept_length, "accept_length_metrics": self.accept_length_metrics,
                "completion_tokens": self.completion_tokens, "spec_verify_ct": self.verify_ct,
                "latency": self.latency, "calls": [c.to_dict() for c in self.calls],
                "duration_s": round(self.seconds, 3)}


def speculative_algorithm(info: Any) -> str | None:
    """The algorithm a /server_info answer reports (None: no speculation or unknown)."""
    if not isinstance(info, dict):
        return None
    algo = info.get("speculative_algorithm")
    return str(algo).upper() if algo not in (None, "", "None", "NONE") else None


def metrics_accept_length(text: str) -> float | None:
    """``sglang:spec_accept_length`` from Prometheus text (the last sample; NaN and absence are None)."""
    vals = [float(v) for v in METRIC.findall(text or "") if v != "NaN"]
    vals = [v for v in vals if math.isfinite(v)]
    return vals[-1] if vals else None


def accept_length(generate_calls: list[Call]) -> tuple[float | None, int, int]:
    """(completion_tokens / spec_verify_ct over the answers that report both, tokens, verify passes)."""
    tokens = verify = 0
    for call in generate_calls:
        meta = call.body.get("meta_info") if call.ok and isinstance(call.body, dict) else None
        if not isinstance(meta, dict):
            continue
        ct, vc = meta.get("completion_tokens"), meta.get("spec_verify_ct")
        if isinstance(ct, int) and isinstance(vc, int) and vc > 0:
            tokens += ct
            verify += vc
    return (tokens / verify if verify else None), tokens, verify


def _latency(calls: list[Call]) -> dict[str, float]:
    secs = sorted(c.seconds for c in calls if c.ok)
    if not secs:
        return {}
    return {"n": len(secs), "p50_s": round(secs[len(secs) // 2], 3), "max_s": round(secs[-1], 3)}


def _completion_tokens(call: Call) -> int | None:
    body = call.body if isinstance(call.body, dict) else {}
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    ct = usage.get("completion_tokens")
    return ct if isinstance(ct, int) else None


def _summary(found: Findings, calls: list[Call], spec: str | None, acc: float | None,
             latency: dict[str, dict[str, float]]) -> str:
    """The report's one line: the first problem (and how many more) when any failed, else what was answered
    and measured, with the first warning: what a person scanning a fleet's smoke logs needs first."""
    problems, warnings = [f.message for f in found.of(Severity.FAIL)], [f.message for f in found.of(Severity.WARN)]
    if problems:
        return problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
    gen = latency.get("generate", {})
    parts = [f"{len([c for c in calls if c.ok])} requests answered"]
    if acc is not None:
        parts.append(f"accept length {acc:.2f} ({spec})")
    if gen:
        parts.append(f"/generate p50 {gen['p50_s']:.2f}s")
    return ", ".join(parts) + (f"; {warnings[0]}" if warnings else "")


def _server_info(client: Client, found: Findings) -> dict[str, Any] | None:
    """The resolved server arguments (``/server_info``, ``/get_server_info`` on older releases), or None with a
    note: without them speculation is judged from the answers alone, which is weaker but not a failure."""
    info_call = client.request("GET", "/server_info")
    if info_call.status == 404:
        info_call = client.request("GET", "/get_server_info")
    info = info_call.body if info_call.ok and isinstance(info_call.body, dict) else None
    if info is None:
        found.info("smoke.server_info",
                   f"server arguments unknown ({info_call.describe()}): speculation judged from the answers")
    return info


def _model_id(client: Client, found: Findings) -> str | None:
    """The first model ``/v1/models`` lists (the name the OpenAI calls must send); a failed listing fails."""
    models = client.request("GET", "/v1/models")
    listed = models.body.get("data") if models.ok and isinstance(models.body, dict) else None
    if isinstance(listed, list) and listed:
        first = listed[0]
        return first.get("id") if isinstance(first, dict) else None
    if not models.ok:
        found.fail("smoke.http", models.describe())
    return None


def _openai_calls(client: Client, found: Findings, model_id: str | None, max_tokens: int) -> list[Call]:
    """One chat and one plain completion through the OpenAI-compatible API, judged: the path most clients use,
    and the one a broken chat template breaks while ``/generate`` still works."""
    chat = client.request("POST", "/v1/chat/completions", {
        "model": model_id or "default", "messages": [{"role": "user", "content": PROMPTS[0]}],
        "max_tokens": max_tokens, "temperature": 0})
    comp = client.request("POST", "/v1/completions", {
        "model": model_id or "default", "prompt": PROMPTS[1], "max_tokens": max_tokens, "temperature": 0})
    calls = [chat, comp]
    for call in calls:
        if not call.ok:
            found.fail("smoke.http", call.describe())
        elif not isinstance(call.body, dict) or not call.body.get("choices"):
            found.fail("smoke.no_choices", f"{call.method} {call.path}: HTTP 200 without choices")
        elif not _completion_tokens(call):
            found.warn("smoke.no_tokens", f"{call.path} generated no tokens")
    return calls


def _generate_payload(opts: SmokeOptions, i: int, skip_tok: bool) -> dict[str, Any]:
    """The i-th greedy ``/generate`` request: a prompt as text, or rotated token ids when the server has no
    tokenizer (``--skip-tokenizer-init``), so that successive requests are not one cached prefix."""
    payload: dict[str, Any] = {"sampling_params": {"max_new_tokens": opts.max_tokens, "temperature": 0,
                                                   "ignore_eos": True}}
    if skip_tok:
        k = i % len(opts.input_ids)
        payload["input_ids"] = list(opts.input_ids[k:] + opts.input_ids[:k])
    else:
        payload["text"] = PROMPTS[i % len(PROMPTS)]
    return payload


def _generate_calls(client: Client, found: Findings, opts: SmokeOptions, skip_tok: bool) -> list[Call]:
    """``opts.requests`` (at least one) ``/generate`` calls, each failure a problem; a timeout or a dead
    connection stops them, since the rest would only wait as long."""
    calls: list[Call] = []
    for i in range(max(1, opts.requests)):
        call = client.request("POST", "/generate", _generate_payload(opts, i, skip_tok))
        calls.append(call)
        if not call.ok:
            found.fail("smoke.http", call.describe())
            if call.error:
                break
    return calls


def _judge_accept_length(found: Findings, opts: SmokeOptions, spec: str, acc: float | None, tokens: int) -> None:
    """A speculative server's accept length against the thresholds: near 1.0 means the drafter does not match
    the target (every step verifies one token: slower than no speculation, silently)."""
    if acc is None:
        found.warn("smoke.no_counters", f"{spec}: the answers carry no speculative counters "
                   "(meta_info.spec_verify_ct): accept length unknown")
    elif acc < opts.fail_below:
        found.fail("smoke.accept_length",
                   f"{spec} accept length {acc:.2f} over {tokens} tokens: the drafter's tokens are "
                   "(almost) never accepted: it does not match the target (a drafter trained for "
                   "another model or revision, a wrong --speculative-draft-model-path, mask token or "
                   "target layers)")
    elif opts.warn_below is not None and acc < opts.warn_below:
        found.warn("smoke.accept_length",
                   f"{spec} accept length {acc:.2f} is below the expected {opts.warn_below:g}")


def run_smoke(opts: SmokeOptions, clock: Callable[[], float] = time.monotonic) -> SmokeReport:
    """Every step against ``opts.base_url`` within ``opts.timeout_s``; the verdict (never raises)."""
    t0 = clock()
    client = Client(opts.base_url, Deadline(opts.timeout_s, clock), opts.api_key)
    found = Findings()

    def finish(spec: str | None = None, acc: float | None = None, acc_m: float | None = None, tokens: int = 0,
               verify: int = 0, latency: dict[str, dict[str, float]] | None = None) -> SmokeReport:
        summary = _summary(found, client.calls, spec, acc, latency or {})
        return SmokeReport(summary, http.shown_url(opts.base_url), found, spec, acc, acc_m, tokens, verify,
                           latency or {}, client.calls, clock() - t0)

    health = client.request("GET", "/health", raw=True)
    if not health.ok:
        found.fail("smoke.unready", f"the server is not ready: {health.describe()}")
        return finish()
    info = _server_info(client, found)
    spec = speculative_algorithm(info)
    skip_tok = bool(info.get("skip_tokenizer_init")) if info else False
    model_id = _model_id(client, found)
    openai_calls: list[Call] = []
    if skip_tok:
        found.info("smoke.no_tokenizer", "the server runs --skip-tokenizer-init: no OpenAI chat/completions "
                   "(no tokenizer); /generate with input_ids")
    else:
        openai_calls = _openai_calls(client, found, model_id, opts.max_tokens)
    gen_calls = _generate_calls(client, found, opts, skip_tok)
    metrics = client.request("GET", "/metrics", raw=True)
    acc_m = metrics_accept_length(metrics.body) if metrics.ok else None
    if metrics.status == 404:
        found.info("smoke.no_metrics", "/metrics not exported (--enable-metrics is off)")
    acc, tokens, verify = accept_length(gen_calls)
    if spec is None and verify:
        spec = "speculative (unnamed)"
    latency = {k: v for k, v in (("generate", _latency(gen_calls)), ("openai", _latency(openai_calls))) if v}
    if spec and not found.failing:
        _judge_accept_length(found, opts, spec, acc, tokens)
    return finish(spec, acc, acc_m, tokens, verify, latency)


def render_text(report: SmokeReport) -> str:
    mark = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}[report.status]
    lines = [f"{mark}: smoke {report.url}: {report.summary}"]
    for c in report.calls:
        lines.append(f"  {c.method:4s} {c.path:22s} {('HTTP ' + str(c.status)) if c.status else '-':8s} "
                     f"{c.seconds:7.3f}s" + (f"  {c.to_dict()['error']}" if not c.ok else ""))
    if report.accept_length is not None:
        lines.append(f"  accept length {report.accept_length:.3f} = {report.completion_tokens} tokens / "
                     f"{report.verify_ct} verify passes" + (f"; /metrics says {report.accept_length_metrics:.3f}"
                                                            if report.accept_length_metrics is not None else ""))
    lines += [f"  problem: {p}" for p in report.problems[1:]]
    lines += [f"  warning: {w}" for w in report.warnings]
    lines += [f"  note: {n}" for n in report.notes]
    return printable("\n".join(lines), lines=True) + "\n"
