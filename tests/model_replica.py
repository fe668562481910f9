"""Sparse replicas of big checkpoints: real safetensors headers, data as holes.

``build_k26_replica(dir)`` lays out Kimi K2.6 as published (64 shards ``model-000NN-of-000064``,
~208k tensors, ~554 GiB apparent size, compressed-tensors int4 experts with group 32) in a few MB
of disk: each shard is its header followed by a ``truncate`` to the full size. Loaders that read
headers (``safetensors.safe_open``) accept them; the data reads back as zeros. Scaled-down specs
(fewer layers/experts/shards) make the same layout small enough for unit tests.
"""

from __future__ import annotations

import copy
import json
import os
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from doctor.model.header import DTYPE_BITS

TensorSpec = tuple[str, str, tuple[int, ...]]  # name, dtype, shape


@dataclass
class K26Spec:
    """Shapes of Kimi K2.6's text model (DeepSeek-V3-like) plus its vision tower."""

    num_hidden_layers: int = 61
    first_k_dense_replace: int = 1
    n_routed_experts: int = 384
    n_shared_experts: int = 1
    hidden_size: int = 7168
    intermediate_size: int = 18432
    moe_intermediate_size: int = 2048
    num_attention_heads: int = 64
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    vocab_size: int = 163840
    group_size: int = 32
    num_experts_per_tok: int = 8
    vision_layers: int = 27
    vision_hidden: int = 1152
    vision_intermediate: int = 4304
    shards: int = 64
    prefix: str = "language_model."
    extra_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def small(cls, **kw: Any) -> K26Spec:
        """The same layout at unit-test scale."""
        base: dict[str, Any] = dict(num_hidden_layers=4, n_routed_experts=8, hidden_size=256, intermediate_size=512,
                                    moe_intermediate_size=256, num_attention_heads=8, q_lora_rank=64,
                                    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                    vocab_size=1024, vision_layers=2, vision_hidden=64, vision_intermediate=128,
                                    shards=4, num_experts_per_tok=2)
        base.update(kw)
        return cls(**base)


def k26_tensors(spec: K26Spec) -> list[list[TensorSpec]]:
    """Tensors grouped by layer (the unit shards are cut along), in checkpoint order."""
    s, p = spec, spec.prefix
    h, qk_head = s.hidden_size, s.qk_nope_head_dim + s.qk_rope_head_dim
    groups: list[list[TensorSpec]] = []
    vis = []
    for b in range(s.vision_layers):
        vb = f"vision_tower.encoder.blocks.{b}."
        vh, vi = s.vision_hidden, s.vision_intermediate
        vis += [(vb + "wqkv.weight", "BF16", (3 * vh, vh)), (vb + "wqkv.bias", "BF16", (3 * vh,)),
                (vb + "wo.weight", "BF16", (vh, vh)), (vb + "wo.bias", "BF16", (vh,)),
                (vb + "norm0.weight", "BF16", (vh,)), (vb + "norm0.bias", "BF16", (vh,)),
                (vb + "norm1.weight", "BF16", (vh,)), (vb + "norm1.bias", "BF16", (vh,)),
                (vb + "mlp.fc0.weight", "BF16", (vi, vh)), (vb + "mlp.fc0.bias", "BF16", (vi,)),
                (vb + "mlp.fc1.weight", "BF16", (vh, vi)), (vb + "mlp.fc1.bias", "BF16", (vh,))]
    vis += [("vision_tower.patch_embed.proj.weight", "BF16", (s.vision_hidden, 3, 14, 14)),
            ("vision_tower.encoder.final_layernorm.weight", "BF16", (s.vision_hidden,)),
            ("mm_projector.pre_norm.weight", "BF16", (s.vision_hidden,)),
            ("mm_projector.proj.0.weight", "BF16", (4 * s.vision_hidden, 4 * s.vision_hidden)),
            ("mm_projector.proj.2.weight", "BF16", (h, 4 * s.vision_hidden))]
    groups.append([(f"{p}model.embed_tokens.weight", "BF16", (s.vocab_size, h)), *vis])
    for layer in range(s.num_hidden_layers):
        lp = f"{p}model.layers.{layer}."
        t: list[TensorSpec] = [
            (lp + "input_layernorm.weight", "BF16", (h,)),
            (lp + "post_attention_layernorm.weight", "BF16", (h,)),
            (lp + "self_attn.q_a_proj.weight", "BF16", (s.q_lora_rank, h)),
            (lp + "self_attn.q_a_layernorm.weight", "BF16", (s.q_lora_rank,)),
            (lp + "self_attn.q_b_proj.weight", "BF16", (s.num_attention_heads * qk_head, s.q_lora_rank)),
            (lp + "self_attn.kv_a_proj_with_mqa.weight", "BF16", (s.kv_lora_rank + s.qk_rope_head_dim, h)),
            (lp + "self_attn.kv_a_layernorm.weight", "BF16", (s.kv_lora_rank,)),
            (lp + "self_attn.kv_b_proj.weight", "BF16",
             (s.num_attention_heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank)),
            (lp + "self_attn.o_proj.weight", "BF16", (h, s.num_attention_heads * s.v_head_dim)),
        ]
        if layer < s.first_k_dense_replace:
            i = s.intermediate_size
            t += [(lp + "mlp.gate_proj.weight", "BF16", (i, h)), (lp + "mlp.up_proj.weight", "BF16", (i, h)),
                  (lp + "mlp.down_proj.weight", "BF16", (h, i))]
        else:
            m, g = s.moe_intermediate_size, s.group_size
            si = m * s.n_shared_experts
            t += [(lp + "mlp.gate.weight", "BF16", (s.n_routed_experts, h)),
                  (lp + "mlp.gate.e_score_correction_bias", "F32", (s.n_routed_experts,)),
                  (lp + "mlp.shared_experts.gate_proj.weight", "BF16", (si, h)),
                  (lp + "mlp.shared_experts.up_proj.weight", "BF16", (si, h)),
                  (lp + "mlp.shared_experts.down_proj.weight", "BF16", (h, si))]
            for e in range(s.n_routed_experts):
                ep = f"{lp}mlp.experts.{e}."
                for proj, (out_f, in_f) in (("gate_proj", (m, h)), ("up_proj", (m, h)), ("down_proj", (h, m))):
                    t += [(f"{ep}{proj}.weight_packed", "I32", (out_f, in_f // 8)),
                          (f"{ep}{proj}.weight_scale", "BF16", (out_f, in_f // g)),
                          (f"{ep}{proj}.weight_shape", "I32", (2,))]
        groups.append(t)
    groups.append([(f"{p}model.norm.weight", "BF16", (h,)), (f"{p}lm_head.weight", "BF16", (s.vocab_size, h))])
    return groups


def nbytes(dtype: str, shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * DTYPE_BITS[dtype] // 8


def header_bytes(tensors: list[TensorSpec], metadata: dict[str, str] | None = None) -> tuple[bytes, int]:
    """A safetensors header as the reference writer lays it out; returns (8 + header, data size).

    Tensors are ordered by alignment (widest dtype first) then name, the JSON is compact and padded
    with spaces to a multiple of 8 bytes, like ``safetensors.serialize``.
    """
    order = sorted(tensors, key=lambda t: (-DTYPE_BITS[t[1]], t[0]))
    doc: dict[str, Any] = {}
    if metadata:
        doc["__metadata__"] = metadata
    pos = 0
    for name, dtype, shape in order:
        size = nbytes(dtype, shape)
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + size]}
        pos += size
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, pos


def write_sparse_safetensors(path: str, tensors: list[TensorSpec], metadata: dict[str, str] | None = None) -> int:
    """Write the header and extend the file to its full size with a hole; returns the file size."""
    head, data = header_bytes(tensors, metadata)
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + data)
    return len(head) + data


def shard_name(i: int, n: int) -> str:
    """K2.6's naming: ``model-00001-of-000064.safetensors`` (five digits, then six in the total)."""
    return f"model-{i:05d}-of-{n:06d}.safetensors"


def plan_shards(groups: list[list[TensorSpec]], n: int) -> list[list[TensorSpec]]:
    """Cut the layer groups into ``n`` shards of similar size, never splitting a group across shards
    unless a group is larger than a shard (then split by tensor)."""
    items = [t for g in groups for t in g]
    total = sum(nbytes(t[1], t[2]) for t in items)
    target = total / n
    shards: list[list[TensorSpec]] = [[] for _ in range(n)]
    acc = 0
    for t in items:
        i = min(n - 1, int(acc / target)) if target else 0
        shards[i].append(t)
        acc += nbytes(t[1], t[2])
    # No shard may be empty (a tiny model with many shards): move one tensor from the left.
    for i in range(n):
        if not shards[i]:
            donor = max(range(n), key=lambda j: len(shards[j]))
            shards[i].append(shards[donor].pop())
    return shards


def k26_config(spec: K26Spec) -> dict[str, Any]:
    """A ``kimi_k25`` config.json with a DeepSeek-V3-like text_config and the int4 quantization config."""
    s = spec
    quant = {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                        "group_size": s.group_size, "dynamic": False, "actorder": None, "observer": "minmax"}}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
        "kv_cache_scheme": None,
    }
    text = {
        "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": s.hidden_size, "intermediate_size": s.intermediate_size,
        "moe_intermediate_size": s.moe_intermediate_size, "num_hidden_layers": s.num_hidden_layers,
        "num_attention_heads": s.num_attention_heads, "num_key_value_heads": s.num_attention_heads,
        "n_routed_experts": s.n_routed_experts, "n_shared_experts": s.n_shared_experts,
        "num_experts_per_tok": s.num_experts_per_tok, "first_k_dense_replace": s.first_k_dense_replace,
        "moe_layer_freq": 1, "q_lora_rank": s.q_lora_rank, "kv_lora_rank": s.kv_lora_rank,
        "qk_nope_head_dim": s.qk_nope_head_dim, "qk_rope_head_dim": s.qk_rope_head_dim,
        "v_head_dim": s.v_head_dim, "vocab_size": s.vocab_size, "max_position_embeddings": 262144,
        "num_nextn_predict_layers": 0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "quantization_config": quant,
    }
    cfg = {
        "model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                     "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
                     "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
        "text_config": text,
        "vision_config": {"vt_hidden_size": s.vision_hidden, "vt_num_hidden_layers": s.vision_layers},
        "media_placeholder_token_id": 163605, "pad_token_id": 163839,
    }
    cfg.update(s.extra_config)
    return cfg


def write_tokenizer_files(model_dir: str, vocab_size: int = 163840) -> None:
    """The files the server's tokenizer needs: a valid tiktoken.model and a tokenizer_config.json with Kimi's
    special tokens (model_replica_tokenizer); placeholder remote code and a minimal chat template."""
    from model_replica_tokenizer import write_kimi_vocab

    write_kimi_vocab(model_dir, vocab_size)
    files = {
        "tokenization_kimi.py": "# placeholder for the remote-code tokenizer\n",
        "chat_template.jinja": "{% for m in messages %}{{ m['content'] }}{% endfor %}\n",
        "configuration_kimi_k25.py": "# placeholder for remote code\n",
        "modeling_kimi_k25.py": "# placeholder for remote code\n",
    }
    for name, text in files.items():
        with open(os.path.join(model_dir, name), "w", encoding="utf-8") as fh:
            fh.write(text)


def build_k26_replica(model_dir: str, spec: K26Spec | None = None, *, tokenizer: bool = True) -> dict[str, Any]:
    """Write the sparse replica into ``model_dir`` (created); returns a summary (files, tensors, bytes)."""
    spec = spec or K26Spec()
    os.makedirs(model_dir, exist_ok=True)
    shards = plan_shards(k26_tensors(spec), spec.shards)
    weight_map: dict[str, str] = {}
    total = 0
    apparent = 0
    for i, tensors in enumerate(shards, start=1):
        name = shard_name(i, spec.shards)
        apparent += write_sparse_safetensors(os.path.join(model_dir, name), tensors, {"format": "pt"})
        for t in tensors:
            weight_map[t[0]] = name
            total += nbytes(t[1], t[2])
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w", encoding="utf-8") as fh:
        json.dump(index, fh, indent=2)
    with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(k26_config(spec), fh, indent=2)
    if tokenizer:
        write_tokenizer_files(model_dir, spec.vocab_size)
    return {"dir": model_dir, "shards": spec.shards, "tensors": len(weight_map), "data_bytes": total,
            "apparent_bytes": apparent}


def dflash_config(target: K26Spec, *, layers: int = 6, block_size: int = 16,
                  target_layer_ids: list[int] | None = None, mask_token_id: int = 163838) -> dict[str, Any]:
    """A DFlash drafter config.json for the target ``target``."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": target.hidden_size, "vocab_size": target.vocab_size, "num_hidden_layers": layers,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 4 * 4096,
        "torch_dtype": "bfloat16", "block_size": block_size,
        "dflash_config": {"target_layer_ids": target_layer_ids if target_layer_ids is not None
                          else [1, 12, 24, 35, 47, 58][: layers],
                          "mask_token_id": mask_token_id, "block_size": block_size},
    }


def build_dflash_replica(model_dir: str, target: K26Spec | None = None, **kw: Any) -> dict[str, Any]:
    """A sparse DFlash drafter (one shard, no index) for ``target``."""
    target = target or K26Spec()
    cfg = dflash_config(target, **kw)
    os.makedirs(model_dir, exist_ok=True)
    h = target.hidden_size
    n_ctx = len(cfg["dflash_config"]["target_layer_ids"])
    tensors: list[TensorSpec] = [("fc.weight", "BF16", (h, n_ctx * h)), ("hidden_norm.weight", "BF16", (h,)),
                                 ("norm.weight", "BF16", (h,))]
    for layer in range(cfg["num_hidden_layers"]):
        lp = f"layers.{layer}."
        tensors += [(lp + "self_attn.q_proj.weight", "BF16", (32 * 128, h)),
                    (lp + "self_attn.k_proj.weight", "BF16", (8 * 128, h)),
                    (lp + "self_attn.v_proj.weight", "BF16", (8 * 128, h)),
                    (lp + "self_attn.o_proj.weight", "BF16", (h, 32 * 128)),
                    (lp + "mlp.gate_proj.weight", "BF16", (4 * 4096, h)),
                    (lp + "mlp.up_proj.weight", "BF16", (4 * 4096, h)),
                    (lp + "mlp.down_proj.weight", "BF16", (h, 4 * 4096)),
                    (lp + "input_layernorm.weight", "BF16", (h,)),
                    (lp + "post_attention_layernorm.weight", "BF16", (h,))]
    size = write_sparse_safetensors(os.path.join(model_dir, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh, indent=2)
    return {"dir": model_dir, "apparent_bytes": size, "tensors": len(tensors)}


_PATTERNS: dict[str, tuple[dict[str, dict[str, int]], int]] = {}


def k26_patterns(spec: K26Spec | None = None) -> tuple[dict[str, dict[str, int]], int]:
    """The checkpoint's tensors folded into the tensor summary's patterns (layer and expert numbers as
    ``#``) with their bytes, and the total: what ``model.tensors`` reports for the full layout, without
    writing it. Folded once per spec and process (the full layout's 208k names take a second), each caller
    getting its own copy."""
    import re

    spec = spec or K26Spec()
    key = json.dumps(asdict(spec), sort_keys=True)
    if key not in _PATTERNS:
        num = re.compile(r"\.\d+(?=[.\n]|\Z)")
        pats: dict[str, dict[str, int]] = {}
        total = 0
        for group in k26_tensors(spec):
            for name, dtype, shape in group:
                n = nbytes(dtype, shape)
                total += n
                pats.setdefault(num.sub(".#", name), {"bytes": 0})["bytes"] += n
        _PATTERNS[key] = (pats, total)
    pats, total = _PATTERNS[key]
    return copy.deepcopy(pats), total
