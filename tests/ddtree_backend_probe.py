"""SGLang 0.5.23's patched TritonAttnBackend on a DDTREE target verify, under Triton's interpreter (CPU).

``TRITON_INTERPRET=1 python ddtree_backend_probe.py ROOT``: ``ROOT`` is the patched tree
(``ddtree_support.patched_tree(whole=True)``), imported as a bare ``sglang`` package. The backend object is
SGLang's own class; its constructor needs a model runner, so the attributes it would set are set here
(``make_backend``: the ones the verify paths read). Its KV index translator (``pack_read_stream``: each
request's committed slots from ``req_to_token`` into the flat index list) and KV pool (``set_kv_buffer`` /
``get_key_buffer`` / ``get_value_buffer`` over two tensors) are small stand-ins; the rest is the patched
code: ``init_cuda_graph_state`` (the buffer sizes), ``init_forward_metadata`` (the eager verify),
``_update_target_verify_buffers`` + ``_build_cuda_graph_forward_metadata`` (graph replay: the mask copied
into the graph's buffer, ``mask_indptr``), ``forward_extend`` (the layout flag to the kernel) and the
patched extend-attention kernel. Outputs are compared with float64 attention over the committed prefix and
each node's tree ancestors.

Prints one line: ``RESULT {...}`` (see ``main``).
"""

import json
import math
import sys
import traceback
import types


def install(root):
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [root + "/sglang"]
    sys.modules["sglang"] = pkg


class Translator:
    """KVIndexTranslator.pack_read_stream's contract: request b's first seq_lens[b] slots of req_to_token."""

    def __init__(self, req_to_token):
        self.req_to_token = req_to_token

    def pack_read_stream(self, plan, *, req_pool_indices, seq_lens, indptr, out):
        for b in range(seq_lens.numel()):
            n, start = int(seq_lens[b]), int(indptr[b])
            out[start: start + n] = self.req_to_token[int(req_pool_indices[b]), :n]


class Pool:
    def __init__(self, k, v):
        self.k, self.v = k, v

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v

    def set_kv_buffer(self, layer, loc, k, v, *args, **kwargs):
        idx = loc.loc if hasattr(loc, "loc") else loc
        self.k[idx] = k.view(self.k[idx].shape)
        self.v[idx] = v.view(self.v[idx].shape)


def make_backend(tb, torch, *, width, max_bs, ctx, heads, kv_heads, dq, dv, pool, translator, ddtree,
                 draft=False):
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    be = object.__new__(tb.TritonAttnBackend)
    cpu = torch.device("cpu")
    be.__dict__.update(
        device=cpu, num_head=heads, num_kv_head=kv_heads, v_head_dim=dv, swa_v_head_dim=None, max_kv_splits=8,
        lean_total_programs=1, lean_block_m=16, max_context_len=ctx, is_draft_runner=draft, skip_prefill=False,
        num_draft_tokens=width, requires_tree_verify_mask=ddtree and not draft,
        compact_tree_verify_mask=ddtree and not draft, verify_only_graphs=ddtree,
        sliding_window_size=None, use_sliding_window_kv_pool=False, dllm_attention=None,
        kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32), qo_indptr=torch.zeros(max_bs + 1, dtype=torch.int64),
        mask_indptr=torch.zeros(max_bs + 1, dtype=torch.int64), window_kv_indptr=None,
        target_verify_num_tokens_per_req=width, kv_index_translator=translator, dcp_size=1,
        enable_deterministic=False, use_verify_splitkv=False, use_verify_shared_kv=False, page_size=1,
        token_to_kv_pool=pool, use_dense_fp8_chunked_prefill=False, use_mla=False,
        allow_bidirectional_attention_in_extend=False, extend_attention_fwd=extend_attention_fwd,
        _dense_one_shot_kv_indptr=None, _verify_mask=None,
    )
    return be


def reference(torch, q, k_ext, v_ext, k_buf, v_buf, prefix_slots, tree, scale):
    w, h, _ = q.shape
    group = h // k_ext.shape[1]
    k = torch.cat([k_buf[prefix_slots], k_ext]).double()
    v = torch.cat([v_buf[prefix_slots], v_ext]).double()
    allowed = torch.cat([torch.ones(w, prefix_slots.numel(), dtype=torch.bool), tree], 1)
    out = torch.empty(w, h, v.shape[-1], dtype=torch.float64)
    for head in range(h):
        s = (q[:, head].double() @ k[:, head // group].T) * scale
        out[:, head] = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v[:, head // group]
    return out


def run_case(shape):
    import importlib

    import torch

    tb = importlib.import_module("sglang.srt.layers.attention.triton_backend")
    fbi = importlib.import_module("sglang.srt.model_executor.forward_batch_info")
    dd = importlib.import_module("sglang.srt.speculative.ddtree_utils")
    heads, kv_heads, dq, dv = shape
    budget, depth, width, max_bs, ctx = 12, 6, 13, 4, 64
    prefix = [0, 7, 30]
    bs = len(prefix)
    g = torch.Generator().manual_seed(1)
    lp, tok = dd.ddtree_topk_from_logits(torch.randn(bs, depth, 50, generator=g) * 4, budget)
    batch = dd.build_tree_batch(lp, tok, torch.arange(bs), width, None, torch.tensor(prefix))
    assert all(bool((~batch.tree_mask[b]).tril().any()) for b in range(bs)), "the trees must branch"
    n_slots = 256
    k_buf = torch.randn(n_slots, kv_heads, dq, generator=g)
    v_buf = torch.randn(n_slots, kv_heads, dv, generator=g)
    perm = torch.randperm(n_slots - 1, generator=g) + 1
    req_to_token = torch.zeros(max_bs + 1, ctx + width, dtype=torch.int64)
    rpi = torch.tensor([3, 1, 2])
    off = 0
    for b, n in enumerate(prefix):
        req_to_token[int(rpi[b]), : n + width] = perm[off: off + n + width]
        off += n + width
    out_cache_loc = torch.cat([req_to_token[int(rpi[b]), n: n + width] for b, n in enumerate(prefix)])
    q = torch.randn(bs * width, heads, dq, generator=g)
    k_ext = torch.randn(bs * width, kv_heads, dq, generator=g)
    v_ext = torch.randn(bs * width, kv_heads, dv, generator=g)
    scale = 1.0 / math.sqrt(dq)
    layer = types.SimpleNamespace(
        tp_q_head_num=heads, tp_k_head_num=kv_heads, qk_head_dim=dq, v_head_dim=dv, layer_id=0, scaling=scale,
        logit_cap=0.0, logit_capping_method="tanh", is_cross_attention=False, attn_type=tb.AttentionType.DECODER,
        sliding_window_size=None, xai_temperature_len=-1, k_scale=None, v_scale=None)
    seq_lens = torch.tensor(prefix, dtype=torch.int64)

    def forward_batch(spec_info):
        return types.SimpleNamespace(
            forward_mode=fbi.ForwardMode.TARGET_VERIFY, batch_size=bs, req_pool_indices=rpi, seq_lens=seq_lens,
            seq_lens_sum=int(seq_lens.sum()), kv_loc_plan=None, spec_info=spec_info, out_cache_loc=out_cache_loc,
            out_cache_loc_is_physical=True, mha_one_shot=False, attn_attend_prefix_cache=None,
            extend_seq_lens_cpu=None, positions=batch.positions, extend_prefix_lens=None)

    def expected():
        outs = []
        for b in range(bs):
            rows = slice(b * width, (b + 1) * width)
            slots = req_to_token[int(rpi[b]), : prefix[b]]
            outs.append(reference(torch, q[rows], k_ext[rows], v_ext[rows], k_buf, v_buf, slots, batch.tree_mask[b],
                                  scale))
        return torch.cat(outs)

    def attend(be, fb):
        pool = be.token_to_kv_pool
        pool.k[out_cache_loc] = 0.0  # written again by forward_extend (save_kv_cache)
        o = be.forward_extend(q.reshape(bs * width, -1), k_ext.clone(), v_ext.clone(), layer, fb)
        return o.view(bs * width, heads, dv).double()

    ref = expected()
    result = {}
    # sizes: DDTREE's target state against the pristine sizing of the same runner
    for ddtree in (True, False):
        be = make_backend(tb, torch, width=width, max_bs=max_bs, ctx=ctx, heads=heads, kv_heads=kv_heads, dq=dq, dv=dv,
                          pool=Pool(k_buf.clone(), v_buf.clone()), translator=Translator(req_to_token), ddtree=ddtree)
        be.init_cuda_graph_state(max_bs, max_bs * width)
        result["ddtree_sizes" if ddtree else "pristine_sizes"] = {
            "attn_logits": list(be.cuda_graph_attn_logits.shape), "kv_indices": be.cuda_graph_kv_indices.numel(),
            "verify_mask": be._verify_mask.buffer.numel()}
    # DDTREE's drafter runner (its graphs verify the DFlash block): no mask, one decode token per request
    block = 8
    for ddtree in (True, False):
        be = make_backend(tb, torch, width=block, max_bs=max_bs, ctx=ctx, heads=heads, kv_heads=kv_heads, dq=dq,
                          dv=dv, pool=Pool(k_buf.clone(), v_buf.clone()), translator=Translator(req_to_token),
                          ddtree=ddtree, draft=True)
        be.init_cuda_graph_state(max_bs, max_bs * block)
        result["draft_ddtree_sizes" if ddtree else "draft_pristine_sizes"] = {
            "attn_logits": list(be.cuda_graph_attn_logits.shape), "kv_indices": be.cuda_graph_kv_indices.numel(),
            "verify_mask": None if be._verify_mask is None else be._verify_mask.buffer.numel()}
    compact = dd.compact_verify_mask(batch.tree_mask)
    spec = types.SimpleNamespace(custom_mask=compact, num_tokens_per_req=width)
    # eager target verify
    be = make_backend(tb, torch, width=width, max_bs=max_bs, ctx=ctx, heads=heads, kv_heads=kv_heads, dq=dq, dv=dv,
                      pool=Pool(k_buf.clone(), v_buf.clone()), translator=Translator(req_to_token), ddtree=True)
    be.init_cuda_graph_state(max_bs, max_bs * width)
    fb = forward_batch(spec)
    be.init_forward_metadata(fb)
    result["eager_mask_indptr"] = be.forward_metadata.mask_indptr.tolist()
    result["eager_err"] = float((attend(be, fb) - ref).abs().max())
    # graph replay: the verify mask copied into the graph's buffer, the compact mask_indptr
    be._verify_mask.buffer.fill_(7)  # stale bytes from an earlier, larger batch
    be._update_target_verify_buffers(None, bs, seq_lens, spec, rpi)
    be.forward_metadata = be._build_cuda_graph_forward_metadata(bs, fbi.ForwardMode.TARGET_VERIFY, spec)
    result["graph_mask_is_buffer"] = be.forward_metadata.custom_mask.data_ptr() == be._verify_mask.buffer.data_ptr()
    result["graph_mask_indptr"] = be.forward_metadata.mask_indptr.tolist()
    result["graph_err"] = float((attend(be, fb) - ref).abs().max())
    # graph replay of a padded bucket: the runner's batch (max_bs) above the batch's requests, whose mask covers
    # the real requests only (the runner pads seq_lens with 1 and the pool indices with 0)
    be._verify_mask.buffer.fill_(7)
    pad = max_bs - bs
    seq_pad = torch.cat([seq_lens, torch.ones(pad, dtype=seq_lens.dtype)])
    rpi_pad = torch.cat([rpi, torch.zeros(pad, dtype=rpi.dtype)])
    try:
        be._update_target_verify_buffers(None, max_bs, seq_pad, spec, rpi_pad)
        copied = be._verify_mask.buffer[: compact.numel()].to(torch.bool)
        result["padded_replay_mask_equal"] = bool(torch.equal(copied, compact.to(torch.bool)))
        result["padded_replay_mask_indptr"] = be.mask_indptr[: max_bs + 1].tolist()
    except RuntimeError as e:
        result["padded_replay_mask_equal"] = f"raised: {e}"
    # capture: the runner hands its all-ones buffer, sized for the FULL_MASK layout (longer, and not a whole
    # number of W x W requests): the first max_bs * W * W cells of it are read
    be._verify_mask.buffer.fill_(0)
    ones = torch.ones(sum(width * (n + width) for n in seq_pad.tolist()) + 1, dtype=torch.bool)
    try:
        be._update_target_verify_buffers(None, max_bs, seq_pad, types.SimpleNamespace(
            custom_mask=ones, num_tokens_per_req=width), rpi_pad)
        result["capture_mask_ones"] = int(be._verify_mask.buffer[: max_bs * width * width].to(torch.bool).sum())
    except RuntimeError as e:
        result["capture_mask_ones"] = f"raised: {e}"
    try:  # a mask that is not a whole number of W x W requests is refused
        be._update_target_verify_buffers(None, max_bs, seq_pad, types.SimpleNamespace(
            custom_mask=compact[:-1], num_tokens_per_req=width), rpi_pad)
        result["ragged_mask"] = "ran"
    except RuntimeError as e:
        result["ragged_mask"] = str(e)
    # controls: without a mask DDTREE refuses (eager and graph); the compact mask on a runner that reads the
    # FULL_MASK layout (the pristine backend) attends wrongly
    for name, call in (("eager", lambda: be.init_forward_metadata(forward_batch(types.SimpleNamespace(
                            custom_mask=None, num_tokens_per_req=width)))),
                       ("graph", lambda: be._build_cuda_graph_forward_metadata(
                            bs, fbi.ForwardMode.TARGET_VERIFY, types.SimpleNamespace(custom_mask=None,
                                                                                     num_tokens_per_req=width)))):
        try:
            call()
            result[f"{name}_without_mask"] = "ran"
        except RuntimeError as e:
            result[f"{name}_without_mask"] = str(e)
    plain = make_backend(tb, torch, width=width, max_bs=max_bs, ctx=ctx, heads=heads, kv_heads=kv_heads, dq=dq,
                         dv=dv, pool=Pool(k_buf.clone(), v_buf.clone()), translator=Translator(req_to_token),
                         ddtree=False)
    padded = torch.zeros(sum(width * (n + width) for n in prefix), dtype=torch.bool)
    padded[: compact.numel()] = compact
    fb_plain = forward_batch(types.SimpleNamespace(custom_mask=padded, num_tokens_per_req=width))
    plain.init_forward_metadata(fb_plain)
    result["misread_err"] = float((attend(plain, fb_plain) - ref).abs().max())
    full = dd.build_verify_custom_mask(batch.tree_mask, seq_lens)
    fb_full = forward_batch(types.SimpleNamespace(custom_mask=full, num_tokens_per_req=width))
    plain.init_forward_metadata(fb_full)
    result["full_layout_err"] = float((attend(plain, fb_full) - ref).abs().max())
    return result


def main():
    install(sys.argv[1])
    out = {}
    for name, shape in (("gqa", (4, 2, 64, 64)), ("mla_absorbed", (2, 1, 576, 512))):
        try:
            out[name] = run_case(shape)
        except Exception:
            out[name] = {"error": traceback.format_exc()}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
