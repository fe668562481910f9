"""The requests of a validation, against SGLang's native ``/generate`` (token ids or text in, token ids out),
each bounded by ``doctor.service.http`` (one deadline for connect, headers and body)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from doctor.service import http

Prompt = str | list[int]


def payload(prompt: Prompt, sampling: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"text": prompt} if isinstance(prompt, str) else {"input_ids": list(prompt)}
    return {**body, "sampling_params": sampling, **(extra or {})}


def post(url: str, body: dict[str, Any], timeout_s: float) -> tuple[int, Any]:
    """(HTTP status or 0 without an answer, the JSON body or ``{"error": ...}``); never raises."""
    reply = http.request(url, timeout_s, method="POST", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
    if reply.status is None:
        return 0, {"error": reply.error or "no answer"}
    try:
        return reply.status, json.loads(reply.body or b"{}")
    except ValueError:
        return reply.status, {"error": reply.body[:300].decode("utf-8", "replace")}


def health(url: str, timeout_s: float = 30.0) -> int:
    reply = http.request(url + "/health", timeout_s, limit=4096)
    return reply.status or 0


def generate(url: str, prompt: Prompt, sampling: dict[str, Any], timeout_s: float,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One request: its output ids, completion tokens, verify rounds, top log-probabilities when asked."""
    t0 = time.monotonic()
    code, body = post(url + "/generate", payload(prompt, sampling, extra), timeout_s)
    meta = body.get("meta_info") if isinstance(body, dict) and isinstance(body.get("meta_info"), dict) else {}
    ids = body.get("output_ids") if isinstance(body, dict) else None
    out: dict[str, Any] = {"code": code, "output_ids": ids if code == 200 and isinstance(ids, list) else None,
                           "completion_tokens": meta.get("completion_tokens"),
                           "spec_verify_ct": meta.get("spec_verify_ct"), "latency_s": round(time.monotonic() - t0, 4)}
    if code != 200:
        out["error"] = str(body)[:300]
    if meta.get("output_top_logprobs") is not None:
        out["top_logprobs"] = meta["output_top_logprobs"]
    return out


def generate_all(url: str, prompts: Sequence[Prompt], sampling: dict[str, Any], concurrency: int,
                 timeout_s: float, extra: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], float]:
    """Every prompt, ``concurrency`` in flight; (results in prompt order, wall seconds)."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(lambda p: generate(url, p, sampling, timeout_s, extra), prompts))
    return results, time.monotonic() - t0


def top_table(rows: Any) -> list[dict[int, float]]:
    """SGLang's ``output_top_logprobs`` (per position, ``[[logprob, token_id, text], ...]``) as token -> logprob."""
    out: list[dict[int, float]] = []
    for row in rows or []:
        table: dict[int, float] = {}
        for entry in row or []:
            if isinstance(entry, (list, tuple)) and len(entry) >= 2 and entry[0] is not None:
                try:
                    table[int(entry[1])] = float(entry[0])
                except (TypeError, ValueError):
                    continue
        out.append(table)
    return out
