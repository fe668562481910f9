"""Speculative decoding of the trained pair, simulated exactly with the torch models: DFLASH and DDTREE as
SGLang runs them.

One *round* per request, as the DFlash spec-v2 worker and the patch set's DDTREE worker do it:

1. the drafter's block ``[root, mask x 7]`` at positions ``n .. n + 7`` (``n``: tokens whose target KV
   exists; the root is the last committed token, not yet in the KV) over the context features of
   positions ``0 .. n - 1``;
2. per draft position the top-k of the log-softmax of the target's LM head on the drafter's hidden states
   (``ddtree_topk_from_logits``); DDTREE: ``build_ddtree`` with ``k = min(budget, vocab)``; DFLASH: the
   chain of the argmaxes (``build_ddtree`` with top-1 and budget ``block - 1``, which is that chain);
3. one target forward over the ``W`` nodes (``encode_eagle``: positions ``n + depth``, the committed
   slots plus each node's ancestors as the mask);
4. acceptance with the patch set's reference verifiers -- ``verify_tree_greedy_reference`` at
   temperature 0, ``verify_tree_sampling_reference`` (target-only: thresholds 1.0; DFLASH's sampling path
   is the same kernel on its chain, ``dflash_utils.compute_dflash_sampling_correct_drafts_and_bonus``)
   otherwise, with the target's ``softmax(logits / T)``;
5. commit: the accepted path's KV kept (positions ``n .. n + accepted``), the rest dropped; the path's
   target features appended to the drafter's context; the bonus becomes the next root.

The first generated token comes from the prefill, as in SGLang. *Accept length* = committed tokens per
round (accepted drafts + the bonus), SGLang's ``completion_tokens / spec_verify_ct`` without the
prefill's token.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pair_models as pm
import torch

PATCH_SET = Path(__file__).resolve().parents[2] / "sglang_patches" / "ddtree-0.5.23"
UTILS_PATH = "sglang/srt/speculative/ddtree_utils.py"


def load_ddtree_utils(path: Path | None = None) -> ModuleType:
    """The patch set's ``ddtree_utils.py``: ``path`` (an applied copy), else the file its first patch
    creates, rebuilt from the repository's diff and checked against the manifest's sha256."""
    if path is None:
        manifest = json.loads((PATCH_SET / "manifest.json").read_text())
        entry = next((p, f) for p in manifest["patches"] for f in p["files"] if f["path"] == UTILS_PATH)
        lines = (PATCH_SET / entry[0]["diff"]).read_text().splitlines(keepends=True)
        start = next(i for i, ln in enumerate(lines) if ln.startswith("+++ ") and ln.rstrip().endswith(UTILS_PATH))
        body = []
        for ln in lines[start + 2:]:
            if ln.startswith(("--- ", "diff ")):
                break
            if ln.startswith("+"):
                body.append(ln[1:])
        text = "".join(body)
        if hashlib.sha256(text.encode()).hexdigest() != entry[1]["after"]:
            raise RuntimeError(f"{UTILS_PATH} rebuilt from {entry[0]['diff']} does not match the manifest's sha256")
        path = Path(tempfile.mkdtemp(prefix="ddtree-utils-")) / "ddtree_utils.py"
        path.write_text(text)
    name = "k26_pair_ddtree_utils"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True)
class Algo:
    name: str  # "DFLASH" or "DDTREE"
    budget: int = 0  # DDTREE only
    temperature: float = 0.0

    @property
    def label(self) -> str:
        return "DFLASH" if self.name == "DFLASH" else f"DDTREE-{self.budget}"


class Session:
    """A batch of requests decoding together: the target's KV (slots valid per request), the drafter's
    context features, the committed tokens."""

    def __init__(self, target: pm.Dsv3, prompts: list[list[int]], layer_ids: list[int]) -> None:
        self.target = target
        self.layer_ids = layer_ids
        dev = target.lm_head.weight.device
        self.dev = dev
        b = len(prompts)
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        width = int(lens.max())
        ids = torch.zeros(b, width, dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, :len(p)] = torch.tensor(p)
        self.cache = pm.KVCache()
        out = target(ids, cache=self.cache)
        slot = torch.arange(width, device=dev)
        self.valid = slot[None] < lens[:, None]  # [B, T]
        # [B, T, F]: the drafter's context features, slot j = position j (none for plain decoding)
        self.feats = target.context_features(out, layer_ids) if layer_ids else None
        self.n = lens.clone()  # committed tokens with KV
        self.last_logits = out.logits[torch.arange(b, device=dev), lens - 1]  # [B, V]

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, self_mask: torch.Tensor) -> pm.TargetOut:
        """The target over new tokens ``[B, Q]`` reading every valid slot and ``self_mask`` ``[B, Q, Q]``."""
        q = tokens.shape[1]
        allowed = torch.cat([self.valid[:, None, :].expand(-1, q, -1), self_mask], dim=-1)
        return self.target(tokens, positions, pm.additive(allowed)[:, None], self.cache)

    def commit(self, rows: list[list[int]], out: pm.TargetOut, q: int, active: torch.Tensor) -> None:
        """Keep, for each request, the new slots ``rows[b]`` (local indices among the ``q`` new tokens, in
        position order): their KV stays, their features join the drafter's context."""
        b = len(rows)
        new_valid = torch.zeros(b, q, dtype=torch.bool, device=self.dev)
        feats = self.target.context_features(out, self.layer_ids)
        grow = max(int(self.n.max()) + q, self.feats.shape[1])
        if grow > self.feats.shape[1]:
            pad = self.feats.new_zeros(b, grow - self.feats.shape[1], self.feats.shape[2])
            self.feats = torch.cat([self.feats, pad], dim=1)
        for i, keep in enumerate(rows):
            if not bool(active[i]) or not keep:
                continue
            idx = torch.tensor(keep, device=self.dev)
            new_valid[i, idx] = True
            n = int(self.n[i])
            self.feats[i, n:n + len(keep)] = feats[i, idx]
            self.n[i] += len(keep)
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self._compact()

    def _compact(self) -> None:
        """Drop slots no request keeps (the rejected tree nodes), keeping each request's order."""
        counts = self.valid.sum(1)
        width = int(counts.max())
        order = torch.sort((~self.valid).to(torch.int8), dim=1, stable=True).indices[:, :width]
        self.cache.keep(order)
        self.valid = torch.arange(width, device=self.dev)[None] < counts[:, None]


def draft(drafter: pm.DFlashDrafter, target: pm.Dsv3, sess: Session, roots: torch.Tensor,
          mask_token: int) -> torch.Tensor:
    """Draft logits ``[B, block - 1, V]`` (float32) for blocks rooted at ``sess.n`` with tokens ``roots``."""
    block = drafter.shape.block
    b = roots.shape[0]
    ids = torch.full((b, block), mask_token, dtype=torch.long, device=sess.dev)
    ids[:, 0] = roots
    positions = sess.n[:, None] + torch.arange(block, device=sess.dev)[None]
    slots = sess.feats.shape[1]
    ctx = drafter.project(sess.feats)
    ctx_kv = drafter.context_kv(ctx, torch.arange(slots, device=sess.dev).expand(b, slots))
    allowed = pm.block_allowed(sess.n, slots, sess.n[:, None], block)
    hidden = drafter(target.model.embed_tokens(ids), positions, ctx_kv, allowed)
    return pm.draft_logits(hidden[:, 1:], target.lm_head.weight)


def sample_first(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> torch.Tensor:
    if temperature == 0.0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, -1)
    return torch.multinomial(probs.cpu(), 1, generator=gen).view(-1).to(logits.device)


def make_trees(dd: ModuleType, logits: torch.Tensor, roots: list[int], algo: Algo, block: int) -> list:
    """One tree per request from draft logits ``[B, block - 1, V]``: DDTREE's best-first tree of ``budget``
    nodes over the top-``min(budget, V)`` tokens per position, or DFLASH's chain of argmaxes."""
    vocab = logits.shape[-1]
    trees = []
    for i, root in enumerate(roots):
        if algo.name == "DDTREE":
            lp, tk = dd.ddtree_topk_from_logits(logits[i], min(algo.budget, vocab))
            trees.append(dd.build_ddtree(lp, tk, algo.budget, root))
        else:
            lp, tk = dd.ddtree_topk_from_logits(logits[i], 1)
            trees.append(dd.build_ddtree(lp, tk, block - 1, root))
    return trees


def accept(dd: ModuleType, enc, target_logits: torch.Tensor, temperature: float, gen: torch.Generator):
    """The reference verifiers on target logits ``[B, W, V]``: committed tokens and accepted path nodes."""
    num_spec = enc.num_spec_tokens()
    b, width = enc.draft_tokens.shape
    links = (enc.draft_tokens, enc.retrieve_index, enc.retrieve_next_token, enc.retrieve_next_sibling)
    if temperature == 0.0:
        res = dd.verify_tree_greedy_reference(*links, target_logits.argmax(-1).reshape(-1).cpu(), num_spec)
    else:
        probs = torch.softmax(target_logits.double().cpu() / temperature, -1)
        coins = torch.rand((b, width), generator=gen, dtype=torch.float64)
        final = torch.rand((b,), generator=gen, dtype=torch.float64)
        res = dd.verify_tree_sampling_reference(*links, probs, coins, final, num_spec)
    return dd.committed_tokens(*res), dd.accepted_path_nodes(res[1], res[2], width)


def summary(algo: Algo, outputs: list[list[int]], rounds: list[list[int]], max_new: int) -> dict:
    """Outputs and rounds; ``accept_length`` = committed tokens per round; ``completion_tokens_per_verify``
    = what serve_check.py reports (the prefill's token included, outputs cut at ``max_new``)."""
    n_rounds = sum(len(r) for r in rounds)
    completion = sum(min(len(o), max_new) for o in outputs)
    return {"algo": algo.label, "temperature": algo.temperature, "outputs": [o[:max_new] for o in outputs],
            "rounds": rounds, "n_rounds": n_rounds,
            "accept_length": sum(sum(r) for r in rounds) / n_rounds if n_rounds else None,
            "completion_tokens_per_verify": completion / n_rounds if n_rounds else None}


def run(target: pm.Dsv3, drafter: pm.DFlashDrafter, dd: ModuleType, prompts: list[list[int]], algo: Algo,
        max_new: int, mask_token: int, seed: int = 0) -> dict:
    """Decode ``prompts`` with ``algo`` until each has ``max_new`` tokens (see :func:`summary`)."""
    gen = torch.Generator().manual_seed(seed)
    block = drafter.shape.block
    with torch.no_grad():
        sess = Session(target, prompts, list(drafter.shape.target_layer_ids))
        b = len(prompts)
        roots = sample_first(sess.last_logits, algo.temperature, gen)
        outputs = [[int(r)] for r in roots]
        rounds: list[list[int]] = [[] for _ in range(b)]
        while True:
            active = torch.tensor([len(o) < max_new for o in outputs], device=sess.dev)
            if not bool(active.any()):
                break
            logits = draft(drafter, target, sess, roots, mask_token)
            enc = dd.encode_eagle(make_trees(dd, logits, [int(r) for r in roots], algo, block),
                                  prefix_lens=sess.n.cpu())
            out = sess.forward(enc.draft_tokens.to(sess.dev), enc.positions.view(b, -1).to(sess.dev),
                               enc.tree_mask.to(sess.dev))
            committed, paths = accept(dd, enc, out.logits, algo.temperature, gen)
            sess.commit(paths, out, enc.width, active)
            for i in range(b):
                if bool(active[i]):
                    outputs[i].extend(committed[i])
                    rounds[i].append(len(committed[i]))
                    roots[i] = committed[i][-1]
    return summary(algo, outputs, rounds, max_new)


def log_probs(dist: dict[int, float] | None, vocab: int) -> torch.Tensor:
    """Log of an exact distribution as logits (zero mass: -1e4; unknown text: uniform)."""
    out = torch.full((vocab,), -1e4 if dist else 0.0, dtype=torch.float64)
    for tok, p in (dist or {}).items():
        out[tok] = torch.log(torch.tensor(p, dtype=torch.float64))
    return out


def run_ideal(lang, dd: ModuleType, prompts: list[list[int]], algo: Algo, max_new: int, block: int = 8,
              seed: int = 0) -> dict:
    """The same rounds with the language itself as the target and its exact per-position marginals as the
    drafter: the ceiling a perfect pair would reach (no neural network involved)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = lang.vocab
    texts = [list(p) for p in prompts]
    roots = [int(sample_first(log_probs(lang.conditional(p), vocab)[None], algo.temperature, gen)) for p in texts]
    outputs = [[r] for r in roots]
    rounds: list[list[int]] = [[] for _ in prompts]
    while any(len(o) < max_new for o in outputs):
        idx = [i for i, o in enumerate(outputs) if len(o) < max_new]
        logits = torch.stack([torch.stack([log_probs(m, vocab) for m in
                                           lang.marginals(lang.parse(texts[i] + [roots[i]]), block - 1)])
                              for i in idx])
        trees = make_trees(dd, logits, [roots[i] for i in idx], algo, block)
        enc = dd.encode_eagle(trees)
        target = torch.stack([torch.stack([log_probs(lang.conditional(texts[i] + [tree.tokens[k] for k in
                                                                                  tree.path(node)]), vocab)
                                           for node in range(tree.size)]) for i, tree in zip(idx, trees, strict=True)])
        committed, _ = accept(dd, enc, target, algo.temperature, gen)
        for i, c in zip(idx, committed, strict=True):
            texts[i] += [roots[i], *c[:-1]]
            outputs[i].extend(c)
            rounds[i].append(len(c))
            roots[i] = c[-1]
    return summary(algo, outputs, rounds, max_new)


def greedy_decode(target: pm.Dsv3, prompts: list[list[int]], n: int) -> tuple[list[list[int]], list[list[float]]]:
    """Plain greedy decoding (no speculation) with a KV cache: the tokens and the top1 - top2 logit
    margin of every decision."""
    with torch.no_grad():
        sess = Session(target, prompts, [])
        b = len(prompts)
        logits = sess.last_logits
        outs: list[list[int]] = [[] for _ in range(b)]
        margins: list[list[float]] = [[] for _ in range(b)]
        eye = torch.ones(b, 1, 1, dtype=torch.bool, device=sess.dev)
        for _ in range(n):
            top = torch.topk(logits.float(), 2, dim=-1)
            tok = top.indices[:, 0]
            for i in range(b):
                outs[i].append(int(tok[i]))
                margins[i].append(float(top.values[i, 0] - top.values[i, 1]))
            out = sess.forward(tok[:, None], sess.n[:, None], eye)
            sess.valid = torch.cat([sess.valid, eye[:, :, 0]], dim=1)
            sess.n += 1
            logits = out.logits[:, 0]
    return outs, margins
