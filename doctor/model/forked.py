"""Spread a pure per-item function over worker processes: JSON parsing of 64 headers holds the GIL, so
threads cannot share it out.

The workers come from multiprocessing's ``forkserver``: a server process started once (fork + exec, from a
clean interpreter that imports the function's module first) forks each worker from itself. The doctor
never calls ``fork()`` in its own process, which runs every check in a thread: a fork there copies locks
that other threads hold (the import lock, logging's, the allocator's) into a child that can then hang on
them for ever (Python 3.12 warns: "This process is multi-threaded, use of fork() may lead to deadlocks").

A worker calls the given module-level function on its share of the items (both are pickled: no lambdas),
sends the JSON results through a pipe and exits. The parent does a share itself, reads the pipes under a
deadline, kills a worker that is late, and computes in-process whatever a worker did not deliver (crashed,
killed, late), so the result never depends on the workers working.
"""

from __future__ import annotations

import functools
import json
import math
import multiprocessing
import os
import pickle
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

MIN_ITEMS_PER_WORKER = 8
START_METHOD = "forkserver"


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


MIN_CPUS = 4  # on 2 cores shared with anything else, measured: no gain over one process


def can_fork() -> bool:
    return START_METHOD in multiprocessing.get_all_start_methods() and not os.environ.get("K26_DOCTOR_NO_FORK")


def workers_for(n_items: int, limit: int = 4) -> int:
    """Processes worth using: one unless there are spare cores and enough items to share.
    ``K26_DOCTOR_FORK_WORKERS=N`` forces N (tests, benchmarks); ``K26_DOCTOR_NO_FORK=1`` forbids workers."""
    forced = os.environ.get("K26_DOCTOR_FORK_WORKERS", "")
    if forced.isdigit() and int(forced) > 0 and can_fork():
        return min(int(forced), max(1, n_items))
    cpus = cpu_count()
    if not can_fork() or cpus < MIN_CPUS:
        return 1
    return max(1, min(limit, cpus, n_items // MIN_ITEMS_PER_WORKER))


def _module_of(func: Callable[[Any], Any]) -> str:
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__module__", "") or ""


def _context(func: Callable[[Any], Any]) -> Any:
    """The forkserver context; its server imports ``func``'s module before forking (set before it starts)."""
    ctx = multiprocessing.get_context(START_METHOD)
    module = _module_of(func)
    if module and module != "__main__":
        ctx.set_forkserver_preload([module])
    return ctx


def _work(func: Callable[[Any], Any], items: list[Any], conn: Connection) -> None:
    """In a worker: the results of its share, as one JSON document through the pipe."""
    try:
        conn.send_bytes(json.dumps([func(item) for item in items]).encode())
    finally:
        conn.close()


def map_forked(func: Callable[[Any], Any], items: list[Any], *, workers: int | None = None,
               timeout: float = 120.0) -> list[Any]:
    """``[func(i) for i in items]``, computed by up to ``workers`` processes (this one included).

    ``func`` and ``items`` must pickle (a module-level function, or ``functools.partial`` of one)."""
    n = workers if workers is not None else workers_for(len(items))
    if n <= 1 or len(items) < 2:
        return [func(i) for i in items]
    size = math.ceil(len(items) / n)
    chunks = [list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size)]
    ctx = _context(func)
    children: list[tuple[Any, Connection, list[int]]] = []  # process, read end, indexes
    for idxs in chunks[1:]:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_work, args=(func, [items[i] for i in idxs], send), daemon=True,
                           name="k26-doctor-worker")
        try:
            proc.start()
        except (OSError, ValueError, TypeError, AttributeError, ImportError, RuntimeError, pickle.PicklingError):
            recv.close()  # no worker (or what it needs does not pickle): this process does that share
            send.close()
            chunks[0].extend(idxs)
            continue
        send.close()
        children.append((proc, recv, idxs))
    results: list[Any] = [None] * len(items)
    done = [False] * len(items)
    for i in chunks[0]:
        results[i] = func(items[i])
        done[i] = True
    deadline = time.monotonic() + timeout
    for proc, recv, idxs in children:
        data = _receive(recv, deadline)
        if data is None and proc.is_alive():
            proc.kill()
        proc.join(max(1.0, deadline - time.monotonic()))
        if data is not None and proc.exitcode == 0:
            try:
                got = json.loads(data)
            except ValueError:
                got = None
            if isinstance(got, list) and len(got) == len(idxs):
                for i, value in zip(idxs, got, strict=True):
                    results[i] = value
                    done[i] = True
    for i, ok in enumerate(done):
        if not ok:  # a worker failed: do its share here
            results[i] = func(items[i])
    return results


def _receive(conn: Connection, deadline: float) -> bytes | None:
    """One message from a worker before ``deadline``, or None (late, or it died without sending)."""
    try:
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            return None
        return conn.recv_bytes()
    except (EOFError, OSError):
        return None
    finally:
        conn.close()
