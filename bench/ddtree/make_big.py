#!/usr/bin/env python3
"""A random DeepSeek-V3 large enough that loading its weights shows in a start: real safetensors shards.

Why: the trained pair's 13 MB load in 0.2 s, so a start plan's weights part (page cache or disk) was never
measured against a real load. This writes DeepSeek-V3's own architecture (``DeepseekV3ForCausalLM``, hidden 7168,
MLA with q_lora 1536 / kv_lora 512 / 128 heads, 256 routed experts of moe_intermediate 2048, 8 per token, one
shared expert, ``noaux_tc`` sigmoid routing in 8 groups) with few layers: ``--dense`` dense layers (DeepSeek-V3's
``first_k_dense_replace`` is 3) then ``--moe`` MoE layers. The default (3 + 1) is about 30 GB (28 GiB): it fits a
64 GiB disk beside the payload and one H200 with a KV cache, and it fits the page cache of a 128 GiB host.

The tensors carry DeepSeek-V3's checkpoint names and dtypes (bf16; ``e_score_correction_bias`` float32) in
``model-0000N-of-0000M.safetensors`` shards of about ``--shard-gib`` GiB with ``model.safetensors.index.json``;
the values are small normals (std 0.02, norms 1): finite, and what the load reads is every byte. They are
generated on ``--device`` (``cuda`` on the GPU host: torch's generator there is fast) one shard at a time and
written with the safetensors library. The tokenizer files of ``--tokenizer-from`` are copied when it has any
(the trained pair has none: its servers run with ``--skip-tokenizer-init``, which the big model's profile keeps).

``--tiny`` shrinks every dimension (same names, same structure, same config keys) for a test on a CPU.

Usage::

    python bench/ddtree/make_big.py OUT [--dense 3] [--moe 1] [--shard-gib 4.5] [--device cuda] [--seed 0]
    python bench/ddtree/make_big.py OUT --tiny --device cpu
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

# DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3), less the layers, the MTP layer, the FP8 quantization and the
# YaRN scaling (a bf16 checkpoint of a few layers, context 8192).
DSV3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": False,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1,
    "ep_size": 1, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 8192, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_key_value_heads": 128, "num_nextn_predict_layers": 0, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}
TINY = {"hidden_size": 128, "intermediate_size": 256, "kv_lora_rank": 32, "moe_intermediate_size": 64,
        "n_routed_experts": 16, "n_group": 4, "topk_group": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_experts_per_tok": 4, "q_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
        "v_head_dim": 32, "vocab_size": 512}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json")
GIB = 1024**3
Item = tuple[str, tuple[int, ...], str]  # a tensor: name, shape, kind (bf16, norm: ones, bias: float32)


def config_for(dense: int, moe: int, tiny: bool) -> dict:
    cfg = dict(DSV3, **(TINY if tiny else {}))
    cfg.update(num_hidden_layers=dense + moe, first_k_dense_replace=dense)
    return cfg


def tensors(cfg: dict) -> list[Item]:
    """Every tensor of the checkpoint, in the order the shards hold them: ``(name, shape, dtype)``, DeepSeek-V3's
    names (the layout SGLang's deepseek_v2.py loads: per-expert gate/up/down projections, ``kv_a_proj_with_mqa``)."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h), "bf16")]

    def mlp(prefix: str, inter: int) -> list[Item]:
        return [(f"{prefix}.gate_proj.weight", (inter, h), "bf16"), (f"{prefix}.up_proj.weight", (inter, h), "bf16"),
                (f"{prefix}.down_proj.weight", (h, inter), "bf16")]

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", (h,), "norm"), (f"{p}.post_attention_layernorm.weight", (h,), "norm"),
                (f"{p}.self_attn.q_a_proj.weight", (cfg["q_lora_rank"], h), "bf16"),
                (f"{p}.self_attn.q_a_layernorm.weight", (cfg["q_lora_rank"],), "norm"),
                (f"{p}.self_attn.q_b_proj.weight", (heads * qk, cfg["q_lora_rank"]), "bf16"),
                (f"{p}.self_attn.kv_a_proj_with_mqa.weight", (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h),
                 "bf16"),
                (f"{p}.self_attn.kv_a_layernorm.weight", (cfg["kv_lora_rank"],), "norm"),
                (f"{p}.self_attn.kv_b_proj.weight",
                 (heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]), "bf16"),
                (f"{p}.self_attn.o_proj.weight", (h, heads * cfg["v_head_dim"]), "bf16")]
        if i < cfg["first_k_dense_replace"]:
            out += mlp(f"{p}.mlp", cfg["intermediate_size"])
            continue
        out += [(f"{p}.mlp.gate.weight", (cfg["n_routed_experts"], h), "bf16"),
                (f"{p}.mlp.gate.e_score_correction_bias", (cfg["n_routed_experts"],), "bias")]
        for e in range(cfg["n_routed_experts"]):
            out += mlp(f"{p}.mlp.experts.{e}", cfg["moe_intermediate_size"])
        out += mlp(f"{p}.mlp.shared_experts", cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
    out += [("model.norm.weight", (h,), "norm"), ("lm_head.weight", (cfg["vocab_size"], h), "bf16")]
    return out


def nbytes(shape: tuple[int, ...], kind: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * (4 if kind == "bias" else 2)


def shards_of(items: list[Item], limit: int) -> list[list[Item]]:
    """The tensors cut into shards of at most ``limit`` bytes (a tensor larger than that alone in its own)."""
    shards: list[list[Item]] = [[]]
    size = 0
    for item in items:
        b = nbytes(item[1], item[2])
        if shards[-1] and size + b > limit:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += b
    return shards


def make(name: str, shape: tuple[int, ...], kind: str, device: str, gen):
    import torch

    if kind == "norm":
        return torch.ones(shape, dtype=torch.bfloat16, device=device)
    if kind == "bias":
        return torch.randn(shape, dtype=torch.float32, device=device, generator=gen) * 0.01
    return (torch.randn(shape, dtype=torch.float32, device=device, generator=gen) * 0.02).to(torch.bfloat16)


def write(out: Path, dense: int, moe: int, shard_gib: float, device: str, seed: int, tiny: bool,
          tokenizer_from: Path | None) -> dict:
    """Write the checkpoint (config first, index last: a folder with an index is whole). Returns what was written
    and how long it took."""
    import torch
    from safetensors.torch import save_file

    started = time.monotonic()
    cfg = config_for(dense, moe, tiny)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model*.safetensors*"):
        old.unlink()
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    copied = []
    if tokenizer_from is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer_from / name).is_file():
                shutil.copyfile(tokenizer_from / name, out / name)
                copied.append(name)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    plan = shards_of(tensors(cfg), int(shard_gib * GIB))
    weight_map, total, timings = {}, 0, []
    for n, shard in enumerate(plan, 1):
        name = f"model-{n:05d}-of-{len(plan):05d}.safetensors"
        t0 = time.monotonic()
        data = {k: make(k, shape, kind, device, gen).cpu() for k, shape, kind in shard}
        t1 = time.monotonic()
        save_file(data, str(out / name), metadata={"format": "pt"})
        size = (out / name).stat().st_size
        total += size
        weight_map.update({k: name for k, _, _ in shard})
        timings.append({"shard": name, "bytes": size, "generate_s": round(t1 - t0, 2),
                        "write_s": round(time.monotonic() - t1, 2)})
        print(json.dumps(timings[-1]), flush=True)
        del data
    params = sum(nbytes(s, k) for _, s, k in tensors(cfg))
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": params}, "weight_map": weight_map}, indent=1, sort_keys=True) + "\n")
    return {"path": str(out), "layers": cfg["num_hidden_layers"], "dense": dense, "moe": moe, "bytes": total,
            "tensor_bytes": params, "shards": len(plan), "tokenizer_files": copied, "device": device,
            "write_s": round(time.monotonic() - started, 1), "per_shard": timings}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dense", type=int, default=3, help="dense layers first (first_k_dense_replace)")
    ap.add_argument("--moe", type=int, default=1, help="MoE layers after them (256 experts each: 22.6 GB)")
    ap.add_argument("--shard-gib", type=float, default=4.5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="every dimension small: a test on a CPU")
    ap.add_argument("--tokenizer-from", type=Path, default=None, help="copy its tokenizer files, if it has any")
    ap.add_argument("--plan-only", action="store_true", help="print the size and the shards, write nothing")
    ns = ap.parse_args(argv)
    if ns.dense < 1 or ns.moe < 0:
        ap.error("--dense must be at least 1 and --moe at least 0")
    cfg = config_for(ns.dense, ns.moe, ns.tiny)
    if ns.plan_only:
        items = tensors(cfg)
        print(json.dumps({"bytes": sum(nbytes(s, k) for _, s, k in items), "tensors": len(items),
                          "shards": len(shards_of(items, int(ns.shard_gib * GIB)))}))
        return 0
    info = write(ns.out, ns.dense, ns.moe, ns.shard_gib, ns.device, ns.seed, ns.tiny, ns.tokenizer_from)
    print(json.dumps({k: v for k, v in info.items() if k != "per_shard"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
