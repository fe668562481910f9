"""The patch set's ddtree_worker.py on CPU: verify inputs from draft logits, the start-up gate, and no greedy
fall-back for sampled requests.

ddtree_worker.py imports ``sglang.srt.speculative.ddtree_utils``; the patched file is registered under that
name (parent packages as bare modules, so SGLang's package ``__init__`` with its heavy imports does not run).
For the fall-back test, ``sglang.kernels.ops.speculative.verify_sampling`` is given the value it has on a
platform without the op (``tree_speculative_sampling_target_only = None``).
"""

from __future__ import annotations

import sys
import types

import ci_requirements
import pytest

torch = ci_requirements.importorskip("torch")

from ddtree_support import ddtree_utils, patched_worker  # noqa: E402

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)


@pytest.fixture()
def worker():
    yield from patched_worker()


def test_prepare_verify_builds_the_tree_batch_and_mask(worker):
    dd = ddtree_utils()
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 40, generator=g) * 3
    roots = torch.tensor([5, 9])
    prefix = torch.tensor([12, 3])
    batch, mask = worker.ddtree_prepare_verify(draft_logits=logits, root_tokens=roots, prefix_lens=prefix, budget=10)
    assert batch.width == 11 and batch.draft_tokens[:, 0].tolist() == [5, 9]
    lp, tok = dd.ddtree_topk_from_logits(logits, 10)
    for b in range(2):
        tree = dd.build_ddtree(lp[b], tok[b], 10, int(roots[b]))
        assert batch.draft_tokens[b].tolist() == list(tree.tokens)
        assert batch.positions.view(2, 11)[b].tolist() == [int(prefix[b]) + d for d in tree.depths]
    # compact: W x W per request; the FULL_MASK layout of revision 3 held the same cells after its prefix part
    assert mask.numel() == 2 * 11 * 11 and torch.equal(mask, dd.compact_verify_mask(batch.tree_mask))
    full, off = dd.build_verify_custom_mask(batch.tree_mask, prefix), 0
    for b, n in enumerate(prefix.tolist()):
        block = full[off: off + 11 * (n + 11)].view(11, n + 11)
        assert torch.equal(block[:, n:].reshape(-1), mask[b * 121: (b + 1) * 121]) and bool(block[:, :n].all())
        off += 11 * (n + 11)


def test_ddtree_stops_at_startup_in_this_revision(worker, monkeypatch):
    monkeypatch.delenv(worker.UNVALIDATED_WORKER_ENV, raising=False)
    monkeypatch.delenv("SGLANG_DDTREE_SITE_RECORD", raising=False)
    with pytest.raises(NotImplementedError, match="DFLASH"):
        worker.get_ddtree_worker_cls()
    for value in ("", "0", "true", "yes"):  # only the exact opt-in opens the gate
        monkeypatch.setenv(worker.UNVALIDATED_WORKER_ENV, value)
        with pytest.raises(NotImplementedError, match="SGLANG_DDTREE_UNVALIDATED_WORKER=1"):
            worker.check_ddtree_worker_available()
    monkeypatch.setenv(worker.UNVALIDATED_WORKER_ENV, "1")
    assert worker.check_ddtree_worker_available() is None


def test_sampled_requests_never_fall_back_to_greedy(worker):
    fake = types.ModuleType("sglang.kernels.ops.speculative.verify_sampling")
    fake.tree_speculative_sampling_target_only = None  # what verify_sampling.py exports without the op
    sys.modules[fake.__name__] = fake
    batch, _ = worker.ddtree_prepare_verify(draft_logits=torch.randn(1, 4, 20), root_tokens=torch.tensor([1]),
                                            prefix_lens=torch.tensor([0]), budget=5)
    with pytest.raises(RuntimeError, match="refusing to verify sampled requests greedily"):
        worker.ddtree_accept(batch=batch, next_token_logits=torch.randn(6, 20), sampling_info=None,
                             is_all_greedy=False)
    with pytest.raises(ValueError, match="logits rows"):
        worker.ddtree_accept(batch=batch, next_token_logits=torch.randn(5, 20), sampling_info=None,
                             is_all_greedy=False)


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def test_sampled_acceptance_passes_the_thresholds_and_the_hosts_top_k(worker):
    """ddtree_accept hands --speculative-accept-threshold-single/acc to the sampling kernel as DFLASH does (acc
    floored at 1e-9, as dflash_utils does) and the draft input's host-side max top-k to the probability builder,
    so nothing is read back from the device there. The CUDA kernel and the graph-pool borrow are recorded
    (they need a GPU); everything else is the patched module."""
    import contextlib

    seen = {}

    def kernel(**kw):
        seen["kernel"] = kw
        kw["accept_token_num"].zero_()

    def probs(**kw):
        seen["probs"] = kw
        return torch.softmax(kw["next_token_logits"].float(), -1).view(kw["bs"], kw["draft_token_num"], -1)

    _module("sglang.kernels.ops.speculative.verify_sampling", tree_speculative_sampling_target_only=kernel)
    _module("sglang.srt.model_executor.runner_utils.pool", borrow_graph_pool=lambda user: contextlib.nullcontext())
    _module("sglang.srt.speculative.dflash_utils", build_speculative_verify_target_probs=probs)
    batch, _ = worker.ddtree_prepare_verify(draft_logits=torch.randn(2, 4, 20), root_tokens=torch.tensor([1, 2]),
                                            prefix_lens=torch.tensor([0, 3]), budget=5)
    worker.ddtree_accept(batch=batch, next_token_logits=torch.randn(12, 20), sampling_info=object(),
                         is_all_greedy=False, threshold_single=0.9, threshold_acc=0.0, max_top_k=7,
                         uniform_top_k_value=None)
    assert seen["kernel"]["threshold_single"] == 0.9 and seen["kernel"]["threshold_acc"] == 1e-9
    assert seen["probs"]["max_top_k"] == 7 and seen["probs"]["draft_token_num"] == 6
    assert seen["kernel"]["target_probs"].shape == (2, 6, 20) and seen["kernel"]["accept_index"].shape == (2, 5)
    worker.ddtree_accept(batch=batch, next_token_logits=torch.randn(12, 20), sampling_info=object(),
                         is_all_greedy=False)
    assert seen["kernel"]["threshold_single"] == 1.0 and seen["kernel"]["threshold_acc"] == 1.0


def _greedy_func(dd):
    """verify_tree_greedy_func's contract on the torch reference of its kernel (same outputs, in place)."""
    def func(*, predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
             retrieve_next_sibling, target_predict):
        p, a, n = dd.verify_tree_greedy_reference(candidates, retrieve_index, retrieve_next_token,
                                                  retrieve_next_sibling, target_predict.reshape(-1),
                                                  accept_index.shape[1])
        predicts.copy_(p)
        accept_index.copy_(a)
        accept_token_num.copy_(n)
    return func


def test_startup_warms_the_verify_kernels_and_a_toolchain_fault_fails_it(worker):
    dd = ddtree_utils()
    spec_tree = _module("sglang.kernels.ops.speculative.spec_tree", verify_tree_greedy_func=_greedy_func(dd))
    _module("sglang.kernels.ops.speculative.verify_sampling", tree_speculative_sampling_target_only=None)
    assert worker.warm_verify_kernels(torch.device("cpu"), 17, 7, 64) == {"greedy": "ok", "sampling": "absent"}
    assert worker.warm_verify_kernels("cpu", 17, 7, 64)["greedy"] == "ok"  # SGLang's workers hold a device string
    sampled = []
    _module("sglang.kernels.ops.speculative.verify_sampling",
            tree_speculative_sampling_target_only=lambda **kw: sampled.append(kw["target_probs"].shape))
    assert worker.warm_verify_kernels(torch.device("cpu"), 17, 7, 64) == {"greedy": "ok", "sampling": "ok"}
    assert sampled == [(1, 17, 64)]  # the serving width and the real vocabulary (the JIT instance depends on it)

    def broken(**kw):
        raise RuntimeError("nvcc fatal: Unsupported gpu architecture 'compute_103'")

    spec_tree.verify_tree_greedy_func = broken
    with pytest.raises(RuntimeError, match=r"greedy tree-verify kernel .*nvcc fatal"):
        worker.warm_verify_kernels(torch.device("cpu"), 17, 7, 64)
    spec_tree.verify_tree_greedy_func = _greedy_func(dd)
    _module("sglang.kernels.ops.speculative.verify_sampling", tree_speculative_sampling_target_only=broken)
    with pytest.raises(RuntimeError, match=r"tree_speculative_sampling_target_only.*nvcc fatal"):
        worker.warm_verify_kernels(torch.device("cpu"), 17, 7, 64)


def test_the_gate_opens_only_for_a_listed_configuration(worker, monkeypatch):
    monkeypatch.delenv(worker.UNVALIDATED_WORKER_ENV, raising=False)
    here = {"sglang": "0.5.23", "tp_size": 1, "attention_backend": "triton", "cuda_graph": True,
            "overlap_schedule": True, "compute_capability": "9.0", "torch": "2.11.0"}
    table = (dict(here, date="2026-12-01", gpu="H200"),)
    assert worker.check_ddtree_worker_available(here, table=table) is None
    assert worker.validated_entry(here, table)["gpu"] == "H200"
    for key, other in (("tp_size", 8), ("cuda_graph", False), ("compute_capability", "10.3"), ("torch", "2.14.1")):
        with pytest.raises(NotImplementedError, match=f"{key}="):
            worker.check_ddtree_worker_available(dict(here, **{key: other}), table=table)
    incomplete = ({k: v for k, v in here.items() if k != "torch"},)  # an entry must pin every key
    with pytest.raises(NotImplementedError):
        worker.check_ddtree_worker_available(here, table=incomplete)
    with pytest.raises(NotImplementedError, match="none yet"):
        worker.check_ddtree_worker_available(here, table=())
    # this revision's own VALIDATED, as a table: the H200 configurations match, anything else is refused naming them
    assert worker.check_ddtree_worker_available(here, worker.VALIDATED) is None
    assert worker.check_ddtree_worker_available(dict(here, cuda_graph=False), worker.VALIDATED) is None
    for key, other in (("overlap_schedule", False), ("tp_size", 8), ("compute_capability", "10.0")):
        with pytest.raises(NotImplementedError, match=r"validated inside a real server .*tp_size=1"):
            worker.check_ddtree_worker_available(dict(here, **{key: other}), worker.VALIDATED)
    # the gate itself (0005): the list alone opens nothing; without a site validation record named, refused
    monkeypatch.delenv("SGLANG_DDTREE_SITE_RECORD", raising=False)
    with pytest.raises(NotImplementedError, match="site validation record"):
        worker.check_ddtree_worker_available(here)
    monkeypatch.setenv(worker.UNVALIDATED_WORKER_ENV, "1")
    assert worker.check_ddtree_worker_available(dict(here, tp_size=8)) is None
