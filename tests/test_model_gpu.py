"""model.fit against the live ``nvml`` fact of a real GPU host (skips without an NVIDIA GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from modelkit import build, make_ctx, run

from doctor.facts.model import collect_drafter, collect_model, collect_model_tensors

pytestmark = pytest.mark.gpu
GIB = 1024 ** 3


def test_small_model_fits_on_the_live_gpus(tmp_path):
    model = build(tmp_path)
    ctx = make_ctx(tmp_path, model, tp=1, profile="h200-tp8")
    nvml = ctx.fact("nvml")
    assert nvml["available"], nvml.get("error")
    res = run(ctx, "model.fit")
    assert res.status.value == "pass", res.summary
    dev = res.details["devices"][0]
    assert dev["total"] > 10 * GIB and 0 < dev["free"] <= dev["total"]


def test_k26_sized_weights_on_one_live_gpu_do_not_fit(tmp_path):
    """The K2.6 layout's totals (554 GiB) against one real GPU: a clean fail naming the GPU."""
    model = build(tmp_path)
    live = make_ctx(tmp_path, model, tp=1, profile="h200-tp8")
    opts = live.facts.options
    m = collect_model(opts)
    m["weights"]["totals"]["data_bytes"] = 595_138_725_088
    facts = {"nvml": json.loads(json.dumps(live.fact("nvml"))), "model": m,
             "model.tensors": collect_model_tensors(opts), "drafter": collect_drafter(opts)}
    res = run(make_ctx(tmp_path, model, tp=1, facts=facts, profile="h200-tp8"), "model.fit")
    assert res.status.value == "fail" and "exceed the static pool" in res.summary
    assert res.details["devices"][0]["name"] in res.summary
