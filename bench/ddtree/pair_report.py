"""``make_trained.py OUT --report``: the trained pair measured exactly, and its speculative decoding simulated.

Everything is computed from the saved checkpoints (their bf16 tensors, evaluated in float32 unless a
figure says bf16) and the language's exact distributions; ``claims`` are judged from those figures by
:func:`judge`, never written by hand. The figures are the predictions a real SGLang server run of the
pair is checked against: the accept lengths of DFLASH and DDTREE at budgets 16, 32, 64, greedy and
sampled, and the target's stability under bf16 (router margins, expert flips, logit margins, greedy
identity).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import make_trained as mt
import pair_models as pm
import specsim
import synthlang
import torch


@dataclass(frozen=True)
class Size:
    heldout_texts: int = 48
    greedy_prompts: int = 128
    greedy_tokens: int = 64
    sim_prompts: int = 32
    sim_tokens: int = 64
    budgets: tuple[int, ...] = (16, 32, 64)
    temperatures: tuple[float, ...] = (0.0, 1.0, 0.7)


SIZES = {"full": Size(), "mini": Size(heldout_texts=2, greedy_prompts=3, greedy_tokens=6, sim_prompts=2, sim_tokens=8,
                                      temperatures=(0.0, 1.0))}
CLEAR_MARGIN = 1.05  # DDTREE's accept length must exceed DFLASH's by at least 5 % at every budget
DFLASH_GREEDY_MIN = 2.0  # "well above 1": a working drafter


def quantiles(x: torch.Tensor, qs=(0.0, 0.001, 0.01, 0.05, 0.5)) -> dict:
    x = x.double().flatten()
    return {f"q{q:g}": float(torch.quantile(x, q)) for q in qs} | {"max": float(x.max()), "n": int(x.numel())}


def heldout(lang: synthlang.Language, n: int, seq_len: int) -> list[list[int]]:
    rng = random.Random("heldout")
    return [lang.sample(rng, seq_len - 2) for _ in range(n)]


def target_fit(target: pm.Dsv3, lang: synthlang.Language, texts: list[list[int]]) -> dict:
    """How close the target is to the language's exact next-token distributions."""
    x = torch.tensor(texts, device=target.lm_head.weight.device)
    truth = torch.stack([mt.soft_targets(lang, t) for t in texts]).to(x.device)
    with torch.no_grad():
        logp = torch.log_softmax(target(x).logits, -1)
    ent = -(truth * torch.log(truth.clamp_min(1e-30))).sum(-1)
    kl = -(truth * logp).sum(-1) - ent
    certain = truth.max(-1).values == 1.0
    branch = (truth > 0).sum(-1) > 1
    err = (logp.exp() - truth).abs().max(-1).values
    return {"positions": int(kl.numel()), "kl": quantiles(kl, (0.5, 0.99, 1.0)),
            "certain_positions": int(certain.sum()),
            "certain_argmax_agree": float((logp.argmax(-1) == truth.argmax(-1))[certain].float().mean()),
            "certain_min_prob": float(logp.exp().gather(-1, truth.argmax(-1, keepdim=True))[..., 0][certain].min()),
            "branch_positions": int(branch.sum()), "branch_max_abs_prob_error": float(err[branch].max()),
            "branch_mean_abs_prob_error": float(err[branch].mean())}


def routing(target: pm.Dsv3, target16: pm.Dsv3, texts: list[list[int]]) -> dict:
    """Per MoE layer: the top-2 margin of the biased router scores over held-out text, expert load, how many
    decisions the correction bias changes, and bf16-vs-fp32 differences of scores, choices and logits."""
    x = torch.tensor(texts, device=target.lm_head.weight.device)
    k = target.shape.experts_per_tok
    with torch.no_grad():
        o32, o16 = target(x), target16(x)
    layers = {}
    flips_total = 0
    for layer, r32, r16 in zip(target.moe_layers(), o32.routing, o16.routing, strict=True):
        gaps = mt.router_gaps(r32, k)
        chosen32 = torch.zeros_like(r32.choice, dtype=torch.bool).scatter(1, r32.experts, True)
        chosen16 = torch.zeros_like(r16.choice, dtype=torch.bool).scatter(1, r16.experts, True)
        unbiased = torch.topk(r32.logits.sigmoid(), k, dim=-1).indices
        chosen_unbiased = torch.zeros_like(chosen32).scatter(1, unbiased, True)
        flips = int((chosen32 != chosen16).any(-1).sum())
        flips_total += flips
        layers[str(layer)] = {
            "gap_2nd_3rd_biased_score": quantiles(gaps),
            "expert_load": [round(float(v), 4) for v in chosen32.float().mean(0)],
            "choices_changed_by_bias": int((chosen32 != chosen_unbiased).any(-1).sum()),
            "bf16_vs_fp32_choice_score_max_abs": float((r32.choice - r16.choice.float()).abs().max()),
            "bf16_vs_fp32_router_logit_max_abs": float((r32.logits - r16.logits.float()).abs().max()),
            "expert_choice_flips_bf16_vs_fp32": flips,
        }
    return {"tokens": int(x.numel()), "layers": layers, "expert_choice_flips_total": flips_total,
            "bf16_vs_fp32_logit_max_abs": float((o32.logits - o16.logits.float()).abs().max())}


def transformers_agreement(out: Path, target: pm.Dsv3, texts: list[list[int]]) -> dict:
    """The saved checkpoint loaded by transformers' DeepseekV3ForCausalLM vs this module, float32."""
    from transformers import DeepseekV3ForCausalLM

    hf = DeepseekV3ForCausalLM.from_pretrained(out / mt.TARGET_DIR, dtype=torch.float32).eval()
    x = torch.tensor(texts)
    with torch.no_grad():
        a = hf(input_ids=x).logits.float()
        b = target.to("cpu")(x).logits
    return {"texts": len(texts), "max_abs_logit_diff": float((a - b).abs().max()),
            "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean())}


def greedy_stability(target: pm.Dsv3, target16: pm.Dsv3, lang: synthlang.Language, size: Size) -> dict:
    prompts = synthlang.prompts(lang, size.greedy_prompts, "greedy", seed=1)
    outs32, margins32 = specsim.greedy_decode(target, prompts, size.greedy_tokens)
    outs16, _ = specsim.greedy_decode(target16, prompts, size.greedy_tokens)
    branch_margins, all_margins = [], []
    for p, o, m in zip(prompts, outs32, margins32, strict=True):
        for i, margin in enumerate(m):
            all_margins.append(margin)
            dist = lang.conditional(p + o[:i])
            if dist is not None and len(dist) > 1:
                branch_margins.append(margin)
    lang_greedy = [lang.greedy(p, size.greedy_tokens) for p in prompts]
    return {"prompts": len(prompts), "tokens_each": size.greedy_tokens,
            "fp32_equals_bf16": sum(a == b for a, b in zip(outs32, outs16, strict=True)),
            "fp32_equals_language_greedy": sum(a == b for a, b in zip(outs32, lang_greedy, strict=True)),
            "top1_top2_logit_margin": quantiles(torch.tensor(all_margins), (0.0, 0.01, 0.5)),
            "top1_top2_logit_margin_at_branches": (quantiles(torch.tensor(branch_margins), (0.0, 0.01, 0.5))
                                                   if branch_margins else None),
            "_outputs": outs32, "_prompts": prompts}


def drafter_fit(drafter: pm.DFlashDrafter, target: pm.Dsv3, lang: synthlang.Language,
                texts: list[list[int]]) -> dict:
    """Per draft depth: KL from the exact marginals, and how often the drafter's argmax is theirs."""
    dev = target.lm_head.weight.device
    table = mt.MarginalTable(lang, drafter.shape.block - 1)
    feats = mt.target_features(target, texts, dev, list(drafter.shape.target_layer_ids))
    kls, agree = [], []
    with torch.no_grad():
        for i, t in enumerate(texts):
            rng = random.Random(i)
            roots, ids, tgts = mt.drafter_batch(lang, table, [t], len(t), drafter.shape.block, rng, dev)
            _, logp = mt.drafter_loss(drafter, target, feats[i:i + 1], roots, ids, tgts)
            ent = -(tgts * torch.log(tgts.clamp_min(1e-30))).sum(-1)
            kls.append((-(tgts * logp).sum(-1) - ent)[0])
            agree.append((logp.argmax(-1) == tgts.argmax(-1))[0])
    kl = torch.cat(kls)
    ag = torch.cat(agree).float()
    return {"blocks": int(kl.shape[0]), "kl_mean_by_depth": [round(float(v), 4) for v in kl.mean(0)],
            "argmax_agree_by_depth": [round(float(v), 4) for v in ag.mean(0)]}


def speculative(target, drafter, dd, lang: synthlang.Language, size: Size, reference: dict) -> dict:
    prompts = synthlang.prompts(lang, size.sim_prompts, "greedy", seed=2)
    base = dict(zip(map(tuple, reference["_prompts"]), reference["_outputs"], strict=True))
    want = [base.get(tuple(p)) for p in prompts]
    if any(w is None for w in want):
        want, _ = specsim.greedy_decode(target, prompts, size.sim_tokens)
    out = {"prompts": len(prompts), "tokens_each": size.sim_tokens, "prompt_set": "greedy, seed 2", "runs": {}}
    for temp in size.temperatures:
        algos = [specsim.Algo("DFLASH", temperature=temp)] + [specsim.Algo("DDTREE", b, temp) for b in size.budgets]
        for algo in algos:
            t0 = time.perf_counter()
            res = specsim.run(target, drafter, dd, prompts, algo, size.sim_tokens, lang.mask_token, seed=3)
            ideal = specsim.run_ideal(lang, dd, prompts, algo, size.sim_tokens, drafter.shape.block, seed=3)
            rec = {"algo": res["algo"], "temperature": temp, "accept_length": round(res["accept_length"], 4),
                   "completion_tokens_per_verify": round(res["completion_tokens_per_verify"], 4),
                   "rounds": res["n_rounds"], "committed": sum(sum(r) for r in res["rounds"]),
                   "committed_per_round_histogram": histogram(res["rounds"]),
                   "ideal_pair_accept_length": round(ideal["accept_length"], 4),
                   "wall_s": round(time.perf_counter() - t0, 1)}
            if temp == 0.0:
                rec["identical_to_target_greedy"] = sum(o == w[:size.sim_tokens] for o, w in
                                                        zip(res["outputs"], want, strict=True))
            out["runs"][f"{res['algo']}@T{temp:g}"] = rec
            mt.log(f"report: {res['algo']} T={temp:g}: accept length {rec['accept_length']} (ideal pair "
                   f"{rec['ideal_pair_accept_length']}; {rec['wall_s']} s)")
    return out


def speculative_bf16(target16, drafter16, dd, lang: synthlang.Language, size: Size) -> dict:
    """Greedy DFLASH and DDTREE with both models in bf16, as the servers run them: accept lengths, and
    outputs against the bf16 target's own greedy decoding (tree-shaped batches round differently)."""
    prompts = synthlang.prompts(lang, size.sim_prompts, "greedy", seed=2)
    want, _ = specsim.greedy_decode(target16, prompts, size.sim_tokens)
    runs = {}
    for algo in [specsim.Algo("DFLASH")] + [specsim.Algo("DDTREE", b) for b in size.budgets]:
        res = specsim.run(target16, drafter16, dd, prompts, algo, size.sim_tokens, lang.mask_token, seed=3)
        runs[res["algo"]] = {"accept_length": round(res["accept_length"], 4),
                             "identical_to_bf16_greedy": sum(o == w for o, w in
                                                             zip(res["outputs"], want, strict=True))}
        mt.log(f"report: bf16 {res['algo']} T=0: accept length {runs[res['algo']]['accept_length']}")
    return {"prompts": len(prompts), "tokens_each": size.sim_tokens, "runs": runs}


def histogram(rounds: list[list[int]]) -> dict:
    counts: dict[int, int] = {}
    for r in rounds:
        for c in r:
            counts[c] = counts.get(c, 0) + 1
    return {str(k): counts[k] for k in sorted(counts)}


def judge(report: dict) -> dict:
    """The report's claims, each computed from its figures: ``{name: {"holds", "value", "threshold"}}``."""
    claims = {}
    runs = report["speculative"]["runs"]
    temps = sorted({r["temperature"] for r in runs.values()})
    for temp in temps:
        base = runs[f"DFLASH@T{temp:g}"]["accept_length"]
        ratios = {r["algo"]: r["accept_length"] / base for r in runs.values()
                  if r["temperature"] == temp and r["algo"] != "DFLASH"}
        claims[f"ddtree_beats_dflash_every_budget@T{temp:g}"] = {
            "holds": bool(ratios) and min(ratios.values()) >= CLEAR_MARGIN,
            "value": {k: round(v, 4) for k, v in ratios.items()}, "threshold": CLEAR_MARGIN}
    if "DFLASH@T0" in runs:
        value = runs["DFLASH@T0"]["accept_length"]
        claims["dflash_greedy_accept_length_well_above_1"] = {"holds": value >= DFLASH_GREEDY_MIN, "value": value,
                                                             "threshold": DFLASH_GREEDY_MIN}
        n = report["speculative"]["prompts"]
        same = {k: r["identical_to_target_greedy"] for k, r in runs.items() if r["temperature"] == 0.0}
        claims["simulated_greedy_lossless"] = {"holds": all(v == n for v in same.values()), "value": same,
                                               "threshold": n}
    if "speculative_bf16" in report:
        n = report["speculative_bf16"]["prompts"]
        same = {k: r["identical_to_bf16_greedy"] for k, r in report["speculative_bf16"]["runs"].items()}
        claims["simulated_greedy_lossless_bf16"] = {"holds": all(v == n for v in same.values()), "value": same,
                                                    "threshold": n}
    g = report["target"]["greedy"]
    claims["greedy_fp32_equals_bf16"] = {"holds": g["fp32_equals_bf16"] == g["prompts"], "value": g["fp32_equals_bf16"],
                                         "threshold": g["prompts"]}
    flips = report["target"]["routing"]["expert_choice_flips_total"]
    claims["no_expert_flips_bf16_vs_fp32"] = {"holds": flips == 0, "value": flips, "threshold": 0}
    return claims


def write_report(out: Path, device: str = "cpu") -> dict:
    mt.torch_setup(device)
    build = json.loads((out / "build.json").read_text())
    size = SIZES["mini" if build["recipe"] == "mini" else "full"]
    seq_len = build["recipe_values"]["seq_len"]
    lang = synthlang.Language.from_json(json.loads((out / "language.json").read_text()))
    t0 = time.perf_counter()
    target = mt.load_target(out, device)
    target16 = mt.load_target(out, device, torch.bfloat16)
    drafter = mt.load_drafter(out, device)
    dd = specsim.load_ddtree_utils()
    texts = heldout(lang, size.heldout_texts, seq_len)
    report: dict = {"pair": {"dir": str(out), "build": build, "size": asdict(size)}, "target": {}}
    report["target"]["fit"] = target_fit(target, lang, texts)
    report["target"]["routing"] = routing(target, target16, texts)
    greedy = greedy_stability(target, target16, lang, size)
    report["target"]["greedy"] = {k: v for k, v in greedy.items() if not k.startswith("_")}
    report["drafter"] = drafter_fit(drafter, target, lang, texts[: max(1, len(texts) // 4)])
    report["speculative"] = speculative(target, drafter, dd, lang, size, greedy)
    report["speculative_bf16"] = speculative_bf16(target16, mt.load_drafter(out, device, torch.bfloat16), dd, lang,
                                                  size)
    report["target"]["transformers_agreement"] = transformers_agreement(out, mt.load_target(out), texts[:4])
    report["claims"] = judge(report)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    held = sum(c["holds"] for c in report["claims"].values())
    mt.log(f"report: {out / 'report.json'} ({held}/{len(report['claims'])} claims hold, {report['wall_s']} s)")
    return report
