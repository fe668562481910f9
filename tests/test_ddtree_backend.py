"""The patched Triton attention backend on a DDTREE target verify: eager and CUDA-graph paths, compact mask.

tests/ddtree_backend_probe.py drives SGLang 0.5.23's own ``TritonAttnBackend`` (the patched file) and the
patched extend-attention kernel under ``TRITON_INTERPRET=1`` on a CPU, for a GQA shape and Kimi / DeepSeek's
absorbed-MLA shape (576/512, one KV head): the verify output equals float64 attention over the committed
prefix and each node's tree ancestors, eager (``init_forward_metadata``) and from the graph buffers
(``_update_target_verify_buffers`` copying the mask into the graph's buffer over stale bytes,
``_build_cuda_graph_forward_metadata``); the mask is the compact ``W x W`` per request (``mask_indptr =
b * W * W``), and the graph state is sized by what the verify reads. Controls: a DDTREE verify without a
mask raises (eager and graph); the compact mask given to a runner that reads the FULL_MASK layout attends
wrongly; the FULL_MASK layout on that runner is still right (nothing else changed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ci_requirements
import pytest
import sglang_wheels
from ddtree_support import patched_tree
from interpreters import probe_env, run_identity

pytestmark = pytest.mark.network  # every test reads the released SGLang 0.5.23 wheel (a first-run download)

PROBE = Path(__file__).resolve().parent / "ddtree_backend_probe.py"


@pytest.fixture(scope="module")
def probe() -> dict:
    """The probe's report: computed once per patched tree, probe and interpreter (``computed_once``: the patched
    tree's name is its content hash; the interpreter's identity names every distribution it imports), reused by
    later runs until one of them changes."""
    python = os.environ.get("K26_SGLANG_ARGS_PYTHON", sys.executable)
    ci_requirements.require("torch", "triton", python=python, needed_for="to run the patched backend in Triton's "
                            "interpreter")
    root = patched_tree(whole=True)
    env = probe_env(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")

    def run() -> tuple[dict, bool]:
        proc = subprocess.run([python, str(PROBE), str(root)], capture_output=True, text=True, timeout=600, env=env,
                              cwd=PROBE.parent)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
        result = json.loads(lines[-1][len("RESULT "):])
        return result, proc.returncode == 0 and not any("error" in r for r in result.values())

    key = {"tree": root.name, **run_identity(python, env)}
    return sglang_wheels.computed_once("ddtree-backend-probe", sglang_wheels.project_sources(PROBE), key,
                                        run)


@pytest.mark.parametrize("shape", ["gqa", "mla_absorbed"])
def test_tree_verify_through_the_backend_matches_float64_eager_and_graph(probe, shape):
    r = probe[shape]
    assert "error" not in r, r.get("error")
    cells = 13 * 13  # W = 13: budget 12
    assert r["eager_mask_indptr"] == r["graph_mask_indptr"] == [0, cells, 2 * cells, 3 * cells]
    assert r["eager_err"] < 1e-4 and r["graph_err"] < 1e-4, r
    assert r["graph_mask_is_buffer"]
    assert "causal attention" in r["eager_without_mask"] and "causal attention" in r["graph_without_mask"]
    assert r["misread_err"] > 0.1, r  # the compact mask read with FULL_MASK strides
    assert r["full_layout_err"] < 1e-4, r  # the pristine layout, unchanged


@pytest.mark.parametrize("shape", ["gqa", "mla_absorbed"])
def test_padded_graph_replay_copies_the_real_requests_mask(probe, shape):
    """A replay runs the smallest captured batch >= the real one: the mask covers the real requests only
    (3 of a bucket of 4 here) and is copied as it is; a mask that is not whole requests is refused."""
    r = probe[shape]
    assert "error" not in r, r.get("error")
    cells = 13 * 13
    assert r["padded_replay_mask_equal"] is True, r["padded_replay_mask_equal"]
    assert r["padded_replay_mask_indptr"] == [0, cells, 2 * cells, 3 * cells, 4 * cells]
    assert "not a whole number of requests" in r["ragged_mask"], r["ragged_mask"]
    # capture hands the runner's longer all-ones buffer (not whole requests): its first bs x W x W cells are read
    assert r["capture_mask_ones"] == 4 * cells, r["capture_mask_ones"]


@pytest.mark.parametrize("shape", ["gqa", "mla_absorbed"])
def test_ddtree_graph_state_is_sized_by_what_the_verify_reads(probe, shape):
    r = probe[shape]
    assert "error" not in r, r.get("error")
    max_bs, width, ctx = 4, 13, 64
    dd, pristine = r["ddtree_sizes"], r["pristine_sizes"]
    assert dd["attn_logits"][0] == max_bs and pristine["attn_logits"][0] == max_bs * width
    assert dd["kv_indices"] == max_bs * ctx and pristine["kv_indices"] == max_bs * width * ctx
    assert dd["verify_mask"] == max_bs * width * width and pristine["verify_mask"] == max_bs * width * (ctx + width)
    draft, draft_pristine, block = r["draft_ddtree_sizes"], r["draft_pristine_sizes"], 8
    assert draft["attn_logits"][0] == max_bs and draft_pristine["attn_logits"][0] == max_bs * block
    assert draft["kv_indices"] == max_bs * ctx and draft_pristine["kv_indices"] == max_bs * block * ctx
    assert draft["verify_mask"] is None and draft_pristine["verify_mask"] is None
