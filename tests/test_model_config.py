"""model.config, model.tokenizer, model.drafter and model.fit on real replicas and reference GPU numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from interpreters import bare_python

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from kimi_kit import transformers_python
from model_replica import K26Spec, k26_config
from modelkit import SMALL, build, build_drafter, make_ctx, run, tree_state

from doctor.model.modelconfig import read_config


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return build(tmp_path)


def edit_config(model: Path, mutate) -> None:
    p = model / "config.json"
    cfg = json.loads(p.read_text())
    mutate(cfg)
    p.write_text(json.dumps(cfg))


def judge(tmp_path, model, check_id, **kw):
    before = tree_state(model)
    res = run(make_ctx(tmp_path, model, **kw), check_id)
    assert tree_state(model) == before
    return res


# -- model.config ---------------------------------------------------------------------------------

def test_config_passes_and_describes(tmp_path, model):
    res = judge(tmp_path, model, "model.config")
    assert res.status.value == "pass", res.details
    assert "kimi_k25 (text kimi_k2): 4 layers, 8 experts" in res.summary and "int4 group 32" in res.summary
    assert res.details["checked_against_shards"] is True


def test_profile_expectations_fail(tmp_path, model):
    """The built-in K2.6 profile expects 61 layers / 384 experts: the small replica must fail them."""
    ctx = make_ctx(tmp_path, model)
    ctx.settings.profile["model"]["num_hidden_layers"] = 61
    ctx.settings.profile["model"]["n_routed_experts"] = 384
    res = run(ctx, "model.config")
    assert res.status.value == "fail"
    assert "num_hidden_layers is 4, the profile expects 61" in res.details["problems"]
    assert "n_routed_experts is 8, the profile expects 384" in res.details["problems"]
    assert {f.code for f in res.findings} == {"model.config.profile"}  # one finding each, coded by its fix
    assert len(res.findings) == len(res.details["problems"])


def test_bad_json_config(tmp_path, model):
    (model / "config.json").write_text("{'model_type': 'kimi_k25'")
    res = judge(tmp_path, model, "model.config")
    assert res.status.value == "fail" and "config.json is not valid JSON" in res.summary


def test_missing_config(tmp_path, model):
    (model / "config.json").unlink()
    res = judge(tmp_path, model, "model.config")
    assert res.status.value == "fail" and "config.json is missing" in res.summary


def test_config_layers_disagree_with_shards(tmp_path, model):
    edit_config(model, lambda c: c["text_config"].update(num_hidden_layers=6))
    ctx = make_ctx(tmp_path, model)
    ctx.settings.profile["model"]["num_hidden_layers"] = 6
    res = run(ctx, "model.config")
    assert res.status.value == "fail"
    assert "num_hidden_layers=6 but the shards lack layer(s) 4-5" in res.summary
    assert res.has("model.config.mismatch") and not res.has("model.config.profile")


def test_config_experts_disagree_with_shards(tmp_path, model):
    edit_config(model, lambda c: c["text_config"].update(n_routed_experts=16))
    ctx = make_ctx(tmp_path, model)
    ctx.settings.profile["model"]["n_routed_experts"] = 16
    res = run(ctx, "model.config")
    assert res.status.value == "fail" and "n_routed_experts=16; the shards differ: layer 1: 8" in res.summary


def test_group_size_disagrees_with_shards(tmp_path, model):
    edit_config(model, lambda c: c["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]
                .update(group_size=64))
    res = judge(tmp_path, model, "model.config")
    assert res.status.value == "fail"
    assert "group_size 64 implies" in res.summary and "(group size 32 in the shards)" in res.summary


def test_packed_shape_disagrees_with_hidden(tmp_path):
    spec = K26Spec.small(hidden_size=512)
    model = build(tmp_path, spec)
    edit_config(model, lambda c: c["text_config"].update(hidden_size=256))
    res = judge(tmp_path, model, "model.config")
    assert res.status.value == "fail"
    assert any("weight_packed" in p for p in res.details["problems"])


def test_int4_shards_without_quantization_config(tmp_path, model):
    edit_config(model, lambda c: c["text_config"].pop("quantization_config"))
    ctx = make_ctx(tmp_path, model)
    ctx.settings.profile["model"].pop("quantization", None)
    res = run(ctx, "model.config")
    assert res.status.value == "fail" and "no compressed-tensors int4 quantization_config" in res.summary


def test_tp_divisibility(tmp_path, model):
    res = judge(tmp_path, model, "model.config", tp=3)
    assert res.status.value == "fail" and "num_attention_heads=8 is not divisible by TP 3" in res.summary
    assert res.has("model.config.tp") and not res.has("model.config.mismatch")


def test_ep_divisibility(tmp_path, model):
    ctx = make_ctx(tmp_path, model, tp=6, profile="rtxpro6000-ep8")
    ctx.settings.profile["parallel"]["ep"] = 3
    res = run(ctx, "model.config")
    assert "n_routed_experts=8 is not divisible by EP 3" in res.details["problems"]


def test_wrong_types_named(tmp_path, model):
    edit_config(model, lambda c: c["text_config"].update(hidden_size="7168", num_attention_heads=-1))
    res = judge(tmp_path, model, "model.config")
    assert res.status.value == "fail"
    assert "text_config.hidden_size is '7168', not a positive integer" in res.details["problems"]


def test_text_model_type_must_be_deepseek_like(tmp_path, model):
    edit_config(model, lambda c: c["text_config"].update(model_type="llama"))
    res = judge(tmp_path, model, "model.config")
    assert res.status.value == "fail" and "kimi_k25 expects one of kimi_k2, deepseek_v3" in res.summary


def test_plain_deepseek_v3_top_level_quant(tmp_path, model):
    def flatten(c):
        text = c.pop("text_config")
        c.clear()
        c.update(text)
        c["model_type"] = "deepseek_v3"
    edit_config(model, flatten)
    view = read_config(json.loads((model / "config.json").read_text()))
    assert view.family == "deepseek_v3" and view.quant_where == "top level" and view.quant["group_size"] == 32
    ctx = make_ctx(tmp_path, model)
    ctx.settings.profile["model"]["model_type"] = "deepseek_v3"
    ctx.settings.profile["model"]["architectures"] = ["DeepseekV3ForCausalLM"]
    res = run(ctx, "model.config")
    assert res.status.value == "pass", res.details


def test_generic_model(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
           "vocab_size": 100}
    view = read_config(cfg)
    assert view.family == "generic" and not view.problems
    assert read_config({"model_type": "llama", "hidden_size": 0}).problems == [
        "hidden_size is 0, not a positive integer"]
    assert read_config([1, 2]).problems


# -- model.tokenizer ------------------------------------------------------------------------------
# The service interpreter of the tests that judge the files: a venv with the transformers SGLang 0.5.23 requires
# (5.19.0, this interpreter's too), so the load is tried as on a server, without this interpreter's torch, whose
# import alone costs a probe about 7 of its 10 seconds here (the replica's load fails alike in both).
SERVICE = "5.19.0"

def test_tokenizer_files_pass_and_say_remote_code(tmp_path, model):
    """The files are judged; the load is not (the service interpreter here has no transformers: see
    test_model_tokenizer.py for the load in real ones), so the verdict is skip, never pass."""
    res = judge(tmp_path, model, "model.tokenizer", python=str(bare_python()))
    assert res.status.value == "skip", res.summary
    assert "transformers is not importable" in res.summary
    assert "needs --trust-remote-code" in res.summary and res.details["trust_remote_code_required"]


@pytest.mark.network
@pytest.mark.parametrize("remove,expect", [
    ("tiktoken.model", "needs tiktoken.model"),
    ("chat_template.jinja", "no chat template"),
    ("tokenization_kimi.py", "tokenization_kimi.py named by auto_map is missing"),
    ("modeling_kimi_k25.py", "modeling_kimi_k25.py named by auto_map is missing"),
])
def test_tokenizer_missing_files(tmp_path, model, remove, expect):
    (model / remove).unlink()
    res = judge(tmp_path, model, "model.tokenizer", python=transformers_python(SERVICE))
    assert res.status.value == "fail"
    assert any(expect in p for p in res.details["problems"]), res.details["problems"]


@pytest.mark.network
def test_tokenizer_config_bad_json(tmp_path, model):
    (model / "tokenizer_config.json").write_text("{")
    res = judge(tmp_path, model, "model.tokenizer", python=transformers_python(SERVICE))
    assert res.status.value == "fail" and "tokenizer_config.json is not valid JSON" in res.summary


@pytest.mark.network
def test_remote_code_turned_off(tmp_path, model):
    ctx = make_ctx(tmp_path, model, python=transformers_python(SERVICE))
    ctx.settings.profile["model"]["trust_remote_code"] = False
    res = run(ctx, "model.tokenizer")
    assert res.status.value == "fail" and "trust_remote_code = false" in json.dumps(res.details)


# -- model.drafter --------------------------------------------------------------------------------

def test_drafter_passes(tmp_path, model):
    d = build_drafter(tmp_path)
    res = run(make_ctx(tmp_path, model, d), "model.drafter")
    assert res.status.value == "pass", res.details


def test_no_drafter_fails_when_the_profile_drafts(tmp_path, model):
    """The profile speculates (DDTREE): a draft model is a required input, and a missing one is a failure."""
    res = run(make_ctx(tmp_path, model, None), "model.drafter")
    assert res.status.value == "fail" and "--draft-model-path" in res.summary


def test_no_drafter_skips_when_the_profile_does_not_draft(tmp_path, model):
    ctx = make_ctx(tmp_path, model, None, extra_toml='[server]\nspeculative_algorithm = ""\n')
    res = run(ctx, "model.drafter")
    assert res.status.value == "skip" and "uses no draft model" in res.summary


@pytest.mark.parametrize("kw,expect", [
    ({"target_layer_ids": [1, 7]}, "target_layer_ids [7] are outside the target's 4 layers"),
    ({"mask_token_id": SMALL.vocab_size}, f"mask_token_id {SMALL.vocab_size} is outside the vocabulary"),
    ({"block_size": 0}, "block_size is 0; it must be an integer >= 1"),
])
def test_drafter_bad_config(tmp_path, model, kw, expect):
    d = build_drafter(tmp_path, **kw)
    before = tree_state(d)
    res = run(make_ctx(tmp_path, model, d), "model.drafter")
    assert tree_state(d) == before
    assert res.status.value == "fail" and any(expect in p for p in res.details["problems"]), res.details


def test_drafter_hidden_and_vocab_must_match_target(tmp_path, model):
    d = build_drafter(tmp_path, K26Spec.small(hidden_size=128, vocab_size=2048), mask_token_id=5)
    res = run(make_ctx(tmp_path, model, d), "model.drafter")
    assert res.status.value == "fail"
    assert "hidden_size is 128, the target's is 256" in res.details["problems"]
    assert "vocab_size is 2048, the target's is 1024" in res.details["problems"]


def test_drafter_shards_use_the_same_validator(tmp_path, model):
    d = build_drafter(tmp_path)
    with open(d / "model.safetensors", "r+b") as fh:
        fh.truncate(1000)
    res = run(make_ctx(tmp_path, model, d), "model.drafter")
    assert res.status.value == "fail" and "model.safetensors" in res.summary and "truncated" in res.summary


# -- model.fit: tests/test_model_fit.py (the window), tests/test_model_memory.py (the arithmetic) --------


def test_full_k26_config_reads_back():
    view = read_config(k26_config(K26Spec()))
    assert not view.problems
    assert view.int_field("num_hidden_layers") == 61 and view.int_field("n_routed_experts") == 384


@pytest.mark.network
def test_snapshot_redaction_keeps_the_verdicts(tmp_path, model):
    """Snapshots redact values under secret-looking keys (mask_token_id, num_key_value_heads, tokenizer_*):
    the model facts must replay to the same verdicts."""
    from doctor.facts.redaction import redact

    d = build_drafter(tmp_path)
    live = make_ctx(tmp_path, model, d, python=transformers_python(SERVICE))
    ids = ("model.shards", "model.config", "model.tokenizer", "model.drafter")
    verdicts = {i: run(live, i) for i in ids}
    facts = {n: redact(json.loads(json.dumps(live.fact(n)))) for n in ("model", "model.tensors", "drafter",
                                                                        "model.tokenizer")}
    replay = make_ctx(tmp_path, model, d, facts=facts, python=transformers_python(SERVICE))
    for i in ids:
        again = run(replay, i)
        assert (again.status, again.summary) == (verdicts[i].status, verdicts[i].summary), i


def test_kv_bytes_per_token():
    from doctor.model.fit import kv_bytes_per_token

    k26 = read_config(k26_config(K26Spec()))
    assert kv_bytes_per_token(k26, 8) == 61 * (512 + 64) * 2  # MLA latent, the same on every TP rank
    assert kv_bytes_per_token(k26, 8, "fp8_e4m3") == 61 * (512 + 64)
    llama = read_config({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                         "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 10})
    assert kv_bytes_per_token(llama, 2) == 2 * 2 * 4 * 8 * 2
