"""The DDTree glue on the patched 0.5.23 sources: what the reviews found and the fixes do.

* requests DDTREE cannot serve get an error response at admission (the scheduler's hunk calls
  ``ddtree_unsupported_request``) instead of a RuntimeError that stopped the batch;
* the worker's support checks run after the attention backends exist, not in ``__init__``, where the
  target's ``kv_index_translator`` does not exist yet (the scheduler builds the speculative worker before
  the memory pools) and DFlash has not set ``_need_mamba_verify_commit``;
* every rank builds the tree from rank 0's top-k;
* the sampled verify's full-vocabulary matrices live in the graph-pool borrow the start-up rehearsal sizes.

The function runs for real (torch, CPU); the placement rules are read from the patched sources' AST, where
running them needs a GPU server.
"""

from __future__ import annotations

import ast
import types

import ci_requirements
import pytest

ci_requirements.require("torch")

from ddtree_support import bare_part, patched_tree, patched_worker  # noqa: E402  (after the skip: it needs torch)

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)


@pytest.fixture()
def worker():
    yield from patched_worker()


def req(return_logprob=False, **sampling):
    params = dict.fromkeys(("json_schema", "regex", "ebnf", "structural_tag"))
    params.update(sampling)
    return types.SimpleNamespace(return_logprob=return_logprob, sampling_params=types.SimpleNamespace(**params))


@pytest.mark.parametrize("kind", ["json_schema", "regex", "ebnf", "structural_tag"])
def test_constrained_requests_are_refused_with_a_reason(worker, kind):
    msg = worker.ddtree_unsupported_request(req(**{kind: "x"}))
    assert msg and "constrained decoding" in msg and kind in msg


def test_logprob_requests_are_refused_and_plain_ones_pass(worker):
    assert "return_logprob" in worker.ddtree_unsupported_request(req(return_logprob=True))
    assert worker.ddtree_unsupported_request(req()) is None


def tree(rel: str) -> ast.Module:
    return ast.parse((patched_tree() / rel).read_text())


def method(module: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in ast.walk(module):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{cls}.{name} not found")


def calls(fn: ast.AST) -> list[str]:
    return [ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)]


def test_support_checks_run_after_the_attention_backends_not_in_init():
    mod = tree("sglang/srt/speculative/ddtree_worker_v2.py")
    assert "self._check_supported" not in calls(method(mod, "DDTreeWorkerV2", "__init__"))
    body = calls(method(mod, "DDTreeWorkerV2", "init_attention_backends"))
    assert body.index("super().init_attention_backends") < body.index("self._check_supported")


def test_the_scheduler_refuses_at_admission():
    mod = tree("sglang/srt/managers/scheduler.py")
    fn = method(mod, "Scheduler", "_handle_generate_request")
    src = ast.unparse(fn)
    assert "ddtree_unsupported_request(req)" in src and "self.spec_algorithm.is_ddtree()" in src
    # before the grammar queue takes the request
    assert src.index("ddtree_unsupported_request(req)") < src.index("process_req_with_grammar")


def test_trees_come_from_rank_zeros_topk_and_sampled_matrices_are_borrowed():
    worker = tree("sglang/srt/speculative/ddtree_worker_v2.py")
    src = ast.unparse(method(worker, "DDTreeWorkerV2", "_tree_eager"))
    bcast = "broadcast_decisions((lp, ids), tp_group.broadcast, int(tp_group.world_size))"
    assert src.index(bcast) < src.index("build_tree_verify(")
    # the folded trees (every TP size) take the same top-k object as the eager ones; the ranks agree on folding
    assert "self._draft_topk_fn()" in ast.unparse(method(worker, "DDTreeWorkerV2", "_make_draft_tree_capture"))
    assert "self._draft_topk_fn()" in ast.unparse(method(worker, "DDTreeWorkerV2", "_draft_topk"))
    assert "self._draft_topk(" in src and not any("candidate_topk" in c for c in calls(worker))
    init = ast.unparse(method(worker, "DDTreeWorkerV2", "init_cuda_graphs"))
    assert "self._every_rank_folded(" in init
    accept = ast.unparse(next(n for n in tree("sglang/srt/speculative/ddtree_worker.py").body
                              if isinstance(n, ast.FunctionDef) and n.name == "ddtree_accept"))
    borrow = accept.index("borrow_graph_pool(")
    assert borrow < accept.index("build_speculative_verify_target_probs(") < accept.index("del target_probs")


def test_the_sampled_decisions_reach_every_rank_whatever_the_tp_sync_setting():
    """predicts / accept_index / accept_num are rank 0's on every rank before the commit, through the set's
    unconditional broadcast (tests/test_ddtree_tp_gloo.py runs it on real process groups), never through
    SpecTpSync, whose sites SGLANG_SPEC_TP_SYNC can turn off."""
    worker = tree("sglang/srt/speculative/ddtree_worker_v2.py")
    src = ast.unparse(method(worker, "DDTreeWorkerV2", "_verify_and_commit"))
    bcast = "broadcast_decisions((predicts, accept_index, accept_num), tp_group.broadcast, int(tp_group.world_size))"
    assert src.index("ddtree_accept(") < src.index(bcast) < src.index("plan_commit(")
    assert src.index(bcast) < src.index("self._commit_graphs.commit(")
    assert "_tp_sync" not in ast.unparse(worker) and "SpecTpSync" not in ast.unparse(worker)


def test_a_vocabulary_that_leaves_a_shard_short_of_the_draft_top_k_is_refused_at_start():
    """The worker's start-up check asks the pure function of vocabulary and TP size (tested in
    tests/test_ddtree_tp_gloo.py) with the draft top-k, so every rank refuses alike."""
    worker = tree("sglang/srt/speculative/ddtree_worker_v2.py")
    src = ast.unparse(method(worker, "DDTreeWorkerV2", "_check_supported"))
    assert "vocab_shard_problem(vocab, int(get_parallel().tp_group.world_size), min(self.ddtree_budget, vocab)" in src
    assert src.index("vocab_shard_problem(") < src.index("raise ValueError")


def test_under_tp_the_verify_logits_stay_shards_and_greedy_rounds_merge_row_maxima():
    """The logits processor (patch 0003) returns a target verify's vocab shard for a head without soft-capping
    only where DDTREE asked (``defer_verify_shard``, set in the worker's __init__, before any graph capture),
    under a plain TP gather; the worker's ``_verify_shard`` merges the row maxima for greedy rounds and gathers
    the shards for the others. (The merge and gather functions run on gloo groups in test_ddtree_tp_gloo.py.)"""
    lp = tree("sglang/srt/layers/logits_processor.py")
    init = ast.unparse(method(lp, "LogitsProcessor", "__init__"))
    assert "self.defer_verify_shard = False" in init
    get = ast.unparse(method(lp, "LogitsProcessor", "_get_logits"))
    branch = get.index("if self.defer_verify_shard and logits_metadata is not None")
    for cond in ("logits_metadata.forward_mode.is_target_verify()", "self.do_tensor_parallel_all_gather",
                 "not self.use_attn_tp_group", "not self.do_tensor_parallel_all_gather_dp_attn",
                 "not self.final_logit_softcapping"):
        assert cond in get[branch: get.index("return logits", branch)], cond
    assert get.index("self._gather_softcap_fused(") < branch < get.index("self._logits_gatherer(logits)")
    worker = tree("sglang/srt/speculative/ddtree_worker_v2.py")
    assert "self._target_logits_processor.defer_verify_shard = True" in ast.unparse(
        method(worker, "DDTreeWorkerV2", "__init__"))
    shard = ast.unparse(method(worker, "DDTreeWorkerV2", "_verify_shard"))
    merge = "vocab_parallel_argmax(shard, start, real, gather)"
    assert shard.index("self._can_skip_verify_logits(") < shard.index(merge)
    assert "gather_vocab_shards(shard, gather, vocab)" in shard
    assert "stacked_all_gather(tp_group.all_gather_into_tensor, int(tp_group.world_size))" in shard
    step = ast.unparse(method(worker, "DDTreeWorkerV2", "_verify_and_commit"))
    assert step.index("is_deferred_shard(") < step.index("self._verify_shard(") < step.index("ddtree_accept(")


REFUSED = {
    "return_logprob": "return_logprob", "return_sampling_mask": "return_sampling_mask",
    "return_routed_experts": "return_routed_experts", "return_indexer_topk": "return_indexer_topk",
    "return_hidden_states": "return_hidden_states", "custom_logit_processor": "custom_logit_processor",
    "min_p": "min_p=0.05", "frequency_penalty": "frequency_penalty=0.5", "presence_penalty": "presence_penalty=-0.5",
    "repetition_penalty": "repetition_penalty=1.1", "min_new_tokens": "min_new_tokens=3",
    "regex": "constrained decoding",
}


def test_requests_a_tree_cannot_serve_exactly_are_refused_at_admission(tmp_path_factory):
    """On SGLang 0.5.23's own Req and SamplingParams (the ``admission`` part of tests/ddtree_bare_probe.py):
    the capture fields (sampling mask, routed experts, indexer top-k, hidden states), min_p, the path-dependent
    penalties and custom logit processors get an error response naming the field; neutral values, ordinary
    temperature / top-p / top-k sampling and logit_bias (the same for every row: exact) pass."""
    out = bare_part(tmp_path_factory, "admission", "to build SGLang's Req and SamplingParams")
    assert out["plain"] is None and out["sampled"] is None and out["logit_bias"] is None, out
    for case, needle in REFUSED.items():
        assert out[case] and out[case].startswith("DDTREE does not support") and needle in out[case], (case, out[case])
