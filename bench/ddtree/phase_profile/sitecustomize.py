"""Per-phase wall times of a speculative decode round inside a real SGLang server, for profiling only.

Put this directory first on PYTHONPATH of a server (``K26_PHASE_PROFILE=1``): when SGLang imports the DFlash
or DDTree worker, their decode-step pieces are wrapped so that each one is timed between two
``torch.cuda.synchronize()`` calls, and every ``K26_PHASE_PROFILE_EVERY`` rounds (default 200) the worker
logs one line ``K26 phase profile <worker> rounds=N total=.. <phase>=<ms per round> ...``. The
synchronisation removes the overlap between host and device work, so the figures say where a round's time
goes, not how fast it runs: speeds are measured on servers without it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import time

_TARGETS = {
    "sglang.srt.speculative.dflash_worker_v2": ("DFlashWorkerV2", {
        "forward_batch_generation": "round",
    }, ()),
    "sglang.srt.speculative.ddtree_worker_v2": ("DDTreeWorkerV2", {
        "forward_batch_generation": "round",
        "_draft_topk": "draft_topk",
        "_append_target_hidden_to_draft_kv_by_loc": "draft_kv_append",
    }, ("build_tree_verify", "plan_commit", "ddtree_accept", "gather_path_rows")),
}
_log = logging.getLogger("k26.phase_profile")


class _Stats:
    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.totals: dict[str, float] = {}
        self.rounds = 0
        self.in_round = False
        self.every = int(os.environ.get("K26_PHASE_PROFILE_EVERY", "200"))

    def add(self, phase: str, seconds: float) -> None:
        self.totals[phase] = self.totals.get(phase, 0.0) + seconds
        if phase == "round":
            self.rounds += 1
            if self.rounds % self.every == 0:
                parts = " ".join(f"{k}={1000 * v / self.rounds:.3f}" for k, v in sorted(self.totals.items()))
                logging.getLogger("sglang").warning("K26 phase profile %s rounds=%d %s", self.worker, self.rounds,
                                                    parts)


def _timed(fn, phase: str, stats: _Stats, decode_only: bool = False):
    import torch

    def wrapper(*args, **kwargs):
        if decode_only:
            batch = kwargs.get("batch", args[1] if len(args) > 1 else None)
            mode = getattr(batch, "forward_mode", None)
            if mode is None or mode.is_extend() or mode.is_idle() or getattr(batch, "is_extend_in_batch", False):
                return fn(*args, **kwargs)
        elif not stats.in_round:  # an inner phase outside a decode round (prefill): not counted
            return fn(*args, **kwargs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if decode_only:
            stats.in_round = True
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.synchronize()
            if decode_only:
                stats.in_round = False
            stats.add(phase, time.perf_counter() - t0)

    wrapper.__wrapped__ = fn
    return wrapper


def _patch(module) -> None:
    cls_name, methods, functions = _TARGETS[module.__name__]
    cls = getattr(module, cls_name)
    stats = _Stats(cls_name)
    for meth, phase in methods.items():
        if meth in cls.__dict__:
            setattr(cls, meth, _timed(cls.__dict__[meth], phase, stats, decode_only=(phase == "round")))
    for fn_name in functions:
        if hasattr(module, fn_name):
            setattr(module, fn_name, _timed(getattr(module, fn_name), fn_name, stats))
    # the target verify forward and the draft forward, seen from the worker
    if cls_name == "DDTreeWorkerV2":
        orig_init = cls.__init__

        def init(self, *a, **kw):
            orig_init(self, *a, **kw)
            tw = self.target_worker
            tw.forward_batch_generation = _timed(tw.forward_batch_generation, "target_forward", stats)
            runner = self.draft_model_runner
            runner.forward = _timed(runner.forward, "draft_forward", stats)

        cls.__init__ = init


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def run(module):
            exec_module(module)
            try:
                _patch(module)
            except Exception as e:  # a profile must never stop a server
                _log.warning("phase profile not installed for %s: %s", name, e)

        spec.loader.exec_module = run
        return spec


if os.environ.get("K26_PHASE_PROFILE") == "1":
    sys.meta_path.insert(0, _Finder())


def _chain_next_sitecustomize() -> None:
    """This file shadows any other ``sitecustomize`` on the path (a distribution's): run that one too."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in sys.path:
        if not d or os.path.abspath(d) == here:
            continue
        cand = os.path.join(d, "sitecustomize.py")
        if os.path.isfile(cand):
            with open(cand) as fh:
                exec(compile(fh.read(), cand, "exec"), {"__name__": "sitecustomize", "__file__": cand})
            return


_chain_next_sitecustomize()
