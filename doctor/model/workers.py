"""Spread a pure per-item function over worker processes: JSON parsing of 64 headers holds the GIL, so
threads cannot share it out.

The workers are fresh interpreters (``python -I -S -B``, this process's ``sys.path`` given to them), never
``fork()``: the doctor runs every check in a thread, and a fork there copies locks other threads hold (the
import lock, logging's, the allocator's) into a child that can hang on them for ever (Python 3.12 warns:
"This process is multi-threaded, use of fork() may lead to deadlocks"). Nor multiprocessing: its forkserver
imports preloaded modules with its own ``sys.path`` (Python 3.10-3.13), and its workers import the caller's
``__main__`` again.

A worker imports the function's module (``doctor.model.shard_work`` is kept light for this), reads its share of
the items (JSON, from a file in a temporary directory), writes the JSON results on stdout and exits. The parent
does a share itself meanwhile, waits for each worker under one deadline, kills one that is late, and computes
in-process whatever a worker did not deliver (crashed, killed, late), so the result never depends on the
workers working. The function must be a module-level function (or ``functools.partial`` of one with JSON
arguments); anything else runs here, all of it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from doctor.core import proc

MIN_ITEMS_PER_WORKER = 8
MIN_CPUS = 4  # on 2 cores shared with anything else, measured: no gain over one process
# What a worker runs (``python -I -S -B -c BOOT JOB``): this process's sys.path, the function's module, its share.
BOOT = ("import importlib, json, sys\n"
        "with open(sys.argv[1], encoding='utf-8') as fh:\n"
        "    job = json.load(fh)\n"
        "sys.path[:] = job['sys_path']\n"
        "func = getattr(importlib.import_module(job['module']), job['name'])\n"
        "sys.stdout.write(json.dumps([func(*job['args'], item) for item in job['items']]))\n")


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def workers_for(n_items: int, limit: int = 4) -> int:
    """Processes worth using: one unless there are spare cores and enough items to share.
    ``K26_DOCTOR_FORK_WORKERS=N`` forces N (tests, benchmarks); ``K26_DOCTOR_NO_FORK=1`` forbids workers."""
    if os.environ.get("K26_DOCTOR_NO_FORK"):
        return 1
    forced = os.environ.get("K26_DOCTOR_FORK_WORKERS", "")
    if forced.isdigit() and int(forced) > 0:
        return min(int(forced), max(1, n_items))
    cpus = cpu_count()
    if cpus < MIN_CPUS:
        return 1
    return max(1, min(limit, cpus, n_items // MIN_ITEMS_PER_WORKER))


def by_name(func: Callable[[Any], Any]) -> dict[str, Any] | None:
    """How a worker finds ``func``: module, name and JSON arguments; None when it cannot (a lambda, a closure,
    ``__main__``'s, arguments that are not JSON)."""
    args: list[Any] = []
    while isinstance(func, functools.partial):
        if func.keywords:
            return None
        args = list(func.args) + args
        func = func.func
    module, name = getattr(func, "__module__", None), getattr(func, "__qualname__", "")
    if not module or module == "__main__" or not name or "." in name or "<" in name:
        return None
    try:
        json.dumps(args)
    except (TypeError, ValueError):
        return None
    return {"module": module, "name": name, "args": args}


def map_in_workers(func: Callable[[Any], Any], items: list[Any], *, workers: int | None = None,
                   timeout: float = 120.0) -> list[Any]:
    """``[func(i) for i in items]``, computed by up to ``workers`` processes (this one included)."""
    n = workers if workers is not None else workers_for(len(items))
    named = by_name(func)
    if n <= 1 or len(items) < 2 or named is None:
        return [func(i) for i in items]
    size = math.ceil(len(items) / n)
    chunks = [list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size)]
    scratch = tempfile.mkdtemp(prefix="k26-doctor-workers-")
    try:
        return _run(func, items, chunks, named, scratch, timeout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(func: Callable[[Any], Any], items: list[Any], chunks: list[list[int]], named: dict[str, Any],
         scratch: str, timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    started: list[tuple[Any, list[int]]] = []
    for k, idxs in enumerate(chunks[1:]):
        job = os.path.join(scratch, f"job-{k}.json")
        with open(job, "w", encoding="utf-8") as fh:
            json.dump({**named, "sys_path": list(sys.path), "items": [items[i] for i in idxs]}, fh)
        child = proc.start([sys.executable, "-I", "-S", "-B", "-c", BOOT, job])
        if isinstance(child, proc.CommandResult):  # could not start: this process does that share
            chunks[0].extend(idxs)
            continue
        started.append((child, idxs))
    results: list[Any] = [None] * len(items)
    done = [False] * len(items)
    for i in chunks[0]:
        results[i] = func(items[i])
        done[i] = True
    for child, idxs in started:
        res = proc.finish(child, deadline - time.monotonic())
        if not res.ok:
            continue
        try:
            got = json.loads(res.stdout)
        except ValueError:
            continue
        if isinstance(got, list) and len(got) == len(idxs):
            for i, value in zip(idxs, got, strict=True):
                results[i] = value
                done[i] = True
    for i, ok in enumerate(done):
        if not ok:  # a worker failed: do its share here
            results[i] = func(items[i])
    return results
