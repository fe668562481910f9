"""A timeline of the deep tier's hashing calls, recorded by wrapping its parts where they are looked up
(``app.run``, ``hashing.hash_files``, the ``verify_model_hashes`` the model facts call, ``WorkerServer.fork_many``,
which ``fork`` calls, ``WorkerProcess.hash``) and by ``gc.callbacks``: for bench/bench_deep_cli.py, which
installs it both in a real ``check --deep`` process and in its own, and bench/bench_model_deep.py's
``run_lead``.

Each call gives, in ms from the call's start: when each thread had its worker (``forks``), when each file
began and ended (``files``), every garbage collection (generation, start, length), and the call's length;
inside a run, also how long after the run's start it began (``lead_ms``) and the verification around it
(``verify_ms``). Nothing of the doctor is changed but the wrappers; the digests are the doctor's.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The deep tier alone, as the benches run it (the model directory follows as --model-path).
CHECK_DEEP = ["check", "--deep", "--only", "model.shards.deep", "--no-verify-cache", "--format", "json"]
CALLS: list[dict[str, Any]] = []
_state: dict[str, Any] = {"t0": None, "gc_start": None, "run_t0": None}
_lock = threading.Lock()


def _ms(t: float) -> float:
    return round((t - _state["t0"]) * 1e3, 3) if _state["t0"] is not None else -1.0


def install() -> None:
    """Wrap the hashing call and its parts (once per process)."""
    from doctor import app
    from doctor.model import facts, hashing

    if getattr(hashing.hash_files, "_timeline", False):
        return
    real_call, real_fork, real_hash = hashing.hash_files, hashing.WorkerServer.fork_many, hashing.WorkerProcess.hash
    real_run, real_verify = app.run, facts.verify_model_hashes

    def run(*a: Any, **k: Any) -> Any:
        _state["run_t0"] = time.monotonic()
        return real_run(*a, **k)

    def verify(*a: Any, **k: Any) -> Any:
        before, t = len(CALLS), time.monotonic()
        try:
            return real_verify(*a, **k)
        finally:
            if len(CALLS) > before:
                CALLS[before]["verify_ms"] = round((time.monotonic() - t) * 1e3, 3)

    def hash_files(*a: Any, **k: Any) -> Any:
        _state["t0"] = time.monotonic()
        call: dict[str, Any] = {"forks": [], "files": [], "gc": []}
        if _state["run_t0"] is not None:
            call["lead_ms"] = round((_state["t0"] - _state["run_t0"]) * 1e3, 3)
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
    app.run = run
    facts.verify_model_hashes = verify
    hashing.hash_files = hash_files
    hashing.WorkerServer.fork_many = fork_many  # type: ignore[method-assign]
    hashing.WorkerProcess.hash = hash_  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)


def run_cli(model_dir: str) -> dict[str, Any]:
    """A real ``check --deep`` of ``model_dir`` in a process of its own, with the timeline installed: its calls'
    timelines (``calls``), its ``model.shards.deep`` result (``result``, None where it gave none) and the tail
    of its stderr (``stderr``)."""
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *CHECK_DEEP, "--model-path", model_dir],
                         capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         timeout=300)
    calls = [json.loads(line[len("timeline "):]) for line in out.stderr.splitlines() if line.startswith("timeline ")]
    try:
        result = next(r for r in json.loads(out.stdout)["results"] if r["id"] == "model.shards.deep")
    except (ValueError, KeyError, TypeError, StopIteration):
        result = None
    return {"calls": calls, "result": result, "stderr": out.stderr[-1500:]}


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
