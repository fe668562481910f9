"""DDTree is lossless: a toy target (random bigram logits) and a toy DFlash-like drafter, verified as trees.

Greedy: DDTree decoding yields exactly the greedy autoregressive sequence. Temperature > 0: the committed
tokens follow the target distribution (chi-square against the exact three-token distribution, fixed seed),
with per-request temperature and top-k repeated over the tree rows as SGLang does; the same statistic
rejects a greedy fall-back and a wrong temperature, so the test can fail.
"""

from __future__ import annotations

import math

import ci_requirements
import pytest

torch = ci_requirements.importorskip("torch")

from ddtree_support import ddtree_utils  # noqa: E402

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)

VOCAB = 6
DRAFT_POSITIONS = 4  # a DFlash block of 5: the root plus four drafted positions
BUDGET = 9


@pytest.fixture(scope="module")
def dd():
    return ddtree_utils()


class Toy:
    """Target: next-token logits depend on the last token only. Drafter: a noisy copy of it, rolled out
    greedily to give one distribution per draft position (what one DFlash pass provides)."""

    def __init__(self, dd, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.dd = dd
        self.target_logits = torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64) * 1.5
        self.draft_logits = self.target_logits + torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64) * 1.2
        self.position_noise = torch.randn(DRAFT_POSITIONS, VOCAB, generator=g, dtype=torch.float64) * 0.5
        trees = [self.tree(root) for root in range(VOCAB)]
        self.enc = dd.encode_eagle(trees)  # one tree per possible root token, rows indexed by root

    def drafter_rows(self, root: int) -> torch.Tensor:
        rows, tok = [], root
        for d in range(DRAFT_POSITIONS):
            logits = self.draft_logits[tok] + self.position_noise[d]
            rows.append(logits)
            tok = int(logits.argmax())
        return torch.stack(rows)

    def tree(self, root: int):
        lp, tok = self.dd.ddtree_topk_from_logits(self.drafter_rows(root), min(BUDGET, VOCAB))
        return self.dd.build_ddtree(lp, tok, BUDGET, root)

    def batch(self, roots: torch.Tensor):
        bs, w = roots.numel(), self.enc.width
        return (self.enc.draft_tokens[roots], torch.arange(bs * w).view(bs, w),
                self.enc.retrieve_next_token[roots], self.enc.retrieve_next_sibling[roots])


def target_probs(toy: Toy, draft: torch.Tensor, temps: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    """Per-node target distributions, [bs, W, V]: request parameters repeated by the tree width."""
    bs, w = draft.shape
    logits = toy.target_logits[draft.reshape(-1)]  # row b*W + k: after node k of request b
    t = toy.dd.repeat_per_node(temps, w).unsqueeze(1)
    k = toy.dd.repeat_per_node(top_ks, w)
    probs = torch.softmax(logits / t, dim=-1)
    kth = probs.sort(dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
    probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    return (probs / probs.sum(-1, keepdim=True)).view(bs, w, VOCAB)


def decode(toy: Toy, start: torch.Tensor, n: int, mode: str, gen: torch.Generator,
           temps: torch.Tensor | None = None, top_ks: torch.Tensor | None = None):
    """DDTree rounds until every row committed ``n`` tokens; returns [bs, n] and the mean tokens per round."""
    dd = toy.dd
    bs = start.numel()
    out = [[] for _ in range(bs)]
    last = start.clone()
    rounds = committed = 0
    todo = torch.arange(bs)
    while todo.numel():
        draft, ridx, nxt, sib = toy.batch(last[todo])
        spec = toy.enc.num_spec_tokens()
        if mode == "greedy":
            predict = toy.target_logits[draft.reshape(-1)].argmax(-1)
            pred, acc, num = dd.verify_tree_greedy_reference(draft, ridx, nxt, sib, predict, spec)
        else:
            probs = target_probs(toy, draft, temps[todo], top_ks[todo])
            coins = torch.rand(draft.shape, generator=gen, dtype=torch.float64)
            final = torch.rand(todo.numel(), generator=gen, dtype=torch.float64)
            pred, acc, num = dd.verify_tree_sampling_reference(draft, ridx, nxt, sib, probs, coins, final, spec)
        toks = dd.committed_tokens(pred, acc, num)
        rounds += todo.numel()
        committed += sum(len(t) for t in toks)
        keep = []
        for i, row in enumerate(todo.tolist()):
            out[row].extend(toks[i])
            last[row] = toks[i][-1]
            if len(out[row]) < n:
                keep.append(row)
        todo = torch.tensor(keep, dtype=torch.int64)
    return torch.tensor([r[:n] for r in out]), committed / rounds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_ddtree_equals_greedy_autoregressive(dd, seed):
    toy = Toy(dd, seed)
    starts = torch.arange(VOCAB)
    n = 40
    got, tokens_per_round = decode(toy, starts, n, "greedy", torch.Generator().manual_seed(seed))
    for s in range(VOCAB):
        tok, ref = s, []
        for _ in range(n):
            tok = int(toy.target_logits[tok].argmax())
            ref.append(tok)
        assert got[s].tolist() == ref
    assert tokens_per_round > 1.0, "the tree should accept drafts at all"


def exact_three_token(toy: Toy, start: int, temp: float, top_k: int) -> torch.Tensor:
    probs = torch.softmax(toy.target_logits / temp, dim=-1)
    kth = probs.sort(dim=-1, descending=True).values[:, top_k - 1: top_k]
    probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    p = probs / probs.sum(-1, keepdim=True)
    # [x1, x2, x3] = p(x1 | start) p(x2 | x1) p(x3 | x2)
    return p[start][:, None, None] * p[:, :, None] * p.unsqueeze(0)


def chi_square(samples: torch.Tensor, expected_p: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic over three-token outcomes, cells with expected count < 5 pooled."""
    n = samples.shape[0]
    idx = samples[:, 0] * VOCAB * VOCAB + samples[:, 1] * VOCAB + samples[:, 2]
    counts = torch.bincount(idx, minlength=VOCAB**3).double()
    exp = expected_p.reshape(-1) * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    ex = torch.cat([exp[big], exp[~big].sum().view(1)])
    keep = ex > 0
    if bool((obs[~keep] > 0).any()):
        return math.inf, int(keep.sum()) - 1  # an impossible outcome was sampled
    stat = float(((obs[keep] - ex[keep]) ** 2 / ex[keep]).sum())
    return stat, int(keep.sum()) - 1


def critical(df: int) -> float:
    """A generous bound (about 5 standard deviations) on a chi-square with ``df`` degrees of freedom."""
    return df + 5.0 * math.sqrt(2.0 * df)


def test_sampled_ddtree_follows_the_target_distribution(dd):
    toy = Toy(dd, 7)
    groups = [(0.7, VOCAB), (1.3, VOCAB), (1.0, 2)]  # (temperature, top_k) per request
    per = 12000
    temps = torch.tensor([t for t, _ in groups for _ in range(per)], dtype=torch.float64)
    top_ks = torch.tensor([k for _, k in groups for _ in range(per)], dtype=torch.int64)
    start = 0
    samples, tokens_per_round = decode(toy, torch.full((len(temps),), start), 3, "sample",
                                       torch.Generator().manual_seed(1234), temps, top_ks)
    assert tokens_per_round > 1.2
    for g, (temp, top_k) in enumerate(groups):
        part = samples[g * per: (g + 1) * per]
        stat, df = chi_square(part, exact_three_token(toy, start, temp, top_k))
        assert stat < critical(df), (temp, top_k, stat, df)
    # the statistic has power: the wrong temperature and a greedy fall-back both fail it
    stat, df = chi_square(samples[:per], exact_three_token(toy, start, 1.3, VOCAB))
    assert stat > critical(df)
    greedy, _ = decode(toy, torch.full((per,), start), 3, "greedy", torch.Generator().manual_seed(0))
    stat, df = chi_square(greedy, exact_three_token(toy, start, 0.7, VOCAB))
    assert stat > critical(df)


def test_top_k_zero_mass_tokens_are_never_committed(dd):
    toy = Toy(dd, 11)
    n = 4000
    temps = torch.ones(n, dtype=torch.float64)
    top_ks = torch.full((n,), 1, dtype=torch.int64)  # top-k 1 at temperature 1 is greedy by definition
    sampled, _ = decode(toy, torch.zeros(n, dtype=torch.int64), 5, "sample",
                        torch.Generator().manual_seed(5), temps, top_ks)
    greedy, _ = decode(toy, torch.zeros(1, dtype=torch.int64), 5, "greedy", torch.Generator())
    assert bool((sampled == greedy).all())
