"""GPU: SGLang 0.5.23's Triton tree-verify kernels on DDTree trees vs float64 / torch references.

The comparisons live in tests/ddtree_gpu_harness.py (runnable without pytest); see its docstring for where
the kernel sources come from. Run: ``python3 -m pytest -q -m gpu tests/test_ddtree_gpu.py``.
"""

from __future__ import annotations

import ddtree_gpu_harness as harness
import pytest

pytestmark = pytest.mark.gpu


def _run(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except harness.Unavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize(("mask_dtype", "layout"), [("bool", "compact"), ("uint8", "compact"), ("bool", "full")])
@pytest.mark.parametrize("shape", sorted(harness.SHAPES))
def test_triton_extend_attention_with_tree_mask_matches_float64(shape, mask_dtype, layout):
    res = _run(harness.run_extend_case, shape, mask_dtype, layout=layout)
    assert res["max_abs_err"] < 3e-2, res  # bf16 inputs and output
    assert res["causal_max_abs_err"] > 0.1, res  # without the mask the tree is attended causally: wrong
    if layout == "compact":
        assert res["misread_max_abs_err"] > 0.1, res  # the compact mask read with FULL_MASK strides: wrong


def test_sglang_triton_greedy_tree_verify_matches_reference():
    res = _run(harness.run_verify_greedy_case)
    assert res["predicts_equal"] and res["accept_index_equal"] and res["accept_num_equal"], res
    assert res["mean_accepted"] > 1.0, res


def test_draft_topk_from_the_upstream_shard_helper_is_exact():
    res = _run(harness.run_draft_topk_case)
    assert res["ok"], res


def test_the_sets_draft_topk_is_exact_at_tp1_equal_to_8_shards_and_captured():
    res = _run(harness.run_shard_topk_case)
    assert res["ok"], res


def test_ddtree_step_loop_with_sglang_greedy_kernel_equals_autoregressive():
    res = _run(harness.run_step_loop_greedy_case)
    assert res["equal_to_autoregressive"], res
    assert res["tokens_per_request_round"] > 1.3, res


def test_ddtree_step_loop_with_sglang_sampling_kernel_keeps_the_target_distribution():
    """Needs an installed sglang whose JIT kernels build here (tvm-ffi, flashinfer headers, nvcc); skips otherwise."""
    res = _run(harness.run_step_loop_sampling_case)
    assert res["ok"], res


def test_commit_graphs_padded_rows_never_touch_a_live_move():
    """The commit's CUDA graph: padded rows that still name slots a live request now moves KV into."""
    res = _run(harness.run_commit_race_case)
    assert res["ok"], res
