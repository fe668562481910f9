"""A server start's actual parts, read from its log: what the start plan (``doctor.service.startplan``) predicted,
measured, so that the constants of ``doctor/data/start_constants.toml`` can be checked.

SGLang stamps each line to the second and logs the landmarks of its start: "Load weight begin/end. elapsed=",
"KV Cache is allocated" / "Memory pool end", "Capture <kind> CUDA graph begin/end ... elapsed=", "Engine startup
timings", "The server is fired up". The parts are the spans between them; what the scheduler spends between the
last memory pool and its startup timings outside the graph captures is kernel warm-up and JIT compiles. The lines
are searched anywhere in a line (a process tag before the stamp, as vLLM's and torch's launchers write, reads the
same). A log without a landmark gives no figure for that
part (never a guessed one).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml

CONSTANTS_FILE = Path(__file__).resolve().parents[1] / "data" / "start_constants.toml"


@dataclass(frozen=True)
class Markers:
    timestamp: re.Pattern[str]
    load_begin: re.Pattern[str]
    load_end: re.Pattern[str]
    memory_pool_end: re.Pattern[str]
    capture_begin: re.Pattern[str]
    capture_end: re.Pattern[str]
    sizes: re.Pattern[str]
    engine_ready: re.Pattern[str]
    fired_up: re.Pattern[str]
    draft_types: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def markers() -> Markers:
    log = load_toml(CONSTANTS_FILE)["log"]
    names = ("timestamp", "load_begin", "load_end", "memory_pool_end", "capture_begin", "capture_end", "sizes",
             "engine_ready", "fired_up")
    return Markers(*(re.compile(log[n]) for n in names), tuple(log["draft_types"]))


def graph_kind(what: str) -> str:
    """A capture's kind for the plan: ``prefill``, ``verify`` (the target's tree/verify graphs), ``draft``,
    ``decode`` (the target's decode graphs, also SGLang's plain "Capture cuda graph")."""
    w = what.lower()
    if "draft" in w:
        return "draft"
    if "prefill" in w:
        return "prefill"
    if "verify" in w:
        return "verify"
    return "decode"


def _stamp(line: str, lay: Markers) -> datetime | None:
    m = lay.timestamp.search(line[:200])
    if not m:
        return None
    try:
        return datetime.fromisoformat(m.group("ts").replace("T", " "))
    except ValueError:
        return None


def read_start(lines: list[str]) -> dict[str, Any]:
    """The actual parts of the first start in ``lines``: ``{"parts": {name: seconds}, "captures": [...],
    "marks": {landmark: seconds after the first stamped line}, "found": [landmarks]}``. Seconds from the
    server's own ``elapsed=`` figures where it prints them, else from the one-second stamps."""
    lay = markers()
    first: datetime | None = None
    marks: dict[str, float] = {}
    loads: list[dict[str, Any]] = []
    captures: list[dict[str, Any]] = []
    open_capture: dict[str, Any] | None = None
    last: float | None = None
    for line in lines:
        ts = _stamp(line, lay)
        if ts is None:
            continue
        if first is None:
            first = ts
        at = (ts - first).total_seconds()
        last = at
        if "fired_up" in marks:
            break
        if lay.load_begin.search(line):
            marks.setdefault("load_begin", at)
        elif (m := lay.load_end.search(line)) is not None:
            kind = m.group("type") or ""
            draft = bool(loads) or any(t.lower() in kind.lower() for t in lay.draft_types)
            loads.append({"what": "drafter" if draft else "weights", "type": kind, "s": float(m.group("s")),
                          "at": at})
        elif lay.memory_pool_end.search(line):
            marks["memory_pool_end"] = at
        elif (m := lay.capture_begin.search(line)) is not None:
            open_capture = {"what": m.group("what").strip() or "decode", "kind": graph_kind(m.group("what")),
                            "backend": m.group("backend"), "sizes": _sizes(line, lay), "begin": at}
        elif (m := lay.capture_end.search(line)) is not None:
            cap = open_capture or {"what": m.group("what").strip() or "decode", "kind": graph_kind(m.group("what")),
                                   "backend": None, "sizes": None, "begin": None}
            cap.update(s=float(m.group("s")), end=at)
            cap["sizes"] = _sizes(line, lay) or cap["sizes"]
            captures.append(cap)
            open_capture = None
        elif lay.engine_ready.search(line):
            marks.setdefault("engine_ready", at)
        elif lay.fired_up.search(line):
            marks["fired_up"] = at
    return _parts(marks, loads, captures, last)


def first_stamp(lines: list[str]) -> datetime | None:
    """The time of the first stamped line (the server's clock, local time, to the second)."""
    lay = markers()
    for line in lines:
        ts = _stamp(line, lay)
        if ts is not None:
            return ts
    return None


def _sizes(line: str, lay: Markers) -> int | None:
    m = lay.sizes.search(line)
    if not m:
        return None
    return len([x for x in m.group("list").split(",") if x.strip()])


def _parts(marks: dict[str, float], loads: list[dict[str, Any]], captures: list[dict[str, Any]],
           last: float | None) -> dict[str, Any]:
    parts: dict[str, float] = {}
    if "load_begin" in marks:
        parts["startup"] = marks["load_begin"]
    for load in loads:
        parts[load["what"]] = round(parts.get(load["what"], 0.0) + load["s"], 2)
    if loads and "memory_pool_end" in marks:
        parts["kv_cache"] = max(0.0, marks["memory_pool_end"] - loads[-1]["at"])
    graphs = round(sum(c["s"] for c in captures), 2)
    if captures:
        parts["cuda_graphs"] = graphs
    if "memory_pool_end" in marks and "engine_ready" in marks:
        parts["kernels"] = round(max(0.0, marks["engine_ready"] - marks["memory_pool_end"] - graphs), 2)
    if "engine_ready" in marks and "fired_up" in marks:
        parts["warmup"] = marks["fired_up"] - marks["engine_ready"]
    return {"parts": parts, "captures": [{k: c[k] for k in ("what", "kind", "backend", "sizes", "s")}
                                         for c in captures],
            "marks": marks, "found": sorted(marks) + (["load_end"] if loads else []),
            "log_span_s": last}
