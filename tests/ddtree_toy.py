"""A toy target and drafter with a real slot-level KV pool, for running the DDTREE step (ddtree_step.py).

The toy target reads its context the way SGLang's verify attention does: the committed prefix through
``req_to_token`` and the tree nodes through ``out_cache_loc``, filtered by the *flattened* custom mask. Its
next-token logits depend on the current token and on a position-weighted hash of every visible (token,
position) in the KV pool, so a wrong mask, position, slot reservation or KV move changes the output. The
drafter reads the draft KV (the target hidden states appended for committed tokens) and its top-k goes
through a simulated tensor-parallel vocab-parallel head (threads, an all-gather at a barrier).

Used by tests/test_ddtree_step.py (CPU, torch references of the verify kernels) and by
tests/ddtree_gpu_harness.py (SGLang's verify kernels). torch only; no pytest.
"""

from __future__ import annotations

import threading

import torch

V = 5  # vocabulary
M = 4  # context hash classes
BLOCK = 5  # DFlash block: the root plus four drafted positions
DEPTH = BLOCK - 1
MAX_LEN = 160  # req_to_token columns


class Toy:
    """Target: logits = A[token] + B[hash of every visible (token, position)]. Drafter: a noisy copy that
    starts from the hash stored in the draft KV of the last committed position."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.A = torch.randn(V, V, generator=g, dtype=torch.float64) * 1.5
        self.B = torch.randn(M, V, generator=g, dtype=torch.float64) * 1.5
        self.DA = self.A + torch.randn(V, V, generator=g, dtype=torch.float64)
        self.DB = self.B + torch.randn(M, V, generator=g, dtype=torch.float64)
        self.pos_noise = torch.randn(DEPTH, V, generator=g, dtype=torch.float64) * 0.5

    @staticmethod
    def weight(tok, pos):
        return tok * (pos + 1)

    def logits(self, tok, h):
        return self.A[tok] + self.B[h]

    def ar_logits(self, seq: list[int]) -> torch.Tensor:
        """Next-token logits after ``seq`` (autoregressive reference)."""
        h = sum(self.weight(t, p) for p, t in enumerate(seq)) % M
        return self.logits(seq[-1], h)


class Engine:
    """KV pools, req_to_token, an allocator and the toy forwards, around ddtree_step's functions."""

    def __init__(self, st, toy: Toy, prompts: list[list[int]], tp: int = 2):
        self.st, self.toy, self.tp = st, toy, tp
        self.pool = pool = max(4096, 16 * len(prompts))  # KV slots
        self.tok_pool = torch.full((pool,), -1, dtype=torch.int64)  # the target's "KV": token and position
        self.pos_pool = torch.full((pool,), -1, dtype=torch.int64)
        self.draft_pool = torch.full((pool, 3), -1.0, dtype=torch.float64)  # draft KV from target hidden
        self.free_slots = list(range(pool - 1, 0, -1))  # slot 0 is SGLang's padding slot
        self.allocs = 0
        bs = len(prompts)
        self.req_to_token = torch.zeros((bs + 2, MAX_LEN), dtype=torch.int64)
        self.req_pool_indices = torch.arange(2, bs + 2)  # not 0..bs-1: rows must be looked up
        self.prefix = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.int64)
        self.allocated = torch.zeros(bs, dtype=torch.int64)
        self.roots = torch.tensor([p[-1] for p in prompts], dtype=torch.int64)
        # prefill: KV (and draft KV) of every prompt token but the last, which is the first root
        self.allocated = st.reserve_verify_slots(self.req_to_token, self.req_pool_indices, self.prefix,
                                                 self.allocated, 0, self.alloc)
        for b, p in enumerate(prompts):
            slots = self.req_to_token[int(self.req_pool_indices[b]), : len(p) - 1]
            h = 0
            for pos, (slot, t) in enumerate(zip(slots.tolist(), p[:-1], strict=True)):
                h = (h + toy.weight(t, pos)) % M
                self.tok_pool[slot], self.pos_pool[slot] = t, pos
                self.draft_pool[slot] = torch.tensor([h, t, pos], dtype=torch.float64)

    # allocator ---------------------------------------------------------------------------------
    def alloc(self, n: int):
        if n > len(self.free_slots):
            return None
        self.allocs += n
        return torch.tensor([self.free_slots.pop() for _ in range(n)], dtype=torch.int64)

    def free(self, slots: torch.Tensor):
        assert len(set(slots.tolist())) == slots.numel()
        assert not set(slots.tolist()) & set(self.free_slots), "double free"
        self.free_slots.extend(slots.tolist())

    # drafter -----------------------------------------------------------------------------------
    def draft_topk(self, budgets: list[int]):
        """Per-position top-k log-probs through a simulated TP vocab-parallel head (threads + barrier)."""
        toy = self.toy
        bs = self.roots.numel()
        last_slot = self.req_to_token[self.req_pool_indices, (self.prefix - 1).clamp(min=0)]
        h = torch.where(self.prefix > 0, self.draft_pool[last_slot, 0].to(torch.int64),
                        torch.zeros(bs, dtype=torch.int64))
        tok = self.roots.clone()
        h = (h + toy.weight(tok, self.prefix)) % M
        rows = []
        for d in range(DEPTH):
            lg = toy.DA[tok] + toy.DB[h] + toy.pos_noise[d]
            rows.append(lg)
            tok = lg.argmax(-1)
            h = (h + toy.weight(tok, self.prefix + d + 1)) % M
        logits = torch.stack(rows, dim=1).reshape(bs * DEPTH, V)
        k = min(max(max(budgets), 1), V)
        return self.vocab_parallel(logits, k)

    def vocab_parallel(self, logits: torch.Tensor, k: int):
        shard = -(-V // self.tp)  # padded local vocab
        results: list = [None] * self.tp
        gathered: list = [None] * self.tp
        barrier = threading.Barrier(self.tp)

        def gather_for(rank):
            def gather(packed):  # the TP group's all-gather of each rank's packed candidates, stacked
                gathered[rank] = packed
                barrier.wait()
                out = torch.stack([gathered[r] for r in range(self.tp)])
                barrier.wait()
                return out
            return gather

        def run(rank):
            start = rank * shard
            local = torch.full((logits.shape[0], shard), 123.0, dtype=logits.dtype)  # padding columns
            real = max(0, min(V - start, shard))
            local[:, :real] = logits[:, start: start + real]
            results[rank] = self.st.vocab_parallel_topk(local, k, start, real, gather_for(rank))

        threads = [threading.Thread(target=run, args=(r,)) for r in range(self.tp)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in range(1, self.tp):  # every rank must hold the same tree input
            assert torch.equal(results[r][0], results[0][0]) and torch.equal(results[r][1], results[0][1])
        lp, ids = results[0]
        bs = logits.shape[0] // DEPTH
        return lp.view(bs, DEPTH, -1), ids.view(bs, DEPTH, -1)

    # target ------------------------------------------------------------------------------------
    def target_forward(self, tv):
        """Write every node's KV at out_cache_loc, then attend as the verify kernel does: the prefix
        through req_to_token, the tree through out_cache_loc, cells from the flattened custom mask.

        Vectorised over the batch. The compact layout (``tv.compact_mask``, what the patched Triton kernel
        reads for DDTREE): request b's ``w x w`` tree cells at offset ``b * w * w``, the prefix visible to
        every node. The reference (FULL_MASK) layout: the ``w x (n_b + w)`` block at offset
        ``sum_{c<b} w * (n_c + w)``, its first ``n_b`` columns for the prefix. Columns are the prefix slots
        (req_to_token) then the tree slots (out_cache_loc); cells past a request's ``n_b + w`` are padding."""
        toy = self.toy
        w, bs = tv.width, tv.batch.bs
        self.tok_pool[tv.out_cache_loc] = tv.input_ids
        self.pos_pool[tv.out_cache_loc] = tv.positions
        n = tv.prefix_lens.to(torch.int64)
        cols = int(n.max()) + w if bs else w
        j = torch.arange(cols).view(1, 1, cols)
        i = torch.arange(w).view(1, w, 1)
        valid = (j < (n + w).view(bs, 1, 1)).expand(bs, w, cols)
        mask = torch.zeros(bs, w, cols, dtype=torch.bool)
        if tv.compact_mask:
            assert tv.custom_mask.numel() == bs * w * w, "compact mask: W x W cells per request"
            tree = tv.custom_mask.view(bs, w, w)
            in_tree = valid & (j >= n.view(bs, 1, 1))
            tree_col = (j - n.view(bs, 1, 1)).clamp(0, w - 1).expand(bs, w, cols)
            mask = (valid & ~in_tree) | (in_tree & tree.gather(2, tree_col))
        else:
            sizes = w * (n + w)
            assert int(sizes.sum()) == tv.custom_mask.numel()
            offsets = torch.cumsum(sizes, 0) - sizes
            flat = offsets.view(bs, 1, 1) + i * (n + w).view(bs, 1, 1) + j
            mask[valid] = tv.custom_mask[flat[valid]]
        rows = self.req_to_token[self.req_pool_indices]  # [bs, MAX_LEN]
        jj = j.view(1, cols).expand(bs, cols)
        is_prefix = jj < n.view(bs, 1)
        tree_col = (jj - n.view(bs, 1)).clamp(0, w - 1)
        kv = torch.where(is_prefix, rows.gather(1, jj.clamp(max=rows.shape[1] - 1)),
                         tv.out_cache_loc.view(bs, w).gather(1, tree_col))
        vals = toy.weight(self.tok_pool[kv], self.pos_pool[kv])  # [bs, cols]
        vals = torch.where(jj < (n + w).view(bs, 1), vals, torch.zeros_like(vals))
        h = ((mask.to(torch.int64) * vals.view(bs, 1, cols)).sum(-1) % M).reshape(-1)
        tok = tv.input_ids
        logits = toy.A[tok] + toy.B[h]
        hidden = torch.stack([h, tok, tv.positions], dim=1).to(torch.float64)
        return logits, hidden

    def move_kv(self, src, dst):
        self.st.apply_kv_moves([self.tok_pool, self.pos_pool], src, dst)

    def append_draft_kv(self, hidden, cache_loc, positions, commit_lens):
        w = hidden.shape[0] // commit_lens.numel()
        keep = (torch.arange(w).view(1, -1) < commit_lens.view(-1, 1).to(torch.int64)).reshape(-1)
        assert torch.equal(hidden[keep, 2].to(torch.int64), positions[keep]), "hidden rows out of path order"
        self.draft_pool[cache_loc[keep]] = hidden[keep]

    # one round ---------------------------------------------------------------------------------
    def round(self, budgets: list[int], width: int, accept, reference: bool = False):
        """One ``ddtree_round``; ``reference``: revision 3's host tree builder, FULL_MASK mask and commit plan."""
        lp, ids = self.draft_topk(budgets)
        impl = dict(build=self.st.build_tree_verify_reference, commit=self.st.plan_commit_reference) if reference \
            else {}
        plan, self.allocated = self.st.ddtree_round(
            req_to_token=self.req_to_token, req_pool_indices=self.req_pool_indices, prefix_lens=self.prefix,
            allocated_lens=self.allocated, root_tokens=self.roots, topk_log_probs=lp, topk_tokens=ids,
            budgets=budgets, width=width, alloc=self.alloc, free=self.free, target_forward=self.target_forward,
            accept=accept, move_kv=self.move_kv, append_draft_kv=self.append_draft_kv, reserve_width=BLOCK, **impl)
        self.prefix = plan.new_seq_lens
        self.roots = plan.bonus_tokens
        return self.st.committed_token_lists(plan.out_tokens, plan.commit_lens)

    def check_state(self, seqs: list[list[int]]):
        """Committed KV, draft KV and slot accounting equal what autoregressive decoding of ``seqs`` gives."""
        toy = self.toy
        for b, seq in enumerate(seqs):
            n = int(self.prefix[b])
            assert n == len(seq) - 1 and int(self.roots[b]) == seq[-1]
            assert int(self.allocated[b]) == n
            slots = self.req_to_token[int(self.req_pool_indices[b]), :n]
            assert self.tok_pool[slots].tolist() == seq[:-1]
            assert self.pos_pool[slots].tolist() == list(range(n))
            h, want = 0, []
            for pos, t in enumerate(seq[:-1]):
                h = (h + toy.weight(t, pos)) % M
                want.append([h, t, pos])
            assert self.draft_pool[slots].tolist() == [[float(x) for x in r] for r in want]
        in_use = self.pool - 1 - len(self.free_slots)
        assert in_use == int(self.allocated.sum()), "leaked or double-counted KV slots"


def ar_greedy(toy: Toy, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(toy.ar_logits(seq).argmax()))
    return seq[len(prompt):]


def exact_three(toy: Toy, prompt: list[int], temp: float, top_k: int, top_p: float) -> torch.Tensor:
    """Exact distribution of the next three tokens (autoregressive, top-k then top-p), [V, V, V]."""
    def dist(seq):
        p = torch.softmax(toy.ar_logits(seq) / temp, -1)
        sp, order = p.sort(descending=True)
        sp[top_k:] = 0
        sp = sp / sp.sum()
        before = sp.cumsum(0) - sp
        sp[(before >= top_p) & (torch.arange(V) > 0)] = 0
        return torch.zeros(V, dtype=torch.float64).scatter(0, order, sp / sp.sum())

    out = torch.zeros(V, V, V, dtype=torch.float64)
    d1 = dist(prompt)
    for a in range(V):
        if d1[a] == 0:
            continue
        d2 = dist([*prompt, a])
        for b in range(V):
            if d2[b] > 0:
                out[a, b] = d1[a] * d2[b] * dist([*prompt, a, b])
    return out


def sample_three(st, toy, prompt, groups, per, seed, accept_factory):
    """Sample the next three tokens after ``prompt`` for ``per`` requests of each (temperature, top-k, top-p)
    group, all in one batch; returns their outcome codes and the mean tokens committed per round."""
    bs = len(groups) * per
    temps = torch.tensor([g[0] for g in groups for _ in range(per)], dtype=torch.float64)
    top_ks = torch.tensor([g[1] for g in groups for _ in range(per)], dtype=torch.int64)
    top_ps = torch.tensor([g[2] for g in groups for _ in range(per)], dtype=torch.float64)
    eng = Engine(st, toy, [prompt] * bs)
    gen = torch.Generator().manual_seed(seed)
    accept = accept_factory(temps, top_ks, top_ps, gen)
    outs = [[] for _ in range(bs)]
    rounds = 0
    while min(len(o) for o in outs) < 3:
        for b, toks in enumerate(eng.round([6] * bs, 7, accept)):
            outs[b].extend(toks)
        rounds += 1
    eng.check_state([prompt + o for o in outs])
    codes = torch.tensor([o[0] * V * V + o[1] * V + o[2] for o in outs])
    return codes, sum(len(o) for o in outs) / (rounds * bs)


