"""The DDTREE decode step (the patch set's ddtree_step.py) on CPU, end to end against a toy model.

The toy target reads its context the way SGLang's verify attention does: the committed prefix through
``req_to_token`` and the tree nodes through ``out_cache_loc``, filtered by the *flattened* custom mask; its
next-token logits depend on the current token and on a position-weighted hash of every visible (token,
position) in the KV pool, so a wrong mask, position, slot reservation or KV move changes the output. The toy
drafter reads the draft KV (the target hidden states appended for committed tokens). Each round goes through
``ddtree_round`` -- slot reservation, tree + verify inputs, the toy target forward, acceptance with the torch
references of SGLang's kernels, KV moves, draft-KV append, freeing -- and the results are compared with plain
autoregressive decoding of the same toy: token for token when greedy (batches of 3 requests with different
prompts, prefix lengths and budgets), in distribution when sampled (per-request temperature / top-k / top-p
in one batch; chi-square, fixed seeds; the statistic also rejects a wrong temperature and a greedy
fall-back).
"""

from __future__ import annotations

import itertools

import ci_requirements
import pytest

torch = ci_requirements.importorskip("torch")

from ddtree_support import chi_square, chi_square_critical, ddtree_step, ddtree_utils  # noqa: E402
from ddtree_toy import DEPTH, Engine, Toy, V, ar_greedy, exact_three, sample_three  # noqa: E402

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)


@pytest.fixture(scope="module")
def st():
    return ddtree_step()


@pytest.fixture(scope="module")
def dd():
    return ddtree_utils()


def greedy_accept(st):
    return lambda tv, logits: st.accept_tree_reference(tv, logits, all_greedy=True)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_greedy_ddtree_rounds_equal_autoregressive_decoding(st, seed):
    toy = Toy(seed)
    prompts = [[1, 2, 3, 4], [0], [4, 4, 2, 1, 0, 3, 3]]  # prefix lengths 3, 0, 6
    budgets, width = [8, 3, 1], 9  # different budgets in one batch (smaller trees padded)
    eng = Engine(st, toy, prompts)
    outs = [[] for _ in prompts]
    n, rounds = 30, 0
    while min(len(o) for o in outs) < n:
        for b, toks in enumerate(eng.round(budgets, width, greedy_accept(st))):
            outs[b].extend(toks)
        rounds += 1
        eng.check_state([p + o for p, o in zip(prompts, outs, strict=True)])
    for b, p in enumerate(prompts):
        assert outs[b] == ar_greedy(toy, p, len(outs[b])), b
    # Acceptance depends on how well the toy drafter guesses: with seed 2 it is wrong on the greedy path
    # (about 1.0 token per round); elsewhere the budget-8 request commits 2-5 tokens per round.
    if seed != 2:
        assert len(outs[0]) / rounds > 1.5, "the trees should accept drafts"


def test_a_wrong_mask_or_skipped_kv_move_is_caught(st):
    """The toy is sensitive to what the step gets wrong: causal attention over the tree, or no KV move."""
    toy = Toy(0)
    prompts = [[1, 2, 3, 4], [0, 3]]

    def run(engine_patch) -> bool:
        eng = Engine(st, toy, prompts)
        engine_patch(eng)
        outs = [[] for _ in prompts]
        for _ in range(12):
            for b, toks in enumerate(eng.round([6, 6], 7, greedy_accept(st))):
                outs[b].extend(toks)
        return all(outs[b] == ar_greedy(toy, p, len(outs[b])) for b, p in enumerate(prompts))

    assert run(lambda e: None)

    def causal(eng):
        fwd = eng.target_forward

        def forward(tv):
            w = tv.width  # the compact layout: W x W tree cells per request, made causal
            tv.custom_mask = torch.ones(w, w, dtype=torch.bool).tril().repeat(tv.batch.bs, 1, 1).reshape(-1)
            return fwd(tv)
        eng.target_forward = forward

    def no_move(eng):
        eng.move_kv = lambda src, dst: None

    assert not run(causal)
    assert not run(no_move)


def test_verify_inputs_for_a_batch_with_different_budgets(st, dd):
    g = torch.Generator().manual_seed(3)
    bs, width = 3, 7
    lp, ids = dd.ddtree_topk_from_logits(torch.randn(bs, DEPTH, 9, generator=g), 6)
    prefix = torch.tensor([5, 0, 11])
    req_to_token = torch.zeros((4, 32), dtype=torch.int64)
    rpi = torch.tensor([3, 1, 2])
    allocated = torch.tensor([2, 0, 20])  # request 2 already owns enough slots
    counter = itertools.count(100)
    calls = []

    def alloc(n):
        calls.append(n)
        return torch.tensor([next(counter) for _ in range(n)])

    new_alloc = st.reserve_verify_slots(req_to_token, rpi, prefix, allocated, width, alloc)
    assert new_alloc.tolist() == [12, 7, 20] and calls == [10 + 7]
    assert req_to_token[3, 2:12].tolist() == list(range(100, 110))
    assert req_to_token[1, 0:7].tolist() == list(range(110, 117))
    loc = st.verify_cache_locs(req_to_token, rpi, prefix, width, new_alloc)
    assert loc.view(bs, width)[0].tolist() == req_to_token[3, 5:12].tolist()
    assert loc.view(bs, width)[2].tolist() == req_to_token[2, 11:18].tolist()
    with pytest.raises(ValueError, match="not reserved"):
        st.verify_cache_locs(req_to_token, rpi, prefix, width, allocated)

    tv = st.build_tree_verify(topk_log_probs=lp, topk_tokens=ids, root_tokens=torch.tensor([7, 8, 1]),
                              prefix_lens=prefix, budgets=[6, 2, 0], width=width, out_cache_loc=loc)
    b = tv.batch
    assert tv.input_ids.dtype == torch.int64 and tv.input_ids.shape == (bs * width,)
    assert b.draft_tokens[:, 0].tolist() == [7, 8, 1]
    for r, budget in enumerate([6, 2, 0]):
        tree = dd.build_ddtree(lp[r], ids[r], budget, int(b.draft_tokens[r, 0]))
        n = tree.size
        assert b.draft_tokens[r, :n].tolist() == list(tree.tokens)
        assert b.positions.view(bs, width)[r, :n].tolist() == [int(prefix[r]) + d for d in tree.depths]
        # filler nodes: unreachable (nobody's child), see the prefix and themselves only
        reach = {0}
        for node in range(width):
            if node in reach:
                for link in (b.retrieve_next_token[r, node], b.retrieve_next_sibling[r, node]):
                    if int(link) >= 0:
                        reach.add(int(link))
        assert reach == set(range(n))
        for f in range(n, width):
            assert b.tree_mask[r, f].nonzero().view(-1).tolist() == [f]
    assert b.retrieve_index.tolist() == torch.arange(bs * width).view(bs, width).tolist()
    # the compact layout: W x W cells per request, whatever the prefix; the prefix part is implicit
    assert tv.custom_mask.numel() == bs * width * width and tv.custom_mask.dtype == torch.bool
    assert torch.equal(tv.custom_mask.view(bs, width, width), b.tree_mask)
    ref = st.build_tree_verify_reference(topk_log_probs=lp, topk_tokens=ids, root_tokens=torch.tensor([7, 8, 1]),
                                         prefix_lens=prefix, budgets=[6, 2, 0], width=width, out_cache_loc=loc)
    assert not ref.compact_mask and ref.custom_mask.numel() == sum(width * (int(p) + width) for p in prefix)
    for name in ("draft_tokens", "positions", "retrieve_next_token", "retrieve_next_sibling", "tree_mask"):
        assert torch.equal(getattr(b, name), getattr(ref.batch, name)), name
    with pytest.raises(ValueError, match="budgets"):
        st.build_tree_verify(topk_log_probs=lp, topk_tokens=ids, root_tokens=torch.tensor([7, 8, 1]),
                             prefix_lens=prefix, budgets=[7, 2, 0], width=width, out_cache_loc=loc)


def test_commit_plan_moves_frees_and_output_ids(st):
    # two requests, W = 4; request 0 accepted nodes 0 -> 2 -> 3, request 1 only its root
    width = 4
    loc = torch.tensor([40, 41, 42, 43, 50, 51, 52, 53])
    predicts = torch.tensor([9, -1, 7, 5, 6, -1, -1, -1])  # after node 0: 9 (node 2's token), node 2: 7, node 3: 5
    accept_index = torch.tensor([[0, 2, 3], [4, -1, -1]])
    accept_num = torch.tensor([2, 0])
    plan = st.plan_commit(predicts, accept_index, accept_num, loc, torch.tensor([10, 3]), width)
    assert plan.out_tokens.tolist() == [[9, 7, 5, -1], [6, -1, -1, -1]]
    assert plan.commit_lens.tolist() == [3, 1] and plan.commit_lens.dtype == torch.int32
    assert plan.new_seq_lens.tolist() == [13, 4] and plan.bonus_tokens.tolist() == [5, 6]
    # fixed shape: one pair per path position; nodes in place and positions past the path copy onto themselves
    assert plan.kv_src.shape == plan.kv_dst.shape == (2 * 3,)
    moves = [(a, b) for a, b in zip(plan.kv_src.tolist(), plan.kv_dst.tolist(), strict=True) if a != b]
    assert moves == [(42, 41), (43, 42)]
    assert plan.kv_src.tolist()[3:] == plan.kv_dst.tolist()[3:] == [50, 50, 50]  # request 1: its root slot
    ref = st.plan_commit_reference(predicts, accept_index, accept_num, loc, torch.tensor([10, 3]), width)
    assert list(zip(ref.kv_src.tolist(), ref.kv_dst.tolist(), strict=True)) == [(42, 41), (43, 42)]
    assert plan.path_rows.tolist() == [[0, 2, 3, 0], [4, 4, 4, 4]]
    assert plan.path_positions.tolist() == [[10, 11, 12, 13], [3, 4, 5, 6]]
    assert st.committed_token_lists(plan.out_tokens, plan.commit_lens) == [[9, 7, 5], [6]]

    kv = torch.arange(60).view(60, 1).float() * 10
    st.apply_kv_moves([kv], plan.kv_src, plan.kv_dst)
    assert kv[40:44].view(-1).tolist() == [400, 420, 430, 430]  # gathered before scattering
    hidden = torch.arange(8).view(8, 1).float()
    assert st.gather_path_rows(hidden, plan.path_rows).view(-1).tolist() == [0, 2, 3, 0, 4, 4, 4, 4]

    req_to_token = torch.zeros((2, 16), dtype=torch.int64)
    req_to_token[0, 10:14] = loc[:4]
    req_to_token[1, 3:7] = loc[4:]
    slots, alloc = st.release_uncommitted_slots(req_to_token, torch.tensor([0, 1]), plan.new_seq_lens,
                                                torch.tensor([14, 7]))
    assert slots.tolist() == [43, 51, 52, 53] and alloc.tolist() == [13, 4]

    # malformed kernel outputs: checked under the debug switch (the checks read the device back)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLANG_DDTREE_DEBUG_CHECKS", "1")
        with pytest.raises(ValueError, match="outside"):
            st.plan_commit(predicts, torch.tensor([[0, 5, 3], [4, -1, -1]]), accept_num, loc, torch.tensor([10, 3]),
                           width)
        with pytest.raises(ValueError, match="out of range"):
            st.plan_commit(predicts, accept_index, torch.tensor([3, 0]), loc, torch.tensor([10, 3]), width)


def test_reservation_fails_cleanly_when_the_pool_is_full(st):
    req_to_token = torch.zeros((1, 16), dtype=torch.int64)
    with pytest.raises(RuntimeError, match="cannot provide"):
        st.reserve_verify_slots(req_to_token, torch.tensor([0]), torch.tensor([2]), torch.tensor([2]), 5,
                                lambda n: None)
    assert int(req_to_token.abs().sum()) == 0
    with pytest.raises(ValueError, match="req_to_token holds"):
        st.reserve_verify_slots(req_to_token, torch.tensor([0]), torch.tensor([14]), torch.tensor([14]), 5,
                                lambda n: torch.arange(n))


def test_target_probs_top_k_then_top_p(st):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4, dtype=torch.float64))
    probs = st.target_probs_reference(logits, torch.tensor([1.0, 1.0]), torch.tensor([4, 2]),
                                      torch.tensor([0.7, 1.0]), width=2)
    assert torch.allclose(probs[0, 0], torch.tensor([0.625, 0.375, 0, 0], dtype=torch.float64))
    assert torch.allclose(probs[1, 1], torch.tensor([0.625, 0.375, 0, 0], dtype=torch.float64))
    greedy = st.target_probs_reference(logits, torch.tensor([1.0]), torch.tensor([1]), torch.tensor([1.0]), 4)
    assert greedy[0, :, 0].tolist() == [1.0] * 4


def sampling_accept(st):
    def factory(temps, top_ks, top_ps, gen):
        return lambda tv, logits: st.accept_tree_reference(tv, logits, all_greedy=False, temperatures=temps,
                                                           top_ks=top_ks, top_ps=top_ps, generator=gen)
    return factory


def test_sampled_ddtree_rounds_follow_the_target_distribution(st):
    toy = Toy(5)
    prompt = [2, 0, 3]
    groups = [(0.7, V, 1.0), (1.4, V, 1.0), (1.0, 2, 1.0), (1.0, V, 0.75), (1.0, 1, 1.0)]  # last: greedy
    per = 2500
    codes, tokens_per_round = sample_three(st, toy, prompt, groups, per, 99, sampling_accept(st))
    assert tokens_per_round > 1.2
    for g, (t, k, p) in enumerate(groups[:-1]):
        stat, df = chi_square(codes[g * per: (g + 1) * per], exact_three(toy, prompt, t, k, p))
        assert stat < chi_square_critical(df), (t, k, p, stat, df)
    greedy = ar_greedy(toy, prompt, 3)
    assert set(codes[4 * per:].tolist()) == {greedy[0] * V * V + greedy[1] * V + greedy[2]}
    # the statistic has power: a wrong temperature and a greedy fall-back both fail it
    stat, df = chi_square(codes[:per], exact_three(toy, prompt, 1.4, V, 1.0))
    assert stat > chi_square_critical(df)

    def greedy_fallback(temps, top_ks, top_ps, gen):
        return greedy_accept(st)

    # (its statistic grows with the sample: at 500 requests it is already ~30x the bound, so one fifth of the
    # batch shows the power the full-size groups above have)
    fallback, _ = sample_three(st, toy, prompt, groups[:1], per // 5, 99, greedy_fallback)
    stat, df = chi_square(fallback, exact_three(toy, prompt, 0.7, V, 1.0))
    assert stat > chi_square_critical(df)


def test_acceptance_thresholds_below_one_are_lossy_and_the_statistic_sees_it(st):
    """--speculative-accept-threshold-acc below 1 (as DFLASH applies it, here through the sampling kernel's
    torch reference) accepts drafts more often than the target distribution allows: the chi-square that the
    default (1.0) passes fails for it -- the biased control a distribution test must reject."""
    toy = Toy(5)
    prompt = [2, 0, 3]
    groups = [(0.7, V, 1.0)]
    per = 1000

    def with_thresholds(single, acc):
        def factory(temps, top_ks, top_ps, gen):
            return lambda tv, logits: st.accept_tree_reference(
                tv, logits, all_greedy=False, temperatures=temps, top_ks=top_ks, top_ps=top_ps, generator=gen,
                threshold_single=single, threshold_acc=acc)
        return factory

    # (the defaults, 1.0, pass this statistic on the same group in the sampled test above)
    biased, _ = sample_three(st, toy, prompt, groups, per, 99, with_thresholds(1.0, 0.3))
    stat, df = chi_square(biased, exact_three(toy, prompt, 0.7, V, 1.0))
    assert stat > chi_square_critical(df), (stat, df)
