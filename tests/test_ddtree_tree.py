"""DDTree tree construction, EAGLE-format encoding and the ancestor-only mask, on the patched module (CPU torch)."""

from __future__ import annotations

import math

import ci_requirements
import pytest

torch = ci_requirements.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("hypothesis")
from ddtree_support import brute_force_top, ddtree_utils  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)


@pytest.fixture(scope="module")
def dd():
    return ddtree_utils()


def random_topk(rng: np.random.Generator, depth: int, topk: int, vocab: int = 50):
    """Sorted top-k log-probs with distinct (tie-free) values and distinct tokens per position."""
    lp = -rng.exponential(1.0, size=(depth, topk)).cumsum(axis=1) - rng.exponential(0.3, size=(depth, 1))
    tokens = np.stack([rng.choice(vocab, size=topk, replace=False) for _ in range(depth)])
    return torch.tensor(lp, dtype=torch.float64), torch.tensor(tokens, dtype=torch.int64)


def tree_rank_paths(tree):
    out = []
    for node in range(1, tree.size):
        out.append(tuple(tree.ranks[i] for i in tree.path(node)[1:]))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(depth=st.integers(1, 4), topk=st.integers(1, 4), seed=st.integers(0, 2**32 - 1), frac=st.floats(0, 1))
def test_builder_keeps_the_budget_most_likely_prefixes(dd, depth, topk, seed, frac):
    rng = np.random.default_rng(seed)
    lp, tok = random_topk(rng, depth, topk)
    budget = round(frac * dd.max_tree_nodes(depth, topk))
    tree = dd.build_ddtree(lp, tok, budget, root_token=7)
    expected = brute_force_top(lp, budget)
    assert tree.size == budget + 1
    assert set(tree_rank_paths(tree)) == {ranks for _, ranks in expected}
    # node scores are the path sums and come out best-first
    for node in range(1, tree.size):
        ranks = tree_rank_paths(tree)[node - 1]
        assert tree.scores[node] == pytest.approx(sum(float(lp[i, r]) for i, r in enumerate(ranks)))
        assert tree.path_tokens(node) == tuple(int(tok[i, r]) for i, r in enumerate(ranks))
    assert all(a >= b - 1e-12 for a, b in zip(tree.scores[1:-1], tree.scores[2:], strict=True))


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 6), topk=st.integers(1, 5), seed=st.integers(0, 2**32 - 1), budget=st.integers(0, 40))
def test_tree_structure_invariants(dd, depth, topk, seed, budget):
    rng = np.random.default_rng(seed)
    lp, tok = random_topk(rng, depth, topk)
    budget = min(budget, dd.max_tree_nodes(depth, topk))
    tree = dd.build_ddtree(lp, tok, budget, root_token=3)
    assert tree.tokens[0] == 3 and tree.parents[0] == -1 and tree.depths[0] == 0
    for node in range(1, tree.size):
        p = tree.parents[node]
        assert 0 <= p < node, "parents precede children"
        assert tree.depths[node] == tree.depths[p] + 1
        assert tree.tokens[node] == int(tok[tree.depths[node] - 1, tree.ranks[node]])
    for kids in tree.children():
        # siblings share a depth (a position), hold distinct tokens, and come in rank order
        assert len({tree.depths[k] for k in kids}) <= 1
        assert len({tree.tokens[k] for k in kids}) == len(kids)
        assert [tree.ranks[k] for k in kids] == sorted(tree.ranks[k] for k in kids)


def test_builder_rejects_bad_input(dd):
    lp = torch.tensor([[-0.1, -2.0], [-0.5, -1.0]])
    tok = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="exceeds"):
        dd.build_ddtree(lp, tok, 7, 0)  # only 2 + 4 prefixes
    with pytest.raises(ValueError, match="sorted"):
        dd.build_ddtree(lp.flip(1), tok, 2, 0)
    with pytest.raises(ValueError, match="duplicate"):
        dd.build_ddtree(lp, torch.tensor([[1, 1], [3, 4]]), 2, 0)
    with pytest.raises(ValueError, match="invalid log-prob"):
        dd.build_ddtree(torch.tensor([[float("nan"), -2.0], [-0.5, -1.0]]), tok, 2, 0)
    with pytest.raises(ValueError):
        dd.build_ddtree(lp, tok, -1, 0)
    assert dd.build_ddtree(lp, tok, 0, 9).tokens == (9,)
    assert dd.max_tree_nodes(15, 64) > 64 and dd.max_tree_nodes(3, 1) == 3


def test_topk_from_logits_is_sorted_log_softmax(dd):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 30, generator=g)
    lp, tok = dd.ddtree_topk_from_logits(logits, 4)
    assert lp.shape == (2, 5, 4) and tok.dtype == torch.int64
    ref = torch.log_softmax(logits.double(), -1)
    assert torch.allclose(lp.double(), ref.gather(-1, tok), atol=1e-5)
    assert bool((lp[..., :-1] >= lp[..., 1:]).all())


def _batch(dd, seed=0, bs=3, depth=4, topk=3, budget=9, prefix=(5, 0, 11)):
    rng = np.random.default_rng(seed)
    trees = [dd.build_ddtree(*random_topk(rng, depth, topk), budget, root_token=100 + b) for b in range(bs)]
    return trees, dd.encode_eagle(trees, prefix_lens=list(prefix[:bs]))


def test_eagle_encoding_dtypes_sentinels_and_global_indices(dd):
    trees, enc = _batch(dd)
    bs, w = 3, 10
    assert enc.width == w and enc.bs == bs
    for name in ("draft_tokens", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling"):
        assert getattr(enc, name).dtype == torch.int64, name
    assert enc.tree_mask.dtype == torch.bool and enc.tree_mask.shape == (bs, w, w)
    assert torch.equal(enc.retrieve_index, torch.arange(bs * w).view(bs, w))  # global rows b*W + k
    assert enc.positions.shape == (bs * w,)
    for b, tree in enumerate(trees):
        assert enc.draft_tokens[b].tolist() == list(tree.tokens)
        assert enc.positions.view(bs, w)[b].tolist() == [(5, 0, 11)[b] + d for d in tree.depths]
        kids = tree.children()
        for node in range(w):
            first = enc.retrieve_next_token[b, node].item()
            assert first == (kids[node][0] if kids[node] else -1)
            assert first == -1 or first > node
        for k in kids:
            if k:
                chain = [enc.retrieve_next_sibling[b, x].item() for x in k]
                assert chain == [*k[1:], -1]
        assert enc.retrieve_next_sibling[b, 0].item() == -1  # the root has no sibling
        values = set(enc.retrieve_next_token[b].tolist()) | set(enc.retrieve_next_sibling[b].tolist())
        assert values <= set(range(1, w)) | {-1}
    assert enc.num_spec_tokens() == max(t.max_depth for t in trees) + 1


def test_encode_decode_round_trip(dd):
    for seed in range(20):
        trees, enc = _batch(dd, seed=seed, depth=5, topk=4, budget=15)
        parents = dd.decode_eagle(enc.retrieve_next_token, enc.retrieve_next_sibling)
        assert parents == [list(t.parents) for t in trees]
        assert torch.equal(enc.parents, torch.tensor(parents))


def test_decode_rejects_malformed_links(dd):
    nt = torch.tensor([[1, -1, -1]])
    with pytest.raises(ValueError, match="unreachable"):
        dd.decode_eagle(nt, torch.tensor([[-1, -1, -1]]))
    with pytest.raises(ValueError, match="twice"):
        dd.decode_eagle(torch.tensor([[1, 2, -1]]), torch.tensor([[-1, 2, -1]]))
    with pytest.raises(ValueError, match="out of range"):
        dd.decode_eagle(torch.tensor([[3, -1, -1]]), torch.tensor([[-1, -1, -1]]))
    with pytest.raises(ValueError):
        dd.encode_eagle([])


def test_mask_is_ancestor_only(dd):
    trees, enc = _batch(dd, seed=3, depth=5, topk=3, budget=20)
    for b, tree in enumerate(trees):
        for i in range(tree.size):
            allowed = set(tree.path(i))
            for j in range(tree.size):
                assert bool(enc.tree_mask[b, i, j]) == (j in allowed), (b, i, j)
        # siblings never see each other; causal order is respected
        assert not bool(torch.triu(enc.tree_mask[b], diagonal=1).any())


def test_verify_custom_mask_layout(dd):
    _, enc = _batch(dd)
    seq = torch.tensor([5, 0, 11])
    flat = dd.build_verify_custom_mask(enc.tree_mask, seq)
    w = enc.width
    assert flat.dtype == torch.bool and flat.numel() == sum(w * (s + w) for s in seq.tolist())
    off = 0
    for b, s in enumerate(seq.tolist()):
        block = flat[off: off + w * (s + w)].view(w, s + w)
        assert bool(block[:, :s].all()), "every tree node reads the whole committed prefix"
        assert torch.equal(block[:, s:], enc.tree_mask[b])
        off += w * (s + w)


def test_repeat_per_node(dd):
    t = torch.tensor([0.5, 1.0, 0.75])
    r = dd.repeat_per_node(t, 4)
    assert r.tolist() == [0.5] * 4 + [1.0] * 4 + [0.75] * 4
    with pytest.raises(ValueError):
        dd.repeat_per_node(t, 0)


def walk_greedy(tree, target_next):
    """Independent per-request greedy tree walk: follow the child equal to the target's choice."""
    node, out = 0, []
    kids = tree.children()
    while True:
        want = target_next[node]
        nxt = [c for c in kids[node] if tree.tokens[c] == want]
        out.append(want)
        if not nxt:
            return out
        node = nxt[0]


def test_greedy_reference_matches_an_independent_walk(dd):
    g = torch.Generator().manual_seed(1)
    for seed in range(10):
        trees, enc = _batch(dd, seed=seed, depth=4, topk=3, budget=12, prefix=(0, 0, 0))
        w = enc.width
        # make the target agree with some tree children so paths are accepted
        target = enc.draft_tokens.clone()
        for b, tree in enumerate(trees):
            kids = tree.children()
            for node in range(w):
                if kids[node] and torch.rand((), generator=g) < 0.8:
                    pick = kids[node][int(torch.randint(len(kids[node]), (), generator=g))]
                    target[b, node] = tree.tokens[pick]
                else:
                    target[b, node] = 1000 + node
        pred, acc, num = dd.verify_tree_greedy_reference(
            enc.draft_tokens, enc.retrieve_index, enc.retrieve_next_token, enc.retrieve_next_sibling,
            target.view(-1), enc.num_spec_tokens())
        committed = dd.committed_tokens(pred, acc, num)
        for b, tree in enumerate(trees):
            assert committed[b] == walk_greedy(tree, target[b].tolist())
            assert acc[b, 0].item() == b * w
            assert (acc[b, num[b] + 1:] == -1).all()
        paths = dd.accepted_path_nodes(acc, num, w)
        for b, tree in enumerate(trees):
            assert paths[b] == tree.path(paths[b][-1])


def test_sampling_reference_accepts_with_certainty_and_rejects_impossible(dd):
    """Point-mass targets: a child with all the mass is always accepted; without any, the residual is sampled."""
    trees, enc = _batch(dd, seed=2, bs=1, depth=3, topk=2, budget=6, prefix=(0,))
    tree = trees[0]
    vocab = 2000
    probs = torch.zeros(1, enc.width, vocab, dtype=torch.float64)
    kids = tree.children()
    for node in range(enc.width):
        probs[0, node, tree.tokens[kids[node][-1]] if kids[node] else 1999] = 1.0
    coins = torch.rand(1, enc.width, dtype=torch.float64)
    pred, acc, num = dd.verify_tree_sampling_reference(
        enc.draft_tokens, enc.retrieve_index, enc.retrieve_next_token, enc.retrieve_next_sibling,
        probs, coins, torch.rand(1, dtype=torch.float64), enc.num_spec_tokens())
    committed = dd.committed_tokens(pred, acc, num)[0]
    assert committed == walk_greedy(tree, [int(probs[0, k].argmax()) for k in range(enc.width)])
    assert math.isclose(float(probs[0, 0].sum()), 1.0)


def test_accepted_kv_moves_make_the_path_contiguous(dd):
    g = torch.Generator().manual_seed(4)
    for seed in range(10):
        trees, enc = _batch(dd, seed=seed, depth=5, topk=3, budget=14, prefix=(0, 0, 0))
        bs, w = enc.bs, enc.width
        target = torch.randint(500, 600, (bs, w), generator=g)
        for b, tree in enumerate(trees):
            for node, kids in enumerate(tree.children()):
                if kids:
                    target[b, node] = tree.tokens[kids[-1]]  # follow the last sibling: forces moves
        _, acc, num = dd.verify_tree_greedy_reference(
            enc.draft_tokens, enc.retrieve_index, enc.retrieve_next_token, enc.retrieve_next_sibling,
            target.view(-1), enc.num_spec_tokens())
        out_cache_loc = torch.randperm(1000, generator=g)[: bs * w]
        pool = torch.full((1000,), -1, dtype=torch.int64)
        pool[out_cache_loc] = torch.arange(bs * w)  # "KV" of verify row r is r
        src, dst, rows = dd.accepted_kv_moves(acc, num, out_cache_loc, w)
        pool[dst] = pool[src].clone()  # gather, then scatter
        paths = dd.accepted_path_nodes(acc, num, w)
        assert rows.tolist() == [b * w + k for b in range(bs) for k in paths[b]]
        for b in range(bs):
            got = pool[out_cache_loc.view(bs, w)[b, : len(paths[b])]].tolist()
            assert got == [b * w + k for k in paths[b]]
        assert int(num.max()) >= 2 and src.numel() > 0
    with pytest.raises(ValueError):
        dd.accepted_kv_moves(acc, num, out_cache_loc[:-1], w)


@pytest.mark.parametrize("shards", [1, 3, 8])
def test_vocab_parallel_topk_merge_is_exact(dd, shards):
    g = torch.Generator().manual_seed(shards)
    vocab, n, k = 103, 7, 16
    logits = torch.randn(n, vocab, generator=g) * 3
    per = -(-vocab // shards)  # padded shard width, like a vocab-parallel embedding
    parts = []
    for s in range(shards):
        local = torch.full((n, per), 123.0)  # padding columns: must never be picked
        real = logits[:, s * per: (s + 1) * per]
        local[:, : real.shape[1]] = real
        parts.append(dd.shard_topk(local, k, s * per, num_valid=real.shape[1]))
    vals, ids, lse = (torch.stack(x) for x in zip(*parts, strict=True))
    lp, tok = dd.merge_shard_topk(vals, ids, lse, k)
    ref_lp, ref_tok = dd.ddtree_topk_from_logits(logits, k)
    assert torch.equal(tok, ref_tok)
    assert torch.allclose(lp, ref_lp, atol=1e-5)
    with pytest.raises(ValueError):
        dd.merge_shard_topk(vals, ids, lse[:, :1], k)
