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

from ddtree_support import ddtree_utils, load_file, patched_tree  # noqa: E402

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)

PKGS = ("sglang", "sglang.srt", "sglang.srt.speculative", "sglang.kernels", "sglang.kernels.ops",
        "sglang.kernels.ops.speculative")


@pytest.fixture()
def worker():
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    root = patched_tree()
    for name in PKGS:
        mod = types.ModuleType(name)
        mod.__path__ = [str(root / name.replace(".", "/"))]
        sys.modules[name] = mod
    sys.modules["sglang.srt.speculative.ddtree_utils"] = ddtree_utils()
    try:
        yield load_file(root / "sglang/srt/speculative/ddtree_worker.py", "sglang.srt.speculative.ddtree_worker")
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)


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
    assert torch.equal(mask, dd.build_verify_custom_mask(batch.tree_mask, prefix))


def test_ddtree_stops_at_startup_in_this_revision(worker, monkeypatch):
    monkeypatch.delenv(worker.UNVALIDATED_WORKER_ENV, raising=False)
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
