"""The DDTREE round's tensor-parallel paths on real process groups: torch.distributed with gloo, on the CPU.

TP > 1 has never run on GPUs; what the round does across ranks is nevertheless plain tensor code in the patch
set's ``ddtree_step`` / ``ddtree_utils`` with one collective between its steps. Here 2, 4 and 8 processes (forked
from this one, so the patched modules are not loaded again) join a gloo group and run those functions with the
group's own collectives:

* the draft top-k (``vocab_parallel_topk``: each rank's shard top-k -- float32, ties to the lowest id -- and float64
  log-sum-exp, packed into ``N x (2k + 1)`` numbers, one all-gather, an exact merge), also as the worker runs it
  (``DraftTopK`` on a vocabulary-parallel LM head through ``stacked_all_gather`` over ``all_gather_into_tensor``)
  and folded with the trees (``DraftTreeCapture``'s capture hook, what the drafter's graph records): equal to the
  full-vocabulary top-k (ids exactly, ties to the lowest id) and to the TP 1 result bit for bit (log-probs included:
  trees at TP > 1 are TP 1's), shards with fewer real rows than the top-k (none at all included) among them; and the
  verify argmax (``vocab_parallel_argmax``: each rank's row maxima and first ids, ``N x 2`` numbers, all-gathered
  and merged, also through the worker's ``stacked_all_gather`` over ``all_gather_into_tensor``) on logits full of
  ties and ``-inf``, over SGLang's vocabulary-parallel layout (``vocab_shard_rows``: padded shards, the last ones
  partly padding) -- equal to the full-vocabulary result (ids exactly, ties to the lowest id); the full logits
  gathered from the shards (``gather_vocab_shards``, for sampled rounds);
* the trees: each rank starts from its own (different) top-k, as ranks whose numerics differ would; after
  ``broadcast_decisions`` every rank builds rank 0's trees;
* the sampled acceptance with a different seed per rank: the ranks' decisions differ before the broadcast
  (the control) and are rank 0's on every rank after it;
* the commit plan and the commit graphs' moves (CPU emulation) from those decisions.

Every rank's result must be identical and equal to the single-process result of rank 0's inputs. The pure
function behind the start-up refusal of a vocabulary a rank's shard cannot serve is tested here too, against
SGLang 0.5.23's own shard layout code.
"""

from __future__ import annotations

import ast
import functools
import multiprocessing
import tempfile
import time
import warnings
from pathlib import Path

import ci_requirements
import pytest

ci_requirements.require("torch", needed_for="by the patched ddtree_step on gloo process groups")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ddtree_support import ddtree_step, ddtree_utils, patchset_tool, require_wheel  # noqa: E402

pytestmark = pytest.mark.network  # reads the released SGLang 0.5.23 wheel (a first-run download)

VOCAB, ROWS, TOPK = 1000, 12, 16
SMALL_VOCAB, SMALL_TOPK = 100, 40  # shards with fewer real rows than the top-k at 2, 4 and 8 ranks
HEAD_HIDDEN = 4
BS, BLOCK, BUDGET = 3, 5, 10
WIDTH = BUDGET + 1
TARGET_VOCAB = 40


@pytest.fixture(scope="module")
def sp():
    return ddtree_step()


# --------------------------------------------------------------------------- inputs (the same on every rank)


def tie_logits() -> torch.Tensor:
    """``[ROWS, VOCAB]`` logits from a few values (ties inside and across shards), ``-inf`` runs, a row with
    fewer finite entries than the top-k, a row all ``-inf``, a row whose maximum sits in the last shard; the
    last rows continuous (where a normaliser summed in another order in float32 would round differently)."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randint(-4, 3, (ROWS, VOCAB), generator=g).float()
    logits[0, 900:] = 9.0  # the maximum tied across the last shards
    logits[1] = float("-inf")
    logits[1, [3, 500, 999]] = torch.tensor([1.0, 1.0, 0.5])
    logits[2] = float("-inf")
    logits[3, ::7] = float("-inf")
    logits[4, 998] = 50.0
    logits[5] = 2.0  # every token tied
    logits[6:] = torch.randn(ROWS - 6, VOCAB, generator=g) * 4  # no ties: the normaliser's rounding shows
    return logits


def small_tie_logits() -> torch.Tensor:
    """``[ROWS, SMALL_VOCAB]``: ties, ``-inf``, an all ``-inf`` row, over a vocabulary whose shards hold fewer
    real rows than ``SMALL_TOPK``."""
    g = torch.Generator().manual_seed(8)
    logits = torch.randint(-3, 2, (ROWS, SMALL_VOCAB), generator=g).float()
    logits[logits == -3] = float("-inf")
    logits[1] = float("-inf")
    logits[2, 90:] = 4.0  # the maximum tied in the last real rows
    return logits


def head() -> tuple[torch.Tensor, torch.Tensor]:
    """A draft LM head and hidden states of small integers: logits exact in float32, full of ties."""
    g = torch.Generator().manual_seed(9)
    weight = torch.randint(-2, 3, (VOCAB, HEAD_HIDDEN), generator=g).float()
    hidden = torch.randint(-2, 3, (BS * BLOCK, HEAD_HIDDEN), generator=g).float()
    return weight, hidden


def full_vocab_topk(logits: torch.Tensor, k: int):
    """The full-vocabulary answer: log-softmax, the first k of a stable descending sort of the logits."""
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]
    return torch.log_softmax(logits, dim=-1).gather(-1, order), order


def local_head(sp, weight: torch.Tensor, rank: int, world: int):
    """Rank ``rank``'s LM-head rows (SGLang's padded layout: garbage past the real rows, never read)."""
    rows = sp.vocab_shard_rows(weight.shape[0], world)
    per = _per_shard(weight.shape[0], world)
    local = torch.full((per, weight.shape[1]), 7.0)
    local[: rows[rank]] = weight[rank * per: rank * per + rows[rank]]
    return local, rows[rank], rank * per


def folded_trees(sp, topk_fn) -> list:
    """What the drafter's graph records: ``DraftTreeCapture``'s hook on a batch of ``BS`` blocks."""
    _weight, hidden = head()
    roots = torch.arange(BS * BLOCK, dtype=torch.int64) % TARGET_VOCAB
    cap = sp.DraftTreeCapture(topk_fn=topk_fn, block=BLOCK, width=WIDTH, budget=BUDGET, topk=BUDGET, max_bs=BS,
                              device=torch.device("cpu"))
    cap(None, type("Out", (), {"hidden_states": hidden})(), type("FB", (), {"input_ids": roots})(), BS * BLOCK)
    assert cap.captured == {BS}, cap.failed
    tv = cap.rows(BS, torch.tensor([3, 8, 0]), torch.arange(BS * WIDTH, dtype=torch.int64))
    return [tv.input_ids, tv.positions, tv.custom_mask, tv.batch.retrieve_index, tv.batch.retrieve_next_token,
            tv.batch.retrieve_next_sibling, tv.batch.scores]


def tp1_results(sp) -> dict:
    """The same work in one process, TP 1 (no gather: the merge of one shard)."""
    weight, hidden = head()
    return {"topk": sp.vocab_parallel_topk(tie_logits(), TOPK, 0, None, None),
            "small_topk": sp.vocab_parallel_topk(small_tie_logits(), SMALL_TOPK, 0, None, None),
            "head_topk": sp.DraftTopK(weight=weight, num_org=VOCAB, vocab_start=0, topk=BUDGET)(hidden),
            "folded": folded_trees(sp, sp.DraftTopK(weight=weight, num_org=VOCAB, vocab_start=0, topk=BUDGET))}


def local_shard(sp, logits: torch.Tensor, rank: int, world: int, fill: float = 123.0):
    """Rank ``rank``'s columns of a vocabulary-parallel head: SGLang's padded shard layout, padding columns
    filled with a value that must never be picked."""
    rows = sp.vocab_shard_rows(logits.shape[1], world)
    per = _per_shard(logits.shape[1], world)
    start = rank * per
    local = torch.full((logits.shape[0], per), fill)
    real = rows[rank]
    local[:, :real] = logits[:, start:start + real]
    return local, start, real


def _per_shard(vocab: int, world: int, pad: int = 64) -> int:
    """The padded shard width (what ``vocab_shard_rows`` cuts the vocabulary into)."""
    if (-(-vocab // pad) * pad) % world:
        pad *= world
    return -(-vocab // pad) * pad // world


def rank_topk(seed: int):
    """A rank's own draft top-k (``[BS, BLOCK - 1, BUDGET]``): sorted log-probs and distinct tokens, from a
    rank-dependent seed (as if the rank's numerics differed)."""
    g = torch.Generator().manual_seed(100 + seed)
    lp = -torch.rand(BS, BLOCK - 1, BUDGET, generator=g).cumsum(-1)
    ids = torch.stack([torch.stack([torch.randperm(TARGET_VOCAB, generator=g)[:BUDGET] for _ in range(BLOCK - 1)])
                       for _ in range(BS)])
    return lp.contiguous(), ids.contiguous()


def target_logits(tv) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(BS * WIDTH, TARGET_VOCAB, generator=g)
    first = tv.batch.retrieve_next_token
    for b in range(BS):  # most nodes' first child likely, so that paths are long
        for k in range(WIDTH):
            c = int(first[b, k])
            if c >= 0:
                logits[b * WIDTH + k, int(tv.batch.draft_tokens[b, c])] += 2.0
    return logits


def round_from(sp, lp, ids, seed: int):
    """Trees, sampled acceptance (a generator seeded ``seed``), commit plan: the single-process round."""
    prefix = torch.tensor([3, 8, 0])
    loc = torch.arange(BS * WIDTH, dtype=torch.int64) * 2 + 5
    tv = sp.build_tree_verify(topk_log_probs=lp, topk_tokens=ids, root_tokens=torch.tensor([1, 2, 3]),
                              prefix_lens=prefix, budgets=BUDGET, width=WIDTH, out_cache_loc=loc)
    decisions = sp.accept_tree_reference(
        tv, target_logits(tv), all_greedy=False, temperatures=torch.ones(BS), top_ks=torch.full((BS,), TARGET_VOCAB),
        top_ps=torch.ones(BS), generator=torch.Generator().manual_seed(seed))
    return tv, tuple(t.contiguous() for t in decisions), loc, prefix


# --------------------------------------------------------------------------- one rank


def rank_main(sp, rank: int, world: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    # torch.distributed.all_gather_into_tensor, the TP group's counterpart, is marked deprecated on gloo
    warnings.filterwarnings("ignore", "`torch.distributed.all_gather_into_tensor` is deprecated", FutureWarning)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.save(rank_work(sp, rank, world), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def gather_stack(x: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return torch.stack(parts)


def rank_work(sp, rank: int, world: int) -> dict:
    res = {}
    logits = tie_logits()
    local, start, real = local_shard(sp, logits, rank, world)
    res["topk"] = sp.vocab_parallel_topk(local, TOPK, start, real, gather_stack)
    small, small_start, small_real = local_shard(sp, small_tie_logits(), rank, world)
    res["small_topk"] = sp.vocab_parallel_topk(small, SMALL_TOPK, small_start, small_real, gather_stack)
    res["small_real"] = small_real
    res["argmax"] = sp.vocab_parallel_argmax(local, start, real, gather_stack)
    # the worker's draft top-k and verify path on a shard: one all_gather_into_tensor per call
    gather = sp.stacked_all_gather(dist.all_gather_into_tensor, world)
    weight, hidden = head()
    w_local, w_real, w_start = local_head(sp, weight, rank, world)
    draft_topk = sp.DraftTopK(weight=w_local, num_org=w_real, vocab_start=w_start, topk=BUDGET, gather=gather)
    res["head_topk"] = draft_topk(hidden)
    res["folded"] = folded_trees(sp, draft_topk)
    shard_start, shard_real = sp.vocab_shard_range(rank, local.shape[1], VOCAB)
    assert (shard_start, shard_real) == (start, real)
    res["verify_argmax"] = sp.vocab_parallel_argmax(local, shard_start, shard_real, gather)
    res["verify_logits"] = sp.gather_vocab_shards(local.to(torch.bfloat16), gather, VOCAB)
    # the trees: each rank's own top-k, then rank 0's on every rank
    lp, ids = rank_topk(rank)
    sp.broadcast_decisions((lp, ids), dist.broadcast, world)
    tv, decisions, loc, prefix = round_from(sp, lp, ids, seed=1000 + rank)  # each rank's own coins
    res["tree"] = [tv.input_ids, tv.positions, tv.custom_mask, tv.batch.retrieve_index,
                   tv.batch.retrieve_next_token, tv.batch.retrieve_next_sibling]
    res["own_decisions"] = [t.clone() for t in decisions]
    sp.broadcast_decisions(decisions, dist.broadcast, world)
    res["decisions"] = list(decisions)
    plan = sp.plan_commit(*decisions, loc, prefix, WIDTH)
    res["plan"] = [plan.out_tokens, plan.commit_lens, plan.new_seq_lens, plan.bonus_tokens, plan.kv_src, plan.kv_dst,
                   plan.path_rows]
    kv = [torch.arange(200, dtype=torch.float64).view(-1, 1).repeat(1, 3)]
    graphs = sp.CommitGraphs(width=WIDTH, num_spec=BLOCK, batch_sizes=[4], device=torch.device("cpu"),
                             move_kv=lambda dst, src: sp.apply_kv_moves(kv, src, dst))
    graphs.capture()
    graphs.commit(*decisions, loc, prefix)
    res["kv"] = kv[0]
    return res


def run_ranks(sp, world: int, tmp: Path, timeout: float = 120.0) -> list[dict]:
    """``world`` forked processes in one gloo group; each rank's results, in rank order."""
    ctx = multiprocessing.get_context("fork")
    store = tmp / "store"
    procs = [ctx.Process(target=rank_main, args=(sp, r, world, str(store), str(tmp))) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
    finally:
        hung = [p for p in procs if p.is_alive()]
        for p in hung:  # only the processes this test started, by their own handle
            p.kill()
            p.join()
    assert not hung, f"{len(hung)} of {world} ranks did not finish within {timeout} s (a collective hung)"
    assert [p.exitcode for p in procs] == [0] * world, [p.exitcode for p in procs]
    return [torch.load(tmp / f"rank{r}.pt") for r in range(world)]


def same(a, b) -> bool:
    """Tensors (or lists/tuples of them) bit for bit, NaN included."""
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if a.dtype.is_floating_point:
        return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    return torch.equal(a, b)


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("world", [2, 4, 8])
def test_tp_paths_agree_on_every_rank_and_equal_the_single_process_round(sp, world, tmp_path):
    results = run_ranks(sp, world, tmp_path)
    logits = tie_logits()
    # every rank holds the same values, bit for bit
    for r in range(1, world):
        for key in ("topk", "small_topk", "head_topk", "folded", "argmax", "verify_argmax", "verify_logits", "tree",
                    "decisions", "plan", "kv"):
            assert same(results[r][key], results[0][key]), (world, r, key)
    # the vocabulary merges equal the full-vocabulary answer: ids exactly (ties to the lowest id), log-probs up
    # to the normaliser's rounding
    lp, ids = results[0]["topk"]
    ref_lp, ref_ids = full_vocab_topk(logits, TOPK)
    assert torch.equal(ids, ref_ids), world
    assert torch.allclose(lp, ref_lp, atol=1e-5, equal_nan=True), world
    assert torch.isnan(lp[2]).all()  # the all -inf row: no distribution, as log_softmax gives
    small_lp, small_ids = results[0]["small_topk"]
    ref_lp, ref_ids = full_vocab_topk(small_tie_logits(), SMALL_TOPK)
    assert torch.equal(small_ids, ref_ids), world
    assert torch.allclose(small_lp, ref_lp, atol=1e-5, equal_nan=True), world
    assert min(r["small_real"] for r in results) < SMALL_TOPK  # the case of a short shard was there
    # the same values as TP 1, bit for bit (log-probs included): the trees at TP > 1 are TP 1's
    tp1 = tp1_results(sp)
    for key in ("topk", "small_topk", "head_topk", "folded"):
        assert same(results[0][key], tp1[key]), (world, key)
    weight, hidden = head()
    head_lp, head_ids = results[0]["head_topk"]
    ref_lp, ref_ids = full_vocab_topk(hidden[:, :] @ weight.T, BUDGET)
    assert torch.equal(head_ids, ref_ids) and torch.allclose(head_lp, ref_lp, atol=1e-5), world
    assert torch.equal(results[0]["argmax"], logits.argmax(dim=-1)), world
    assert torch.equal(results[0]["verify_argmax"], logits.argmax(dim=-1)), world
    assert same(results[0]["verify_logits"], logits.to(torch.bfloat16).float()), world  # padding columns dropped
    assert int(results[0]["argmax"][0]) == 900 and int(results[0]["argmax"][2]) == 0  # ties across shards; all -inf
    # the round on rank 0's inputs in one process: trees, decisions, plan, KV
    tv, decisions, loc, prefix = round_from(sp, *rank_topk(0), seed=1000)
    assert same(results[0]["tree"], [tv.input_ids, tv.positions, tv.custom_mask, tv.batch.retrieve_index,
                                     tv.batch.retrieve_next_token, tv.batch.retrieve_next_sibling])
    assert same(results[0]["decisions"], list(decisions))
    plan = sp.plan_commit(*decisions, loc, prefix, WIDTH)
    assert same(results[0]["plan"], [plan.out_tokens, plan.commit_lens, plan.new_seq_lens, plan.bonus_tokens,
                                     plan.kv_src, plan.kv_dst, plan.path_rows])
    kv = [torch.arange(200, dtype=torch.float64).view(-1, 1).repeat(1, 3)]
    sp.apply_kv_moves(kv, plan.kv_src, plan.kv_dst)
    assert same(results[0]["kv"], kv[0])
    # the control: each rank's own coins decided differently before the broadcast
    assert any(not same(results[r]["own_decisions"], results[0]["own_decisions"]) for r in range(1, world))


def test_without_the_broadcast_the_ranks_sampled_decisions_differ(sp):
    """What the broadcast prevents, in one process: the same trees and logits, each rank's own generator."""
    _tv, d0, *_ = round_from(sp, *rank_topk(0), seed=1000)
    others = [round_from(sp, *rank_topk(0), seed=1000 + r)[1] for r in range(1, 4)]
    assert any(not same(list(d), list(d0)) for d in others)


def test_exact_topk_orders_ties_by_id_whatever_the_input():
    """The order key behind both merges: the first k of a stable descending sort, ``-0.0`` equal to ``0.0``,
    ``-inf`` last, on every input."""
    exact_topk = ddtree_utils().exact_topk
    g = torch.Generator().manual_seed(3)
    for trial in range(20):
        x = torch.randint(-2, 2, (5, 64), generator=g).float()
        x[x == -2] = float("-inf")
        x[:, 5] = -0.0
        vals, ids = exact_topk(x, 9)
        order = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :9]
        assert torch.equal(ids, order), trial
        assert torch.equal(vals, x.gather(-1, order)), trial


# --------------------------------------------------------------------------- the vocabulary refusal


EMBEDDING = "sglang/srt/layers/vocab_parallel_embedding.py"


@functools.lru_cache(maxsize=1)
def sglang_layout() -> dict:
    """SGLang 0.5.23's own ``pad_vocab_size``, ``vocab_range_from_global_vocab_size`` and
    ``VocabParallelEmbedding._get_indices``, compiled from the wheel's ``vocab_parallel_embedding.py``."""
    with tempfile.TemporaryDirectory() as tmp:
        patchset_tool().unpack(require_wheel(), Path(tmp), [EMBEDDING])
        src = (Path(tmp) / EMBEDDING).read_text()
    mod = ast.parse(src)
    wanted = {"pad_vocab_size", "vocab_range_from_per_partition_vocab_size", "vocab_range_from_global_vocab_size"}
    funcs = [n for n in mod.body if isinstance(n, ast.Assign)  # first: a default argument below reads it
             and [ast.unparse(t) for t in n.targets] == ["DEFAULT_VOCAB_PADDING_SIZE"]]
    funcs += [n for n in mod.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    cls = next(n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == "VocabParallelEmbedding")
    get_indices = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_get_indices")
    get_indices.decorator_list = []
    ns = {"Sequence": list, "divide": lambda a, b: a // b if a % b == 0 else (_ for _ in ()).throw(ValueError()),
          "VocabParallelEmbeddingShardIndices": lambda *a: a}
    exec(compile(ast.Module(body=[*funcs, get_indices], type_ignores=[]), "vocab_parallel_embedding", "exec"), ns)
    return ns


def sglang_shard_rows(vocab: int, tp: int) -> list[int]:
    """Real rows per rank as SGLang lays them out (:func:`sglang_layout`, with the padding rule of
    ``VocabParallelEmbedding.__init__``: its default padding, times the TP size where that does not divide)."""
    ns = sglang_layout()
    pad = ns["DEFAULT_VOCAB_PADDING_SIZE"]
    if ns["pad_vocab_size"](vocab, pad) % tp:
        pad *= tp
    padded = ns["pad_vocab_size"](vocab, pad)
    rows = []
    for r in range(tp):
        idx = ns["_get_indices"](None, padded, padded, vocab, vocab, r, tp)
        rows.append(idx[5] - idx[4])  # org_vocab_end_index - org_vocab_start_index
    return rows


def test_shard_rows_follow_sglangs_layout(sp):
    for vocab in (40, 100, 1000, 32000, 151936, 163840, 163842, 200064, 50257):
        for tp in (1, 2, 3, 4, 8, 16):
            rows = sp.vocab_shard_rows(vocab, tp)
            assert rows == sglang_shard_rows(vocab, tp), (vocab, tp)
            assert sum(rows) == vocab and len(rows) == tp
    assert sp.vocab_shard_rows(163840, 8) == [20480] * 8  # Kimi K2.6 at TP 8
    assert sp.vocab_shard_rows(100, 8) == [16] * 6 + [4, 0]


def test_a_vocabulary_a_shard_cannot_serve_is_refused(sp):
    assert sp.vocab_shard_problem(163840, 8, 64) == ""
    assert sp.vocab_shard_problem(100, 1, 64) == ""
    why = sp.vocab_shard_problem(100, 8, 10)
    assert why == ("the target vocabulary of 100 tokens over 8 tensor-parallel ranks leaves rank(s) [6, 7] with "
                   "[0, 4] real LM-head rows, fewer than the draft top-k's 10 (shard rows per rank: "
                   "[16, 16, 16, 16, 16, 16, 4, 0])")
    assert "rank(s) [7]" in sp.vocab_shard_problem(100, 8, 4)  # no real row at all
    with pytest.raises(ValueError):
        sp.vocab_shard_rows(0, 8)
