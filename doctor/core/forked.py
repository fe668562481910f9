"""Spread a pure per-file function over forked children: JSON parsing of 64 headers holds the GIL, so
threads cannot share it out, and a fresh interpreter per worker costs more than the work.

``fork`` gives each child the parent's imported modules and data for free; a child only calls the
given function on its share of the items (stdlib I/O and ``json``, nothing imported), sends the JSON
results through a pipe and leaves with ``os._exit``. The parent does a share itself, reads the pipes
under a deadline, and computes in-process whatever a child did not deliver (crashed, killed, late),
so the result never depends on the children working.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

MIN_ITEMS_PER_WORKER = 8


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


MIN_CPUS = 4  # on 2 cores shared with anything else, measured: no gain over one process


def workers_for(n_items: int, limit: int = 4) -> int:
    """Processes worth using: one unless there are spare cores and enough items to share.
    ``K26_DOCTOR_FORK_WORKERS=N`` forces N (tests, benchmarks); ``K26_DOCTOR_NO_FORK=1`` forbids forking."""
    forced = os.environ.get("K26_DOCTOR_FORK_WORKERS", "")
    if forced.isdigit() and int(forced) > 0 and hasattr(os, "fork") and not os.environ.get("K26_DOCTOR_NO_FORK"):
        return min(int(forced), max(1, n_items))
    cpus = cpu_count()
    if not hasattr(os, "fork") or os.environ.get("K26_DOCTOR_NO_FORK") or cpus < MIN_CPUS:
        return 1
    return max(1, min(limit, cpus, n_items // MIN_ITEMS_PER_WORKER))


def map_forked(func: Callable[[Any], Any], items: list[Any], *, workers: int | None = None,
               timeout: float = 120.0) -> list[Any]:
    """``[func(i) for i in items]``, computed by up to ``workers`` processes (this one included)."""
    n = workers if workers is not None else workers_for(len(items))
    if n <= 1 or len(items) < 2:
        return [func(i) for i in items]
    size = math.ceil(len(items) / n)
    chunks = [list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size)]
    children: list[tuple[int, int, list[int]]] = []  # pid, read fd, indexes
    for idxs in chunks[1:]:
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            chunks[0].extend(idxs)
            continue
        if pid == 0:  # child: compute, write, leave without running any of the parent's cleanup
            code = 0
            try:
                os.close(r)
                payload = json.dumps([func(items[i]) for i in idxs]).encode()
                view = memoryview(payload)
                while view:
                    view = view[os.write(w, view):]
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        children.append((pid, r, idxs))
    results: list[Any] = [None] * len(items)
    done = [False] * len(items)
    for i in chunks[0]:
        results[i] = func(items[i])
        done[i] = True
    deadline = time.monotonic() + timeout
    for pid, fd, idxs in children:
        data = _read_all(fd, deadline)
        if data is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = -1
        if data is not None and status == 0:
            try:
                got = json.loads(data)
            except ValueError:
                got = None
            if isinstance(got, list) and len(got) == len(idxs):
                for i, value in zip(idxs, got, strict=True):
                    results[i] = value
                    done[i] = True
    for i, ok in enumerate(done):
        if not ok:  # a child failed: do its share here
            results[i] = func(items[i])
    return results


def _read_all(fd: int, deadline: float) -> bytes | None:
    parts: list[bytes] = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
