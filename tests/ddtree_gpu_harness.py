"""Harness: SGLang 0.5.23's own Triton kernels on DDTree trees, against float64 torch references.

* ``extend_attention_fwd`` -- the kernel the Triton backend runs for TARGET_VERIFY -- with the
  ancestor-only tree mask in the flattened FULL_MASK layout (bool as the eager path passes it, uint8 as the
  CUDA-graph buffer holds it), for a GQA shape and Kimi/DeepSeek's absorbed-MLA shape (576/512, one KV
  head), against float64 attention; and, as a control, the same kernel without the mask (what a graph
  captured without the buffer would run) must be wrong on the tree.
* ``verify_tree_greedy_kernel_triton`` (speculative/spec_tree.py) on the DDTree EAGLE encoding, against
  the torch reference in ``ddtree_utils``.
* the set's draft top-k (``ddtree_step.vocab_parallel_topk``, ``run_shard_topk_case``) at TP 1 on the device
  (the merge of one shard the identity), 8 shards merged on the device equal to TP 1 bit for bit, captured in a
  CUDA graph equal to eager, against the full-vocabulary top-k.
* ``ddtree_step.CommitGraphs`` captured in real CUDA graphs (``run_commit_race_case``): a live move into a
  root slot a padded row of the bucket last held keeps the moved KV, and the bucket's whole scatter writes no
  slot twice with different sources.

No SGLang install is needed: the kernel files come from an installed ``sglang`` if there is one, else from
the 0.5.23 wheel (tests/sglang_wheels.py: ``$SGLANG_WHEELS``, else the per-user cache, else pip download). They are
loaded with their package ``__init__`` files skipped, and ``sglang.srt.utils`` -- imported by the kernels
only for platform predicates (is_cuda, is_hip, gfx checks, SM count) -- answered from torch.

No pytest needed: ``python3 tests/ddtree_gpu_harness.py`` prints the measurements and exits 0 when every
comparison holds, 1 on a failed one, 3 when it could not run (no CUDA/triton/kernel sources);
tests/test_ddtree_gpu.py runs the same under pytest (``-m gpu``).
``TRITON_INTERPRET=1 python3 tests/ddtree_gpu_harness.py --interpret`` runs the comparisons on a CPU in
Triton's interpreter (tests/test_ddtree_interpreted.py does that in the suite).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import json
import sys
import tempfile
import types
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddtree_support import SET_DIR, bare_sglang, find_wheel, load_file


class Unavailable(Exception):
    """What the comparison needs is not here (no CUDA, no triton, no kernel sources): a skip, not a failure."""


def _need(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise Unavailable(f"{module} is not importable: {exc}") from None

ATTN = "sglang/kernels/ops/attention"
SPEC = "sglang/kernels/ops/speculative"
KERNEL_FILES = [f"{ATTN}/extend_attention.py", f"{ATTN}/decode_attention.py", f"{ATTN}/score_mod.py",
                "sglang/srt/environ.py", f"{SPEC}/spec_tree.py", f"{SPEC}/lilicorr.py", f"{SPEC}/dflash.py"]


def _torch(device: str = "cuda"):
    torch = _need("torch")
    _need("triton")
    if device == "cuda" and not torch.cuda.is_available():
        raise Unavailable("needs a CUDA device")
    return torch


EXTEND = f"{ATTN}/extend_attention.py"
COMPACT_MARK = "CUSTOM_MASK_COMPACT"


def _source_root() -> Path:
    """A directory holding ``sglang/...`` kernel sources as the patched server runs them: an installed
    sglang with the set applied; else its pristine files (or the 0.5.23 wheel's) with the set's
    ``extend_attention.py`` change applied here (strict, hash-checked against the manifest)."""
    if "root" in _KERNELS:
        return _KERNELS["root"]
    spec = importlib.util.find_spec("sglang")
    base = None
    if spec is not None and spec.submodule_search_locations:
        cand = Path(next(iter(spec.submodule_search_locations))).parent
        if all((cand / f).is_file() for f in KERNEL_FILES):
            base = cand
    if base is not None and COMPACT_MARK in (base / EXTEND).read_text():
        _KERNELS["root"] = base
        return base
    dest = Path(tempfile.mkdtemp(prefix="ddtree-kernels-"))
    if base is not None:
        for f in KERNEL_FILES:
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            (dest / f).write_bytes((base / f).read_bytes())
    else:
        wheel = find_wheel()
        if wheel is None:
            raise Unavailable("neither an installed sglang nor the sglang 0.5.23 wheel is available")
        with zipfile.ZipFile(wheel) as zf:
            for f in KERNEL_FILES:
                zf.extract(f, dest)
    (dest / EXTEND).write_bytes(patched_file(EXTEND, (dest / EXTEND).read_bytes()))
    _KERNELS["root"] = dest
    return dest


def patched_file(rel: str, pristine: bytes) -> bytes:
    """``pristine`` (which must hash to the manifest's ``before``) with the set's section for ``rel``
    applied by the patch engine's strict applier; the result must hash to the manifest's ``after``."""
    sys.path.insert(0, str(SET_DIR.parents[1]))
    from doctor.sglang.patching import udiff

    manifest = json.loads((SET_DIR / "manifest.json").read_text())
    patch = next(p for p in manifest["patches"] if any(f["path"] == rel for f in p["files"]))
    entry = next(f for f in patch["files"] if f["path"] == rel)
    if hashlib.sha256(pristine).hexdigest() != entry["before"]:
        raise Unavailable(f"{rel} here is neither the patched file nor the 0.5.23 original")
    section = udiff.match_section(udiff.parse((SET_DIR / patch["diff"]).read_bytes()), rel)
    out = udiff.apply(pristine, section)
    assert hashlib.sha256(out).hexdigest() == entry["after"], f"{rel}: diff and manifest disagree"
    return out


def _platform_utils(torch) -> types.ModuleType:
    """What the kernels import from ``sglang.srt.utils``: platform predicates, from torch."""
    mod = types.ModuleType("sglang.srt.utils")
    hip = torch.version.hip is not None

    def arch() -> str:
        return getattr(torch.cuda.get_device_properties(0), "gcnArchName", "") if hip else ""

    mod.is_cuda = lambda: torch.version.cuda is not None and torch.cuda.is_available()
    mod.is_hip = lambda: hip
    mod.is_gfx95_supported = lambda: hip and arch().startswith("gfx95")
    mod.is_gfx1250_supported = lambda: hip and arch().startswith("gfx1250")
    mod.is_cpu = mod.is_musa = mod.is_npu = mod.is_xpu = lambda: False
    mod.get_device_core_count = lambda device_id=0: torch.cuda.get_device_properties(device_id).multi_processor_count
    return mod


_KERNELS: dict[str, types.ModuleType] = {}


def extend_attention_module(torch) -> types.ModuleType:
    if "extend" not in _KERNELS:
        with bare_sglang(_source_root(), ("sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
                                          "sglang.srt"), {"sglang.srt.utils": _platform_utils(torch)}):
            _KERNELS["extend"] = importlib.import_module("sglang.kernels.ops.attention.extend_attention")
    return _KERNELS["extend"]


def lilicorr_module(torch) -> types.ModuleType:
    """``sglang/kernels/ops/speculative/lilicorr.py``: ``lilicorr_topk_lse``, the shard top-k + log-sum-exp
    under the ``candidate_topk(..., with_partition=True)`` the DDTREE worker takes its draft top-k from (Triton
    kernels on a GPU, its torch path elsewhere)."""
    if "lilicorr" not in _KERNELS:
        with bare_sglang(_source_root(), ("sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.speculative")):
            _KERNELS["lilicorr"] = importlib.import_module("sglang.kernels.ops.speculative.lilicorr")
    return _KERNELS["lilicorr"]


def run_draft_topk_case(device: str = "cuda", seed: int = 0) -> dict:
    """The worker's draft top-k (``lilicorr_topk_lse``: top-k logits, ids, full-vocabulary log-sum-exp, so
    log-probs = logit - lse) against the revision-3 path (``log_softmax`` over the vocabulary, then top-k):
    the same ids and log-probs, for tile-selected (min(K, tiles) a power of two) and fallback shapes."""
    torch = _torch(device)
    mod = lilicorr_module(torch)
    dd = ddtree_utils_module()
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    cases = []
    for vocab, k in ((4096, 4), (20000, 16), (163840, 64), (3000, 5)):
        logits = torch.randn(24, vocab, generator=g, device=dev) * 3.0
        vals, ids, lse = mod.lilicorr_topk_lse(logits, k)
        ref_lp, ref_ids = dd.ddtree_topk_from_logits(logits, k)
        lp = vals.float() - lse.unsqueeze(-1)
        cases.append({"vocab": vocab, "k": k, "ids_equal": bool(torch.equal(ids.long(), ref_ids)),
                      "max_abs_err": float((lp - ref_lp).abs().max())})
    return {"cases": cases, "ok": all(c["ids_equal"] and c["max_abs_err"] < 1e-4 for c in cases)}


def run_shard_topk_case(device: str = "cuda", seed: int = 0) -> dict:
    """The patch set's draft top-k (``ddtree_step.vocab_parallel_topk`` / ``DraftTopK``: float32 shard top-k,
    ties to the lowest id, float64 log-sum-exp, the exact merge) on the device's kernels, at TP 1 (world size 1,
    no collective: the merge of one shard must be the identity), against the full-vocabulary answer computed on
    the CPU (the first k of a stable descending sort, float64 log-softmax rounded to float32); the same logits
    cut into 8 shards and merged on the device (TP 8's numerics without the collective) must give TP 1's values
    bit for bit; on a GPU, the function captured in a CUDA graph and replayed on new logits gives the eager
    values bit for bit. bf16 logits (Kimi K2.6's head dtype: ties are common at 163840 columns), a tie-heavy
    row, ``-inf`` runs and an all ``-inf`` row; budgets 16/32/64 at the TP 1 and TP 8 shard widths.
    ``lilicorr_ids_equal`` (SGLang's helper the revision-6 path used) is reported, not judged: its tile
    pre-selection has no fixed tie rule."""
    torch = _torch(device)
    st = ddtree_step_module()
    dd = ddtree_utils_module()
    dev = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    shapes = ((163840, 64, 48), (163840, 16, 48), (20480, 32, 48), (20480, 64, 48)) if device == "cuda" else \
        ((8192, 64, 8), (2560, 32, 8))
    def bits(x):  # float32 compared bit for bit (the all -inf row's NaN log-probs included)
        return x.contiguous().view(torch.int32)

    cases = []
    for vocab, k, rows in shapes:
        cpu = (torch.randn(rows, vocab, generator=g) * 3).to(torch.bfloat16).float()
        cpu[0] = torch.randint(-2, 3, (vocab,), generator=g).float()  # ties everywhere
        cpu[1, ::3] = float("-inf")
        cpu[2] = float("-inf")
        logits = cpu.to(dev, torch.bfloat16)
        lp, ids = st.vocab_parallel_topk(logits, k, 0, None, None)
        order = torch.sort(cpu, dim=-1, descending=True, stable=True).indices[:, :k]
        ref_lp = torch.log_softmax(cpu.double(), dim=-1).gather(-1, order).float()
        vals, sids, lse = dd.shard_topk(logits, k, 0, None)
        one = dd.merge_shard_topk(vals[None], sids[None], lse[None], k)  # world size 1
        own = (vals.double() - lse[:, None]).float()
        identity = bool(torch.equal(one[1], sids) and torch.equal(bits(one[0]), bits(own))
                        and torch.equal(one[1], ids) and torch.equal(bits(one[0]), bits(lp)))
        per = vocab // 8
        packed = torch.stack([dd.pack_shard_topk(*dd.shard_topk(logits[:, r * per:(r + 1) * per], k, r * per))
                              for r in range(8)])
        lp8, ids8 = dd.merge_packed_shard_topk(packed, k)
        case = {"vocab": vocab, "k": k, "ids_equal": bool(torch.equal(ids.cpu(), order)),
                "max_abs_err": float((lp.cpu() - ref_lp).nan_to_num(0.0).abs().max()),
                "nan_rows_equal": bool(torch.equal(lp.cpu().isnan(), ref_lp.isnan())),
                "identity_at_tp1": identity,
                "tp8_equals_tp1": bool(torch.equal(ids8, ids) and torch.equal(bits(lp8), bits(lp)))}
        if device == "cuda":
            static = logits.clone()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                st.vocab_parallel_topk(static, k, 0, None, None)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out_lp, out_ids = st.vocab_parallel_topk(static, k, 0, None, None)
            fresh = (torch.randn(rows, vocab, generator=g) * 3).to(dev, torch.bfloat16)
            static.copy_(fresh)
            graph.replay()
            torch.cuda.synchronize()
            e_lp, e_ids = st.vocab_parallel_topk(fresh, k, 0, None, None)
            case["graph_equals_eager"] = bool(torch.equal(out_ids, e_ids) and torch.equal(bits(out_lp), bits(e_lp)))
            try:
                l_vals, l_ids, _ = lilicorr_module(torch).lilicorr_topk_lse(logits, k)
                case["lilicorr_ids_equal"] = bool(torch.equal(l_ids.long(), ids))
                case["lilicorr_vals_equal"] = bool(torch.equal(l_vals.float(), vals))
            except Exception as exc:  # reported only
                case["lilicorr"] = f"{type(exc).__name__}: {exc}"
        cases.append(case)
    judged = ("ids_equal", "nan_rows_equal", "identity_at_tp1", "tp8_equals_tp1", "graph_equals_eager")
    ok = all(c["max_abs_err"] < 1e-5 and all(c.get(key, True) for key in judged) for c in cases)
    return {"cases": cases, "ok": ok}


def verify_greedy_kernel_module() -> types.ModuleType:
    """``verify_tree_greedy_kernel_triton`` and its launcher, cut out of spec_tree.py unchanged.

    The rest of spec_tree.py imports SGLang's platform layer; these two functions need only triton.
    """
    if "verify" in _KERNELS:
        return _KERNELS["verify"]
    src = (_source_root() / "sglang/kernels/ops/speculative/spec_tree.py").read_text()
    tree = ast.parse(src)
    wanted = {"verify_tree_greedy_kernel_triton", "verify_tree_greedy_triton"}
    decorated = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            lines = src.splitlines()[node.lineno - 1 - len(node.decorator_list): node.end_lineno]
            decorated.append("\n".join(lines))
    assert len(decorated) == 2, "spec_tree.py no longer defines the greedy verify kernel"
    path = Path(tempfile.mkdtemp(prefix="ddtree-spec-tree-")) / "sglang_spec_tree_verify.py"
    path.write_text("import torch\nimport triton\nimport triton.language as tl\n\n\n" + "\n\n\n".join(decorated) + "\n")
    mod = load_file(path, "sglang_spec_tree_verify")
    _KERNELS["verify"] = mod
    return mod


def ddtree_utils_module():
    """The patch set's ddtree_utils.py, rebuilt from its creating diff and checked against the manifest
    (patch 0001 only creates it; no wheel and no ``patch`` binary needed on the GPU machine)."""
    if "ddtree_utils" not in _KERNELS:
        _KERNELS["ddtree_utils"] = created_file_module("sglang/srt/speculative/ddtree_utils.py",
                                                       "k26_ddtree_utils_gpu", {})
    return _KERNELS["ddtree_utils"]


def created_file_module(rel: str, name: str, deps: dict[str, types.ModuleType]) -> types.ModuleType:
    """A file the patch set creates, rebuilt from its ``/dev/null`` section of the diff (hash checked against
    the manifest) and loaded with ``deps`` registered under their SGLang module names for the load."""
    manifest = json.loads((SET_DIR / "manifest.json").read_text())
    patch = next(p for p in manifest["patches"] if any(f["path"] == rel for f in p["files"]))
    entry = next(f for f in patch["files"] if f["path"] == rel)
    assert entry["before"] is None, f"{rel} is not created by the set"
    lines = (SET_DIR / patch["diff"]).read_text().splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.rstrip("\n") == f"+++ b/{rel}")
    body = []
    for ln in lines[start + 1:]:
        if ln.startswith("--- "):
            break
        if ln.startswith("+"):
            body.append(ln[1:])
    text = "".join(body)
    assert hashlib.sha256(text.encode()).hexdigest() == entry["after"], f"{rel}: diff and manifest disagree"
    dest = Path(tempfile.mkdtemp(prefix="ddtree-created-")) / Path(rel).name
    dest.write_text(text)
    saved = {k: sys.modules.get(k) for k in deps}
    sys.modules.update(deps)
    try:
        return load_file(dest, name)
    finally:
        for k, v in saved.items():
            if v is None:
                del sys.modules[k]
            else:
                sys.modules[k] = v


def ddtree_step_module():
    return created_file_module("sglang/srt/speculative/ddtree_step.py", "k26_ddtree_step_gpu",
                               {"sglang.srt.speculative.ddtree_utils": ddtree_utils_module()})


def run_step_loop_greedy_case(device: str = "cuda", seeds=(0, 1, 3), n: int = 30) -> dict:
    """The DDTREE step loop (ddtree_step.ddtree_round on the toy of tests/ddtree_toy.py) with SGLang's
    greedy tree-verify kernel doing the acceptance: must reproduce greedy autoregressive decoding."""
    torch = _torch(device)
    import ddtree_toy as toy_mod

    st = ddtree_step_module()
    kern = verify_greedy_kernel_module()
    dev = torch.device(device)

    def accept(tv, logits):
        b = tv.batch
        bs, w, spec = b.bs, b.width, b.num_spec_tokens()
        predicts = torch.full((bs * w,), -1, dtype=torch.int32, device=dev)
        accept_index = torch.full((bs, spec), -1, dtype=torch.int32, device=dev)
        accept_num = torch.zeros((bs,), dtype=torch.int32, device=dev)
        kern.verify_tree_greedy_triton(predicts, accept_index, accept_num, b.draft_tokens.to(dev),
                                       b.retrieve_index.to(dev), b.retrieve_next_token.to(dev),
                                       b.retrieve_next_sibling.to(dev), logits.argmax(-1).view(bs, w).to(dev))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return predicts.cpu(), accept_index.cpu(), accept_num.cpu()

    prompts = [[1, 2, 3, 4], [0], [4, 4, 2, 1, 0, 3, 3]]
    equal, committed, rounds = True, 0, 0
    for seed in seeds:
        toy = toy_mod.Toy(seed)
        eng = toy_mod.Engine(st, toy, prompts)
        outs = [[] for _ in prompts]
        while min(len(o) for o in outs) < n:
            for b, toks in enumerate(eng.round([8, 3, 1], 9, accept)):
                outs[b].extend(toks)
            rounds += 1
        eng.check_state([p + o for p, o in zip(prompts, outs, strict=True)])
        equal &= all(outs[b] == toy_mod.ar_greedy(toy, p, len(outs[b])) for b, p in enumerate(prompts))
        committed += sum(len(o) for o in outs)
    return {"equal_to_autoregressive": equal, "tokens_per_request_round": committed / (rounds * len(prompts))}


def run_commit_race_case(device: str = "cuda", bucket: int = 8) -> dict:
    """``ddtree_step.CommitGraphs`` captured (CUDA graphs on a GPU; the CPU emulation elsewhere): a bucket
    committed at full size, then 2 live requests whose accepted path moves KV into three slots that padded
    rows 3, 5 and 7 still named as their roots (freed and reallocated). The KV after the commit must equal the
    eager plan's moves of the live requests alone, and the bucket's whole scatter (padded rows included) must
    write no slot twice with different sources: on a GPU such a duplicate resolves either way, so the first
    check alone could pass by chance."""
    torch = _need("torch")
    if device == "cuda" and not torch.cuda.is_available():
        raise Unavailable("needs a CUDA device")
    st = ddtree_step_module()
    dev = torch.device(device)
    width, num_spec = 11, 5
    kv = [torch.randn(400, 576, device=dev, dtype=torch.bfloat16)]
    graphs = st.CommitGraphs(width=width, num_spec=num_spec, batch_sizes=[2, bucket], device=dev,
                             move_kv=lambda dst, src: st.apply_kv_moves(kv, src, dst))
    graphs.capture()

    def accept(bs, paths):
        acc = (torch.arange(bs, device=dev) * width).view(-1, 1).repeat(1, num_spec)
        num = torch.zeros(bs, dtype=torch.int64, device=dev)
        for b, nodes in paths.items():
            for i, node in enumerate(nodes, start=1):
                acc[b, i] = b * width + node
            num[b] = len(nodes)
        return torch.zeros(bs * width, dtype=torch.int64, device=dev), acc, num

    first = torch.arange(10, 10 + bucket * width, device=dev)
    graphs.commit(*accept(bucket, {0: [1, 2], 3: [1, 4]}), first, torch.zeros(bucket, dtype=torch.int64, device=dev))
    # Two live requests (a smaller bucket would serve 2: make the big one serve 3 instead).
    bs = 3
    loc = torch.arange(200, 200 + bs * width, device=dev)
    stale = [int(first[r * width]) for r in (3, 5, 7) if r < bucket]
    loc[width + 1: width + 1 + len(stale)] = torch.tensor(stale, device=dev)
    predicts, acc, num = accept(bs, {1: [3, 5, 7], 2: [1]})
    prefix = torch.tensor([5, 9, 2], device=dev)
    kv[0].copy_(torch.randn(kv[0].shape, device=dev, dtype=kv[0].dtype))
    want = [kv[0].clone()]
    plan = st.plan_commit(predicts, acc, num, loc, prefix, width)
    st.apply_kv_moves(want, plan.kv_src, plan.kv_dst)
    got = graphs.commit(predicts, acc, num, loc, prefix)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    out = graphs.captured[graphs.bucket(bs)][1]
    seen, conflicts = {}, []
    for s, d in zip(out.kv_src.tolist(), out.kv_dst.tolist(), strict=True):
        if seen.setdefault(d, s) != s:
            conflicts.append(d)
    kv_equal = bool(torch.equal(kv[0], want[0]))
    return {"bucket": graphs.bucket(bs), "stale_slots": stale, "kv_equal_to_eager": kv_equal,
            "conflicting_writes": conflicts, "commit_lens": got.commit_lens.tolist(),
            "ok": kv_equal and not conflicts and got.commit_lens.tolist() == [1, 4, 2]}


def sampling_kernel():
    """SGLang's JIT CUDA ``tree_speculative_sampling_target_only``; needs an installed sglang with its JIT
    toolchain (tvm-ffi, flashinfer headers, nvcc)."""
    try:
        mod = importlib.import_module("sglang.kernels.ops.speculative.sampling")
    except Exception as exc:  # ImportError, or the package's own import-time errors
        raise Unavailable(f"sglang.kernels.ops.speculative.sampling is not importable: {exc!r}") from None
    return mod.tree_speculative_sampling_target_only


def run_step_loop_sampling_case(per: int = 2500, seed: int = 99) -> dict:
    """The DDTREE step loop with SGLang's CUDA tree-sampling kernel doing the acceptance, per-request
    temperature / top-k / top-p repeated over the tree rows: chi-square of the next three tokens against the
    exact autoregressive distribution, per group, plus the greedy group (top-k 1) token for token."""
    torch = _torch("cuda")
    import ddtree_toy as toy_mod
    from ddtree_support import chi_square, chi_square_critical

    kernel = sampling_kernel()
    st = ddtree_step_module()
    dev = torch.device("cuda")
    V = toy_mod.V
    groups = [(0.7, V, 1.0), (1.4, V, 1.0), (1.0, 2, 1.0), (1.0, V, 0.75), (1.0, 1, 1.0)]

    def factory(temps, top_ks, top_ps, gen):
        def accept(tv, logits):
            b = tv.batch
            bs, w, spec = b.bs, b.width, b.num_spec_tokens()
            probs = st.target_probs_reference(logits, temps, top_ks, top_ps, w).to(dev, torch.float32).contiguous()
            predicts = torch.full((bs * w,), -1, dtype=torch.int32, device=dev)
            accept_index = torch.full((bs, spec), -1, dtype=torch.int32, device=dev)
            accept_num = torch.zeros((bs,), dtype=torch.int32, device=dev)
            kernel(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                   candidates=b.draft_tokens.to(dev), retrive_index=b.retrieve_index.to(dev),
                   retrive_next_token=b.retrieve_next_token.to(dev),
                   retrive_next_sibling=b.retrieve_next_sibling.to(dev),
                   uniform_samples=torch.rand((bs, w), generator=gen).to(dev),
                   uniform_samples_for_final_sampling=torch.rand((bs,), generator=gen).to(dev),
                   target_probs=probs, draft_probs=torch.zeros_like(probs), threshold_single=1.0,
                   threshold_acc=1.0, deterministic=True)
            torch.cuda.synchronize()
            return predicts.cpu(), accept_index.cpu(), accept_num.cpu()
        return accept

    toy = toy_mod.Toy(5)
    prompt = [2, 0, 3]
    codes, tokens_per_round = toy_mod.sample_three(st, toy, prompt, groups, per, seed, factory)
    out = {"tokens_per_round": tokens_per_round, "groups": []}
    ok = True
    for g, (t, k, p) in enumerate(groups[:-1]):
        stat, df = chi_square(codes[g * per: (g + 1) * per], toy_mod.exact_three(toy, prompt, t, k, p))
        ok &= stat < chi_square_critical(df)
        out["groups"].append({"temperature": t, "top_k": k, "top_p": p, "chi2": round(stat, 1), "df": df})
    greedy = toy_mod.ar_greedy(toy, prompt, 3)
    out["greedy_group_exact"] = set(codes[4 * per:].tolist()) == {greedy[0] * V * V + greedy[1] * V + greedy[2]}
    out["ok"] = bool(ok and out["greedy_group_exact"])
    return out


def make_trees(dd, torch, bs: int, budget: int, depth: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    trees = []
    for b in range(bs):
        logits = torch.randn(depth, 64, generator=g) * 4.0
        lp, tok = dd.ddtree_topk_from_logits(logits, min(budget, 64))
        trees.append(dd.build_ddtree(lp, tok, budget, root_token=b))
    return trees


def reference_attention(torch, q, k_ext, v_ext, k_buf, v_buf, prefix_slots, tree_mask, sm_scale):
    """float64 attention for one request: every node reads the prefix and its tree ancestors (itself included)."""
    w, h, _ = q.shape
    hkv = k_ext.shape[1]
    group = h // hkv
    k = torch.cat([k_buf[prefix_slots], k_ext]).double()
    v = torch.cat([v_buf[prefix_slots], v_ext]).double()
    n_prefix = prefix_slots.numel()
    allowed = torch.cat([torch.ones(w, n_prefix, dtype=torch.bool, device=q.device), tree_mask], dim=1)
    out = torch.empty(w, h, v.shape[-1], dtype=torch.float64, device=q.device)
    for head in range(h):
        kh, vh = k[:, head // group], v[:, head // group]
        scores = (q[:, head].double() @ kh.T) * sm_scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[:, head] = torch.softmax(scores, dim=-1) @ vh
    return out


SHAPES = {
    "gqa": dict(heads=8, kv_heads=2, dq=128, dv=128),
    "mla_absorbed": dict(heads=16, kv_heads=1, dq=576, dv=512),  # Kimi K2.6 / DeepSeek-V3 on Triton
}


def run_extend_case(shape: str, mask_dtype: str, *, seed: int = 0, device: str = "cuda", dtype_name: str = "bfloat16",
                    prefix: tuple[int, ...] = (0, 29, 300), heads: int | None = None, layout: str = "compact") -> dict:
    """One comparison; ``device="cpu"`` with ``TRITON_INTERPRET=1`` runs the same kernel in Triton's interpreter.

    ``layout``: ``"compact"`` (DDTREE's ``W x W`` per request, ``custom_mask_compact=True``) or ``"full"``
    (the FULL_MASK layout EAGLE and revision 3 used). Controls: the kernel without a mask (causal over the
    tree) and, for the compact layout, the compact mask read with the FULL_MASK strides.

    ``heads`` overrides the shape's query-head count (a multiple of its KV heads): the interpreter runs each
    head's program in numpy, so the CPU run uses fewer heads with the same head dimensions and grouping."""
    torch = _torch(device)
    dd = ddtree_utils_module()
    ext = extend_attention_module(torch)
    cfg = dict(SHAPES[shape], **({"heads": heads} if heads else {}))
    if cfg["heads"] % cfg["kv_heads"]:
        raise ValueError(f"{cfg['heads']} query heads do not group over {cfg['kv_heads']} KV heads")
    dev = torch.device(device)
    dtype = getattr(torch, dtype_name)
    budget, depth = 16, 8
    prefix = list(prefix)
    bs = len(prefix)
    trees = make_trees(dd, torch, bs, budget, depth, seed)
    enc = dd.encode_eagle(trees, prefix_lens=prefix)
    w = enc.width
    assert all(bool((~enc.tree_mask[b]).tril().any()) for b in range(bs)), "trees must branch (else: causal)"
    g = torch.Generator(device=dev).manual_seed(seed)
    n_slots = sum(prefix) + 64
    k_buf = torch.randn(n_slots, cfg["kv_heads"], cfg["dq"], generator=g, device=dev, dtype=dtype)
    v_buf = torch.randn(n_slots, cfg["kv_heads"], cfg["dv"], generator=g, device=dev, dtype=dtype)
    perm = torch.randperm(n_slots, generator=g, device=dev)
    slots, off = [], 0
    for p in prefix:
        slots.append(perm[off: off + p])
        off += p
    n_tok = bs * w
    q = torch.randn(n_tok, cfg["heads"], cfg["dq"], generator=g, device=dev, dtype=dtype)
    k_ext = torch.randn(n_tok, cfg["kv_heads"], cfg["dq"], generator=g, device=dev, dtype=dtype)
    v_ext = torch.randn(n_tok, cfg["kv_heads"], cfg["dv"], generator=g, device=dev, dtype=dtype)
    qo_indptr = torch.arange(0, (bs + 1) * w, w, dtype=torch.int32, device=dev)
    kv_indptr = torch.tensor([0, *torch.tensor(prefix).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    kv_indices = torch.cat(slots).to(torch.int64)
    if layout == "compact":  # what DDTREE's target verify passes: W x W per request, mask_indptr = b * W * W
        custom_mask = dd.compact_verify_mask(enc.tree_mask).to(dev)
        mask_indptr = torch.arange(0, (bs + 1) * w * w, w * w, device=dev, dtype=torch.int64)
    else:  # the FULL_MASK layout (W x (prefix + W) per request), which the kernel still reads unchanged
        custom_mask = dd.build_verify_custom_mask(enc.tree_mask, torch.tensor(prefix)).to(dev)
        mask_indptr = torch.tensor([0, *[w * (p + w) for p in prefix]], device=dev).cumsum(0).to(torch.int64)
    if mask_dtype == "uint8":
        custom_mask = custom_mask.to(torch.uint8)
    sm_scale = 1.0 / cfg["dq"] ** 0.5

    def run(mask, compact=False):
        o = torch.empty(n_tok, cfg["heads"], cfg["dv"], device=dev, dtype=dtype)
        ext.extend_attention_fwd(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, mask, True,
                                 mask_indptr if mask is not None else None, w, 1.0, 1.0, sm_scale,
                                 **({"custom_mask_compact": True} if compact else {}))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return o

    masked, causal = run(custom_mask, compact=layout == "compact"), run(None)
    # the control of the layout: the compact mask read as if it were FULL_MASK (what the pristine kernel, or
    # a missing custom_mask_compact, would do) is wrong on every request with a prefix. It sits at the start
    # of a zeroed buffer of the FULL_MASK size (as in the graph's mask buffer), so the misread stays in bounds.
    misread = None
    if layout == "compact":
        padded = torch.zeros(sum(w * (p + w) for p in prefix), dtype=custom_mask.dtype, device=dev)
        padded[: custom_mask.numel()] = custom_mask
        misread = run(padded, compact=False)
    err = causal_err = misread_err = 0.0
    for b in range(bs):
        rows = slice(b * w, (b + 1) * w)
        ref = reference_attention(torch, q[rows], k_ext[rows], v_ext[rows], k_buf, v_buf, slots[b],
                                  enc.tree_mask[b].to(dev), sm_scale)
        err = max(err, float((masked[rows].double() - ref).abs().max()))
        causal_err = max(causal_err, float((causal[rows].double() - ref).abs().max()))
        if misread is not None and prefix[b] > 0:
            misread_err = max(misread_err, float((misread[rows].double() - ref).abs().max()))
    out = {"layout": layout, "max_abs_err": err, "causal_max_abs_err": causal_err, "width": w,
           "mask_cells": int(custom_mask.numel())}
    if misread is not None:
        out["misread_max_abs_err"] = misread_err
    return out


def run_verify_greedy_case(seed: int = 0, device: str = "cuda") -> dict:
    torch = _torch(device)
    dd = ddtree_utils_module()
    kern = verify_greedy_kernel_module()
    bs, budget, depth = 6, 24, 10
    trees = make_trees(dd, torch, bs, budget, depth, seed)
    enc = dd.encode_eagle(trees)
    w = enc.width
    g = torch.Generator().manual_seed(seed + 1)
    target = torch.randint(1000, 2000, (bs, w), generator=g)
    for b, tree in enumerate(trees):
        for node, kids in enumerate(tree.children()):
            if kids and torch.rand((), generator=g) < 0.85:
                target[b, node] = tree.tokens[kids[int(torch.randint(len(kids), (), generator=g))]]
    spec = enc.num_spec_tokens()
    ref_pred, ref_acc, ref_num = dd.verify_tree_greedy_reference(
        enc.draft_tokens, enc.retrieve_index, enc.retrieve_next_token, enc.retrieve_next_sibling,
        target.view(-1), spec)
    dev = torch.device(device)
    predicts = torch.full((bs * w,), -1, dtype=torch.int32, device=dev)
    accept_index = torch.full((bs, spec), -1, dtype=torch.int32, device=dev)
    accept_num = torch.zeros((bs,), dtype=torch.int32, device=dev)
    kern.verify_tree_greedy_triton(predicts, accept_index, accept_num, enc.draft_tokens.to(dev),
                                   enc.retrieve_index.to(dev), enc.retrieve_next_token.to(dev),
                                   enc.retrieve_next_sibling.to(dev), target.to(dev))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return {
        "predicts_equal": bool(torch.equal(predicts.cpu().long(), ref_pred)),
        "accept_index_equal": bool(torch.equal(accept_index.cpu().long(), ref_acc)),
        "accept_num_equal": bool(torch.equal(accept_num.cpu().long(), ref_num)),
        "mean_accepted": float(ref_num.double().mean()),
    }


def extend_case_holds(r: dict, tol: float) -> bool:
    """The masked kernel matches float64 attention; the controls (no mask; compact read as FULL_MASK) do not."""
    return r["max_abs_err"] < tol and r["causal_max_abs_err"] > 0.1 and r.get("misread_max_abs_err", 1.0) > 0.1


def main(argv: list[str]) -> int:
    """Without pytest: print the measurements, 1 on a failed comparison.

    ``--interpret`` (with ``TRITON_INTERPRET=1`` in the environment): the same kernels on the CPU in Triton's
    interpreter, float32, short prefixes -- a check of the harness and the mask layout where no GPU is.
    """
    interpret = "--interpret" in argv
    try:
        _torch("cpu" if interpret else "cuda")
        _source_root()
    except Unavailable as exc:
        print(f"SKIP: {exc}")
        return 3  # neither pass nor fail: nothing was compared
    # Interpreted: float32, short prefixes, 4 query heads (absorbed MLA keeps 576/512 over one KV head, 4 heads
    # per KV head; GQA 4 over 2): each head is a numpy program there, 16 heads cost a minute.
    kw = dict(device="cpu", dtype_name="float32", prefix=(0, 5, 40), heads=4) if interpret else {}
    tol = 1e-4 if interpret else 3e-2
    ok = True
    for shape in sorted(SHAPES):
        for mask_dtype, layout in (("bool", "compact"), ("uint8", "compact"), ("bool", "full")):
            r = run_extend_case(shape, mask_dtype, layout=layout, **kw)
            good = extend_case_holds(r, tol)
            ok &= good
            print(f"extend_attention {shape:13s} mask={mask_dtype:5s} {r} {'OK' if good else 'FAIL'}")
    r = run_verify_greedy_case(device="cpu" if interpret else "cuda")
    good = r["predicts_equal"] and r["accept_index_equal"] and r["accept_num_equal"]
    ok &= good
    print(f"verify_tree_greedy_triton {r} {'OK' if good else 'FAIL'}")
    r = run_draft_topk_case(device="cpu" if interpret else "cuda")
    ok &= r["ok"]
    print(f"draft top-k (lilicorr_topk_lse) {r} {'OK' if r['ok'] else 'FAIL'}")
    r = run_shard_topk_case(device="cpu" if interpret else "cuda")
    ok &= r["ok"]
    print(f"draft top-k (ddtree_step.vocab_parallel_topk, TP 1 and 8 shards) {r} {'OK' if r['ok'] else 'FAIL'}")
    r = run_step_loop_greedy_case(device="cpu" if interpret else "cuda")
    good = r["equal_to_autoregressive"]
    ok &= good
    print(f"ddtree_step loop, greedy kernel {r} {'OK' if good else 'FAIL'}")
    if not interpret:
        r = run_commit_race_case()
        ok &= r["ok"]
        print(f"ddtree_step commit graphs, padded rows and a reused root slot {r} {'OK' if r['ok'] else 'FAIL'}")
        try:
            r = run_step_loop_sampling_case()
            ok &= r["ok"]
            print(f"ddtree_step loop, sampling kernel {r} {'OK' if r['ok'] else 'FAIL'}")
        except Unavailable as exc:
            print(f"ddtree_step loop, sampling kernel SKIP: {exc}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
