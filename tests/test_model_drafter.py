"""model.drafter against the target and the server command, and model.config's remote code, on real
replicas (safetensors headers, configs as published) and the built-in profiles."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from modelkit import build, build_drafter, make_ctx, run, tree_state
from modelkit import edit_config as edit

from doctor.model.drafter import arg_value


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return build(tmp_path)


def drafter_result(tmp_path: Path, model: Path, drafter: Path, profile: str = "b300-tp8-ddtree", **server: object):
    ctx = make_ctx(tmp_path, model, drafter, profile=profile)
    ctx.settings.profile["server"].update(server)
    before = tree_state(drafter)
    res = run(ctx, "model.drafter")
    assert tree_state(drafter) == before
    return res


# -- the draft path ------------------------------------------------------------------------------

def test_draft_path_is_the_target(tmp_path: Path, model: Path) -> None:
    res = drafter_result(tmp_path, model, model)
    assert res.status.value == "fail" and "is the target model's directory" in res.summary
    assert "Point --draft-model-path" in res.remediation.text
    assert res.remediation.commands == ["hf download example/Kimi-K2.6-DFlash --local-dir '<drafter dir>'"]
    assert not any("model-0" in c for c in res.remediation.commands)  # never "re-download the target's shards"


def test_draft_path_is_a_link_to_the_target(tmp_path: Path, model: Path) -> None:
    link = tmp_path / "drafter-link"
    os.symlink(model, link)
    res = drafter_result(tmp_path, model, link)
    assert res.status.value == "fail" and "is the target model's directory" in res.summary


def test_a_copy_of_the_target_as_drafter(tmp_path: Path, model: Path) -> None:
    copy = build(tmp_path, name="copy")
    res = drafter_result(tmp_path, model, copy)
    assert res.status.value == "fail"
    assert any("are the target's: --draft-model-path points at a copy of the target" in p
               for p in res.details["problems"])


# -- the algorithm ----------------------------------------------------------------------------------

def test_eagle3_drafter_under_ddtree(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path)
    edit(d / "config.json", lambda c: c.update(architectures=["Eagle3DeepseekV2ForCausalLM"]))
    res = drafter_result(tmp_path, model, d)
    assert res.status.value == "fail"
    text = " | ".join(res.details["problems"])
    assert "the drafter is an EAGLE3 drafter (Eagle3DeepseekV2ForCausalLM), but the server runs " \
           "--speculative-algorithm DDTREE, which needs a DFlash drafter" in text


def test_dflash_drafter_under_eagle3(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path)
    ctx = make_ctx(tmp_path, model, d)
    ctx.settings.profile["server"]["speculative_algorithm"] = "EAGLE3"
    ctx.settings.profile["drafter"].pop("architectures")
    res = run(ctx, "model.drafter")
    assert res.status.value == "fail"
    (problem,) = res.details["problems"]
    assert problem.startswith("the drafter is a DFlash drafter (DFlashDraftModel), but the server runs "
                              "--speculative-algorithm EAGLE3, which needs an EAGLE3 drafter")
    assert "set [server] speculative_algorithm = DFLASH" in res.remediation.text


def test_unknown_drafter_architecture_warns(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path)
    edit(d / "config.json", lambda c: c.update(architectures=["SomeNewDraftModel"]))
    ctx = make_ctx(tmp_path, model, d)
    ctx.settings.profile["drafter"].pop("architectures")
    res = run(ctx, "model.drafter")
    assert res.status.value == "warn" and "none SGLang 0.5.23 runs under DDTREE" in res.summary


# -- the drafter's own consistency ------------------------------------------------------------------

def test_target_layer_ids_against_the_fc_width(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path, target_layer_ids=[1, 2])  # fc takes 2 x hidden
    edit(d / "config.json", lambda c: c["dflash_config"].update(target_layer_ids=[0, 1, 2]))
    res = drafter_result(tmp_path, model, d)
    assert res.status.value == "fail"
    assert "fc.weight takes 2 target hidden state(s) but target_layer_ids lists 3" in res.summary


def test_target_layer_ids_use_the_text_config_layers(tmp_path: Path, model: Path) -> None:
    """kimi_k25 keeps num_hidden_layers under text_config (4 in the small replica)."""
    d = build_drafter(tmp_path, target_layer_ids=[1, 4])
    res = drafter_result(tmp_path, model, d)
    assert res.status.value == "fail" and "target_layer_ids [4] are outside the target's 4 layers" in res.summary
    assert res.findings[0].code == "model.drafter.mismatch"  # config.json's: the drafter trained for this target


# -- DDTREE: block, budget, target backend ------------------------------------------------------------

def test_budget_below_the_block(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path, block_size=16)
    res = drafter_result(tmp_path, model, d, ddtree_budget=8)
    assert res.status.value == "fail"
    assert "--speculative-ddtree-budget 8 is below the DFlash block minus one (15, the drafter's block_size)" \
        in res.summary
    assert "ddtree_budget to at least 15" in res.remediation.text
    assert drafter_result(tmp_path, model, d, ddtree_budget=15).status.value == "pass"


def test_block_from_the_flag_wins_over_the_config(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path, block_size=8)
    res = drafter_result(tmp_path, model, d, ddtree_budget=8,
                         args=["--speculative-dflash-block-size", "32", "--reasoning-parser", "kimi_k2"])
    assert res.status.value == "fail" and "(31, --speculative-dflash-block-size)" in res.summary


def test_block_of_one_and_no_budget(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path, block_size=1)
    assert "DFlash block of at least 2" in drafter_result(tmp_path, model, d).summary
    d2 = build_drafter(tmp_path, name="d2")
    ctx = make_ctx(tmp_path, model, d2)
    ctx.settings.profile["server"].pop("ddtree_budget")
    res = run(ctx, "model.drafter")
    assert res.status.value == "fail" and "needs --speculative-ddtree-budget N" in res.summary


@pytest.mark.parametrize("backend", ["flashinfer", "trtllm_mla", None])
def test_ddtree_needs_the_triton_target_backend(tmp_path: Path, model: Path, backend: str | None) -> None:
    d = build_drafter(tmp_path)
    res = drafter_result(tmp_path, model, d, attention_backend=backend)
    assert res.status.value == "fail"
    assert "DDTREE verifies its tree only on the triton attention backend" in " | ".join(res.details["problems"])
    assert '--attention-backend triton' in res.remediation.text


# -- the draft attention backend against an MLA target (DFLASH, b200 profile) ----------------------------

def test_mla_only_backend_inherited_by_the_dflash_draft(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path)
    res = drafter_result(tmp_path, model, d, profile="b200-tp8", attention_backend="trtllm_mla")
    assert res.status.value == "warn"
    assert ("the DFlash draft would run on trtllm_mla (the target's attention backend): trtllm_mla runs only MLA "
            "attention (the target is MLA, DFlash drafter is a GQA model); SGLang silently replaces it with "
            "flashinfer") in res.summary
    assert "--speculative-draft-attention-backend triton" in res.remediation.text
    named = drafter_result(tmp_path, model, d, profile="b200-tp8", attention_backend="trtllm_mla",
                           args=["--speculative-draft-attention-backend", "fa3"])
    assert named.status.value == "pass", named.summary


def test_dflash_num_draft_tokens_must_equal_the_block(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path, block_size=16)
    res = drafter_result(tmp_path, model, d, profile="b200-tp8", args=["--speculative-num-draft-tokens", "8"])
    assert res.status.value == "fail"
    assert "--speculative-num-draft-tokens 8 differs from the DFlash block 16" in res.summary


def test_arg_value() -> None:
    assert arg_value(["--a", "1", "--a=2"], "--a") == "2"
    assert arg_value(["--a"], "--a") is None and arg_value([], "--a") is None


# -- model.config: the remote code -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["configuration_kimi_k25.py", "modeling_kimi_k25.py", "tokenization_kimi.py"])
def test_config_names_a_missing_remote_code_file_and_the_download(tmp_path: Path, model: Path, name: str) -> None:
    (model / name).unlink()
    res = run(make_ctx(tmp_path, model), "model.config")
    assert res.status.value == "fail"
    assert f"remote-code file {name} named by auto_map is missing" in res.summary
    assert res.remediation.commands == [f"hf download moonshotai/Kimi-K2.6 --include {name} --local-dir {model}"]


def test_config_follows_relative_imports_of_remote_code(tmp_path: Path, model: Path) -> None:
    (model / "modeling_kimi_k25.py").write_text("from .modeling_deepseek import DeepseekV3ForCausalLM\n")
    res = run(make_ctx(tmp_path, model), "model.config")
    assert res.status.value == "fail"
    assert "remote-code file modeling_deepseek.py (imported by modeling_kimi_k25.py) is missing" in res.summary
    (model / "modeling_deepseek.py").write_text("class DeepseekV3ForCausalLM:\n    pass\n")
    assert run(make_ctx(tmp_path, model), "model.config").status.value == "pass"


def test_config_unreadable_remote_code(tmp_path: Path, model: Path) -> None:
    (model / "configuration_kimi_k25.py").write_bytes(b"class KimiK25Config(:\n\xff\xfe")
    res = run(make_ctx(tmp_path, model), "model.config")
    assert res.status.value == "fail" and "configuration_kimi_k25.py not readable Python" in res.summary
