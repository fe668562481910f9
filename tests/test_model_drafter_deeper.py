"""model.drafter and sglang.flags on drafters that SGLang starts with and that then draft nothing, or that stop
it late: a draft vocabulary without its lm_head, target_layer_ids of a deeper target, EAGLE3 and MTP drafts named
by their config's keys under DDTREE, and a drafting argv without a draft model. Real sparse safetensors
(``tests/model_replica.py``) and real config files; the flag table read from SGLang 0.5.23's real sources."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from model_replica import write_sparse_safetensors
from modelkit import SMALL, build, build_drafter, make_ctx, run, tree_state
from modelkit import edit_config as edit

from doctor.core.result import Status


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return build(tmp_path)


def add_tensor(shard: Path, name: str, dtype: str, shape: tuple[int, ...]) -> None:
    """Rewrite a sparse shard with one more tensor, the others as its real header lists them."""
    with shard.open("rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    meta = header.pop("__metadata__", None)
    tensors = [(k, v["dtype"], tuple(v["shape"])) for k, v in
               sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])]
    write_sparse_safetensors(str(shard), [*tensors, (name, dtype, shape)], meta)


def drafter_result(tmp_path: Path, model: Path, drafter: Path | None, profile: str = "b300-tp8-ddtree",
                   **server: object):
    ctx = make_ctx(tmp_path, model, drafter, profile=profile)
    ctx.settings.profile["server"].update(server)
    before = tree_state(drafter) if drafter else None
    res = run(ctx, "model.drafter")
    if drafter:
        assert tree_state(drafter) == before
    return res


# -- a draft vocabulary without its lm_head ---------------------------------------------------------------

def test_draft_vocabulary_without_lm_head_fails(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path)
    edit(d / "config.json", lambda c: c.update(draft_vocab_size=32000))
    res = drafter_result(tmp_path, model, d)
    assert res.status is Status.FAIL
    assert "declares a draft vocabulary (draft_vocab_size 32000) but the shards hold no lm_head.weight" in res.summary
    assert "model.drafter.no_lm_head" in res.details["problem_codes"]


def test_draft_vocabulary_with_its_lm_head_passes_and_one_of_other_rows_fails(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path)
    edit(d / "config.json", lambda c: c.update(draft_vocab_size=32000))
    add_tensor(d / "model.safetensors", "lm_head.weight", "BF16", (32000, SMALL.hidden_size))
    res = drafter_result(tmp_path, model, d)
    assert res.status is not Status.FAIL, res.summary
    assert "no_lm_head" not in " ".join(res.details.get("problem_codes") or [])
    d2 = build_drafter(tmp_path, name="d2")
    edit(d2 / "config.json", lambda c: c.update(draft_vocab_size=32000))
    add_tensor(d2 / "model.safetensors", "lm_head.weight", "BF16", (SMALL.vocab_size, SMALL.hidden_size))
    res = drafter_result(tmp_path, model, d2)
    assert res.status is Status.FAIL
    assert f"lm_head.weight has [{SMALL.vocab_size}] rows, config.json's draft_vocab_size is 32000" in res.summary


def test_a_dflash_drafter_without_draft_vocabulary_needs_no_lm_head(tmp_path: Path, model: Path) -> None:
    res = drafter_result(tmp_path, model, build_drafter(tmp_path))
    assert res.status is not Status.FAIL, res.summary
    assert res.details["problem_codes"] == []


# -- target_layer_ids of a deeper target -----------------------------------------------------------------

def test_target_layer_ids_of_a_deeper_target_name_the_depth_it_was_built_for(tmp_path: Path, model: Path) -> None:
    layers = json.loads((model / "config.json").read_text())["text_config"]["num_hidden_layers"]
    d = build_drafter(tmp_path, target_layer_ids=[1, layers + 2])
    res = drafter_result(tmp_path, model, d)
    assert res.status is Status.FAIL
    assert f"target_layer_ids [{layers + 2}] are outside the target's {layers} layers" in res.summary
    assert f"built for a target of at least {layers + 3} layers" in res.summary
    assert "mat1 and mat2 shapes cannot be multiplied" in res.summary
    # the last layer itself is inside: no "deeper target" said
    ok = build_drafter(tmp_path, name="ok", target_layer_ids=[1, layers - 1])
    assert "deeper" not in drafter_result(tmp_path, model, ok).summary
    assert "outside" not in drafter_result(tmp_path, model, ok).summary


# -- EAGLE3 and MTP drafts named by their keys under DDTREE ------------------------------------------------

def eagle3_config(c: dict) -> None:
    """SpecForge's EAGLE3 export of a Llama-style draft: architectures that name no algorithm, eagle_config."""
    c.pop("dflash_config")
    c.update(architectures=["LlamaForCausalLM"], draft_vocab_size=32000,
             eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": True})


def test_eagle3_draft_named_by_its_eagle_config_under_ddtree(tmp_path: Path, model: Path) -> None:
    d = build_drafter(tmp_path)
    edit(d / "config.json", eagle3_config)
    res = drafter_result(tmp_path, model, d)
    assert res.status is Status.FAIL
    text = " | ".join(res.details["problems"])
    assert "the drafter is an EAGLE3 drafter (LlamaForCausalLM; its config.json has eagle_config), but the server " \
           "runs --speculative-algorithm DDTREE, which needs a DFlash drafter" in text
    assert "model.drafter.wrong_algorithm" in res.details["problem_codes"]


def test_mtp_draft_with_the_targets_architectures_is_named_an_mtp_draft(tmp_path: Path, model: Path) -> None:
    archs = json.loads((model / "config.json").read_text())["architectures"]
    d = build_drafter(tmp_path)
    edit(d / "config.json", lambda c: (c.pop("dflash_config"), c.update(architectures=archs,
                                                                          num_nextn_predict_layers=1)))
    res = drafter_result(tmp_path, model, d, speculative_algorithm="DFLASH")
    text = " | ".join(res.details["problems"])
    assert "the drafter is an EAGLE or NextN (MTP) drafter" in text and "num_nextn_predict_layers" in text
    assert "copy of the target" not in text
    assert "--speculative-algorithm DFLASH" in text


def test_named_by_keys() -> None:
    from doctor.model.drafter import named_by_keys

    assert named_by_keys({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1]}}) == "EAGLE3"
    assert named_by_keys({"num_nextn_predict_layers": 1}) == "EAGLE"
    assert named_by_keys({"num_nextn_predict_layers": 0}) is None  # a target's own config says 0
    assert named_by_keys({"num_nextn_predict_layers": 1, "dflash_config": {}}) is None


# -- a drafting argv without a draft model ---------------------------------------------------------------

def test_speculative_algorithm_in_server_args_without_a_draft_model(tmp_path: Path, model: Path) -> None:
    ctx = make_ctx(tmp_path, model, None, profile="b300-tp8-ddtree")
    server = ctx.settings.profile["server"]
    server.pop("speculative_algorithm")
    server["args"] = [*server.get("args", []), "--speculative-algorithm", "EAGLE3"]
    res = run(ctx, "model.drafter")
    assert res.status is Status.FAIL and res.has("model.drafter.no_path")
    assert "--speculative-algorithm EAGLE3 (in [server] args) but no draft model is given" in res.summary


# -- diagnose: the error text of a failed start ----------------------------------------------------------

def test_diagnose_names_the_drafter_for_a_shape_mismatch_in_the_draft_step() -> None:
    from doctor.service.diagnose import diagnose_lines, load_signatures

    lines = ['  File "sglang/srt/speculative/dflash_worker.py", line 412, in forward_draft',
             "RuntimeError: mat1 and mat2 shapes cannot be multiplied (7x21504 and 28672x7168)"]
    found = diagnose_lines(lines, load_signatures())
    assert found[0].signature.id == "draft-target-layers-shape" and found[0].signature.check == "model.drafter"
    # the same torch error with no draft model about it is not blamed on the drafter
    assert not any(f.signature.check == "model.drafter"
                   for f in diagnose_lines(["RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x2 and 3x4)"],
                                           load_signatures()))


@pytest.mark.parametrize("check_id, words", [
    ("model.drafter", ["draft_vocab_size", "lm_head.weight", "mat1 and mat2 shapes cannot be multiplied",
                       "eagle_config", "num_nextn_predict_layers"]),
    ("sglang.flags", ["--speculative-draft-model-path", "sglang.flags.no_draft_model"]),
])
def test_explain_says_what_the_drafter_judgement_reads(check_id: str, words: list[str]) -> None:
    from conftest import run_doctor

    out = run_doctor("explain", check_id)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0 and all(w in text for w in words), out.stdout
