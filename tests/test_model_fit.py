"""model.fit: the --mem-fraction-static window for Kimi K2.6 (its real config, the published checkpoint's
tensors, a real DFlash drafter replica) on the reference H200 host's NVML numbers, and on the same GPUs
scaled to a B300's memory."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from model_replica import K26Spec, build_dflash_replica, k26_config, k26_patterns
from modelkit import build, make_ctx, nvml_fact, run

from doctor.model.facts import collect_drafter, collect_model, collect_model_tensors

GIB = 1024 ** 3


def k26_facts(tmp_path, n_gpus, *, free_fraction=None, memory_scale=1.0):
    """Facts of Kimi K2.6 (config, tensors, a DFlash drafter) on ``n_gpus`` reference H200s."""
    model = build(tmp_path)
    drafter = tmp_path / "drafter"
    build_dflash_replica(str(drafter), K26Spec())
    opts = make_ctx(tmp_path, model, drafter).facts.options
    m = collect_model(opts)
    pats, total = k26_patterns()
    m["weights"]["totals"]["data_bytes"] = total
    m["config"] = {"present": True, "text": json.dumps(k26_config(K26Spec()))}
    tensors = collect_model_tensors(opts)
    tensors["summary"]["patterns"] = pats
    nvml = nvml_fact(n_gpus, free_fraction=free_fraction)
    for dev in nvml["devices"]:
        for key in ("total", "free", "used"):
            dev["memory"][key] = int(dev["memory"][key] * memory_scale)
    return {"nvml": nvml, "model": m, "model.tensors": tensors, "drafter": collect_drafter(opts)}, model, drafter


def fit(tmp_path, n_gpus=8, *, profile="h200-tp8", tp=8, server=None, settings=None, **kw):
    facts, model, drafter = k26_facts(tmp_path, n_gpus, **kw)
    ctx = make_ctx(tmp_path, model, drafter, tp=tp, facts=facts, profile=profile)
    ctx.settings.profile = copy.deepcopy(ctx.settings.profile)
    ctx.settings.profile.setdefault("server", {}).update(server or {})
    for key, value in (settings or {}).items():
        setattr(ctx.settings, key, value)
    return run(ctx, "model.fit")


def test_k26_ddtree_on_eight_h200_at_085_fits_with_the_patched_graph_state(tmp_path):
    """DDTree budget 64 at the full 256k context. SGLang's own Triton graph state at W = 65 (logits 12 GiB,
    KV indices 6 GiB at max_bs 48 x 65 x 262144) would exceed the 15% of an H200 that 0.85 leaves outside
    the pool; the ddtree-0.5.23 set sizes its target's by what the tree verify reads (one decode token and
    one prefix of indices per request, the W x W mask), so 0.85 is inside the window -- and above it
    (0.95) the check warns with the recommended value."""
    res = fit(tmp_path)
    d = res.details
    assert res.status.value == "pass", res.summary
    assert 0.6 < d["f_min"] < 0.85 < d["f_max"] < 0.95 and d["recommended"] <= d["f_max"]
    out = d["window"]["outside"]
    assert out["target graph kv_indices"] == 48 * 262_144 * 8
    assert out["target graph attn_logits"] == 48 * 8 * 256 * 512 * 4
    assert out["target graph verify_mask"] == 48 * 65 * 65
    assert d["kv_bytes_per_token"] == 70_272 + 1 * 256 * 6 * 2  # K2.6's MLA latent + the drafter's KV
    assert 72 * GIB < d["per_gpu_weights"] < 74 * GIB
    assert d["shape"]["verify_width"] == 65 and d["shape"]["graph_max_bs"] == 48
    above = fit(tmp_path / "above", server={"mem_fraction_static": 0.95})
    assert above.status.value == "warn" and "above the window" in above.summary and "recommended" in above.summary
    assert above.remediation and "mem_fraction_static" in above.remediation.commands[0]


def test_the_recommended_value_passes(tmp_path):
    first = fit(tmp_path / "a")
    rec = first.details["recommended"]
    res = fit(tmp_path / "b", server={"mem_fraction_static": rec})
    assert res.status.value == "pass", res.summary
    assert f"inside the window [{first.details['f_min']:.3f}, {first.details['f_max']:.3f}]" in res.summary
    assert res.details["kv_tokens"] >= res.details["kv_tokens_needed"]


def test_b300_profile_at_085_passes(tmp_path):
    """The deployment: 8 x B300 (the reference GPUs scaled to ~268 GiB), profile b300-tp8-ddtree."""
    res = fit(tmp_path, profile="b300-tp8-ddtree", memory_scale=268 / 140.4)
    assert res.status.value == "pass", res.summary
    assert res.details["f_min"] < 0.85 < res.details["f_max"]
    assert res.details["shape"]["chunked_prefill"] == 16384


def test_below_the_window_warns_with_the_tokens(tmp_path):
    res = fit(tmp_path, server={"mem_fraction_static": 0.6})
    assert res.status.value == "warn" and "below the window" in res.summary, res.summary
    assert res.details["kv_tokens"] < res.details["kv_tokens_needed"]


def test_no_value_works_fails(tmp_path):
    """48 requests of 64k tokens each do not fit next to K2.6 on H200s, whatever the fraction."""
    res = fit(tmp_path, settings={"kv_tokens_per_request": 65536})
    assert res.status.value == "fail" and "no --mem-fraction-static works" in res.summary, res.summary
    assert res.details["f_min"] > res.details["f_max"]


def test_a_shorter_context_and_fewer_graphs_widen_the_window(tmp_path):
    wide = fit(tmp_path / "a", settings={"context_length": 32768, "cuda_graph_max_bs": 8})
    narrow = fit(tmp_path / "b")
    assert wide.details["f_max"] > narrow.details["f_max"] and wide.details["f_min"] < narrow.details["f_min"]
    assert wide.details["shape"]["context_len"] == 32768 and wide.details["shape"]["graph_max_bs"] == 8


def test_k26_on_two_h200_fails(tmp_path):
    res = fit(tmp_path, 2, tp=2)
    assert res.status.value == "fail", res.summary
    assert "exceed the static pool" in res.summary and "NVIDIA H200" in res.summary
    assert res.details["per_gpu_weights"] > 140 * GIB


def test_busy_gpus_fail(tmp_path):
    res = fit(tmp_path, free_fraction=0.4)
    assert res.status.value == "fail" and "free now" in res.summary and "gpu.idle" in res.summary, res.summary


def test_unset_fraction_warns_with_sglang_s_pick(tmp_path):
    facts, model, drafter = k26_facts(tmp_path, 8)
    ctx = make_ctx(tmp_path, model, drafter, tp=8, facts=facts, profile="h200-tp8")
    ctx.settings.profile = copy.deepcopy(ctx.settings.profile)
    del ctx.settings.profile["server"]["mem_fraction_static"]
    res = run(ctx, "model.fit")
    assert res.status.value == "warn" and "SGLang would pick" in res.summary, res.summary
    assert 0 < res.details["sglang_auto_fraction"] < 1


def test_without_gpu_facts_skips(tmp_path):
    facts, model, drafter = k26_facts(tmp_path, 8)
    facts["nvml"] = {"available": False, "error": "NVML library not found", "devices": []}
    res = run(make_ctx(tmp_path, model, drafter, facts=facts), "model.fit")
    assert res.status.value == "skip" and "NVML library not found" in res.summary
    del facts["nvml"]
    assert run(make_ctx(tmp_path, model, drafter, facts=facts), "model.fit").status.value == "skip"


@pytest.mark.parametrize("text", ["{}", json.dumps({"model_type": "llama", "num_hidden_layers": "x"})])
def test_a_config_without_geometry_cannot_size_the_kv(tmp_path, text):
    facts, model, drafter = k26_facts(tmp_path, 8)
    facts["model"]["config"] = {"present": True, "text": text}
    res = run(make_ctx(tmp_path, model, drafter, tp=8, facts=facts, profile="h200-tp8"), "model.fit")
    assert res.status.value == "warn" and "cannot be sized" in res.summary, res.summary


def test_the_tiny_ddtree_start_on_the_h200_predicted_before_it_ran(tmp_path):
    """model.fit on the facts the doctor had before the real start (the idle H200's NVML numbers, the tiny
    DeepSeek-V3 target and DFlash drafter configs, the validation profile: DDTREE budget 16 at 0.35) predicts
    the KV pool SGLang then allocated (bench/results/ddtree-h200-round1: 9,267,201 tokens) within 2%."""
    from test_model_memory import TINY, ddtree_runs

    runs = [r for r in ddtree_runs() if r[1]["name"] == "ddtree-dsv3-eager"]
    if not runs:
        pytest.skip("the DDTree round-1 logs are not in bench/results/")
    from doctor.model.memory import startup_figures

    figs = startup_figures(runs[0][2])
    snap = json.loads((Path(__file__).parent / "fixtures" / "snapshots" / "h200x1-real.json").read_text())
    model = build(tmp_path)
    drafter = tmp_path / "drafter"
    build_dflash_replica(str(drafter), K26Spec.small())
    ctx = make_ctx(tmp_path, model, drafter, tp=1, profile="h200-tp8")
    opts = ctx.facts.options
    m, d = collect_model(opts), collect_drafter(opts)
    m["config"] = {"present": True, "text": json.dumps(dict(TINY["dsv3"], model_type="deepseek_v3"))}
    m["weights"]["totals"]["data_bytes"] = int(figs["load"][0][1] * GIB)  # the 0.02 GiB SGLang loaded
    d["config"] = {"present": True, "text": json.dumps(dict(TINY["dflash"], dflash_config={"block_size": 8}))}
    d["weights"] = {"totals": {"data_bytes": 0}}
    facts = {"nvml": snap["facts"]["nvml"], "model": m, "model.tensors": {"summary": None}, "drafter": d}
    profile = Path(__file__).resolve().parents[1] / "bench" / "ddtree" / "profiles" / "h200-tiny-ddtree.toml"
    res = run(make_ctx(tmp_path, model, drafter, tp=1, facts=facts, profile=str(profile)), "model.fit")
    assert res.status.value == "pass", res.summary
    assert res.details["kv_tokens"] == pytest.approx(figs["kv"][0][0], rel=0.02)
    assert res.details["pre"] / GIB == pytest.approx(figs["pre"], abs=0.05)
