"""The batched DDTree builder (ddtree_utils.build_tree_batch, ddtree_step.build_tree_verify / plan_commit) against
the reference heap builder it replaces, on the patched modules (CPU torch).

* Equal to the reference: for tie-free random scores the batched trees are the reference trees tensor for
  tensor (tokens, parents, depths, positions, first-child / next-sibling links, ancestor mask), per-request
  budgets included (smaller trees padded with unreachable fillers); the kept prefixes are the brute-force
  top-``budget`` set.
* Valid under ties: scores drawn from a few values (zeros included: a child as likely as its parent) give
  trees that are prefix-closed, parents first, with the top-``budget`` multiset of scores.
* No host synchronisation and fixed shapes: the whole round's tree work runs on the ``meta`` device, which
  has no data, so any ``.item()`` / ``.tolist()`` / ``bool(tensor)`` / boolean-mask indexing raises there.
* The debug switch (``SGLANG_DDTREE_DEBUG_CHECKS=1``) refuses what the reference refuses; without it the hot
  path never reads the device and still builds a valid tree from garbage (NaN, +inf, unsorted rows).
* The per-bucket CUDA-graph wrapper (emulated on the CPU) gives the eager values for every batch size.
* The round profiler synchronises and logs only when switched on.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("hypothesis")
from ddtree_support import brute_force_top as brute_force_scores  # noqa: E402
from ddtree_support import ddtree_step, ddtree_utils  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.network  # every test reads the released SGLang 0.5.23 wheel (a first-run download)

FIELDS = ("draft_tokens", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "tree_mask",
          "parents", "depths")


@pytest.fixture(scope="module")
def dd():
    return ddtree_utils()


@pytest.fixture(scope="module")
def sp():
    return ddtree_step()


@pytest.fixture()
def debug_checks(monkeypatch):
    monkeypatch.setenv("SGLANG_DDTREE_DEBUG_CHECKS", "1")


def random_rows(rng, bs, depth, topk, vocab=60):
    """Sorted, tie-free top-k log-probs and distinct tokens per position, ``[bs, depth, topk]``."""
    lp = -rng.exponential(1.0, size=(bs, depth, topk)).cumsum(axis=2) - rng.exponential(0.3, size=(bs, depth, 1))
    tok = np.stack([np.stack([rng.choice(vocab, size=topk, replace=False) for _ in range(depth)]) for _ in range(bs)])
    return torch.tensor(lp, dtype=torch.float64), torch.tensor(tok, dtype=torch.int64)


def reference(dd, sp, lp, tok, roots, budgets, width, prefix):
    trees = [sp.pad_tree(dd.build_ddtree(lp[b], tok[b], int(budgets[b]), int(roots[b])), width)
             for b in range(lp.shape[0])]
    return trees, dd.encode_eagle(trees, prefix_lens=prefix)


def rank_paths(batch, b):
    """The kept prefixes of request ``b`` as tuples of top-k ranks (root excluded, fillers skipped)."""
    parents, ranks = batch.parents[b].tolist(), batch.ranks[b].tolist()
    out = []
    for node in range(1, len(parents)):
        if parents[node] == -1:
            continue
        path, cur = [], node
        while cur > 0:
            path.append(ranks[cur])
            cur = parents[cur]
        out.append(tuple(reversed(path)))
    return out


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # the env var only
@given(depth=st.integers(1, 6), topk=st.integers(1, 6), bs=st.integers(1, 4), width=st.integers(1, 40),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_batched_trees_are_the_reference_trees(dd, sp, debug_checks, depth, topk, bs, width, seed, data):
    width = min(width, dd.max_tree_nodes(depth, topk) + 1)
    rng = np.random.default_rng(seed)
    lp, tok = random_rows(rng, bs, depth, topk)
    budgets = torch.tensor(data.draw(st.lists(st.integers(0, width - 1), min_size=bs, max_size=bs)))
    roots = torch.arange(bs) + 100
    prefix = torch.tensor(data.draw(st.lists(st.integers(0, 50), min_size=bs, max_size=bs)))
    got = dd.build_tree_batch(lp, tok, roots, width, budgets, prefix)  # debug checks on: validated too
    trees, ref = reference(dd, sp, lp, tok, roots, budgets, width, prefix)
    for name in FIELDS:
        assert torch.equal(getattr(got, name), getattr(ref, name)), name
        assert getattr(got, name).is_contiguous(), name  # SGLang's JIT kernels read them as flat arrays
    for b, tree in enumerate(trees):
        assert got.scores[b].tolist() == pytest.approx(list(tree.scores))
        assert got.ranks[b].tolist() == list(tree.ranks)
    assert got.max_depth == depth and got.num_spec_tokens() == depth + 1


@pytest.mark.parametrize(("depth", "topk"), [(1, 5), (2, 4), (3, 3), (4, 2), (5, 1), (3, 4)])
def test_batched_trees_keep_the_brute_force_best_prefixes(dd, depth, topk):
    rng = np.random.default_rng(depth * 10 + topk)
    total = dd.max_tree_nodes(depth, topk)
    for budget in range(total + 1):
        lp, tok = random_rows(rng, 1, depth, topk)
        got = dd.build_tree_batch(lp, tok, torch.tensor([7]), budget + 1)
        expected = brute_force_scores(lp[0], budget)
        assert set(rank_paths(got, 0)) == {ranks for _, ranks in expected}, budget
        # nodes come best first
        assert got.scores[0, 1:].tolist() == pytest.approx(sorted((s for s, _ in expected), reverse=True))


def check_valid(dd, batch, lp, budgets):
    """Prefix-closed trees, parents first, siblings distinct, the top-budget multiset of scores."""
    dd.check_tree_batch(batch)
    for b in range(batch.bs):
        paths = rank_paths(batch, b)
        assert len(paths) == len(set(paths)) == int(budgets[b])
        assert all(p[:-1] in set(paths) or len(p) == 1 for p in paths), "closed under taking prefixes"
        best = brute_force_scores(lp[b], int(budgets[b]))
        got = sorted((sum(float(lp[b, i, r]) for i, r in enumerate(p)) for p in paths), reverse=True)
        assert got == pytest.approx([s for s, _ in best])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(depth=st.integers(1, 4), topk=st.integers(1, 4), seed=st.integers(0, 2**32 - 1), frac=st.floats(0, 1))
def test_trees_are_valid_under_ties(dd, depth, topk, seed, frac):
    rng = np.random.default_rng(seed)
    bs = 3
    # a few values only, zero included: siblings, cousins and a child with its parent tie
    vals = rng.choice([0.0, -0.5, -1.0, -2.0], size=(bs, depth, topk))
    lp = torch.tensor(-np.sort(-vals, axis=2), dtype=torch.float64)
    tok = torch.stack([torch.randperm(40)[:topk].repeat(depth, 1) for _ in range(bs)])
    total = dd.max_tree_nodes(depth, topk)
    budgets = torch.tensor([round(frac * total), total, min(1, total)])
    width = total + 1
    got = dd.build_tree_batch(lp, tok, torch.zeros(bs, dtype=torch.int64), width, budgets)
    check_valid(dd, got, lp, budgets)


def test_hot_path_builds_a_valid_tree_from_garbage_and_the_debug_switch_refuses_it(dd, monkeypatch):
    lp = torch.tensor([[[-0.1, float("nan"), -2.0], [float("inf"), -0.5, -3.0], [-float("inf"), -1.0, -0.2]]])
    tok = torch.tensor([[[1, 2, 3], [4, 5, 6], [7, 8, 9]]])
    monkeypatch.delenv("SGLANG_DDTREE_DEBUG_CHECKS", raising=False)
    got = dd.build_tree_batch(lp, tok, torch.tensor([0]), 9)
    dd.check_tree_batch(got)  # links, parents and mask consistent
    monkeypatch.setenv("SGLANG_DDTREE_DEBUG_CHECKS", "1")
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        dd.build_tree_batch(lp, tok, torch.tensor([0]), 9)
    good = torch.tensor([[[-0.1, -1.0], [-0.2, -0.3]]])
    with pytest.raises(ValueError, match="not sorted"):
        dd.build_tree_batch(good.flip(2), torch.tensor([[[1, 2], [3, 4]]]), torch.tensor([0]), 4)
    with pytest.raises(ValueError, match="duplicate"):
        dd.build_tree_batch(good, torch.tensor([[[1, 1], [3, 4]]]), torch.tensor([0]), 4)
    with pytest.raises(ValueError, match="exceeds"):
        dd.build_tree_batch(good, torch.tensor([[[1, 2], [3, 4]]]), torch.tensor([0]), 8)  # 6 prefixes
    with pytest.raises(ValueError, match="must lie in"):
        dd.build_tree_batch(good, torch.tensor([[[1, 2], [3, 4]]]), torch.tensor([0]), 4, torch.tensor([4]))
    with pytest.raises(ValueError, match="must lie in"):
        dd.build_tree_batch(good, torch.tensor([[[1, 2], [3, 4]]]), torch.tensor([0]), 4, 5)


def test_fewer_candidates_than_the_budget_and_the_root_alone(dd):
    rng = np.random.default_rng(3)
    lp, tok = random_rows(rng, 2, 3, 2)  # top-2 over 3 positions: 14 prefixes, budget 10 > top-k
    got = dd.build_tree_batch(lp, tok, torch.tensor([5, 6]), 11)
    check_valid(dd, got, lp, [10, 10])
    root = dd.build_tree_batch(lp, tok, torch.tensor([5, 6]), 1, None, torch.tensor([3, 9]))
    assert root.draft_tokens.tolist() == [[5], [6]] and root.positions.tolist() == [3, 9]
    assert root.tree_mask.tolist() == [[[True]], [[True]]] and root.retrieve_next_token.tolist() == [[-1], [-1]]


@pytest.mark.parametrize("budget", [16, 64, 256])
@pytest.mark.parametrize("bs", [1, 32])
def test_the_round_tree_work_never_reads_the_device_and_has_fixed_shapes(dd, sp, monkeypatch, budget, bs):
    """On the meta device (no data: every host read raises): trees, encoding, compact mask and commit plan
    for a (bs, W) batch, uniform and per-request budgets; the shapes depend on (bs, W, depth) only."""
    monkeypatch.delenv("SGLANG_DDTREE_DEBUG_CHECKS", raising=False)
    meta, depth, w = torch.device("meta"), 15, budget + 1
    lp = torch.empty(bs, depth, budget, device=meta)
    tok = torch.empty(bs, depth, budget, dtype=torch.int64, device=meta)
    ints = torch.empty(bs, dtype=torch.int64, device=meta)
    loc = torch.empty(bs * w, dtype=torch.int64, device=meta)
    for budgets in (budget, torch.empty(bs, dtype=torch.int64, device=meta)):
        tv = sp.build_tree_verify(topk_log_probs=lp, topk_tokens=tok, root_tokens=ints, prefix_lens=ints,
                                  budgets=budgets, width=w, out_cache_loc=loc)
        b = tv.batch
        assert tv.input_ids.shape == tv.positions.shape == (bs * w,)
        assert b.retrieve_next_token.shape == b.retrieve_next_sibling.shape == (bs, w)
        assert tv.custom_mask.shape == (bs * w * w,)  # the compact layout, whatever the context
        spec = b.num_spec_tokens()
        plan = sp.plan_commit(torch.empty(bs * w, dtype=torch.int32, device=meta),
                              torch.empty(bs, spec, dtype=torch.int32, device=meta),
                              torch.empty(bs, dtype=torch.int32, device=meta), loc, ints, w)
        assert plan.kv_src.shape == plan.kv_dst.shape == (bs * spec,)
        assert plan.out_tokens.shape == plan.path_rows.shape == (bs, w) and plan.commit_lens.shape == (bs,)
    # the control: the reference implementation reads the device and fails there
    with pytest.raises((RuntimeError, NotImplementedError)):
        sp.build_tree_verify_reference(topk_log_probs=lp, topk_tokens=tok, root_tokens=ints, prefix_lens=ints,
                                       budgets=budget, width=w, out_cache_loc=loc)


def test_tree_graph_buckets_give_the_eager_values(dd, sp, monkeypatch):
    """TreeBuildGraphs, emulated on the CPU (capture records a re-run on the static buffers): a batch runs in the
    smallest bucket >= bs, its first bs rows overwritten, and gets the eager result; a batch above every bucket,
    or another budget, runs eager."""
    monkeypatch.delenv("SGLANG_DDTREE_DEBUG_CHECKS", raising=False)
    depth, topk, budget = 4, 6, 10
    w = budget + 1
    graphs = sp.TreeBuildGraphs(width=w, depth=depth, topk=topk, budget=budget, batch_sizes=[2, 4, 8],
                                device=torch.device("cpu"), dtype=torch.float64)
    graphs.capture()
    assert sorted(graphs.captured) == [2, 4, 8]
    rng = np.random.default_rng(0)
    for bs in (1, 3, 4, 7, 8, 2, 1, 9):
        lp, tok = random_rows(rng, bs, depth, topk)
        args = dict(topk_log_probs=lp, topk_tokens=tok, root_tokens=torch.arange(bs) + 3,
                    prefix_lens=torch.arange(bs) * 5, budgets=budget, width=w,
                    out_cache_loc=torch.arange(bs * w) + 1000)
        got, want = graphs.build(**args), sp.build_tree_verify(**args)
        assert graphs.bucket(bs) == (None if bs > 8 else next(b for b in (2, 4, 8) if b >= bs))
        for name in FIELDS:
            assert torch.equal(getattr(got.batch, name), getattr(want.batch, name)), (bs, name)
        assert torch.equal(got.custom_mask, want.custom_mask) and torch.equal(got.out_cache_loc, want.out_cache_loc)
        assert torch.equal(got.input_ids, want.input_ids) and torch.equal(got.positions, want.positions)
    lp, tok = random_rows(rng, 3, depth, topk)
    other = graphs.build(topk_log_probs=lp, topk_tokens=tok, root_tokens=torch.zeros(3, dtype=torch.int64),
                         prefix_lens=torch.zeros(3, dtype=torch.int64), budgets=[4, 2, 0], width=w,
                         out_cache_loc=torch.arange(3 * w))
    assert [int((other.batch.parents[b, 1:] >= 0).sum()) for b in range(3)] == [4, 2, 0]
    monkeypatch.setenv("SGLANG_DDTREE_DEBUG_CHECKS", "1")
    with pytest.raises(RuntimeError, match="DEBUG_CHECKS"):
        sp.TreeBuildGraphs(width=w, depth=depth, topk=topk, budget=budget, batch_sizes=[2],
                           device=torch.device("cpu")).capture()


def test_round_profiler_synchronises_and_logs_only_when_on(sp):
    ticks, syncs, logs = iter(range(10_000)), [], []
    prof = sp.RoundProfiler(enabled=True, every=2, sync=lambda: syncs.append(1), log=logs.append,
                            clock=lambda: float(next(ticks)))
    for bs in (4, 6):
        for name in sp.PHASES:
            with prof.phase(name):
                pass
        prof.end_round(bs)
    assert len(syncs) == 2 * 2 * len(sp.PHASES) and len(logs) == 1
    assert logs[0].startswith("DDTREE profile: 2 rounds, mean batch 5.0, ms per round: draft_forward 1000.000")
    assert all(f"{name} " in logs[0] for name in sp.PHASES) and "total 7000.000" in logs[0]
    with pytest.raises(ValueError, match="unknown DDTREE phase"):
        prof.phase("tree")
    off_syncs, off_logs = [], []
    off = sp.RoundProfiler(enabled=False, every=1, sync=lambda: off_syncs.append(1), log=off_logs.append)
    with off.phase("tree_build"):
        pass
    off.end_round(3)
    assert off_syncs == [] and off_logs == []


def test_profiler_reads_its_switches(sp, monkeypatch):
    monkeypatch.setenv("SGLANG_DDTREE_PROFILE", "1")
    monkeypatch.setenv("SGLANG_DDTREE_PROFILE_EVERY", "7")
    prof = sp.RoundProfiler.from_env(torch.device("cpu"), print)
    assert prof.enabled and prof.every == 7
    monkeypatch.setenv("SGLANG_DDTREE_PROFILE", "yes")
    monkeypatch.setenv("SGLANG_DDTREE_PROFILE_EVERY", "many")
    prof = sp.RoundProfiler.from_env(torch.device("cpu"), print)
    assert not prof.enabled and prof.every == 100
