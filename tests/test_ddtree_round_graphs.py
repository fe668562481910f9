"""The DDTREE round's own work in CUDA graphs (the patch set's ddtree_step.py), on CPU torch.

* ``DraftTreeCapture``: the draft top-k and the trees, folded into the drafter's decode graph as a capture tail
  hook. Each bucket's capture writes its trees into static rows; a replay re-runs the captured work on the
  runner's new hidden states and input ids (emulated here by calling the hook again on the bucket's buffers,
  which is what the graph replays). The batch's rows, moved to their real prefixes, equal the eager trees of the
  same hidden states, for every batch size up to the largest bucket, whatever the padded rows hold -- also with
  the worker's own top-k (``DraftTopK``, the function the drafter's graph captures at every TP size).
* ``CommitGraphs``: the commit plan and the target's KV moves per bucket (emulated on the CPU: capture records a
  re-run on the static buffers). A batch in a larger bucket gets the eager plan and exactly the eager KV moves:
  the padded rows -- stale rows of an earlier, larger batch, whose moves were real -- write nothing a live row
  does not write identically (no slot is written twice with different KV in the bucket's whole scatter, which a
  GPU resolves either way), also where a live move targets a slot a padded row last held as its root. The
  outputs that outlive the round are not overwritten by the next round's replay.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
from ddtree_support import ddtree_step  # noqa: E402

pytestmark = pytest.mark.network  # reads the released SGLang 0.5.23 wheel (a first-run download)

FIELDS = ("draft_tokens", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "tree_mask", "parents",
          "depths")
BLOCK, BUDGET, HIDDEN, VOCAB = 5, 10, 12, 40
WIDTH = BUDGET + 1


@pytest.fixture(scope="module")
def sp():
    return ddtree_step()


@pytest.fixture(autouse=True)
def _no_debug_checks(monkeypatch):
    monkeypatch.delenv("SGLANG_DDTREE_DEBUG_CHECKS", raising=False)


def head_topk(weight: torch.Tensor, k: int):
    """The draft head's exact top-k log-probs (as the worker's candidate_topk with its log-sum-exp)."""
    def topk(hidden: torch.Tensor):
        lp = torch.log_softmax(hidden.double() @ weight.double().T, dim=-1)
        vals, ids = torch.topk(lp, k, dim=-1)
        return vals.float(), ids.to(torch.int64)
    return topk


def draft_outputs(gen: torch.Generator, bs: int):
    hidden = torch.randn(bs * BLOCK, HIDDEN, generator=gen) * 3
    ids = torch.randint(0, VOCAB, (bs * BLOCK,), generator=gen)
    return hidden, ids


def eager_trees(sp, topk, hidden, ids, prefix, loc, bs):
    h = hidden[: bs * BLOCK].view(bs, BLOCK, -1)
    lp, tok = topk(h[:, 1:].reshape(-1, HIDDEN))
    return sp.build_tree_verify(topk_log_probs=lp.view(bs, BLOCK - 1, -1), topk_tokens=tok.view(bs, BLOCK - 1, -1),
                                root_tokens=ids[: bs * BLOCK].view(bs, BLOCK)[:, 0], prefix_lens=prefix,
                                budgets=BUDGET, width=WIDTH, out_cache_loc=loc)


def same_trees(got, want) -> list[str]:
    bad = [name for name in FIELDS if not torch.equal(getattr(got.batch, name), getattr(want.batch, name))]
    for name in ("input_ids", "positions", "custom_mask", "out_cache_loc", "prefix_lens"):
        if not torch.equal(getattr(got, name), getattr(want, name)):
            bad.append(name)
    if not torch.equal(got.batch.positions, want.batch.positions):
        bad.append("batch.positions")
    return bad


def test_draft_tree_capture_replays_give_the_eager_trees(sp):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN, generator=gen)
    topk = head_topk(weight, BUDGET)
    buckets, max_bs = (2, 4, 8), 8
    cap = sp.DraftTreeCapture(topk_fn=topk, block=BLOCK, width=WIDTH, budget=BUDGET, topk=BUDGET, max_bs=max_bs,
                              device=torch.device("cpu"))
    for b in reversed(buckets):  # the runner's capture, largest bucket first
        hidden, ids = draft_outputs(gen, b)
        cap(None, type("Out", (), {"hidden_states": hidden})(), type("FB", (), {"input_ids": ids})(), b * BLOCK)
    assert cap.captured == set(buckets)
    for bs in (1, 3, 4, 7, 8, 2, 1):
        bucket = next(b for b in buckets if b >= bs)
        hidden, ids = draft_outputs(gen, bucket)  # the padded rows hold whatever the runner left there
        cap(None, type("Out", (), {"hidden_states": hidden})(), type("FB", (), {"input_ids": ids})(), bucket * BLOCK)
        prefix = torch.arange(bs, dtype=torch.int64) * 7 + 3
        loc = torch.arange(bs * WIDTH, dtype=torch.int64) + 500
        got = cap.rows(bs, prefix, loc)
        want = eager_trees(sp, topk, hidden, ids, prefix, loc, bs)
        assert same_trees(got, want) == [], (bs, same_trees(got, want))
        assert torch.equal(got.positions.view(bs, WIDTH)[:, 0], prefix)  # the root at its request's prefix
        # the eager path of the same object (a draft forward without a graph) gives the same trees
        eager = sp.at_prefix(cap.compute(hidden, ids, bs), prefix)
        assert same_trees(type(want)(**{**eager.__dict__, "out_cache_loc": loc}), want) == []


def test_the_workers_draft_topk_folded_gives_its_eager_trees(sp):
    """The worker's own top-k (``DraftTopK``, TP 1: the merge of one shard) as the capture hook's ``topk_fn``,
    on a bf16 head of small integers (logits full of ties): the folded trees equal the eager path's (the same
    object, then ``build_tree_verify``) for every batch size, and its top-k is the full-vocabulary one (the first
    k of a stable descending sort, log-softmax values)."""
    gen = torch.Generator().manual_seed(5)
    weight = torch.randint(-2, 3, (VOCAB, HIDDEN), generator=gen).to(torch.bfloat16)
    draft_topk = sp.DraftTopK(weight=weight, num_org=VOCAB, vocab_start=0, topk=BUDGET)
    buckets = (2, 4)
    cap = sp.DraftTreeCapture(topk_fn=draft_topk, block=BLOCK, width=WIDTH, budget=BUDGET, topk=BUDGET,
                              max_bs=max(buckets), device=torch.device("cpu"))

    def outputs(bs):
        hidden = torch.randint(-2, 3, (bs * BLOCK, HIDDEN), generator=gen).float()
        return hidden, torch.randint(0, VOCAB, (bs * BLOCK,), generator=gen)

    for b in reversed(buckets):
        cap(None, type("Out", (), {"hidden_states": outputs(b)[0]})(),
            type("FB", (), {"input_ids": outputs(b)[1]})(), b * BLOCK)
    assert cap.captured == set(buckets), cap.failed
    for bs in (1, 2, 3, 4):
        bucket = next(b for b in buckets if b >= bs)
        hidden, ids = outputs(bucket)
        cap(None, type("Out", (), {"hidden_states": hidden})(), type("FB", (), {"input_ids": ids})(), bucket * BLOCK)
        prefix = torch.arange(bs, dtype=torch.int64) * 5 + 1
        loc = torch.arange(bs * WIDTH, dtype=torch.int64) + 100
        want = eager_trees(sp, draft_topk, hidden, ids, prefix, loc, bs)
        assert same_trees(cap.rows(bs, prefix, loc), want) == [], bs
    logits = hidden.to(torch.bfloat16).float() @ weight.float().T
    lp, tok = draft_topk(hidden)
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :BUDGET]
    assert torch.equal(tok, order)
    assert torch.allclose(lp, torch.log_softmax(logits.double(), dim=-1).gather(-1, order).float(), atol=1e-6)
    cut = torch.sort(logits, dim=-1, descending=True).values
    assert (cut[:, BUDGET - 1] == cut[:, BUDGET]).sum() >= 4  # ties across the cut: which ids is the tie rule's


def test_draft_tree_capture_refuses_what_is_not_a_batch_of_blocks(sp):
    cap = sp.DraftTreeCapture(topk_fn=head_topk(torch.ones(VOCAB, HIDDEN), BUDGET), block=BLOCK, width=WIDTH,
                              budget=BUDGET, topk=BUDGET, max_bs=4, device=torch.device("cpu"))
    out, fb = type("Out", (), {"hidden_states": torch.zeros(40, HIDDEN)})(), type("FB", (), {
        "input_ids": torch.zeros(40, dtype=torch.int64)})()
    for tokens in (BLOCK * 4 + 1, BLOCK * 5, 0):
        with pytest.raises(RuntimeError, match="not a batch of blocks"):
            cap(None, out, fb, tokens)
    with pytest.raises(RuntimeError, match="no hidden states"):
        cap(None, type("Out", (), {"hidden_states": None})(), fb, BLOCK)
    assert cap.captured == set()
    cap(None, out, fb, BLOCK * 2)
    assert cap.captured == {2} and cap.failed is None


def test_a_draft_tree_capture_that_fails_leaves_its_bucket_uncaptured(sp):
    """A bucket whose trees could not be computed inside the capture is not used (the worker keeps its own tree
    graphs and says why); the capture of the draft forward itself goes on."""
    def broken(hidden):
        raise ValueError("head shape")
    cap = sp.DraftTreeCapture(topk_fn=broken, block=BLOCK, width=WIDTH, budget=BUDGET, topk=BUDGET, max_bs=4,
                              device=torch.device("cpu"))
    out, fb = type("Out", (), {"hidden_states": torch.zeros(20, HIDDEN)})(), type("FB", (), {
        "input_ids": torch.zeros(20, dtype=torch.int64)})()
    cap(None, out, fb, BLOCK * 4)
    assert cap.captured == set() and cap.failed == "ValueError: head shape"


def accept_outputs(sp, gen, bs, num_spec):
    """Greedy acceptance of random trees against random target logits (the torch reference of the kernel)."""
    lp = -torch.rand(bs, num_spec - 1, BUDGET, generator=gen).cumsum(-1)
    tok = torch.stack([torch.stack([torch.randperm(VOCAB, generator=gen)[:BUDGET] for _ in range(num_spec - 1)])
                       for _ in range(bs)])
    tv = sp.build_tree_verify(topk_log_probs=lp, topk_tokens=tok, root_tokens=torch.zeros(bs, dtype=torch.int64),
                              prefix_lens=torch.zeros(bs, dtype=torch.int64), budgets=BUDGET, width=WIDTH,
                              out_cache_loc=torch.zeros(bs * WIDTH, dtype=torch.int64))
    # logits whose argmax is mostly a node's first child's token, so that paths are long and moves real
    logits = torch.randn(bs * WIDTH, VOCAB, generator=gen)
    first = tv.batch.retrieve_next_token
    for b in range(bs):
        for k in range(WIDTH):
            c = int(first[b, k])
            if c >= 0 and float(torch.rand((), generator=gen)) < 0.85:
                logits[b * WIDTH + k, int(tv.batch.draft_tokens[b, c])] += 20.0
    return sp.accept_tree_reference(tv, logits, all_greedy=True)


def test_commit_graphs_make_the_eager_moves_and_nothing_else(sp):
    gen = torch.Generator().manual_seed(1)
    num_spec, slots_n = BLOCK, 400
    kv = [torch.randn(slots_n, 3, generator=gen), torch.randn(slots_n, 2, generator=gen)]
    graphs = sp.CommitGraphs(width=WIDTH, num_spec=num_spec, batch_sizes=[2, 4, 8], device=torch.device("cpu"),
                             move_kv=lambda dst, src: sp.apply_kv_moves(kv, src, dst))
    graphs.capture()
    assert sorted(graphs.captured) == [2, 4, 8]
    moved_somewhere = 0
    kept = None
    for bs in (8, 3, 4, 2, 1, 7, 1, 9):
        predicts, acc, num = accept_outputs(sp, gen, bs, num_spec)
        # the tree's nodes sit at slots of positions prefix .. prefix + W - 1, distinct over the batch
        loc = (torch.randperm(slots_n - 20, generator=gen)[: bs * WIDTH] + 10).to(torch.int64)
        prefix = torch.randint(0, 50, (bs,), generator=gen)
        for t in kv:  # the slots' contents change between rounds as requests come and go
            t.copy_(torch.randn(t.shape, generator=gen))
        before = [t.clone() for t in kv]
        want_kv = [t.clone() for t in kv]
        want = sp.plan_commit(predicts, acc, num, loc, prefix, WIDTH)
        sp.apply_kv_moves(want_kv, want.kv_src, want.kv_dst)
        got = graphs.commit(predicts, acc, num, loc, prefix)
        assert graphs.bucket(bs) == (None if bs > 8 else next(b for b in (2, 4, 8) if b >= bs))
        for name in ("out_tokens", "commit_lens", "new_seq_lens", "bonus_tokens", "path_rows", "path_positions"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (bs, name)
        for t, w in zip(kv, want_kv, strict=True):
            assert torch.equal(t, w), bs  # the real moves, and no stale row of a larger batch moved anything
        if graphs.bucket(bs) is not None:  # the bucket's whole scatter, padded rows included, is unambiguous
            out = graphs.captured[graphs.bucket(bs)][1]
            assert conflicting_writes(out.kv_src, out.kv_dst) == [], bs
        moved_somewhere += sum(int((t != b).any()) for t, b in zip(kv, before, strict=True))
        if kept is not None:  # the previous round's outputs survive this round's replay
            assert torch.equal(kept[0].out_tokens, kept[1]) and torch.equal(kept[0].bonus_tokens, kept[2])
        kept = (got, got.out_tokens.clone(), got.bonus_tokens.clone())
    assert moved_somewhere > 0  # the batches did move KV (paths longer than the root)


def test_commit_graphs_without_neutralised_padding_would_corrupt_the_kv(sp):
    """The control: a bucket replayed with its padded rows left as an earlier batch wrote them (accept counts,
    accept indices, slots) replays that batch's moves onto the KV of whatever now holds those slots."""
    gen = torch.Generator().manual_seed(2)
    kv = [torch.randn(300, 2, generator=gen)]
    graphs = sp.CommitGraphs(width=WIDTH, num_spec=BLOCK, batch_sizes=[4], device=torch.device("cpu"),
                             move_kv=lambda dst, src: sp.apply_kv_moves(kv, src, dst))
    graphs.capture()
    loc = (torch.randperm(280, generator=gen)[: 4 * WIDTH] + 10).to(torch.int64)
    zero = torch.zeros(4, dtype=torch.int64)
    for _ in range(200):  # a batch of 4 whose rows 1-3 make at least one real move
        predicts, acc, num = accept_outputs(sp, gen, 4, BLOCK)
        plan = sp.plan_commit(predicts, acc, num, loc, zero, WIDTH)
        if bool((plan.kv_src.view(4, -1)[1:] != plan.kv_dst.view(4, -1)[1:]).any()):
            break
    else:
        pytest.fail("no batch with a real move in its rows 1-3")
    graphs.commit(predicts, acc, num, loc, zero)
    (_p_in, acc_s, num_s, slots_s, _prefix), _out, replay = graphs.captured[4]
    kv[0].copy_(torch.randn(kv[0].shape, generator=gen))  # the slots now hold other requests' KV
    fresh = kv[0].clone()
    p, a, n = accept_outputs(sp, gen, 1, BLOCK)
    one = loc[:WIDTH].clone()
    want = fresh.clone()
    one_plan = sp.plan_commit(p, a, n, one, zero[:1], WIDTH)
    sp.apply_kv_moves([want], one_plan.kv_src, one_plan.kv_dst)
    graphs.commit(p, a, n, one, zero[:1])
    assert torch.equal(kv[0], want)  # neutralised padding: only the real request's moves
    kv[0].copy_(fresh)  # the same replay with the padded rows left as the earlier batch wrote them
    num_s[1:].copy_(num[1:].to(num_s.dtype))
    acc_s[1:].copy_(acc[1:].to(acc_s.dtype))
    slots_s[WIDTH:].copy_(loc[WIDTH:])
    replay()
    assert not torch.equal(kv[0], want)


def hand_accept(bs: int, num_spec: int, paths: dict[int, list[int]]):
    """Acceptance outputs written by hand: request ``b`` accepts the nodes ``paths[b]`` (node indices in its
    tree, root excluded); every other request accepts nothing (its root only)."""
    predicts = torch.arange(bs * WIDTH, dtype=torch.int64) % VOCAB
    acc = (torch.arange(bs, dtype=torch.int64) * WIDTH).view(-1, 1).repeat(1, num_spec)
    num = torch.zeros(bs, dtype=torch.int64)
    for b, nodes in paths.items():
        for i, node in enumerate(nodes, start=1):
            acc[b, i] = b * WIDTH + node
        num[b] = len(nodes)
    return predicts, acc, num


def conflicting_writes(src: torch.Tensor, dst: torch.Tensor) -> list[int]:
    """Destination slots written twice with different sources in one move list (which write wins is undefined
    on a GPU: a scatter with duplicate indices)."""
    seen: dict[int, int] = {}
    bad = []
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        if seen.setdefault(d, s) != s:
            bad.append(d)
    return bad


def race_setup(sp):
    """A bucket of 4 committed at full size, then 2 live requests, the second of which moves its accepted node
    3 into position 1 of its window: a slot that the previous batch's row 3 held as its root (freed, then
    reallocated). Returns the graphs, the KV, the second round's inputs and that slot."""
    kv = [torch.arange(200, dtype=torch.float64).view(-1, 1) * torch.ones(1, 2, dtype=torch.float64)]
    graphs = sp.CommitGraphs(width=WIDTH, num_spec=BLOCK, batch_sizes=[4], device=torch.device("cpu"),
                             move_kv=lambda dst, src: sp.apply_kv_moves(kv, src, dst))
    graphs.capture()
    first = torch.arange(10, 10 + 4 * WIDTH, dtype=torch.int64)
    graphs.commit(*hand_accept(4, BLOCK, {0: [1, 2], 3: [1]}), first, torch.zeros(4, dtype=torch.int64))
    stale = int(first[3 * WIDTH])  # row 3's root slot, still named by the bucket's padded row 3
    loc = torch.arange(100, 100 + 2 * WIDTH, dtype=torch.int64)
    loc[WIDTH + 1] = stale  # request 1's position prefix + 1 now lives in that slot
    kv[0].copy_(torch.arange(200, dtype=torch.float64).view(-1, 1) * torch.ones(1, 2, dtype=torch.float64))
    second = (*hand_accept(2, BLOCK, {1: [3]}), loc, torch.tensor([7, 9]))
    return graphs, kv, second, stale, int(loc[WIDTH + 3])


def test_padded_rows_never_revert_a_live_move_into_a_stale_root_slot(sp):
    """The race: a padded row with accept count 0 still has step 0 on its path; before the fix it copied its
    stale root slot onto itself, a second write (the slot's old KV) to the slot a live request's accepted node
    moves into. On the CPU the padded row, written last, won: the fresh KV was reverted."""
    graphs, kv, second, stale, src = race_setup(sp)
    moved = kv[0][src].clone()
    plan = graphs.commit(*second)
    assert int(plan.commit_lens[1]) == 2 and stale in plan.kv_dst.tolist()
    assert torch.equal(kv[0][stale], moved), (
        f"slot {stale} holds {kv[0][stale].tolist()} after the commit, not the moved KV {moved.tolist()}")
    # The whole bucket's move list (the padded rows' moves included) writes no slot twice with different KV.
    (_p, _acc, _num, _slots, _prefix), out, _replay = graphs.captured[4]
    assert conflicting_writes(out.kv_src, out.kv_dst) == []


def test_the_race_reappears_when_the_padded_rows_keep_their_stale_slots(sp):
    """The control: the same replay with the padded rows' slots put back as the larger batch left them (what the
    commit did before the fix) reverts the live move -- the test above can fail."""
    graphs, kv, second, stale, src = race_setup(sp)
    before = kv[0].clone()
    graphs.commit(*second)
    (_p, _acc, _num, slots, _prefix), out, replay = graphs.captured[4]
    kv[0].copy_(before)
    slots[2 * WIDTH:].copy_(torch.arange(10 + 2 * WIDTH, 10 + 4 * WIDTH))  # the first batch's rows 2-3
    replay()
    assert stale in conflicting_writes(out.kv_src, out.kv_dst)
    assert torch.equal(kv[0][stale], before[stale]) and not torch.equal(before[stale], before[src])
