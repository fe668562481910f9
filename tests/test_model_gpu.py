"""model.fit against the live ``nvml`` fact of a real GPU host (skips without an NVIDIA GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from modelkit import build, make_ctx, run

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
    """The real K2.6 layout (a sparse replica: 64 shards, 208,544 tensors, 554 GiB apparent) against one
    real GPU at TP1: a clean fail naming the GPU."""
    from model_replica import K26Spec, build_k26_replica

    model = tmp_path / "k26"
    build_k26_replica(str(model), K26Spec())
    res = run(make_ctx(tmp_path, model, tp=1, profile="h200-tp8", spec=K26Spec()), "model.fit")
    assert res.status.value == "fail" and "exceed the static pool" in res.summary, res.summary
    assert res.details["devices"][0]["name"] in res.summary
