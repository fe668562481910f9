"""The trained pair's two models in plain torch: the DeepSeek-V3 target and the DFlash drafter, as SGLang runs
them (0.5.23).

Both modules name their parameters exactly as the checkpoints SGLang loads (``state_dict()`` keys are the
safetensors keys), so one set of tensors is trained, measured, simulated and saved.

Target (:class:`Dsv3`): transformers' ``DeepseekV3ForCausalLM`` forward (``modeling_deepseek_v3.py``),
re-written with a KV cache that takes any additive mask and explicit positions (a tree verify: the
committed slots plus each node's ancestors) and with the router's decisions exposed:

* MLA: ``q = q_b(rmsnorm(q_a(x)))`` split nope 128 / rope 64; ``kv_a_proj_with_mqa`` split latent 512 /
  shared rope key 64; latent through ``kv_a_layernorm`` then ``kv_b_proj`` to per-head nope key and value;
  interleaved RoPE (``rope_interleave``: pairs ``(x0, x1), (x2, x3)...`` rotated, HF
  ``apply_rotary_pos_emb_interleave``); softmax scale ``qk_head_dim ** -0.5``; softmax in fp32.
* MoE (layers >= ``first_k_dense_replace``): router logits in fp32 (``F.linear(x.float(), W.float())``,
  SGLang ``MoEGate.forward``: bf16 x bf16 -> fp32 GEMM), ``scores = sigmoid(logits)``, choice on
  ``scores + e_score_correction_bias`` (SGLang ``biased_grouped_topk_impl``, ``layers/moe/topk.py``; one
  group), weights = the *unbiased* scores of the chosen experts renormalised (``norm_topk_prob``) times
  ``routed_scaling_factor``; plus the shared expert.
* Residual stream: ``hidden_states[i]`` is the input of layer ``i`` (``[0]`` the embeddings).

Drafter (:class:`DFlashDrafter`), from ``sglang/srt/models/dflash.py`` and
``sglang/srt/speculative/dflash_worker_v2.py`` of the 0.5.23 wheel (line numbers of that file):

* Context features: the target captures ``layers_to_capture = [id + 1 for id in target_layer_ids]``
  (``deepseek_v2.py`` 3475-3485 ``set_dflash_layers_to_capture``) and a capture at layer ``i`` is the
  residual stream entering layer ``i`` (``layers/layer_boundary/stage.py`` 461-479, ``stream.residual``
  after the add), i.e. transformers' ``hidden_states[id + 1]``: the output of layer ``id``. The features
  of one token are those captures concatenated in ``target_layer_ids`` order.
* ``project_target_hidden`` = ``hidden_norm(fc(concat))`` (``dflash.py`` 830-846).
* Context K/V of every draft layer (``dflash_worker_v2.py`` 1965-1972 and 2015-2028,
  ``_append_target_hidden_*``): ``prepare_context_hidden_for_kv`` is the identity for
  ``DFlashDraftModel`` (``dflash.py`` 825-828: no ``input_layernorm``), then ``kv_proj_only`` (``dflash.py``
  429-455: K and V rows of the fused QKV weight), ``apply_k_norm`` (per-head RMSNorm, 457-460), and
  ``apply_k_rope`` at the *context token's own position* (462-466). Context token ``j`` sits at position
  ``j``; the context of a block rooted at position ``p`` is positions ``0 .. p - 1``.
* The block (``dflash_worker_v2.py`` 2550-2582 and the patched DDTREE worker): ``[last committed token,
  mask x (block - 1)]``, embedded with the *target's* embedding (no noise scale for DeepSeek: it has no
  ``get_dflash_noise_embedding_scale``, 538-542), at positions ``p .. p + block - 1`` where ``p`` = committed
  length (the last committed token, the "bonus", is not yet in the target's KV).
* Layers (``dflash.py`` 628-668 ``DFlashDecoderLayer.forward``): fused residual pre-norm,
  ``input_layernorm`` -> attention -> ``post_attention_layernorm`` -> SiLU-gated MLP; attention
  (``dflash.py`` 374-422): fused QKV, ``q_norm`` / ``k_norm`` per head (RMSNorm over ``head_dim``), neox
  RoPE (``rope_is_neox_style`` default True, 265-277: rotate halves), scale ``head_dim ** -0.5`` (281), GQA over
  ``num_key_value_heads``; ``ENCODER_ONLY`` attention when the config has no ``layer_types``
  (``dflash.py`` 166-171) and the Triton backend runs it non-causally (``triton_backend.py`` 1747-1752):
  every block token reads the whole context and the *whole* block, itself included.
* Final ``norm`` (``dflash.py`` 874-879); the draft logits are the target's ``lm_head`` on that hidden
  state (no target final norm: DDTREE ``_draft_topk``, DFLASH's greedy head), log-softmax in fp32
  (``ddtree_utils.ddtree_topk_from_logits``). Block index ``i >= 1`` predicts the token at position
  ``p + i``; index 0 (the root) is not a prediction.
* RMSNorm everywhere: ``x * rsqrt(mean(x^2) + eps)`` in fp32, times the weight (``layernorm.py``
  828-876).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

NEG = -1e30


class RMSNorm(nn.Module):
    """transformers' DeepseekV3RMSNorm / SGLang's RMSNorm (``cast_x_before_out_mul``)."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def linear(i: int, o: int) -> nn.Linear:
    return nn.Linear(i, o, bias=False)


# -- target ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetShape:
    """make_tiny.py's dsv3 shape (the Kimi K2.6 text path, scaled down)."""

    vocab: int = 64
    hidden: int = 256
    intermediate: int = 512
    moe_intermediate: int = 128
    layers: int = 4
    heads: int = 4
    experts: int = 8
    experts_per_tok: int = 2
    shared_experts: int = 1
    first_dense: int = 1
    q_lora: int = 64
    kv_lora: int = 512
    rope_dim: int = 64
    nope_dim: int = 128
    v_dim: int = 128
    rope_theta: float = 10000.0
    eps: float = 1e-6

    def hf_config_kwargs(self) -> dict:
        return dict(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                    moe_intermediate_size=self.moe_intermediate, num_hidden_layers=self.layers,
                    num_attention_heads=self.heads, num_key_value_heads=self.heads,
                    n_shared_experts=self.shared_experts, n_routed_experts=self.experts,
                    num_experts_per_tok=self.experts_per_tok, n_group=1, topk_group=1, routed_scaling_factor=1.0,
                    norm_topk_prob=True, first_k_dense_replace=self.first_dense, q_lora_rank=self.q_lora,
                    kv_lora_rank=self.kv_lora, qk_rope_head_dim=self.rope_dim, qk_nope_head_dim=self.nope_dim,
                    v_head_dim=self.v_dim, max_position_embeddings=4096, rope_theta=self.rope_theta,
                    rms_norm_eps=self.eps, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                    pad_token_id=0, rope_scaling=None, rope_interleave=True)


def rope_interleave(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """HF ``apply_rotary_pos_emb_interleave`` for ``x`` ``[B, h, S, d]`` at ``positions`` ``[B, S]``."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    freqs = positions.float()[:, None, :, None] * inv
    cos, sin = freqs.cos().to(x.dtype), freqs.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_neox(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style RoPE (rotate halves) for ``x`` ``[B, h, S, d]`` at ``positions`` ``[B, S]``."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    freqs = positions.float()[:, None, :, None] * inv
    cos, sin = freqs.cos().to(x.dtype), freqs.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Eager attention as HF's ``eager_attention_forward``: ``mask`` additive ``[B, 1, Q, K]``."""
    w = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        w = w + mask.to(w.dtype)
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


@dataclass
class KVCache:
    """Per-layer expanded keys ``[B, h, T, dk]`` and values; slots are appended, and :meth:`keep` drops
    the rejected ones."""

    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)

    def length(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    def keep(self, index: torch.Tensor) -> None:
        """Keep slots ``index`` ``[B, T']`` (per request) in that order."""
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                idx = index[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
                store[i] = torch.gather(t, 2, idx)


class MLA(nn.Module):
    def __init__(self, s: TargetShape) -> None:
        super().__init__()
        self.s = s
        self.q_a_proj = linear(s.hidden, s.q_lora)
        self.q_a_layernorm = RMSNorm(s.q_lora, s.eps)
        self.q_b_proj = linear(s.q_lora, s.heads * (s.nope_dim + s.rope_dim))
        self.kv_a_proj_with_mqa = linear(s.hidden, s.kv_lora + s.rope_dim)
        self.kv_a_layernorm = RMSNorm(s.kv_lora, s.eps)
        self.kv_b_proj = linear(s.kv_lora, s.heads * (s.nope_dim + s.v_dim))
        self.o_proj = linear(s.heads * s.v_dim, s.hidden)

    def forward(self, x, positions, mask, cache: KVCache | None, layer: int):
        s = self.s
        b, n, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, n, s.heads, -1).transpose(1, 2)
        q_nope, q_rot = q.split([s.nope_dim, s.rope_dim], dim=-1)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([s.kv_lora, s.rope_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, n, s.heads, -1).transpose(1, 2)
        k_nope, v = kv.split([s.nope_dim, s.v_dim], dim=-1)
        q_rot = rope_interleave(q_rot, positions, s.rope_theta)
        k_rot = rope_interleave(k_rot.view(b, 1, n, s.rope_dim), positions, s.rope_theta)
        k = torch.cat([k_nope, k_rot.expand(-1, s.heads, -1, -1)], dim=-1)
        q = torch.cat([q_nope, q_rot], dim=-1)
        if cache is not None:
            if len(cache.keys) <= layer:
                cache.keys.append(k)
                cache.values.append(v)
            else:
                cache.keys[layer] = k = torch.cat([cache.keys[layer], k], dim=2)
                cache.values[layer] = v = torch.cat([cache.values[layer], v], dim=2)
        out = attend(q, k, v, mask, (s.nope_dim + s.rope_dim) ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = linear(hidden, inter)
        self.up_proj = linear(hidden, inter)
        self.down_proj = linear(inter, hidden)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, s: TargetShape) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(s.experts, s.hidden))
        self.register_buffer("e_score_correction_bias", torch.zeros(s.experts))


@dataclass
class Routing:
    """One MoE layer's decisions for every token: fp32 router logits, biased choice scores, chosen experts."""

    logits: torch.Tensor
    choice: torch.Tensor
    experts: torch.Tensor


class MoE(nn.Module):
    def __init__(self, s: TargetShape) -> None:
        super().__init__()
        self.s = s
        self.gate = Gate(s)
        self.experts = nn.ModuleList(MLP(s.hidden, s.moe_intermediate) for _ in range(s.experts))
        self.shared_experts = MLP(s.hidden, s.moe_intermediate * s.shared_experts)

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        logits = F.linear(flat.float(), self.gate.weight.float())
        scores = logits.sigmoid()
        choice = scores + self.gate.e_score_correction_bias.float()
        experts = torch.topk(choice, self.s.experts_per_tok, dim=-1).indices
        weights = scores.gather(1, experts)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        # Each (token, slot) is written once, then the slots are summed: deterministic on every device.
        per_slot = flat.new_zeros(flat.shape[0], self.s.experts_per_tok, flat.shape[1])
        for e in range(self.s.experts):
            tok, slot = torch.where(experts == e)
            if tok.numel():
                y = self.experts[e](flat[tok]) * weights[tok, slot, None]
                per_slot = per_slot.index_put((tok, slot), y.to(flat.dtype))
        out = per_slot.sum(1).view(shape) + self.shared_experts(x)
        return out, Routing(logits, choice, experts)


class Layer(nn.Module):
    def __init__(self, s: TargetShape, i: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.self_attn = MLA(s)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)
        self.mlp = MLP(s.hidden, s.intermediate) if i < s.first_dense else MoE(s)


class _Body(nn.Module):
    def __init__(self, s: TargetShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden)
        self.layers = nn.ModuleList(Layer(s, i) for i in range(s.layers))
        self.norm = RMSNorm(s.hidden, s.eps)


@dataclass
class TargetOut:
    logits: torch.Tensor  # [B, S, V] float32
    hidden_states: list  # residual stream entering layer i, i = 0..layers-1, then the final pre-norm output
    routing: list  # one Routing per MoE layer


class Dsv3(nn.Module):
    """DeepseekV3ForCausalLM with checkpoint parameter names (``model.*``, ``lm_head.weight``)."""

    def __init__(self, s: TargetShape = TargetShape()) -> None:
        super().__init__()
        self.shape = s
        self.model = _Body(s)
        self.lm_head = linear(s.hidden, s.vocab)

    def moe_layers(self) -> list[int]:
        return [i for i in range(self.shape.layers) if i >= self.shape.first_dense]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, cache: KVCache | None = None) -> TargetOut:
        """``input_ids`` ``[B, S]``; ``positions`` default ``0..S-1``; ``mask`` additive ``[B, 1, S, T + S]``
        over the cache's ``T`` slots and the new tokens (default: causal without cache)."""
        b, n = input_ids.shape
        if positions is None:
            positions = torch.arange(n, device=input_ids.device).expand(b, n)
        x = self.model.embed_tokens(input_ids)
        if mask is None:
            if cache is not None and cache.length():
                raise ValueError("a cached forward needs an explicit mask")
            mask = causal_mask(n, x.device)
        hidden, routing = [], []
        for i, layer in enumerate(self.model.layers):
            hidden.append(x)
            x = x + layer.self_attn(layer.input_layernorm(x), positions, mask, cache, i)
            h = layer.post_attention_layernorm(x)
            if isinstance(layer.mlp, MoE):
                y, r = layer.mlp(h)
                routing.append(r)
            else:
                y = layer.mlp(h)
            x = x + y
        hidden.append(x)
        logits = self.lm_head(self.model.norm(x)).float()
        return TargetOut(logits, hidden, routing)

    def context_features(self, out: TargetOut, layer_ids: list[int]) -> torch.Tensor:
        """The drafter's context features: ``hidden_states[id + 1]`` concatenated (see the docstring)."""
        return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


def causal_mask(n: int, device, offset: int = 0) -> torch.Tensor:
    allowed = torch.ones(n, n + offset, dtype=torch.bool, device=device).tril(offset)
    return additive(allowed)[None, None]


def additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.where(allowed, 0.0, NEG).float()


# -- drafter --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrafterShape:
    """make_tiny.py's DFlash drafter shape: Qwen3-style layers, hidden 256, block 8."""

    hidden: int = 256
    intermediate: int = 512
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    block: int = 8
    rope_theta: float = 10000.0
    eps: float = 1e-6
    target_layer_ids: tuple[int, ...] = (1, 2)


class DraftAttention(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.s = s
        self.q_proj = linear(s.hidden, s.heads * s.head_dim)
        self.k_proj = linear(s.hidden, s.kv_heads * s.head_dim)
        self.v_proj = linear(s.hidden, s.kv_heads * s.head_dim)
        self.o_proj = linear(s.heads * s.head_dim, s.hidden)
        self.q_norm = RMSNorm(s.head_dim, s.eps)
        self.k_norm = RMSNorm(s.head_dim, s.eps)

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, roped) and V ``[B, kv_heads, L, d]`` of ``x`` ``[B, L, H]`` at ``positions``: the
        context path (``kv_proj_only`` + ``apply_k_norm`` + ``apply_k_rope``) and the block's own K/V."""
        s = self.s
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, s.kv_heads, s.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        return rope_neox(k, positions, s.rope_theta), v

    def forward(self, x, positions, ctx_kv, mask):
        s = self.s
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, s.heads, s.head_dim)).transpose(1, 2)
        q = rope_neox(q, positions, s.rope_theta)
        k, v = self.kv(x, positions)
        k = torch.cat([ctx_kv[0], k], dim=2).repeat_interleave(s.heads // s.kv_heads, dim=1)
        v = torch.cat([ctx_kv[1], v], dim=2).repeat_interleave(s.heads // s.kv_heads, dim=1)
        out = attend(q, k, v, mask, s.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class DraftLayer(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.self_attn = DraftAttention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)
        self.mlp = MLP(s.hidden, s.intermediate)


class DFlashDrafter(nn.Module):
    """SGLang's DFlashDraftModel (see the module docstring), with the checkpoint's parameter names."""

    def __init__(self, s: DrafterShape = DrafterShape()) -> None:
        super().__init__()
        self.shape = s
        self.layers = nn.ModuleList(DraftLayer(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden, s.eps)
        self.fc = linear(s.hidden * len(s.target_layer_ids), s.hidden)
        self.hidden_norm = RMSNorm(s.hidden, s.eps)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """``project_target_hidden``: ``hidden_norm(fc(concat))``."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's context K/V from projected features ``ctx`` ``[B, L, H]`` at ``positions``."""
        return [layer.self_attn.kv(ctx, positions) for layer in self.layers]

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, ctx_kv: list, allowed: torch.Tensor):
        """Block hidden states ``[B, Q, H]`` for block-token embeddings ``embeds`` at ``positions``;
        ``allowed`` ``[B, Q, L + Q]`` says which context slots and block tokens each block token reads."""
        mask = additive(allowed)[:, None]
        x = embeds
        for layer, kv in zip(self.layers, ctx_kv, strict=True):
            x = x + layer.self_attn(layer.input_layernorm(x), positions, kv, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)


def block_allowed(ctx_len: torch.Tensor, ctx_slots: int, roots: torch.Tensor, block: int) -> torch.Tensor:
    """``allowed`` for blocks rooted at positions ``roots`` ``[B, K]`` (K blocks per row, laid out one after
    the other): a block token reads context positions ``< root`` among ``ctx_slots`` (slot ``j`` =
    position ``j``, valid below ``ctx_len`` ``[B]``) and every token of its own block."""
    b, k = roots.shape
    dev = roots.device
    slot = torch.arange(ctx_slots, device=dev)
    ctx = (slot[None, None] < roots[..., None]) & (slot[None, None] < ctx_len[:, None, None])  # [B, K, L]
    ctx = ctx.repeat_interleave(block, dim=1)  # [B, K*block, L]
    blk_id = torch.arange(k * block, device=dev) // block
    own = blk_id[:, None] == blk_id[None, :]
    return torch.cat([ctx, own[None].expand(b, -1, -1)], dim=-1)


def draft_logits(drafter_hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
    """The target's LM head on the drafter's hidden states (float32 logits)."""
    return torch.matmul(drafter_hidden.float(), lm_head_weight.float().T)


def init_(module: nn.Module, seed: int, std: float = 0.02) -> None:
    """Deterministic init: normal(0, std) for matrices and embeddings, ones for norms, zeros for gates."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if p.dim() == 1:
                p.fill_(1.0)
            elif name.endswith("gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * std * 0.1)
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * min(std, 1.0 / math.sqrt(fan_in)))
