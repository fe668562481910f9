#!/usr/bin/env python3
"""Tiny target/drafter checkpoints for running DDTree inside a real SGLang server (no weights carried).

Two targets and a DFlash drafter for each, written with transformers' own ``save_pretrained``
(safetensors), deterministic from a seed:

* ``qwen3``: Qwen3ForCausalLM, 4 layers, hidden 256, 4 heads (2 KV), vocabulary 64;
* ``dsv3``: DeepseekV3ForCausalLM, the Kimi K2.6 text path: MLA (q_lora 64, kv_lora 512, rope 64,
  nope 128, v 128), first layer dense then MoE with 8 routed experts (2 per token) + 1 shared;
* ``<target>-dflash``: a DFlashDraftModel (2 Qwen3-style layers, hidden 256, block 8, mask token 63,
  target_layer_ids inside the target's layers) whose weights are random.

The lm_head of each target is scaled so that the argmax of its logits has a margin far above bf16
noise: greedy outputs are then a property of the model, not of kernel rounding, and a speculative
server must reproduce the non-speculative one token for token. With a 64-token vocabulary a random
drafter still gets non-root tokens accepted, so KV moves and the draft-context append run.

Usage: ``python bench/ddtree/make_tiny.py OUT_DIR`` (torch and transformers; CPU is enough).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB = 64
HIDDEN = 256
MASK_TOKEN_ID = VOCAB - 1
BLOCK = 8
LM_HEAD_SCALE = 8.0


def _scale_lm_head(model) -> None:
    import torch

    with torch.no_grad():
        w = model.lm_head.weight
        w.copy_(torch.nn.functional.normalize(w.float(), dim=-1).to(w.dtype) * LM_HEAD_SCALE)


def qwen3(out: Path, seed: int = 1) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                      rope_theta=10000.0, tie_word_embeddings=False, torch_dtype="bfloat16",
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = Qwen3ForCausalLM(cfg)
    _scale_lm_head(model)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    return {"layers": 4}


def dsv3(out: Path, seed: int = 2, layers: int = 4) -> dict:
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512, moe_intermediate_size=128,
                           num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                           n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=1,
                           topk_group=1, routed_scaling_factor=1.0, first_k_dense_replace=1,
                           q_lora_rank=64, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                           v_head_dim=128, max_position_embeddings=4096, rope_theta=10000.0,
                           tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2,
                           pad_token_id=0, rope_scaling=None)
    model = DeepseekV3ForCausalLM(cfg)
    _scale_lm_head(model)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    # Keys of DeepSeek-V3's (and Kimi K2's text) config.json that transformers' class does not write
    # but SGLang's deepseek_v2.py reads; no MTP layer (none is saved).
    path = out / "config.json"
    config = json.loads(path.read_text())
    config.update({"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "ep_size": 1,
                   "num_nextn_predict_layers": 0})
    path.write_text(json.dumps(config, indent=1) + "\n")
    return {"layers": layers}


def dflash(out: Path, target_layers: int, seed: int) -> None:
    """A DFlashDraftModel checkpoint as SGLang 0.5.23's models/dflash.py loads it (layers.*, fc,
    hidden_norm, norm; embedding and LM head borrowed from the target)."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    layers, heads, kv_heads, head_dim, inter = 2, 4, 2, 64, 512
    target_layer_ids = [1, target_layers - 2] if target_layers > 3 else [0]
    t: dict[str, torch.Tensor] = {}

    def lin(name, o, i):
        t[name] = (torch.randn(o, i) / i ** 0.5).to(torch.bfloat16)

    for i in range(layers):
        p = f"layers.{i}."
        lin(p + "self_attn.q_proj.weight", heads * head_dim, HIDDEN)
        lin(p + "self_attn.k_proj.weight", kv_heads * head_dim, HIDDEN)
        lin(p + "self_attn.v_proj.weight", kv_heads * head_dim, HIDDEN)
        lin(p + "self_attn.o_proj.weight", HIDDEN, heads * head_dim)
        t[p + "self_attn.q_norm.weight"] = torch.ones(head_dim, dtype=torch.bfloat16)
        t[p + "self_attn.k_norm.weight"] = torch.ones(head_dim, dtype=torch.bfloat16)
        t[p + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        lin(p + "mlp.gate_proj.weight", inter, HIDDEN)
        lin(p + "mlp.up_proj.weight", inter, HIDDEN)
        lin(p + "mlp.down_proj.weight", HIDDEN, inter)
    t["norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    t["hidden_norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    lin("fc.weight", HIDDEN, HIDDEN * len(target_layer_ids))
    out.mkdir(parents=True, exist_ok=True)
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": HIDDEN,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "hidden_act": "silu", "attention_bias": False,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "block_size": BLOCK,
        "dflash_config": {"block_size": BLOCK, "mask_token_id": MASK_TOKEN_ID, "target_layer_ids": target_layer_ids},
    }
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def main(argv: list[str]) -> int:
    """``make_tiny.py ROOT [--dsv3-layers N,M]``: the qwen3 and dsv3 pairs in ROOT, and with
    ``--dsv3-layers`` deeper dsv3 targets (``dsv3-lN``, each with its drafter) of the same width, for readings
    that depend on the layer count (CUDA-graph capture memory)."""
    ap = argparse.ArgumentParser(prog=Path(argv[0]).name)
    ap.add_argument("root", nargs="?", default="tiny")
    ap.add_argument("--dsv3-layers", default="", help="comma-separated layer counts of deeper dsv3 targets")
    args = ap.parse_args(argv[1:])
    extra = [int(x) for x in args.dsv3_layers.split(",") if x]
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    builds = [("qwen3", qwen3, 11, {}), ("dsv3", dsv3, 12, {})]
    builds += [(f"dsv3-l{n}", dsv3, 12, {"layers": n}) for n in extra]
    for name, build, seed, kw in builds:
        if (root / name / "config.json").exists():
            continue
        info = build(root / name, **kw)
        dflash(root / f"{name}-dflash", info["layers"], seed)
        print(f"{name}: {root / name} + {root / (name + '-dflash')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
