"""Forked header parsing: same verdicts as in-process, and a failing child never changes the result."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from model_replica import K26Spec, shard_name
from modelkit import build

from doctor.core import forked
from doctor.core.forked import map_forked
from doctor.model.scan import clear_cache, scan_weights, tensor_summary

SPEC = K26Spec.small(shards=16)


def test_map_forked_matches_serial():
    items = list(range(37))
    assert map_forked(lambda x: {"sq": x * x}, items, workers=3) == [{"sq": x * x} for x in items]


def test_failing_children_are_redone_in_the_parent():
    parent = os.getpid()

    def func(x):
        if os.getpid() != parent:
            if x % 2:
                raise RuntimeError("child crash")
            os._exit(3)
        return x + 1

    assert map_forked(func, list(range(20)), workers=4) == [x + 1 for x in range(20)]


def test_late_child_is_killed_and_redone():
    import time

    parent = os.getpid()

    def func(x):
        if os.getpid() != parent:
            time.sleep(30)
        return x

    t0 = time.monotonic()
    assert map_forked(func, list(range(10)), workers=2, timeout=0.5) == list(range(10))
    assert time.monotonic() - t0 < 10


@pytest.fixture
def fork_on(monkeypatch):
    monkeypatch.setattr(forked, "MIN_CPUS", 1)
    monkeypatch.setattr(forked, "cpu_count", lambda: 4)
    monkeypatch.setattr(forked, "MIN_ITEMS_PER_WORKER", 2)


def _scan(model):
    clear_cache()
    return json.loads(json.dumps(scan_weights(str(model))))


@pytest.mark.parametrize("damage", ["none", "truncate", "wrong_shard"])
def test_forked_scan_equals_serial(tmp_path, monkeypatch, fork_on, damage):
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
    assert forked.workers_for(SPEC.shards) > 1
    with_fork = _scan(model)
    summary_fork = tensor_summary(str(model), [s["name"] for s in with_fork["shards"]])
    monkeypatch.setenv("K26_DOCTOR_NO_FORK", "1")
    serial = _scan(model)
    assert with_fork == serial
    assert summary_fork == tensor_summary(str(model), [s["name"] for s in serial["shards"]])
    assert (damage == "none") == all(s["ok"] for s in serial["shards"])
    if damage == "none":
        assert serial["totals"]["tensors"] == summary_fork["dtypes"]["BF16"] + summary_fork["dtypes"]["I32"] + \
            summary_fork["dtypes"].get("F32", 0)
