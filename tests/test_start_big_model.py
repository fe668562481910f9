"""bench/ddtree/make_big.py: the random DeepSeek-V3 whose load the start plan is measured on, written for real
(``--tiny``: every dimension small, the same names, structure and config keys) and read back with the safetensors
library; the full size planned without writing it."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SCRIPT = ROOT / "bench" / "ddtree" / "make_big.py"
# The config attributes SGLang 0.5.23's sglang/srt/models/deepseek_v2.py reads as `config.<key>` (those that are
# DeepSeek-V3 config.json keys), and the ones its weight loader and transformers' DeepseekV3Config need.
SGLANG_KEYS = {"architectures", "first_k_dense_replace", "hidden_act", "hidden_size", "intermediate_size",
               "kv_lora_rank", "max_position_embeddings", "moe_intermediate_size", "moe_layer_freq", "n_group",
               "n_routed_experts", "n_shared_experts", "norm_topk_prob", "num_attention_heads", "num_experts_per_tok",
               "num_hidden_layers", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "rms_norm_eps",
               "rope_theta", "routed_scaling_factor", "scoring_func", "tie_word_embeddings", "topk_group",
               "topk_method", "v_head_dim", "vocab_size", "model_type", "num_key_value_heads", "torch_dtype",
               "num_nextn_predict_layers"}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch", reason="make_big.py generates the values with torch")
    out = tmp_path_factory.mktemp("big") / "dsv3"
    tok = out.parent / "tok"
    tok.mkdir()
    (tok / "tokenizer_config.json").write_text('{"model_max_length": 8192}')
    res = run(str(out), "--tiny", "--device", "cpu", "--shard-gib", "0.0005", "--tokenizer-from", str(tok))
    assert res.returncode == 0, res.stderr
    return out


def test_the_shards_are_real_safetensors_with_deepseek_v3s_names_and_shapes(tiny: Path) -> None:
    from safetensors import safe_open

    cfg = json.loads((tiny / "config.json").read_text())
    index = json.loads((tiny / "model.safetensors.index.json").read_text())
    shards = sorted(tiny.glob("model-*.safetensors"))
    assert len(shards) == 4 and {p.name for p in shards} == set(index["weight_map"].values())
    seen, total = {}, 0
    for path in shards:
        with safe_open(str(path), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            for key in f.keys():
                t = f.get_tensor(key)
                assert index["weight_map"][key] == path.name
                assert bool(t.float().isfinite().all()), key
                seen[key] = t
                total += t.numel() * t.element_size()
    assert set(seen) == set(index["weight_map"]) and index["metadata"]["total_size"] == total
    h, heads, qk = cfg["hidden_size"], cfg["num_attention_heads"], cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    assert tuple(seen["model.layers.0.self_attn.q_b_proj.weight"].shape) == (heads * qk, cfg["q_lora_rank"])
    assert tuple(seen["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].shape) == (
        cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h)
    assert tuple(seen["model.layers.2.mlp.down_proj.weight"].shape) == (h, cfg["intermediate_size"])  # dense
    moe = cfg["first_k_dense_replace"]
    experts = {k for k in seen if k.startswith(f"model.layers.{moe}.mlp.experts.")}
    assert len(experts) == 3 * cfg["n_routed_experts"] and f"model.layers.{moe}.mlp.gate.weight" in seen
    assert tuple(seen[f"model.layers.{moe}.mlp.experts.15.up_proj.weight"].shape) == (cfg["moe_intermediate_size"], h)
    assert str(seen[f"model.layers.{moe}.mlp.gate.e_score_correction_bias"].dtype) == "torch.float32"
    assert str(seen["lm_head.weight"].dtype) == "torch.bfloat16"
    assert not any(".mlp.experts." in k for k in seen if k.startswith("model.layers.0."))
    w = seen["model.layers.0.self_attn.o_proj.weight"].float()
    assert 0.015 < float(w.std()) < 0.025 and abs(float(w.mean())) < 0.005  # small normals
    assert float(seen["model.norm.weight"].float().min()) == 1.0


def test_the_config_is_deepseek_v3s_with_the_keys_sglang_reads(tiny: Path) -> None:
    cfg = json.loads((tiny / "config.json").read_text())
    assert SGLANG_KEYS <= set(cfg), SGLANG_KEYS - set(cfg)
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    assert cfg["num_hidden_layers"] == 4 and cfg["first_k_dense_replace"] == 3
    assert cfg["topk_method"] == "noaux_tc" and cfg["scoring_func"] == "sigmoid"
    assert cfg["n_routed_experts"] % cfg["n_group"] == 0 and cfg["topk_group"] <= cfg["n_group"]
    assert "quantization_config" not in cfg  # bf16 weights
    assert (tiny / "tokenizer_config.json").read_text() == '{"model_max_length": 8192}'


def test_the_same_seed_writes_the_same_bytes(tiny: Path, tmp_path: Path) -> None:
    res = run(str(tmp_path / "again"), "--tiny", "--device", "cpu", "--shard-gib", "0.0005")
    assert res.returncode == 0, res.stderr

    def digest(folder: Path) -> list[str]:
        return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("model-*.safetensors"))]

    assert digest(tmp_path / "again") == digest(tiny)


def test_the_full_model_is_planned_to_fit_the_h200_host() -> None:
    """The default: DeepSeek-V3's real widths, 3 dense layers and one of 256 experts: 28 GiB in shards of at most
    4.5 GiB (a 64 GiB disk beside the payload, one H200's memory with a KV cache, a 128 GiB host's page cache)."""
    res = run("/nonexistent/never-written", "--plan-only")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert 26 * 2**30 < plan["bytes"] < 30 * 2**30 and plan["shards"] == math.ceil(plan["bytes"] / (4.5 * 2**30))
    assert not Path("/nonexistent/never-written").exists()
    two = json.loads(run("/nonexistent/x", "--plan-only", "--dense", "1", "--moe", "2").stdout)
    assert two["bytes"] > 45 * 2**30  # a second MoE layer: 22.6 GB more, past the disk's room
    assert run("/nonexistent/x", "--dense", "0").returncode != 0


def test_the_big_models_profile_serves_it_alone(tiny: Path, tmp_path: Path) -> None:
    """bench_start_plan.py's profile for the big model (from the trained pair's, as gpu_session.sh points it): the
    server command `launch` would exec names the big model, no drafter, no speculative decoding, room for a KV
    cache beside 28 GiB of weights."""
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_start_plan

    text = (ROOT / "bench" / "ddtree" / "profiles" / "h200-trained-ddtree.toml").read_text()
    trained = tmp_path / "trained.toml"
    trained.write_text(text.replace("/tmp/trained", str(tmp_path / "pair")))
    profile = bench_start_plan.big_profile(tmp_path, tiny, trained)
    res = subprocess.run([sys.executable, "-m", "doctor", "launch", "--profile", str(profile), "--python",
                          sys.executable, "--dry-run"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    argv = res.stdout.split("\n")
    assert argv[argv.index("--model-path") + 1] == str(tiny), res.stdout + res.stderr
    assert "--speculative-algorithm" not in argv and "--speculative-draft-model-path" not in argv
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.6" and "--skip-tokenizer-init" in argv


def test_the_bench_writes_the_big_model_in_a_process_of_its_own(tmp_path: Path) -> None:
    """bench_start_plan.write_big runs make_big.py as a child process (here --tiny on the CPU): the bench's own
    process never imports torch, so it holds no GPU memory when the doctor's gpu.idle looks before the launch (on
    the H200 it held 7.5 GiB and the big model's launch was refused); a failed write raises with its cause."""
    pytest.importorskip("torch", reason="make_big.py generates the values with torch")
    out = tmp_path / "dsv3"
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import bench_start_plan as b; from pathlib import "
            "Path; info = b.write_big(Path(sys.argv[2]), 1, 1, device='cpu', tiny=True); "
            "print(json.dumps({'torch': 'torch' in sys.modules, 'info': info}))")
    res = subprocess.run([sys.executable, "-c", code, str(ROOT / "bench"), str(out)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["torch"] is False
    info = got["info"]
    assert info["layers"] == 2 and info["device"] == "cpu" and info["per_shard"], info
    assert (out / "model.safetensors.index.json").is_file()
    assert sum(f.stat().st_size for f in out.glob("*.safetensors")) == info["bytes"]
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_start_plan

    assert bench_start_plan.write_big(out, 1, 1)["reused"] is True  # a whole one of that shape is kept
    with pytest.raises(RuntimeError, match=r"make_big\.py exited with status"):
        bench_start_plan.write_big(tmp_path / "bad", 0, 1, device="cpu", tiny=True)


def test_setup_applies_the_patch_set_again_when_the_repositorys_differs(tmp_path: Path) -> None:
    """gpu_session.sh's setup records the patch set's hash in .setup-done: the same set skips the setup, another
    (an earlier revision applied to the site) removes the unpacked SGLang so that it is unpacked and patched again
    (here there is no payload to unpack: it stops saying so)."""
    script = ROOT / "bench" / "ddtree" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    work = tmp_path / "work"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "WORK": str(work), "OUT": str(tmp_path / "out")}
    patch_set = ROOT / "sglang_patches" / "ddtree-0.5.23"
    digest = hashlib.sha256((patch_set / "manifest.json").read_bytes() + b"".join(
        p.read_bytes() for p in sorted(patch_set.glob("*.patch")))).hexdigest()[:16]
    (work / "site" / "sglang").mkdir(parents=True)
    (work / "site" / "sglang" / "ddtree_added.py").write_text("# a file an earlier revision of the set added\n")
    (work / ".setup-done").write_text(f"patch-set {digest}\n")
    same = subprocess.run(["bash", str(script), "setup"], env=env, capture_output=True, text=True, timeout=60)
    assert f"setup: already done on this host (patch set {digest})" in same.stdout, same.stdout + same.stderr
    assert (work / "site" / "sglang" / "ddtree_added.py").exists()
    (work / ".setup-done").write_text("patch-set 0123456789abcdef\n")
    other = subprocess.run(["bash", str(script), "setup"], env=env, capture_output=True, text=True, timeout=60)
    assert f"the site holds patch set 0123456789abcdef, the repository's is {digest}" in other.stdout, other.stdout
    assert not (work / "site" / "sglang").exists() and "no SGLang payload on this host" in other.stdout
    assert (work / ".setup-done").read_text() == "patch-set 0123456789abcdef\n"  # not done: not recorded
