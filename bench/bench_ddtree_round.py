"""Benchmark: one DDTREE round's tree work -- tree build, EAGLE encoding, verify mask, commit plan -- per request.

Issue 20: the round's host work is what made a DDTREE round 1.8x-6.2x a DFLASH round on an H200. Both
implementations of the ddtree-0.5.23 patch set are timed in the same run with the same loop
(bench/timing.py), on the same inputs, at budgets 16/64/256 and batch sizes 1 and 32:

* reference -- revision 3, kept in the set as the oracle: ``build_tree_verify_reference`` (one Python heap
  per request on host lists, per-request encoding, the FULL_MASK custom mask over ``W x (prefix + W)`` cells
  per request) and ``plan_commit_reference`` (range checks and the real moves read back from the device);
* batched -- what the worker runs now: ``build_tree_verify`` (batched tensor code on the inputs' device, no
  host synchronisation, the compact ``W x W`` mask) and ``plan_commit`` (fixed shapes).

The ratio is reference / batched (above 1: the batched one is faster). The mask bytes per round are
computed at the given prefix length (they are what the verify reads and, with graphs, copies). Inputs: a
16-token DFlash block (15 draft positions), each position's top-``budget`` log-probs of random logits, a
verify outcome whose accepted paths follow the trees. One host thread (``--threads``), as the scheduler's.
With ``--device cuda`` the batched work runs on the GPU (each call synchronised) and, where CUDA graphs can
be captured, its replay per batch-size bucket (what the worker does with decode graphs on) is timed too.

    python3 bench/bench_ddtree_round.py                      # CPU, the patched tree from the 0.5.23 wheel
    K26_DDTREE_SITE=<patched site-packages> python3 bench/bench_ddtree_round.py --device cuda --repeat 200
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from timing import measure  # noqa: E402 (bench/timing.py: the script's folder is on sys.path)

DEPTH = 15  # a 16-token DFlash block: the root and 15 drafted positions


def load_modules():
    """ddtree_utils / ddtree_step as the patch set creates them (an unpack of the 0.5.23 wheel with the set
    applied, as the tests build it)."""
    import ddtree_support

    # On a GPU host without network: the installed, patched SGLang's site-packages (K26_DDTREE_SITE).
    site = os.environ.get("K26_DDTREE_SITE")
    root = Path(site) if site else ddtree_support.patched_tree()
    step = ddtree_support.load_file(root / "sglang/srt/speculative/ddtree_utils.py",
                                    "sglang.srt.speculative.ddtree_utils")
    return step, ddtree_support.load_file(root / "sglang/srt/speculative/ddtree_step.py", "k26_bench_ddtree_step")


def inputs(torch, dd, bs: int, budget: int, prefix: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 1000 * bs + budget)
    logits = torch.randn(bs, DEPTH, 4096, generator=g) * 2.5
    lp, ids = dd.ddtree_topk_from_logits(logits, budget)
    w = budget + 1
    return dict(topk_log_probs=lp.to(device), topk_tokens=ids.to(device), root_tokens=torch.arange(bs).to(device),
                prefix_lens=torch.full((bs,), prefix, dtype=torch.int64).to(device), budgets=budget, width=w,
                out_cache_loc=(torch.randperm(bs * w * 4, generator=g)[: bs * w] + 1).to(device))


def accept_outputs(torch, dd, tv, seed: int = 0):
    """A verify outcome on the batch's trees: the target agrees with one child at most nodes."""
    b = tv.batch
    g = torch.Generator().manual_seed(seed)
    target = b.draft_tokens.detach().cpu().clone()
    nt = b.retrieve_next_token.cpu()
    for r in range(b.bs):
        for node in range(b.width):
            child = int(nt[r, node])
            target[r, node] = int(b.draft_tokens[r, child]) if child >= 0 and torch.rand((), generator=g) < 0.7 \
                else 10_000 + node
    pred, acc, num = dd.verify_tree_greedy_reference(
        b.draft_tokens.cpu(), b.retrieve_index.cpu(), b.retrieve_next_token.cpu(), b.retrieve_next_sibling.cpu(),
        target.view(-1), b.num_spec_tokens())
    dev = b.draft_tokens.device
    return pred.to(dev, torch.int32), acc.to(dev, torch.int32), num.to(dev, torch.int32)


def run_case(torch, dd, st, device, budget: int, bs: int, prefix_len: int, repeat: int, timed) -> list[str]:
    """The report lines of one (budget, batch size): both implementations on the same inputs, checked equal."""
    kw = inputs(torch, dd, bs, budget, prefix_len, device)
    tv = st.build_tree_verify(**kw)
    pred, acc, num = accept_outputs(torch, dd, tv)
    loc, prefix, w = kw["out_cache_loc"], kw["prefix_lens"], kw["width"]

    def reference():
        t = st.build_tree_verify_reference(**kw)
        st.plan_commit_reference(pred, acc, num, loc, prefix, w)
        return t

    def batched():
        t = st.build_tree_verify(**kw)
        st.plan_commit(pred, acc, num, loc, prefix, w)
        return t

    ref_tv = reference()
    for name in ("draft_tokens", "retrieve_next_token", "retrieve_next_sibling", "tree_mask"):
        assert torch.equal(getattr(ref_tv.batch, name).cpu(), getattr(tv.batch, name).cpu()), name
    r = measure(timed(reference), repeat)
    n = measure(timed(batched), repeat)
    out = [f"{budget:>6} {bs:>3} | {r.best * 1e3:7.3f} / {r.median * 1e3:7.3f} | "
           f"{n.best * 1e3:7.3f} / {n.median * 1e3:7.3f} | {r.best * 1e3 / bs:11.3f} "
           f"{n.best * 1e3 / bs:11.3f} | {r.best / n.best:5.2f}, {r.median / n.median:5.2f} | "
           f"{ref_tv.custom_mask.numel():>10} {tv.custom_mask.numel():>9}"]
    if device.type != "cuda":
        return out
    graphs = st.TreeBuildGraphs(width=w, depth=DEPTH, topk=budget, budget=budget, batch_sizes=[bs], device=device)
    try:
        graphs.capture()
    except Exception as exc:  # report, do not hide: the worker would run eager then
        return [*out, f"{'':>10} graph capture failed: {type(exc).__name__}: {exc}"]

    def replayed():
        t = graphs.build(**kw)
        st.plan_commit(pred, acc, num, loc, prefix, w)
        return t

    assert torch.equal(replayed().custom_mask, tv.custom_mask)  # the replay gives the eager trees
    g = measure(timed(replayed), repeat)
    return [*out, f"{'':>10} tree build replayed from a CUDA graph + plan_commit: {g.best * 1e3:6.3f} / "
                  f"{g.median * 1e3:6.3f} ms; ratio reference/graph {r.best / g.best:5.2f}, {r.median / g.median:5.2f}"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budgets", default="16,64,256")
    ap.add_argument("--batch-sizes", default="1,32")
    ap.add_argument("--prefix", type=int, default=4096, help="committed tokens per request (the mask's prefix)")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--output", help="also write the report here")
    args = ap.parse_args()
    os.environ.pop("SGLANG_DDTREE_DEBUG_CHECKS", None)
    import torch

    torch.set_num_threads(args.threads)
    dd, st = load_modules()
    device = torch.device(args.device)
    cuda = device.type == "cuda"

    def timed(fn):
        def run():
            out = fn()
            if cuda:
                torch.cuda.synchronize()
            return out
        return run

    lines = [f"$ python3 bench/bench_ddtree_round.py --device {args.device} --repeat {args.repeat} "
             f"--prefix {args.prefix} --threads {args.threads}   # "
             f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}, "
             f"{platform.node() or 'host'}, torch {torch.__version__}"
             + (f", load {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else ""),
             "per round (best / median ms), per request (best ms), ratio reference/batched (best, median); "
             "mask: custom-mask bytes per round",
             f"{'budget':>6} {'bs':>3} | {'reference ms':>17} | {'batched ms':>17} | {'per req ref':>11} "
             f"{'per req new':>11} | {'ratio':>13} | {'mask ref':>10} {'mask new':>9}"]
    for budget in [int(x) for x in args.budgets.split(",")]:
        for bs in [int(x) for x in args.batch_sizes.split(",")]:
            lines += run_case(torch, dd, st, device, budget, bs, args.prefix, args.repeat, timed)
    report = "\n".join(lines)
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
