"""Header parsing in worker processes: same verdicts as in-process, a failing worker never changes the
result, and no worker is forked from the doctor's own (threaded) process: every test here turns Python's
"multi-threaded, use of fork() may lead to deadlocks" DeprecationWarning into an error, and the workers say
that they are fresh interpreters (none of this process's modules or threads), not copies of it."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from model_replica import K26Spec, shard_name
from modelkit import build

from doctor.model import workers
from doctor.model.scan import clear_cache, scan_weights, tensor_summary
from doctor.model.workers import map_in_workers

SPEC = K26Spec.small(shards=16)
pytestmark = pytest.mark.filterwarnings("error::DeprecationWarning")


def square(x):
    import threading

    return {"sq": x * x, "pid": os.getpid(), "ppid": os.getppid(), "main": sys.argv[:1],
            "modules": "doctor.app" in sys.modules, "threads": threading.active_count()}


def crash_in_children(parent, x):
    if os.getpid() != parent:
        if x % 2:
            raise RuntimeError("child crash")
        os._exit(3)
    return x + 1


def late_in_children(parent, x):
    if os.getpid() != parent:
        time.sleep(30)
    return x


def test_map_in_workers_matches_serial():
    items = list(range(37))
    got = map_in_workers(square, items, workers=3)
    assert [g["sq"] for g in got] == [x * x for x in items]
    assert len({g["pid"] for g in got}) == 3 and os.getpid() in {g["pid"] for g in got}  # two workers did shares


def test_failing_children_are_redone_in_the_parent():
    assert map_in_workers(functools.partial(crash_in_children, os.getpid()), list(range(20)), workers=4) == \
        [x + 1 for x in range(20)]


def test_late_child_is_killed_and_redone():
    t0 = time.monotonic()
    assert map_in_workers(functools.partial(late_in_children, os.getpid()), list(range(10)), workers=2,
                      timeout=0.5) == list(range(10))
    assert time.monotonic() - t0 < 10


def test_what_a_worker_cannot_find_runs_here():
    """A lambda cannot be named to a worker: the parent computes every share, nothing is lost."""
    got = map_in_workers(lambda x: (x, os.getpid()), list(range(12)), workers=3)
    assert got == [(x, os.getpid()) for x in range(12)]


def test_workers_are_not_forked_from_this_threaded_process():
    """The doctor runs checks in threads; its workers come from the forkserver, never from ``fork()`` here
    (Python 3.12+ warns, as an error in this test: -W error::DeprecationWarning)."""
    import threading
    import warnings

    stop = threading.Event()
    busy = threading.Thread(target=stop.wait, daemon=True)
    busy.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            got = map_in_workers(square, list(range(16)), workers=4)
    finally:
        stop.set()
    assert [g["sq"] for g in got] == [x * x for x in range(16)]
    shares = [g for g in got if g["pid"] != os.getpid()]
    assert len({g["pid"] for g in shares}) == 3
    # a fresh interpreter (python -c), not a copy of this one: none of this process's modules or threads
    assert all(g["main"] == ["-c"] and not g["modules"] and g["threads"] == 1 for g in shares), shares


@pytest.fixture
def fork_on(monkeypatch):
    monkeypatch.setattr(workers, "MIN_CPUS", 1)
    monkeypatch.setattr(workers, "cpu_count", lambda: 4)
    monkeypatch.setattr(workers, "MIN_ITEMS_PER_WORKER", 2)


def _scan(model):
    clear_cache()
    return json.loads(json.dumps(scan_weights(str(model))))


@pytest.mark.parametrize("damage", ["none", "truncate", "wrong_shard"])
def test_scan_in_workers_equals_serial(tmp_path, monkeypatch, fork_on, damage):
    model = build(tmp_path, SPEC)
    s3 = shard_name(3, SPEC.shards)
    if damage == "truncate":
        with open(model / s3, "r+b") as fh:
            fh.truncate(os.path.getsize(model / s3) - 1)
    elif damage == "wrong_shard":
        idx_path = model / "model.safetensors.index.json"
        idx = json.loads(idx_path.read_text())
        name = next(k for k, v in idx["weight_map"].items() if v == s3)
        idx["weight_map"][name] = shard_name(4, SPEC.shards)
        idx_path.write_text(json.dumps(idx))
    assert workers.workers_for(SPEC.shards) > 1
    with_workers = _scan(model)
    summary_workers = tensor_summary(str(model), [s["name"] for s in with_workers["shards"]])
    monkeypatch.setenv("K26_DOCTOR_NO_FORK", "1")
    serial = _scan(model)
    assert with_workers == serial
    assert summary_workers == tensor_summary(str(model), [s["name"] for s in serial["shards"]])
    assert (damage == "none") == all(s["ok"] for s in serial["shards"])
    if damage == "none":
        assert serial["totals"]["tensors"] == summary_workers["dtypes"]["BF16"] + summary_workers["dtypes"]["I32"] + \
            summary_workers["dtypes"].get("F32", 0)
