"""The KV-slot accounting a DDTREE server really runs on: SGLang 0.5.23's DFlash spec-v2 reservation.

The DDTree worker (``ddtree_worker_v2.py``) reserves nothing itself. Each decode step it writes the tree's
``W = budget + 1`` tokens (and the drafter its block of ``B <= W`` into the first ``B`` of them) to the slots of
positions ``seq_len .. seq_len + W - 1``, read from ``req_to_token``; it relies on the scheduler having
over-allocated those slots and on SGLang freeing what was not committed. That is DFlash's mechanism, reused:

* ``DFlashDraftInputV2.prepare_for_decode`` (speculative/dflash_info_v2.py:114-220) reserves
  ``2 x speculative_num_draft_tokens`` (dflash_info_v2.py:143-147; ``= W`` for DDTREE) past ``kv_committed_len``
  through ``page_aligned_decode_alloc_lens`` (mem_cache/allocation_sizing.py:73-93) and ``alloc_for_spec_decode``
  (mem_cache/allocation.py:780-848: ``alloc_token_slots``, the ``assign_req_to_token_pool`` Triton kernel,
  ``kv_allocated_len = max(kv_allocated_len, nxt)``). The 2x absorbs the overlap scheduler's lag:
  ``kv_committed_len`` trails the device by one verify (allocation_sizing.py:64-70).
* the result processor commits ``kv_committed_len += len(accepted run)`` (managers/scheduler_components/
  batch_result_processor.py:829-831);
* ``release_kv_cache`` frees ``[cache_protected_len, owned_kv_len)`` and the over-allocation
  ``[owned_kv_len, kv_allocated_len)`` (mem_cache/common.py:400-476);
* the scheduler's checks: ``available + evictable + protected + session_held + uncached == total``
  (managers/scheduler_components/invariant_checker.py:83-94, uncached = the running rows' private tokens,
  :282-296), ``0 <= kv_committed_len <= kv_allocated_len <= row width`` and no owned slot in the free pool, no
  duplicate free slot (:347-420); idle: every slot and every ``req_to_token`` row free.

The probe runs SGLang's own code for all of that -- ``ServerArgs`` published into the runtime context,
``MHATokenToKVPool`` + ``TokenToKVPoolAllocator`` + ``ReqToTokenPool`` (row width ``context_len +
get_req_to_token_extra_context_len()``, kv_cache_configurator.py:1572, :1648) on the CPU, a disabled
``RadixCache``, real ``Req``\\ s, the real ``prepare_for_decode`` (its Triton kernel in Triton's interpreter),
``release_kv_cache`` and the invariant checker's ``_check_pool_invariant`` -- and stands in only for what is
not accounting: the batch is a namespace of the fields ``prepare_for_decode`` reads, the prefill is the
row + slots ``alloc_for_extend`` leaves, and the worker's forward is the window it reads and writes, with a
random committed length per request and round. ``overlap`` settles each round's commit only after the next
round was reserved, as the overlap scheduler does. Interpreter: ``$K26_SGLANG_ARGS_PYTHON`` or this one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import ci_requirements
import pytest
import sglang_wheels
from ddtree_support import patched_tree
from interpreters import probe_env, run_identity

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)

_PROBE = textwrap.dedent(
    r'''
    import json, random, sys
    from array import array
    from types import SimpleNamespace
    root, configs = sys.argv[1], json.loads(sys.argv[2])
    sys.path.insert(0, root)
    import torch
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
    from sglang.srt.managers.scheduler_components.pool_stats_observer import kv_private_tokens
    from sglang.srt.mem_cache.allocation import alloc_token_slots
    from sglang.srt.mem_cache.allocation_sizing import (
        get_alloc_reserve_per_decode, get_req_to_token_extra_context_len, page_aligned_decode_alloc_lens)
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.common import release_kv_cache
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def run(cfg):
        W, B, CTX, PAGE, TOTAL, NREQ = (cfg[k] for k in ("width", "block", "context_len", "page_size",
                                                           "pool_tokens", "rows"))
        window_width = W + cfg.get("window_extra", 0)
        reset_context()
        # what _handle_ddtree resolves (tests/test_ddtree_patchset.py checks it): verify width W = budget + 1 in
        # speculative_num_draft_tokens, the drafter block in speculative_dflash_block_size, topk 1, 1 step
        publish(ServerArgs(model_path="dummy", device="cpu", page_size=PAGE, speculative_algorithm="DDTREE",
                           speculative_ddtree_budget=W - 1, speculative_num_draft_tokens=W,
                           speculative_dflash_block_size=B, speculative_eagle_topk=1, speculative_num_steps=1,
                           disable_radix_cache=True), role="scheduler")
        kvpool = MHATokenToKVPool(size=TOTAL, page_size=PAGE, dtype=torch.float16, head_num=1, head_dim=4,
                                  layer_num=1, device="cpu", enable_memory_saver=False)
        if PAGE == 1:
            alloc = TokenToKVPoolAllocator(TOTAL, torch.float16, "cpu", kvpool, need_sort=False)
        else:
            alloc = PagedTokenToKVPoolAllocator(TOTAL, PAGE, torch.float16, "cpu", kvpool, need_sort=False)
        rtp = ReqToTokenPool(size=NREQ, max_context_len=CTX + get_req_to_token_extra_context_len(), device="cpu",
                             enable_memory_saver=False)
        tree = RadixCache(CacheInitParams(disable=True, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc,
                                          page_size=PAGE))
        row_width = int(rtp.req_to_token.shape[1])
        reserve = 2 * W  # dflash_info_v2.py:143-147
        out = {"algorithm": SpeculativeAlgorithm.from_string("DDTREE").name, "row_width": row_width,
               "scheduler_reserve": get_alloc_reserve_per_decode(), "problems": [], "rounds": 0, "commits": [],
               "max_window_end_minus_allocated": -10**9}

        def problem(msg):
            if len(out["problems"]) < 12:
                out["problems"].append(msg)

        def free_list():  # free page ids (slot ids at page size 1)
            return [p for t in (alloc.free_pages, alloc.release_pages) if t is not None for p in t.tolist()]

        def check(running, tag):
            uncached = sum(kv_private_tokens(r.kv, PAGE) for r in running)
            leak, msg = SchedulerInvariantChecker._check_pool_invariant(
                "full", alloc.available_size(), tree.evictable_size(), tree.protected_size(), 0, TOTAL, uncached)
            if leak:
                problem(f"{tag}: {msg}")
            free = free_list()
            if len(free) != len(set(free)):
                problem(f"{tag}: double free ({len(free) - len(set(free))} duplicate slots in the free pool)")
            free, owner = set(free), {}
            for r in running:
                kv = r.kv
                if not 0 <= kv.kv_committed_len <= kv.kv_allocated_len <= row_width:
                    problem(f"{tag}: req {r.rid}: committed {kv.kv_committed_len}, allocated "
                            f"{kv.kv_allocated_len}, row width {row_width}")
                for s in rtp.req_to_token[kv.req_pool_idx, :kv.kv_allocated_len].tolist():
                    page = s // PAGE
                    if page in free or owner.get(page, r.rid) != r.rid:
                        problem(f"{tag}: slot {s} of req {r.rid} is free or owned by req {owner.get(page)}")
                        break
                    owner[page] = r.rid

        rng = random.Random(cfg["seed"])
        # max_new_tokens <= max_req_len - input_len - 1 (scheduler.py:2710-2716),
        # max_req_len = min(context_len - 1, kv_capacity - 1) (tp_worker.py:568-571)
        max_req_len = min(CTX - 1, TOTAL - 1)
        waiting, running, pending = [], [], {}
        for i, (n_in, n_new) in enumerate(cfg["requests"]):
            sp = SamplingParams(max_new_tokens=max(1, min(n_new, max_req_len - n_in - 1)))
            sp.normalize(None)  # as the tokenizer manager does before the scheduler sees a request
            waiting.append(Req(str(i), "", array("q", [(7 * i + j) % 50 + 1 for j in range(n_in)]), sp))
        draft_input = DFlashDraftInputV2.create_idle_input(device="cpu")
        while waiting or running:
            while waiting and len(running) < NREQ:
                r = waiting.pop(0)
                # a prompt without a cached prefix after alloc_for_extend (allocation.py:374-490): its row and
                # slots, committed = allocated = prompt length; the prefill's token is the first round's root
                assert rtp.alloc([r]) is not None
                n = len(r.origin_input_ids)
                if PAGE == 1:
                    locs = alloc_token_slots(tree, n)
                else:  # whole pages; the last one's tail is where the first decode continues (last_loc)
                    locs = alloc.alloc(-(-n // PAGE) * PAGE)[:n]
                rtp.req_to_token[r.kv.req_pool_idx, :n] = locs.to(torch.int32)
                r.kv.kv_committed_len = r.kv.kv_allocated_len = n
                r.output_ids.append(1)
                r.device_len = n  # seq_lens on the device: what the worker's window starts at
                running.append(r)
            batch = SimpleNamespace(
                reqs=list(running), device="cpu", tree_cache=tree, req_to_token_pool=rtp,
                token_to_kv_pool_allocator=alloc, hisparse_coordinator=None, seq_lens_cpu=None, seq_lens_sum=None,
                req_pool_indices=torch.tensor([r.kv.req_pool_idx for r in running], dtype=torch.int64),
                batch_size=lambda: len(running), maybe_evict_swa=lambda: None)
            # what prepare_for_decode is about to reserve (the same call it makes): never past the row
            _, nxt, _ = page_aligned_decode_alloc_lens(running, reserve=reserve, page_size=PAGE)
            over = [(r.rid, r.kv.kv_committed_len, n) for r, n in zip(running, nxt) if n > row_width]
            if over:
                problem(f"round {out['rounds']}: the reservation would write req_to_token past its row "
                        f"(width {row_width}): (req, kv_committed_len, reserved end) = {over}")
                break  # the kernel would store out of the row (into another row or past the tensor)
            before = rtp.req_to_token.clone()
            draft_input.prepare_for_decode(batch)
            mine = {r.kv.req_pool_idx for r in running}
            touched = set((rtp.req_to_token != before).any(dim=1).nonzero().view(-1).tolist())
            if touched - mine:
                problem(f"round {out['rounds']}: the reservation wrote rows {sorted(touched - mine)}")
            for r in running:  # overlap: the previous round's result is processed after this one was scheduled
                if r.rid in pending:
                    r.kv.kv_committed_len += pending.pop(r.rid)  # batch_result_processor.py:831
            for r in running:
                if r.finished():
                    continue
                # the worker's window: req_to_token[row, seq_len : seq_len + W] (ddtree_worker_v2.py,
                # assign_extend_cache_locs_func), the drafter's block its first B columns
                end = r.device_len + window_width
                out["max_window_end_minus_allocated"] = max(out["max_window_end_minus_allocated"],
                                                            end - r.kv.kv_allocated_len)
                if end > r.kv.kv_allocated_len:
                    problem(f"round {out['rounds']}: req {r.rid}: window [{r.device_len}, {end}) past its "
                            f"reservation ({r.kv.kv_allocated_len})")
                window = rtp.req_to_token[r.kv.req_pool_idx, r.device_len:min(end, row_width)].tolist()
                if {s // PAGE for s in window} & set(free_list()):
                    problem(f"round {out['rounds']}: req {r.rid}: window slots are in the free pool")
                # committed this round (accepted drafts + bonus): the extremes 1 and accept_max often
                a = rng.choice((1, cfg["accept_max"], rng.randint(1, cfg["accept_max"])))
                out["commits"].append(a)
                r.device_len += a
                r.output_ids.extend([1] * a)
                if cfg["overlap"]:
                    pending[r.rid] = a
                else:
                    r.kv.kv_committed_len += a  # batch_result_processor.py:831
                r.update_finish_state(new_accepted_len=a)
            check(running, f"round {out['rounds']}")
            out["rounds"] += 1
            for r in [r for r in running if r.finished()]:
                pending.pop(r.rid, None)
                if cfg.get("skip_release"):  # control: the row goes back, its KV slots do not
                    rtp.free(r)
                else:
                    release_kv_cache(r, tree, checkpoint=False)  # batch_result_processor.py:1374
                running.remove(r)
            check(running, f"round {out['rounds']} after release")
        out["idle_available"], out["total"] = alloc.available_size(), TOTAL
        out["idle_free_rows"], out["rows"] = len(rtp.free_slots), NREQ
        return out

    print("RESULT " + json.dumps({name: run(cfg) for name, cfg in configs.items()}))
    '''
)

# Requests (prompt length, max_new_tokens) that finish well inside the context; rows: at most 4 running. Narrow
# windows commit fewer tokens a round, so they get shorter requests (the rounds run the Triton interpreter).
_REQUESTS = [[3, 90], [40, 300], [200, 150], [1, 400], [120, 60], [17, 250], [300, 200], [9, 33]]
_SHORT = [[3, 40], [40, 120], [200, 60], [1, 150], [120, 30], [9, 33]]


def _cfg(width: int, block: int, overlap: bool, **kw) -> dict:
    base = dict(width=width, block=block, overlap=overlap, accept_max=width, context_len=4096, page_size=1,
                pool_tokens=8192, rows=4, seed=width * 2 + overlap, requests=_SHORT if width < 32 else _REQUESTS)
    return base | kw


CONFIGS = {
    # W = budget + 1 with the drafter block B <= W; committed lengths 1..W each round (a DDTree path commits at
    # most B: its depth is at most B - 1 drafts plus the bonus -- so 1..W is the harder case)
    "w9-b8": _cfg(9, 8, False),
    "w9-b8-overlap": _cfg(9, 8, True),
    "w17-b16-overlap": _cfg(17, 16, True),
    "w65-b16-overlap": _cfg(65, 16, True),  # Kimi K2.6 profile: budget 64 over a 16-token DFlash block
    "w65-b16-page16-overlap": _cfg(65, 16, True, page_size=16),  # --page-size 16: the paged allocator
    # controls, which the checks must catch: a window one wider than the reservation covers under overlap
    # (committed W in the round before), and finished requests whose KV slots are never freed
    "control-wide-window": _cfg(9, 8, True, window_extra=1, seed=3),
    "control-no-release": _cfg(9, 8, False, skip_release=True),
    # a request the scheduler lets run to its length limit (context 300, the clamp above) with W = 65
    "context-limit-w65": _cfg(65, 16, True, accept_max=16, context_len=300, requests=[[250, 1000], [20, 40]]),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The probe's report: computed once per patched tree, probe, configurations and interpreter
    (``computed_once``), reused by later runs until one of them changes."""
    python = os.environ.get("K26_SGLANG_ARGS_PYTHON", sys.executable)
    root = patched_tree(whole=True)
    # the reservation's req_to_token write is SGLang's Triton kernel (assign_req_to_token_pool): the interpreter
    env = probe_env(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")

    def run() -> tuple[dict, bool]:
        d = tmp_path_factory.mktemp("kv-accounting")
        script = d / "kv_accounting_probe.py"
        script.write_text(_PROBE)
        proc = subprocess.run([python, str(script), str(root), json.dumps(CONFIGS)], capture_output=True, text=True,
                              timeout=600, cwd=d, env=env)
        missing = [ln for ln in proc.stderr.splitlines() if "No module named" in ln]
        if proc.returncode != 0 and missing:
            name = re.search(r"No module named '([^']+)'", missing[-1])
            ci_requirements.unavailable(ci_requirements.reason([name.group(1) if name else missing[-1].strip()],
                                                               python, "to import SGLang's scheduler side")
                                        + "; or set K26_SGLANG_ARGS_PYTHON to an interpreter that has it")
        if proc.returncode != 0:
            pytest.fail(f"the probe failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:]), True

    key = {"tree": root.name, "probe": _PROBE, "configs": CONFIGS, **run_identity(python, env)}
    return sglang_wheels.computed_once("ddtree-kv-accounting", [], key, run)


@pytest.mark.parametrize("name", ["w9-b8", "w9-b8-overlap", "w17-b16-overlap", "w65-b16-overlap",
                                  "w65-b16-page16-overlap"])
def test_the_dflash_reservation_covers_every_ddtree_round_and_frees_everything(results: dict, name: str) -> None:
    res, cfg = results[name], CONFIGS[name]
    assert res["algorithm"] == "DDTREE"
    # the scheduler's capacity estimate reserves what prepare_for_decode allocates: 2 x W
    assert res["scheduler_reserve"] == 2 * cfg["width"]
    assert res["problems"] == [], res["problems"]
    # never past the reservation; under overlap with a committed length of W the window ends exactly at it
    # (at page size 1: larger pages round the reservation up)
    assert res["max_window_end_minus_allocated"] <= 0
    if cfg["overlap"] and cfg["page_size"] == 1:
        assert res["max_window_end_minus_allocated"] == 0, "the lag case (commit W, then a window) was not hit"
    assert res["rounds"] >= 12 and {1, cfg["width"]} <= set(res["commits"])
    # idle: SGLang's leak check (every slot and every row back)
    assert res["idle_available"] == res["total"] and res["idle_free_rows"] == res["rows"]


def test_the_accounting_checks_catch_a_wide_window_and_a_leak(results: dict) -> None:
    wide = results["control-wide-window"]
    assert any("past its reservation" in p for p in wide["problems"]), wide["problems"]
    leak = results["control-no-release"]
    assert any("[full]" in p for p in leak["problems"]) and leak["idle_available"] < leak["total"], leak


def test_a_request_at_the_context_limit_stays_inside_its_req_to_token_row(results: dict) -> None:
    """DFlash's reservation (kv_committed_len + 2W, dflash_info_v2.py:143-147) outgrew the req_to_token row
    (context_len + 4 + W at page size 1, allocation_sizing.py:96-116) once a request passed context_len + 4 - W,
    and the scheduler lets it reach about context_len - 3 (scheduler.py:2710-2716): with W = 65 the kernel
    stored up to 57 entries past the row (a pristine 0.5.23 DFLASH bug too). Patch 0004 gives DFLASH/DDTREE the
    row headroom UNO and page > 1 get (2W + page_size - 1)."""
    res = results["context-limit-w65"]
    assert res["problems"] == [], res["problems"]
    assert res["idle_available"] == res["total"] and res["idle_free_rows"] == res["rows"]
