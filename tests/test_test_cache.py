"""The test cache of computed results (sglang_wheels.computed_once): a result is reused only while everything it
was keyed by is unchanged, and a result its computation does not vouch for is never kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import sglang_wheels
from interpreters import identity


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(sglang_wheels, "CACHE", tmp_path / "cache")
    return tmp_path / "cache"


def counting(result: dict, keep: bool = True):
    calls = []

    def compute() -> tuple[dict, bool]:
        calls.append(1)
        return result, keep
    return compute, calls


def test_a_result_is_computed_once_per_content_of_its_inputs_and_key(tmp_path: Path, cache: Path) -> None:
    src = tmp_path / "probe.py"
    src.write_text("print(1)\n")
    compute, calls = counting({"value": 1})
    assert sglang_wheels.computed_once("p", [src], {"python": "a"}, compute) == {"value": 1}
    assert sglang_wheels.computed_once("p", [src], {"python": "a"}, compute) == {"value": 1}
    assert len(calls) == 1
    sglang_wheels.computed_once("p", [src], {"python": "b"}, compute)  # another interpreter
    assert len(calls) == 2
    src.write_text("print(2)\n")  # the probe changed
    sglang_wheels.computed_once("p", [src], {"python": "a"}, compute)
    assert len(calls) == 3
    assert len(list((cache / "results").glob("p-*.json"))) == 3


def test_a_result_not_vouched_for_is_returned_and_not_kept(tmp_path: Path, cache: Path) -> None:
    compute, calls = counting({"error": "the child crashed"}, keep=False)
    for _ in range(2):
        assert sglang_wheels.computed_once("p", [], {}, compute) == {"error": "the child crashed"}
    assert len(calls) == 2 and not list((cache / "results").glob("*.json"))


def test_a_torn_result_is_computed_again(tmp_path: Path, cache: Path) -> None:
    compute, calls = counting({"value": 1})
    sglang_wheels.computed_once("p", [], {}, compute)
    (stored,) = (cache / "results").glob("p-*.json")
    stored.write_text('{"val')
    assert sglang_wheels.computed_once("p", [], {}, compute) == {"value": 1} and len(calls) == 2


def test_the_inputs_of_a_probe_are_the_checkout_modules_it_imports(tmp_path: Path) -> None:
    """Nested imports too (inside a function), at any depth; what is not the checkout's is left to the
    interpreter's identity."""
    here = Path(__file__).resolve().parent
    script = tmp_path / "probe.py"
    script.write_text("import json\n\ndef main():\n    from ddtree_support import SET_DIR\n    import torch\n")
    found = sglang_wheels.project_sources(script)
    assert script.resolve() in found and here / "ddtree_support.py" in found
    assert here / "sglang_wheels.py" in found and here / "downloads.py" in found  # what ddtree_support imports
    assert all(p == script.resolve() or here.parent in p.parents for p in found)


def test_the_interpreters_identity_names_its_distributions(tmp_path: Path) -> None:
    import sys

    me = identity(sys.executable)
    assert "error" not in me and ["pytest", __import__("pytest").__version__] in me["distributions"]
    assert "files" in me


def test_a_worker_gives_its_children_one_openmp_thread() -> None:
    """conftest._one_thread_per_worker: set in each xdist worker before torch is imported (a caller's value kept)."""
    import os

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("one process (-n 0): torch keeps its default")
    assert os.environ.get("OMP_NUM_THREADS") and os.environ.get("MKL_NUM_THREADS")
