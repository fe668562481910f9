"""The ``--mem-fraction-static`` window, computed before a 20-minute load, as SGLang 0.5.23 accounts memory.

SGLang measures ``pre`` = free GPU memory once torch.distributed is up, before any weight loads
(``distributed/bootstrap.py`` ``measure_pre_model_load_memory``, the minimum over ranks), loads the
target and the drafter, then sizes the KV pool (``mem_cache/kv_cache_configurator.py``
``_profile_available_bytes``)::

    KV bytes = free after the loads - pre x (1 - f)  =  pre x f - weights (target + drafter)
    tokens   = KV bytes // bytes per token (target cell + the DFLASH/DDTREE draft cell)

and leaves ``pre x (1 - f)`` for everything allocated later: the request-to-token table, the attention
backends' CUDA-graph buffers (Triton's grow with the verify width and the context length; the DDTree patch
set sizes its target's by what the tree verify reads: one decode token and one prefix of KV indices per
request, a ``W x W`` mask), the graph logits buffer (``W`` rows per request), the graphs themselves,
activations, NCCL, allocator slack. So:

    f_min = (weights + the KV the profile's context and concurrency need) / pre
    f_max = 1 - (what is allocated outside the pool) / pre

Everything here is a pure function of numbers (config fields, byte counts, the server's arguments);
the constants are SGLang's, kept as data in ``doctor/data/sglang_memory.toml`` with their sources.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "sglang_memory.toml"
GIB = 1024 ** 3
MIB = 1024 ** 2

# Tensors SGLang keeps whole on every TP rank (the rest is split): MLA's down projections, routers and
# their bias, norms, the vision tower and its projector (DeepSeek-V3 / Kimi K2.x, models/deepseek_v2.py).
TARGET_REPLICATED = ("q_a_proj", "kv_a_proj_with_mqa", "layernorm", ".norm.", "norm.weight", ".mlp.gate.",
                     "vision_tower.", "mm_projector.", "e_score_correction_bias")
# DFlash drafter (models/dflash.py): attention and MLP are TP-split; ``fc`` (ReplicatedLinear) and the
# norms are not.
DRAFT_REPLICATED = ("norm",)
DRAFT_REPLICATED_PREFIXES = ("fc.",)
DFLASH_FAMILY = ("DFLASH", "DDTREE", "DSPARK")


def constants(path: str | None = None) -> dict[str, Any]:
    """SGLang's constants (``doctor/data/sglang_memory.toml``; ``path`` only for tests)."""
    return load_toml(path or DATA_FILE)


# -- weights ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WeightSplit:
    """Bytes of a checkpoint under TP: split over the ranks, or whole on each."""

    sharded: int
    replicated: int
    tp: int

    @property
    def per_gpu(self) -> int:
        return math.ceil(self.sharded / self.tp) + self.replicated


def split_weights(patterns: dict[str, Any] | None, total: int, tp: int, *, draft: bool = False) -> WeightSplit:
    """(sharded, replicated) bytes of a tensor summary's patterns; without patterns all is sharded."""
    tp = max(1, int(tp))
    if not patterns:
        return WeightSplit(int(total), 0, tp)
    markers = DRAFT_REPLICATED if draft else TARGET_REPLICATED
    prefixes = DRAFT_REPLICATED_PREFIXES if draft else ()
    rep = sharded = 0
    for pat, v in patterns.items():
        n = int(v.get("bytes") or 0) if isinstance(v, dict) else 0
        if any(m in pat for m in markers) or pat.startswith(prefixes):
            rep += n
        else:
            sharded += n
    return WeightSplit(sharded, rep, tp)


# -- attention geometry and the KV cell -------------------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    """What the KV cache and the attention buffers of one model depend on."""

    layers: int
    heads: int
    mla: bool
    kv_heads: int = 0  # MHA
    head_dim: int = 0  # MHA: K width per head
    v_head_dim: int = 0  # MHA: V width; MLA: kv_lora_rank (the value buffer's width)
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    mla_v_head_dim: int = 0  # MLA: V width per head in prefill (v_head_dim of the config)
    vocab: int = 0
    max_positions: int | None = None
    hidden: int = 0
    intermediate: int = 0
    moe_intermediate: int = 0
    experts: int = 0
    topk: int = 0


def _int(d: dict[str, Any], key: str) -> int | None:
    v = d.get(key)
    return v if type(v) is int and v > 0 else None


def geometry(text: dict[str, Any] | None) -> Geometry | None:
    """The geometry of a (text) config; None when the fields it needs are missing or malformed."""
    if not isinstance(text, dict):
        return None
    layers, heads = _int(text, "num_hidden_layers"), _int(text, "num_attention_heads")
    if not layers or not heads:
        return None
    hidden = _int(text, "hidden_size")
    common = {"vocab": _int(text, "vocab_size") or 0, "max_positions": _int(text, "max_position_embeddings"),
              "hidden": hidden or 0, "intermediate": _int(text, "intermediate_size") or 0,
              "moe_intermediate": _int(text, "moe_intermediate_size") or 0,
              "experts": _int(text, "n_routed_experts") or _int(text, "num_experts") or 0,
              "topk": _int(text, "num_experts_per_tok") or 0}
    lora, rope = _int(text, "kv_lora_rank"), _int(text, "qk_rope_head_dim")
    if lora and rope:
        return Geometry(layers, heads, True, v_head_dim=lora, kv_lora_rank=lora, qk_rope_head_dim=rope,
                        qk_nope_head_dim=_int(text, "qk_nope_head_dim") or 0,
                        mla_v_head_dim=_int(text, "v_head_dim") or 0, **common)
    head_dim = _int(text, "head_dim") or (hidden // heads if hidden else None)
    if not head_dim:
        return None
    kv_heads = _int(text, "num_key_value_heads") or heads
    return Geometry(layers, heads, False, kv_heads=kv_heads, head_dim=head_dim,
                    v_head_dim=_int(text, "v_head_dim") or head_dim, **common)


def kv_cell(g: Geometry, tp: int, elem_bytes: int = 2) -> int:
    """KV bytes per token on one GPU (pool_configurator.DefaultPoolConfigurator._compute_cell_size)."""
    if g.mla:
        return (g.kv_lora_rank + g.qk_rope_head_dim) * g.layers * elem_bytes
    return max(1, g.kv_heads // max(1, tp)) * (g.head_dim + g.v_head_dim) * g.layers * elem_bytes


# -- the server's shape, as SGLang resolves it ------------------------------------------------------

FLAG_KEYS = {  # server flag -> ServerShape field
    "--context-length": "context_len", "--max-running-requests": "max_running_requests",
    "--cuda-graph-max-bs-decode": "graph_max_bs", "--cuda-graph-max-bs": "graph_max_bs",
    "--chunked-prefill-size": "chunked_prefill", "--speculative-num-draft-tokens": "num_draft_tokens",
    "--speculative-dflash-block-size": "draft_block", "--speculative-ddtree-budget": "ddtree_budget",
    "--triton-attention-num-kv-splits": "num_kv_splits", "--tp-size": "tp", "--tp": "tp", "--pp-size": "pp",
    "--max-total-tokens": "max_total_tokens",
}
TEXT_FLAGS = {"--speculative-algorithm": "algorithm", "--kv-cache-dtype": "kv_dtype",
              "--mem-fraction-static": "mem_fraction", "--attention-backend": "attention_backend"}
SWITCHES = {"--disable-cuda-graph": "disable_graphs"}


def parse_server_args(args: list[str]) -> dict[str, Any]:
    """The values of the flags the memory window depends on, from a server argv (later flags win)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        if name in SWITCHES:
            out[SWITCHES[name]] = True
        elif name in FLAG_KEYS or name in TEXT_FLAGS:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
            if not eq:
                i += 1
            if name in FLAG_KEYS:
                try:
                    out[FLAG_KEYS[name]] = int(str(value))
                except ValueError:
                    out.setdefault("unparsed", []).append(f"{name} {value}")
            elif name == "--mem-fraction-static":
                try:
                    out["mem_fraction"] = float(str(value))
                except ValueError:
                    out.setdefault("unparsed", []).append(f"{name} {value}")
            else:
                out[TEXT_FLAGS[name]] = value
        i += 1
    return out


@dataclass
class ServerShape:
    """The numbers SGLang resolves at start that memory depends on (what was given, else its default)."""

    tp: int = 1
    pp: int = 1
    context_len: int = 4096
    max_running_requests: int | None = None  # None: SGLang sizes it from the pool
    graph_max_bs: int = 0  # 0: no decode CUDA graphs
    prefill_graphs: bool = True
    chunked_prefill: int = 8192
    algorithm: str = "NONE"
    verify_width: int = 1  # target tokens per request in the decode/verify graphs
    draft_block: int = 0  # drafter tokens per request (DFLASH family)
    kv_bytes: int = 2
    num_kv_splits: int = 8
    max_total_tokens: int | None = None
    notes: list[str] = field(default_factory=list)


def gpu_tier(gpu_gib: float, tp: int, c: dict[str, Any]) -> tuple[int, int]:
    """(chunked_prefill_size, decode graph max_bs) SGLang picks for a GPU of ``gpu_gib`` GiB."""
    for below, chunk, bs_small, bs_large in c["defaults"]["gpu_tiers"]:
        if gpu_gib < below:
            return int(chunk), int(bs_large if tp >= 4 else bs_small)
    return 16384, 512


def server_shape(args: list[str], target: Geometry, *, gpu_gib: float, draft_block: int | None = None,
                 c: dict[str, Any] | None = None) -> ServerShape:
    """Resolve the shape from the server's argv the way 0.5.23 does (memory_hook, speculative_hook,
    the DDTree patch set's ``_handle_ddtree``)."""
    c = c or constants()
    v = parse_server_args(args)
    s = ServerShape(tp=v.get("tp", 1), pp=v.get("pp", 1))
    s.notes += [f"cannot read {u}" for u in v.get("unparsed", [])]
    s.context_len = v.get("context_len") or target.max_positions or 4096
    if not v.get("context_len") and not target.max_positions:
        s.notes.append("no --context-length and no max_position_embeddings: 4096 assumed")
    chunk, tier_bs = gpu_tier(gpu_gib, s.tp, c)
    s.chunked_prefill = v.get("chunked_prefill") or chunk
    s.algorithm = str(v.get("algorithm") or "NONE").upper()
    s.kv_bytes = c["kv"]["fp8_bytes"] if "fp8" in str(v.get("kv_dtype") or "") else c["kv"]["bf16_bytes"]
    s.num_kv_splits = v.get("num_kv_splits") or c["triton"]["num_kv_splits"]
    s.max_total_tokens = v.get("max_total_tokens")
    speculative = s.algorithm not in ("NONE", "")
    s.max_running_requests = v.get("max_running_requests") or (
        c["kv"]["speculative_max_running_requests"] if speculative else None)
    _speculative_shape(s, v, draft_block, speculative)
    if v.get("disable_graphs"):
        s.graph_max_bs, s.prefill_graphs = 0, False
    else:
        bs = v.get("graph_max_bs") or tier_bs
        if not v.get("graph_max_bs") and s.max_running_requests:
            bs = min(bs, s.max_running_requests)  # memory_hook: a default max_bs follows --max-running-requests
        if s.max_running_requests:
            bs = min(bs, s.max_running_requests)  # get_batch_sizes_to_capture: never above the request slots
        s.graph_max_bs = bs
    return s


def _speculative_shape(s: ServerShape, v: dict[str, Any], draft_block: int | None, speculative: bool) -> None:
    """The draft block and the tokens the target verifies per request, as each algorithm sets them (DDTree: the
    budget + 1, at least the block; DFlash: the block; the others: the draft tokens)."""
    if s.algorithm == "DDTREE":
        budget = v.get("ddtree_budget")
        s.draft_block = v.get("draft_block") or draft_block or 16
        # _handle_ddtree: speculative_num_draft_tokens = budget + 1; the target verifies
        # max(num_draft_tokens, block) tokens per request (the patched spec_info).
        s.verify_width = max((budget + 1) if budget else v.get("num_draft_tokens") or s.draft_block, s.draft_block)
        if not budget:
            s.notes.append("DDTREE without --speculative-ddtree-budget: SGLang refuses to start")
    elif s.algorithm in DFLASH_FAMILY:
        s.draft_block = v.get("draft_block") or v.get("num_draft_tokens") or draft_block or 16
        s.verify_width = s.draft_block
    elif speculative:
        s.verify_width = v.get("num_draft_tokens") or 1


# -- what lies outside the pool -----------------------------------------------------------------------

def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def sm_count(gpu_name: str | None, c: dict[str, Any] | None = None) -> int:
    table = (c or constants())["sm_count"]
    name = (gpu_name or "").upper()
    best = None
    for key, n in table.items():
        if key != "default" and key.upper() in name and (best is None or len(key) > len(best[0])):
            best = (key, n)
    return int(best[1] if best else table["default"])


def triton_graph_buffers(g: Geometry, *, tp: int, max_bs: int, tokens_per_req: int, context_len: int,
                         num_kv_splits: int, sms: int, verify_mask: bool, ddtree: bool = False,
                         c: dict[str, Any] | None = None) -> dict[str, int]:
    """Bytes of the Triton backend's CUDA-graph state (``TritonAttnBackend.init_cuda_graph_state``).

    ``ddtree``: a runner of the DDTree patch set (the target, whose graphs verify ``W = tokens_per_req`` tree
    nodes per request, or the drafter at its block): the split-KV decode buffers hold one token per request,
    the KV indices each request's committed prefix once, and the target's verify mask is the compact
    ``W x W`` per request (``doctor/data/sglang_memory.toml`` [triton] has the formulas)."""
    c = c or constants()
    t = c["triton"]
    if max_bs <= 0:
        return {}
    tokens = max_bs if ddtree else max_bs * tokens_per_req
    heads = max(1, g.heads // max(1, tp))
    splits = num_kv_splits
    if g.mla:
        splits = max(num_kv_splits, min(next_pow2(sms), next_pow2(math.ceil(context_len / t["mla_min_block_kv"]))))
    out = {
        "attn_logits": tokens * heads * splits * g.v_head_dim * t["logits_bytes"],
        "attn_lse": tokens * heads * splits * t["logits_bytes"],
        "kv_indices": tokens * context_len * t["kv_index_bytes"],
    }
    if verify_mask and tokens_per_req > 1:
        cols = tokens_per_req if ddtree else context_len + tokens_per_req
        out["verify_mask"] = max_bs * tokens_per_req * cols * t["mask_bytes"]
    return out


def decode_capture_sizes(max_bs: int, speculative: bool, c: dict[str, Any] | None = None) -> list[int]:
    """The decode / target verify batch sizes SGLang captures up to ``max_bs``
    (``generate_decode_cuda_graph_batch_sizes``; ``max_bs`` itself always)."""
    if max_bs <= 0:
        return []
    g = (c or constants())["graphs"]
    ranges = g["spec_bs_ranges"] if speculative else g["decode_bs_ranges"]
    sizes = sorted({x for a, b, step in ranges for x in range(a, min(b, max_bs) + 1, step)})
    return sizes if max_bs in sizes else [*sizes, max_bs]


def captured_graph_bytes(g: Geometry, *, max_bs: int, speculative: bool, c: dict[str, Any] | None = None) -> int:
    """Device memory the target's decode / verify graphs take when captured (one graph per captured batch
    size, each a fixed part and a part per layer; the verify width does not enter: ``[graphs]`` in
    ``doctor/data/sglang_memory.toml`` has the readings)."""
    gr = (c or constants())["graphs"]
    per = gr["verify_graph_mib"] if speculative else gr["decode_graph_mib"]
    per += gr["verify_graph_per_layer_mib"] * g.layers
    return int(len(decode_capture_sizes(max_bs, speculative, c)) * per * MIB)


def prefill_graph_sizes(max_tokens: int, c: dict[str, Any]) -> int:
    """How many token counts the prefill graphs capture up to ``max_tokens``."""
    return sum(1 for a, b, step in c["reserve"]["prefill_graph_ranges"] for x in range(a, b + 1, step)
               if x <= max_tokens)


def activation_bytes_per_token(g: Geometry, tp: int, c: dict[str, Any] | None = None) -> int:
    """The prefill working set of one token on one GPU (the doctor's estimate, factors in the data file):
    hidden-state buffers, the attention's per-head q/k/v, the MoE's per-expert intermediates of the
    top-k experts (or the dense MLP's), the router's logits; times the allocator's slack."""
    a = (c or constants())["activation"]
    tp = max(1, tp)
    heads = max(1, g.heads // tp)
    elem = a["elem_bytes"]
    if g.mla:
        attn = heads * (2 * (g.qk_nope_head_dim + g.qk_rope_head_dim) + g.mla_v_head_dim) + g.kv_lora_rank \
            + g.qk_rope_head_dim
    else:
        attn = heads * g.head_dim + 2 * max(1, g.kv_heads // tp) * g.head_dim + heads * g.v_head_dim
    if g.topk and g.moe_intermediate:
        mlp = g.topk * (3 * math.ceil(g.moe_intermediate / tp) + g.hidden)
    else:
        mlp = 3 * math.ceil((g.intermediate or 4 * g.hidden) / tp)
    per = elem * (a["hidden_buffers"] * g.hidden + attn + mlp) + a["router_bytes"] * g.experts
    return int(per * a["allocator_slack"])


def sglang_reserve(shape: ServerShape, mla: bool, c: dict[str, Any] | None = None) -> int:
    """SGLang's own reserve when it picks mem_fraction_static (memory_hook.handle_gpu_memory_settings and
    reserve_for_graph_mb), without its 10 GiB floor: shown next to the doctor's estimate, for comparison."""
    c = c or constants()
    r = c["reserve"]
    mib = r["fixed_mib"] + max(shape.chunked_prefill, r["min_activation_tokens"]) * r["per_activation_token_mib"]
    mib += shape.tp * shape.pp / 8 * r["per_tp_pp_eighth_mib"]
    if shape.graph_max_bs:
        mib += shape.graph_max_bs * r["decode_graph_per_bs_mib"]
    if shape.prefill_graphs:
        mib += r["prefill_graph_mla_mib"] if mla else prefill_graph_sizes(shape.chunked_prefill, c) * \
            r["prefill_graph_per_size_mib"]
    return int(mib * MIB)


def sglang_auto_fraction(shape: ServerShape, mla: bool, gpu_total: int, c: dict[str, Any] | None = None) -> float:
    """The mem_fraction_static SGLang picks when none is given (with its 10 GiB floor above 60 GiB)."""
    gpu_mib = gpu_total / MIB
    reserve = sglang_reserve(shape, mla, c) / MIB
    if gpu_mib > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    return round((gpu_mib - reserve) / gpu_mib, 3) if gpu_mib > 0 else 0.0


def outside_pool(target: Geometry, shape: ServerShape, *, draft: Geometry | None, sms: int,
                 c: dict[str, Any] | None = None) -> dict[str, int]:
    """Bytes allocated outside the static pool, by item."""
    c = c or constants()
    r = c["reserve"]
    tp, pp = shape.tp, shape.pp
    items: dict[str, int] = {}
    act_tokens = max(shape.chunked_prefill, r["min_activation_tokens"])
    items["prefill activations"] = int(r["fixed_mib"] * MIB + act_tokens * activation_bytes_per_token(target, tp, c))
    if tp * pp > 1:
        items["parallel slack (SGLang's reserve)"] = int(tp * pp / 8 * r["per_tp_pp_eighth_mib"] * MIB)
    if shape.graph_max_bs:
        speculative = shape.algorithm != "NONE"
        n_graphs = len(decode_capture_sizes(shape.graph_max_bs, speculative, c))
        kind = "verify" if speculative else "decode"
        items[f"target {kind} graphs captured ({n_graphs} batch sizes)"] = captured_graph_bytes(
            target, max_bs=shape.graph_max_bs, speculative=speculative, c=c)
        for name, n in triton_graph_buffers(target, tp=tp, max_bs=shape.graph_max_bs,
                                            tokens_per_req=shape.verify_width, context_len=shape.context_len,
                                            num_kv_splits=shape.num_kv_splits, sms=sms,
                                            verify_mask=speculative, ddtree=shape.algorithm == "DDTREE",
                                            c=c).items():
            items[f"target graph {name}"] = n
        rows = shape.graph_max_bs * shape.verify_width
        if target.vocab:
            items["graph logits buffer"] = rows * target.vocab * c["triton"]["shared_logits_bytes"]
        if draft is not None and shape.algorithm in DFLASH_FAMILY and shape.draft_block:
            items[f"draft graphs captured ({n_graphs} batch sizes)"] = int(
                n_graphs * c["graphs"]["draft_graph_mib"] * MIB)
            for name, n in triton_graph_buffers(draft, tp=tp, max_bs=shape.graph_max_bs,
                                                tokens_per_req=shape.draft_block, context_len=shape.context_len,
                                                num_kv_splits=shape.num_kv_splits, sms=sms, verify_mask=False,
                                                ddtree=shape.algorithm == "DDTREE", c=c).items():
                items[f"draft graph {name}"] = n
    if shape.prefill_graphs:
        if target.mla:
            items["prefill graphs (SGLang's reserve)"] = int(r["prefill_graph_mla_mib"] * MIB)
        else:
            n = prefill_graph_sizes(shape.chunked_prefill, c)
            items["prefill graphs (SGLang's reserve)"] = int(n * r["prefill_graph_per_size_mib"] * MIB)
    return items


def req_to_token_bytes(shape: ServerShape, requests: int, c: dict[str, Any] | None = None) -> int:
    c = c or constants()
    return (requests + 1) * shape.context_len * c["kv"]["req_to_token_bytes"]


def auto_max_running(tokens: int, context_len: int, c: dict[str, Any] | None = None) -> int:
    """resolve_max_num_reqs without --max-running-requests."""
    k = (c or constants())["kv"]
    est = int(tokens / max(1, context_len) * k["auto_requests_per_context"])
    return min(max(min(est, k["auto_requests_max"]), k["auto_requests_min"]), max(1, tokens // 2))


def runtime_overhead(tp: int, pp: int = 1, c: dict[str, Any] | None = None) -> int:
    """Bytes the server takes before it measures ``pre`` (CUDA context, communicators)."""
    rt = (c or constants())["runtime"]
    return int((rt["context_mib"] + (rt["tp_group_mib"] if tp * pp > 1 else 0)) * MIB)


# -- the window -----------------------------------------------------------------------------------------

@dataclass
class Window:
    """The viable ``--mem-fraction-static`` range on one GPU, with the arithmetic behind it."""

    pre: int  # bytes SGLang will measure before loading
    weights: int  # target + drafter on this GPU
    cell: int  # KV bytes per token (target + draft)
    need_tokens: int
    outside: dict[str, int]  # fixed bytes outside the pool, by item
    per_token_outside: int  # bytes outside the pool per KV token (the eager runner's static buffers)
    f_min: float
    f_max: float
    recommended: float | None

    @property
    def need_kv(self) -> int:
        return self.need_tokens * self.cell

    @property
    def empty(self) -> bool:
        return self.f_min > self.f_max

    def kv_tokens(self, f: float) -> int:
        """max_total_num_tokens SGLang would allocate at ``f`` (0 when the weights do not fit)."""
        return max(0, int(self.pre * f - self.weights) // self.cell) if self.cell else 0

    def outside_at(self, f: float) -> int:
        """Everything allocated outside the pool when the pool is sized at ``f``."""
        return sum(self.outside.values()) + self.per_token_outside * self.kv_tokens(f)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outside_total"] = sum(self.outside.values())
        d["need_kv"] = self.need_kv
        return d


def window(*, pre: int, weights: int, cell: int, need_tokens: int, outside: dict[str, int],
           per_token_outside: int = 0) -> Window:
    """f_min: weights and the needed KV inside ``pre x f``; f_max: what lies outside fits in ``pre x (1-f)``
    (some of it grows with the pool: ``per_token_outside`` bytes per KV token, so f_max solves
    ``C + e (pre f - W) / cell = pre (1 - f)``); recommended: the largest value that still leaves the outside
    its room (more KV never hurts), to 0.01."""
    pre = max(1, int(pre))
    fixed = sum(outside.values())
    f_min = (weights + need_tokens * cell) / pre
    e = per_token_outside / cell if cell else 0.0
    f_max = (pre - fixed + e * weights) / (pre * (1 + e))
    rec = math.floor(f_max * 100) / 100
    if rec < f_min:
        rec = math.floor(f_max * 1000) / 1000
    recommended = rec if f_min <= rec <= f_max and rec > 0 else None
    return Window(pre, weights, cell, need_tokens, outside, per_token_outside, round(f_min, 4), round(f_max, 4),
                  recommended)


# -- SGLang's own start-up lines ------------------------------------------------------------------------

_NUM = r"(-?[0-9.]+)"
LOG_PATTERNS = {
    "load_begin": re.compile(r"Load weight begin\. avail mem=" + _NUM + " GB"),
    "load_end": re.compile(r"Load weight end\..*?avail mem=" + _NUM + r" GB(?:, mem usage=" + _NUM + " GB)?"),
    "kv_mha": re.compile(r"KV Cache is allocated\. (?:dtype: [\w.]+, )?#tokens: (\d+), K size: " + _NUM
                         + r" GB, V size: " + _NUM + " GB"),
    "kv_mla": re.compile(r"KV Cache is allocated\. (?:dtype: [\w.]+, )?#tokens: (\d+), KV size: " + _NUM + " GB"),
    "pool_end": re.compile(r"Memory pool end\. avail mem=" + _NUM + " GB"),
    "summary": re.compile(r"max_total_num_tokens=(\d+),.*?max_running_requests=(\d+),.*?context_len=(\d+),"
                          r".*?available_gpu_mem=" + _NUM + " GB"),
    "dist_end": re.compile(r"Init torch distributed ends\..*?mem usage=" + _NUM + " GB"),
    "capture_begin": re.compile(r"Capture (?:[\w ]+ )?(?:CUDA|cuda) graph begin\..*?avail mem=" + _NUM + " GB"),
    "capture_end": re.compile(r"Capture ([\w ]+ )?(?:CUDA|cuda) graph end\..*?mem usage=" + _NUM
                              + r" GB[.,] avail mem=" + _NUM + " GB"),
}
_RANK = re.compile(r"\bTP(\d+)\b")
# Every pattern above needs one of these in its line: the other lines (most of a log) are passed over at once.
_NEEDLES = ("mem", "KV Cache is allocated")


def _value(text: str | None) -> Any:
    """A log field: int, float, or the text itself (a phase name)."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def parse_startup_log(lines: list[str], rank: int = 0) -> dict[str, Any]:
    """SGLang's memory lines of one rank (``TP<rank>``, or lines without a rank), in order of appearance.
    GB in SGLang's log is GiB (``get_available_gpu_memory`` divides by 1 << 30)."""
    out: dict[str, list[Any]] = {k: [] for k in LOG_PATTERNS}
    out["kv"] = []  # both pool kinds in order of appearance: (tokens, GiB)
    for line in lines:
        if _NEEDLES[0] not in line and _NEEDLES[1] not in line:
            continue
        m_rank = _RANK.search(line)
        if m_rank and int(m_rank.group(1)) != rank:
            continue
        for key, rx in LOG_PATTERNS.items():
            m = rx.search(line)
            if m:
                vals = tuple(_value(x) for x in m.groups())
                out[key].append(vals)
                if key == "kv_mha":
                    out["kv"].append((int(vals[0]), float(vals[1]) + float(vals[2])))
                elif key == "kv_mla":
                    out["kv"].append((int(vals[0]), float(vals[1])))
    return out


def startup_figures(lines: list[str]) -> dict[str, Any]:
    """The figures of one SGLang start, for comparing the window's arithmetic with what SGLang did:
    ``pre`` (GiB, the minimum over ranks, as SGLang reduces it), rank 0's weights (target, then drafter:
    ``load``), KV pools (target, then drafter: ``kv`` as ``(tokens, GiB)``), ``pool_end`` and the
    summary line. Absent lines leave their keys empty."""
    ranks = sorted({int(m.group(1)) for m in map(_RANK.search, lines) if m} or {0})
    per = {r: parse_startup_log(lines, r) for r in ranks}
    first = per[ranks[0]]
    begins = [p["load_begin"][0][0] for p in per.values() if p["load_begin"]]
    kv = first["kv"]
    return {
        "ranks": ranks,
        "pre": min(begins) if begins else None,
        "pre_rank0": first["load_begin"][0][0] if first["load_begin"] else None,
        "load": [(float(a), float(u) if u is not None else None) for a, u in first["load_end"]],
        "kv": kv,
        "pool_end": [float(x[0]) for x in first["pool_end"]],
        "summary": first["summary"][0] if first["summary"] else None,
        "dist_usage": [float(x[0]) for x in first["dist_end"]],
        "capture_begin": [float(x[0]) for x in first["capture_begin"]],
        "capture_end": [(str(x[0] or "").strip(), float(x[1]), float(x[2])) for x in first["capture_end"]],
    }
