#!/usr/bin/env python3
"""A TRAINED tiny target + DFlash drafter pair on which DDTree's losslessness and worth can be shown in real servers.

``make_tiny.py``'s random pair proves nothing (a chaotic MoE target under bf16, accept length 1.03). This
script trains, deterministically from a seed:

* a target with the K2.6 text path's shape (``DeepseekV3ForCausalLM``: MLA with q_lora 64, kv_lora 512,
  rope 64 / nope 128 / v 128 heads; layer 0 dense, then MoE with 8 routed experts, 2 per token, 1 shared;
  ``noaux_tc`` sigmoid routing with a non-zero ``e_score_correction_bias``) on the synthetic language of
  ``synthlang.py``, against its exact next-token distributions, with a hinge on every MoE layer's gap
  between the 2nd and 3rd biased router score so that bf16 noise cannot flip an expert choice;
* a DFlash drafter (``DFlashDraftModel``: 2 layers, block 8, mask token 63, ``target_layer_ids`` [1, 2])
  on that target's hidden states, against the exact per-position marginals of the next 7 tokens.

Written to ``OUT/dsv3`` (``save_pretrained``, bf16 safetensors, plus the DeepSeek-V3 config keys SGLang's
``deepseek_v2.py`` reads), ``OUT/dsv3-dflash`` (the layout of SGLang 0.5.23's ``models/dflash.py``),
``OUT/language.json`` and ``OUT/build.json`` (recipe, versions, sha256 of every file); the same seed, recipe
and device give the same bytes. ``--report`` evaluates the saved pair exactly on the CPU (or ``--device``):
target fit, router margins, bf16-vs-fp32 differences, greedy margins, and speculative decoding simulated
with the patch set's own tree builder and verifiers (``specsim.py``), into ``OUT/report.json``: the
predictions a real server run is checked against.

Usage::

    python bench/ddtree/make_trained.py OUT [--device cpu|cuda] [--seed 0] [--report]
    python bench/ddtree/make_trained.py --prompts N --kind greedy|sampled --seed S -o FILE.json

The pair is trained on texts of 256 tokens: keep prompt + generated tokens within that (the prompt sets
are at most 128 tokens long).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthlang

TARGET_DIR, DRAFTER_DIR = "dsv3", "dsv3-dflash"
ROUTER_BIAS_SPAN = 0.2  # e_score_correction_bias drawn in [-0.1, 0.1]: a tie-breaker that decides some choices


@dataclass(frozen=True)
class Recipe:
    seq_len: int = 256
    target_steps: int = 480
    target_batch: int = 8
    target_lr: float = 3e-3
    hinge_margin: float = 0.1
    hinge_weight: float = 1.0
    # The greedy decision's own margin: top-1 minus the best other logit, asked to be at least this at a
    # branch point (the language's own is log(0.55/0.30) = 0.61) and at a certain position; cross-entropy
    # alone left 1% of branch points within 0.05 of a tie, which bf16 noise flips.
    branch_margin: float = 0.5
    certain_margin: float = 3.0
    margin_weight: float = 1.0
    balance_weight: float = 0.1
    drafter_texts: int = 160
    drafter_steps: int = 300
    drafter_batch: int = 8
    anchors: int = 32
    drafter_lr: float = 2e-3


RECIPES = {
    "full": Recipe(),
    # Seconds on a CPU: the layouts, determinism and plumbing, not the quality (tests).
    "mini": Recipe(seq_len=24, target_steps=3, target_batch=2, drafter_texts=4, drafter_steps=3, drafter_batch=2,
                   anchors=4),
}


def log(msg: str) -> None:
    print(msg, flush=True)


def torch_setup(device: str):
    """Float32 matmuls without TF32 and torch's deterministic kernels where it has them (CUDA): the same
    seed on the same device and stack gives the same bytes."""
    import os

    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    # One CPU thread: reductions then run in one order on every host (the bytes do not depend on the core
    # count), and on a shared machine one thread wastes no time spinning (a training step took 1.6 CPU-s
    # with one thread and 8.7 with two on a loaded 2-core host).
    torch.set_num_threads(1)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is visible to torch")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    return torch


# -- data -----------------------------------------------------------------------------------------


def soft_targets(lang: synthlang.Language, text: list[int]):
    """``[len, vocab]`` exact next-token distributions of every prefix of ``text``."""
    import torch

    out = torch.zeros(len(text), lang.vocab)
    for i, dist in enumerate(lang.next_distributions(text)):
        for tok, p in dist.items():
            out[i, tok] = p
    return out


class MarginalTable:
    """Exact per-position marginals of the next ``depth`` tokens, memoised by state (the drafter's target)."""

    def __init__(self, lang: synthlang.Language, depth: int) -> None:
        self.lang, self.depth = lang, depth
        self.memo: dict = {}

    def get(self, state):
        import torch

        if state not in self.memo:
            t = torch.zeros(self.depth, self.lang.vocab)
            for d, dist in enumerate(self.lang.marginals(state, self.depth)):
                for tok, p in dist.items():
                    t[d, tok] = p
            self.memo[state] = t
        return self.memo[state]


# -- target ---------------------------------------------------------------------------------------


def router_gaps(routing, k: int):
    """Per token: the k-th minus the (k+1)-th biased router score (the margin of the top-k decision)."""
    import torch

    top = torch.topk(routing.choice, k + 1, dim=-1).values
    return top[:, k - 1] - top[:, k]


def balance_loss(routing, experts: int, temperature: float = 0.05):
    """``E * sum_e q_e^2 - 1`` (0 when the load is uniform), ``q`` the mean over tokens of a sharp softmax of
    the biased choice scores: without it the hinge is met most easily by the bias alone, sending every
    token to the same two experts (a MoE that never routes)."""
    import torch

    q = torch.softmax(routing.choice / temperature, dim=-1).mean(0)
    return experts * (q * q).sum() - 1.0


def decision_margin_loss(logits, tgt, branch_margin: float, certain_margin: float):
    """Mean hinge on ``logit[argmax tgt] - max other logit`` below its floor (``branch_margin`` where the exact
    distribution has several tokens, ``certain_margin`` where it has one): the greedy decision made robust to
    the rounding of another kernel, the property the lossless criterion needs of the target."""
    import torch

    want = tgt.argmax(-1, keepdim=True)
    top = logits.gather(-1, want).squeeze(-1)
    other = logits.scatter(-1, want, float("-inf")).max(-1).values
    branch = (tgt > 0).sum(-1) > 1
    floor = torch.where(branch, torch.full_like(top, branch_margin), torch.full_like(top, certain_margin))
    return torch.relu(floor - (top - other)).mean()


def lr_at(step: int, steps: int, base: float, warmup: int = 20) -> float:
    return base * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / max(1, steps))))


def optimise(opt, module, loss, lr: float) -> None:
    """One AdamW step at ``lr`` with the gradient norm clipped to 1."""
    import torch

    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
    opt.step()


def train_target(lang: synthlang.Language, recipe: Recipe, seed: int, device: str):
    import pair_models as pm
    import torch

    torch.manual_seed(seed)
    model = pm.Dsv3()
    pm.init_(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for i in model.moe_layers():
            bias = (torch.rand(model.shape.experts, generator=g) - 0.5) * ROUTER_BIAS_SPAN
            model.model.layers[i].mlp.gate.e_score_correction_bias.copy_(bias.to(torch.bfloat16).float())
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.target_lr, betas=(0.9, 0.98), weight_decay=0.0)
    rng = random.Random(f"target-{seed}")
    k = model.shape.experts_per_tok
    t0 = time.perf_counter()
    for step in range(recipe.target_steps):
        texts = [lang.sample(rng, recipe.seq_len - 2) for _ in range(recipe.target_batch)]
        x = torch.tensor(texts, device=device)
        tgt = torch.stack([soft_targets(lang, t) for t in texts]).to(device)
        out = model(x)
        ce = -(tgt * torch.log_softmax(out.logits, -1)).sum(-1).mean()
        hinge = sum(torch.relu(recipe.hinge_margin - router_gaps(r, k)).mean() for r in out.routing)
        balance = sum(balance_loss(r, model.shape.experts) for r in out.routing) / len(out.routing)
        # The hinge weighs more as the fit converges: routing margins widen once the function is learnt.
        hinge_w = recipe.hinge_weight * (0.5 + 2.5 * step / max(1, recipe.target_steps - 1))
        margin = decision_margin_loss(out.logits, tgt, recipe.branch_margin, recipe.certain_margin)
        loss = ce + hinge_w * hinge + recipe.balance_weight * balance + recipe.margin_weight * margin
        optimise(opt, model, loss, lr_at(step, recipe.target_steps, recipe.target_lr))
        if step % 20 == 0 or step == recipe.target_steps - 1:
            ent = -(tgt * torch.log(tgt.clamp_min(1e-30))).sum(-1).mean()
            log(f"target step {step}: kl {float((ce - ent).detach()):.4f} hinge {float(hinge.detach()):.4f} "
                f"balance {float(balance.detach()):.3f} margin {float(margin.detach()):.4f} "
                f"({time.perf_counter() - t0:.0f} s)")
    return model


def save_target(model, out: Path) -> None:
    """``save_pretrained`` of a transformers DeepseekV3ForCausalLM holding the trained tensors (loaded by
    transformers from their checkpoint names: nothing missing, nothing unexpected), plus SGLang's keys."""
    import torch
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    with tempfile.TemporaryDirectory(prefix="dsv3-") as tmp:
        state = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
        DeepseekV3Config(**model.shape.hf_config_kwargs()).save_pretrained(tmp)
        hf, info = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float32, output_loading_info=True)
        bad = {k: sorted(v) for k, v in info.items() if v and k != "error_msgs"}
        if bad or info.get("error_msgs"):
            raise RuntimeError(f"transformers did not load the trained target cleanly: {bad} {info.get('error_msgs')}")
        hf.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    path = out / "config.json"
    config = json.loads(path.read_text())
    # DeepSeek-V3's (and Kimi K2's text) config keys that transformers does not write but SGLang's
    # deepseek_v2.py reads; no MTP layer.
    config.update({"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "ep_size": 1,
                   "num_nextn_predict_layers": 0, "torch_dtype": "bfloat16"})
    path.write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")


def load_target(out: Path, device: str = "cpu", dtype=None):
    """The saved target as :class:`pair_models.Dsv3` (its bf16 tensors, in ``dtype``, default float32)."""
    import pair_models as pm
    import torch
    from safetensors.torch import load_file

    model = pm.Dsv3()
    model.load_state_dict({k: v.float() for k, v in load_file(str(out / TARGET_DIR / "model.safetensors")).items()},
                          strict=True)
    return model.to(device=device, dtype=dtype or torch.float32).eval()


# -- drafter --------------------------------------------------------------------------------------


def drafter_batch(lang, table: MarginalTable, texts, anchors: int, block: int, rng: random.Random, device):
    """Block inputs and exact marginal targets for ``anchors`` random roots per text."""
    import torch

    roots, ids, tgts = [], [], []
    for t in texts:
        states = lang.states(t)
        picks = sorted(rng.sample(range(2, len(t)), min(anchors, len(t) - 2)))
        roots.append(picks)
        ids.append([[t[p]] + [lang.mask_token] * (block - 1) for p in picks])
        tgts.append(torch.stack([table.get(states[p]) for p in picks]))
    roots_t = torch.tensor(roots, device=device)
    ids_t = torch.tensor(ids, device=device).view(len(texts), -1)
    return roots_t, ids_t, torch.stack(tgts).to(device)


def drafter_loss(drafter, target, feats, roots, ids, tgts):
    """Soft cross-entropy of the drafter's per-position predictions against the exact marginals; the
    predictions as log-probs ``[B, K, block - 1, V]``."""
    import pair_models as pm
    import torch

    b, seq = feats.shape[:2]
    block = drafter.shape.block
    k = roots.shape[1]
    ctx = drafter.project(feats)
    ctx_kv = drafter.context_kv(ctx, torch.arange(seq, device=feats.device).expand(b, seq))
    allowed = pm.block_allowed(torch.full((b,), seq, device=feats.device), seq, roots, block)
    positions = (roots[..., None] + torch.arange(block, device=feats.device)).view(b, -1)
    hidden = drafter(target.model.embed_tokens(ids), positions, ctx_kv, allowed).view(b, k, block, -1)
    logp = torch.log_softmax(pm.draft_logits(hidden[:, :, 1:], target.lm_head.weight), -1)
    return -(tgts * logp).sum(-1).mean(), logp


def target_features(target, texts, device, layer_ids, chunk: int = 8):
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(texts), chunk):
            o = target(torch.tensor(texts[i:i + chunk], device=device))
            out.append(target.context_features(o, layer_ids))
    return torch.cat(out)


def train_drafter(lang: synthlang.Language, target, recipe: Recipe, seed: int, device: str):
    import pair_models as pm
    import torch

    torch.manual_seed(seed)
    drafter = pm.DFlashDrafter()
    pm.init_(drafter, seed + 7)
    drafter.to(device)
    for p in target.parameters():
        p.requires_grad_(False)
    layer_ids = list(drafter.shape.target_layer_ids)
    rng = random.Random(f"drafter-{seed}")
    texts = [lang.sample(rng, recipe.seq_len - 2) for _ in range(recipe.drafter_texts)]
    feats = target_features(target, texts, device, layer_ids)
    table = MarginalTable(lang, drafter.shape.block - 1)
    opt = torch.optim.AdamW(drafter.parameters(), lr=recipe.drafter_lr, betas=(0.9, 0.98), weight_decay=0.0)
    t0 = time.perf_counter()
    for step in range(recipe.drafter_steps):
        pick = rng.sample(range(len(texts)), recipe.drafter_batch)
        batch_texts = [texts[i] for i in pick]
        roots, ids, tgts = drafter_batch(lang, table, batch_texts, recipe.anchors, drafter.shape.block, rng,
                                         device)
        loss, _ = drafter_loss(drafter, target, feats[pick], roots, ids, tgts)
        optimise(opt, drafter, loss, lr_at(step, recipe.drafter_steps, recipe.drafter_lr))
        if step % 25 == 0 or step == recipe.drafter_steps - 1:
            ent = -(tgts * torch.log(tgts.clamp_min(1e-30))).sum(-1).mean()
            log(f"drafter step {step}: kl {float((loss - ent).detach()):.4f} ({time.perf_counter() - t0:.0f} s)")
    return drafter


def drafter_config(drafter, lang: synthlang.Language) -> dict:
    s = drafter.shape
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": lang.vocab,
        "hidden_size": s.hidden, "intermediate_size": s.intermediate, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "rms_norm_eps": s.eps, "rope_theta": s.rope_theta, "max_position_embeddings": 4096, "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "block_size": s.block,
        "dflash_config": {"block_size": s.block, "mask_token_id": lang.mask_token,
                          "target_layer_ids": list(s.target_layer_ids)},
    }


def save_drafter(drafter, lang: synthlang.Language, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(drafter_config(drafter, lang), indent=1, sort_keys=True) + "\n")


def load_drafter(out: Path, device: str = "cpu", dtype=None):
    import pair_models as pm
    import torch
    from safetensors.torch import load_file

    config = json.loads((out / DRAFTER_DIR / "config.json").read_text())
    shape = pm.DrafterShape(target_layer_ids=tuple(config["dflash_config"]["target_layer_ids"]),
                            block=int(config["dflash_config"]["block_size"]))
    drafter = pm.DFlashDrafter(shape)
    state = load_file(str(out / DRAFTER_DIR / "model.safetensors"))
    drafter.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return drafter.to(device=device, dtype=dtype or torch.float32).eval()


# -- build ----------------------------------------------------------------------------------------


def file_hashes(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name not in ("build.json", "report.json")}


def build(out: Path, seed: int, device: str, recipe_name: str) -> dict:
    torch = torch_setup(device)
    import transformers

    recipe = RECIPES[recipe_name]
    t0 = time.perf_counter()
    lang = synthlang.build(seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "language.json").write_text(json.dumps(lang.to_json(), indent=1) + "\n")
    target = train_target(lang, recipe, seed, device)
    t_target = time.perf_counter() - t0
    save_target(target, out / TARGET_DIR)
    target = load_target(out, device)
    drafter = train_drafter(lang, target, recipe, seed, device)
    save_drafter(drafter, lang, out / DRAFTER_DIR)
    info = {"seed": seed, "device": device, "recipe": recipe_name, "recipe_values": asdict(recipe),
            "language_sha256": lang.sha256(), "torch": torch.__version__, "transformers": transformers.__version__,
            "files": file_hashes(out)}
    (out / "build.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    total = time.perf_counter() - t0
    log(f"built {out} in {total:.0f} s (target {t_target:.0f} s, drafter {total - t_target:.0f} s) on {device}")
    return info


# -- prompts --------------------------------------------------------------------------------------


def prompt_file(n: int, kind: str, seed: int, lang_seed: int) -> dict:
    lang = synthlang.build(lang_seed)
    items = synthlang.prompts(lang, n, kind, seed)
    return {"kind": kind, "seed": seed, "language_seed": lang_seed, "language_sha256": lang.sha256(),
            "max_total_tokens": RECIPES["full"].seq_len, "prompts": items}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", type=Path, help="output directory of the pair")
    ap.add_argument("--seed", type=int, default=0, help="build seed (with --prompts: the prompt set's seed)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="full")
    ap.add_argument("--report", action="store_true", help="evaluate the pair into OUT/report.json")
    ap.add_argument("--rebuild", action="store_true", help="build even if OUT holds a build")
    ap.add_argument("--prompts", type=int, metavar="N", help="write N prompts of the language and exit")
    ap.add_argument("--kind", choices=("greedy", "sampled"), default="greedy")
    ap.add_argument("--language-seed", type=int, default=0, help="the language of --prompts (the build seed)")
    ap.add_argument("-o", "--output", type=Path, help="--prompts: the JSON file to write")
    args = ap.parse_args(argv)
    if args.prompts is not None:
        if args.output is None:
            ap.error("--prompts needs -o FILE.json")
        data = prompt_file(args.prompts, args.kind, args.seed, args.language_seed)
        args.output.write_text(json.dumps(data) + "\n")
        log(f"{len(data['prompts'])} {args.kind} prompts -> {args.output}")
        return 0
    if args.out is None:
        ap.error("OUT is required")
    if args.rebuild or not (args.out / "build.json").is_file():
        build(args.out, args.seed, args.device, args.recipe)
    if args.report:
        import pair_report

        pair_report.write_report(args.out, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
