"""A timeline of the deep tier's hashing calls, recorded by wrapping its parts where they are looked up
(``hashing.hash_files``, ``WorkerServer.fork_many``, which ``fork`` calls, ``WorkerProcess.hash``) and by
``gc.callbacks``: for bench/bench_deep_cli.py, which installs it both in a real ``check --deep`` process and
in its own.

Each call gives, in ms from the call's start: when each thread had its worker (``forks``), when each file
began and ended (``files``), every garbage collection (generation, start, length), and the call's length.
Nothing of the doctor is changed but the wrappers; the digests are the doctor's.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from typing import Any

CALLS: list[dict[str, Any]] = []
_state: dict[str, Any] = {"t0": None, "gc_start": None}
_lock = threading.Lock()


def _ms(t: float) -> float:
    return round((t - _state["t0"]) * 1e3, 3) if _state["t0"] is not None else -1.0


def install() -> None:
    """Wrap the hashing call and its parts (once per process)."""
    from doctor.model import hashing

    if getattr(hashing.hash_files, "_timeline", False):
        return
    real_call, real_fork, real_hash = hashing.hash_files, hashing.WorkerServer.fork_many, hashing.WorkerProcess.hash

    def hash_files(*a: Any, **k: Any) -> Any:
        _state["t0"] = time.monotonic()
        call: dict[str, Any] = {"forks": [], "files": [], "gc": []}
        _state["call"] = call
        try:
            return real_call(*a, **k)
        finally:
            call["call_ms"] = _ms(time.monotonic())
            CALLS.append(call)
            _state["t0"] = None

    def fork_many(self: Any, count: int) -> Any:
        got = real_fork(self, count)
        if _state["t0"] is not None:
            with _lock:
                _state["call"]["forks"].extend([_ms(time.monotonic())] * len(got))
        return got

    def hash_(self: Any, path: str, on_bytes: Any) -> Any:
        start = time.monotonic()
        try:
            return real_hash(self, path, on_bytes)
        finally:
            if _state["t0"] is not None:
                with _lock:
                    _state["call"]["files"].append((_ms(start), _ms(time.monotonic())))

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if _state["t0"] is None:
            return
        if phase == "start":
            _state["gc_start"] = time.monotonic()
        elif _state["gc_start"] is not None:
            _state["call"]["gc"].append((info.get("generation"), _ms(_state["gc_start"]),
                                         round((time.monotonic() - _state["gc_start"]) * 1e3, 3)))
            _state["gc_start"] = None

    hash_files._timeline = True  # type: ignore[attr-defined]
    hashing.hash_files = hash_files
    hashing.WorkerServer.fork_many = fork_many  # type: ignore[method-assign]
    hashing.WorkerProcess.hash = hash_  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)


def main_cli(argv: list[str]) -> None:
    """``python deep_timeline.py ARGS...``: the real doctor CLI with ARGS, the timeline installed, and each
    call's timeline printed to stderr as ``timeline JSON`` when it exits."""
    install()
    from doctor.cli import main

    sys.argv = ["k26-doctor", *argv]
    try:
        main()
    finally:
        for call in CALLS:
            sys.stderr.write("timeline " + json.dumps(call) + "\n")


if __name__ == "__main__":
    main_cli(sys.argv[1:])
