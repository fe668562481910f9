"""The DDTREE worker glue (ddtree_worker_v2.py) against SGLang 0.5.23's real modules, without a GPU.

What can be checked here: the opt-in gate (DDTREE stops at argument resolution unless
SGLANG_DDTREE_UNVALIDATED_WORKER=1), that the glue imports against the patched wheel's own modules and
subclasses DFlashWorkerV2, that every attribute it reads on ``self`` exists on DFlashWorkerV2, and that every
keyword argument it passes to SGLang's functions and dataclasses (ForwardBatch, GenerationBatchResult,
DFlashVerifyInput, the KV plan, the draft-KV append, ...) is in their real signatures. What cannot: running
it (needs CUDA, the models, a scheduler) -- see the patch set's README.

Runs under ``$K26_SGLANG_ARGS_PYTHON`` (an interpreter with SGLang's runtime dependencies and torch); only
``setproctitle`` and ``aiohttp`` -- imported by the scheduler module and the package for process titles and
the HTTP frontend, never called here -- may be absent and are then stubbed. Any other missing module skips.
"""

from __future__ import annotations

import pytest
from ddtree_support import BARE_STUBBABLE, bare_part

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)


def test_worker_glue_imports_and_matches_sglang_signatures(tmp_path_factory):
    # the probe's worker_glue part (tests/ddtree_bare_probe.py), in the session's one bare-package child
    out = bare_part(tmp_path_factory, "worker_glue", "to import the worker glue's SGLang modules")
    assert out["gate_default"].startswith("DDTREE starts only on a site validation record"), out["gate_default"]
    assert "SGLANG_DDTREE_UNVALIDATED_WORKER=1" in out["gate_default"]
    assert out["mro"] == ["DDTreeWorkerV2", "DFlashWorkerV2"]
    assert out["missing_attrs"] == [], out["missing_attrs"]
    assert out["kwargs_checked"] > 50 and out["unknown_kwargs"] == [], out
    assert set(out["stubbed"]) <= set(BARE_STUBBABLE)
