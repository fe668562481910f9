#!/usr/bin/env python3
"""Where a decode round's time goes, from SGLang's own torch-profiler traces (``torch_profile`` phases of
``serve_check.py``: CPU and GPU activities, Python stacks).

Per trace: the decode steps (``scheduler.run_batch`` spans holding a ``step[VERIFY ...]``), their host time
(the span), the cycle from one step to the next, and the GPU's busy time in each cycle (the union of kernel,
memcpy and memset intervals): a round whose GPU is busy for a fraction of its cycle is bound by the host.
Then the Python functions of the scheduler thread inside those steps, inclusive microseconds and calls per
step, side by side for the traces given (the first is the reference). The profiler's own overhead inflates
every host figure (a Python event per call); compare traces of one call with one another, never with the
round costs of unprofiled phases.

    python3 bench/ddtree/trace_report.py DFLASH.trace.json.gz DDTREE.trace.json.gz [...] [--top 30]
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def load(path: str) -> list[dict[str, Any]]:
    raw = Path(path).read_bytes()
    doc = json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def busy_us(intervals: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Microseconds of [t0, t1) covered by the (sorted) intervals."""
    total, cur = 0.0, t0
    for a, b in intervals:
        if b <= cur or a >= t1:
            continue
        a, b = max(a, cur), min(b, t1)
        if b > a:
            total += b - a
            cur = b
    return total


def scheduler_steps(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every ``scheduler.run_batch`` span in time order, and those of them that hold a ``step[VERIFY ...]``
    (the decode steps)."""
    ann = [e for e in events if e.get("cat") == "user_annotation" and "dur" in e]
    verify = sorted(e["ts"] for e in ann if e["name"].startswith("step[VERIFY"))
    steps = sorted((e for e in ann if e["name"] == "scheduler.run_batch"), key=lambda e: e["ts"])
    return steps, [e for e in steps if any(e["ts"] <= v <= e["ts"] + e["dur"] for v in verify)]


def summarize(path: str) -> dict[str, Any]:
    events = load(path)
    all_steps, steps = scheduler_steps(events)
    if not steps:
        return {"path": path, "steps": 0}
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    nxt = {id(a): b for a, b in itertools.pairwise(all_steps)}
    cycles, busy = [], []
    for s in steps:
        b = nxt.get(id(s))
        if b is None:
            continue
        cycles.append(b["ts"] - s["ts"])
        busy.append(busy_us(gpu, s["ts"], b["ts"]))
    tid = steps[0]["tid"]
    py = [e for e in events if e.get("cat") == "python_function" and e.get("tid") == tid and "dur" in e]
    incl: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for s in steps:
        lo, hi = s["ts"], s["ts"] + s["dur"]
        for e in py:
            if e["ts"] >= lo and e["ts"] + e["dur"] <= hi:
                incl[e["name"]] += e["dur"]
                calls[e["name"]] += 1
    n = len(steps)
    return {"path": path, "steps": n, "host_us": statistics.median(s["dur"] for s in steps),
            "cycle_us": statistics.median(cycles) if cycles else None,
            "gpu_busy_us": statistics.median(busy) if busy else None,
            "python_events_per_step": sum(calls.values()) / n,
            "incl_us": {k: v / n for k, v in incl.items()}, "calls": {k: v / n for k, v in calls.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", help="write the summaries here")
    args = ap.parse_args()
    runs = [summarize(p) for p in args.traces]
    for r in runs:
        if not r["steps"]:
            print(f"{r['path']}: no decode steps (a trace of prefill only, or not SGLang's)")
            continue
        gpu = f"{r['gpu_busy_us']:.0f}" if r["gpu_busy_us"] is not None else "n/a"
        cyc = f"{r['cycle_us']:.0f}" if r["cycle_us"] is not None else "n/a"
        print(f"{Path(r['path']).name}: {r['steps']} decode steps, host {r['host_us']:.0f} us per step, "
              f"cycle {cyc} us, GPU busy {gpu} us per cycle, {r['python_events_per_step']:.0f} Python calls per step")
    done = [r for r in runs if r["steps"]]
    if len(done) > 1:
        keys = sorted(set().union(*(r["incl_us"] for r in done)),
                      key=lambda k: -max(r["incl_us"].get(k, 0) for r in done))
        print("inclusive us per step (calls per step), " + " | ".join(Path(r["path"]).name[:24] for r in done))
        for k in keys[: args.top]:
            cells = "  ".join(f"{r['incl_us'].get(k, 0):8.0f} ({r['calls'].get(k, 0):4.1f})" for r in done)
            print(f"{cells}  {k[:110]}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
