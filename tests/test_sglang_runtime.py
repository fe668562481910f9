"""sglang.install looks past ``import sglang``: what a real server imported at start and stopped on.

The probe runs for real under an interpreter with package trees built on disk (a FlashInfer whose JIT
directories are whole or partial, a CuTe DSL namespace without ``cutlass.cute``); the judgement runs on
the facts it reports, for the profiles it matters to. The rules come from real SGLang 0.5.23 servers
that stopped on each (bench/results/ddtree-h200-round1/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from stack_support import healthy_venv, make_ctx, nvml_fact, run_check, stack_site

from doctor.core.result import Severity, Status
from doctor.sglang.runtime import RUNTIME_CUTE_DSL, RUNTIME_FLASHINFER, RUNTIME_FLASHINFER_SOURCES, runtime_problems

PROBE = Path(__file__).resolve().parents[1] / "doctor" / "probes" / "sglang_import.py"
JIT_DIRS = ("data/csrc", "data/include", "data/cutlass/include", "data/cccl/cub")


def flashinfer_tree(site: Path, dirs=JIT_DIRS, importable: bool = True) -> None:
    pkg = site / "flashinfer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sampling.py").write_text("def top_p_renorm_probs(p, t):\n    return p\n" if importable
                                     else "raise ImportError('libcudart.so.13: cannot open shared object file')\n")
    for d in dirs:
        (pkg / d).mkdir(parents=True)


def runtime_from_probe(site: Path) -> dict:
    """The probe's own ``runtime_deps()`` under a real interpreter with ``site`` on its path."""
    code = (f"import sys; sys.path[:0] = [{str(site)!r}, {str(PROBE.parent)!r}]; import json, sglang_import; "
            "print(json.dumps(sglang_import.runtime_deps()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_probe_reads_a_whole_flashinfer_and_a_namespace_only_cute_dsl(tmp_path):
    flashinfer_tree(tmp_path)
    (tmp_path / "cutlass" / "_mlir").mkdir(parents=True)  # what the DSL's base wheel alone provides
    rt = runtime_from_probe(tmp_path)
    assert rt["flashinfer"]["importable"] is True
    assert rt["flashinfer"]["jit_dirs"] == dict.fromkeys(JIT_DIRS, True)
    assert rt["cute_dsl"]["found"] is False


def test_probe_reads_a_trimmed_flashinfer_and_one_that_fails_to_import(tmp_path):
    flashinfer_tree(tmp_path / "a", dirs=("data/include", "data/cccl/cub"))
    rt = runtime_from_probe(tmp_path / "a")
    assert rt["flashinfer"]["jit_dirs"]["data/csrc"] is False and rt["flashinfer"]["jit_dirs"]["data/include"]
    flashinfer_tree(tmp_path / "b", importable=False)
    rt = runtime_from_probe(tmp_path / "b")
    assert rt["flashinfer"]["importable"] is False and "libcudart" in rt["flashinfer"]["error"]


NO_FI = {"flashinfer": {"importable": False, "error": "ModuleNotFoundError: No module named 'flashinfer'"},
         "cute_dsl": {"found": True}}
TRIMMED = {"flashinfer": {"importable": True, "package_dir": "/site/flashinfer",
                          "jit_dirs": {"data/csrc": True, "data/cutlass/include": False}},
           "cute_dsl": {"found": True}}
NO_CUTE = {"flashinfer": {"importable": True, "jit_dirs": dict.fromkeys(JIT_DIRS, True)},
           "cute_dsl": {"found": False}}


@pytest.mark.parametrize("algo", ["DDTREE", "DFLASH"])
def test_speculative_verify_without_flashinfer_fails_with_the_pinned_install(algo):
    found = runtime_problems(NO_FI, algorithm=algo, architectures=["KimiK25ForConditionalGeneration"],
                             flashinfer_pin="==0.7.2")
    assert [(f.code, f.severity) for f in found] == [(RUNTIME_FLASHINFER, Severity.FAIL)]
    assert "flashinfer.sampling" in found[0].message and algo in found[0].message
    assert found[0].fix and found[0].fix.commands == ["pip install 'flashinfer-python==0.7.2'"]


def test_no_speculation_does_not_need_flashinfer_and_a_trimmed_one_is_named():
    assert runtime_problems(NO_FI, algorithm=None, architectures=["Qwen3ForCausalLM"]) == []
    found = runtime_problems(TRIMMED, algorithm="DDTREE", architectures=[])
    assert [(f.code, f.severity) for f in found] == [(RUNTIME_FLASHINFER_SOURCES, Severity.FAIL)]
    assert "lacks data/cutlass/include" in found[0].message
    assert found[0].fix and "--force-reinstall" in found[0].fix.commands[0]


def test_cute_dsl_fails_a_qwen_target_and_only_warns_a_kimi_one():
    found = runtime_problems(NO_CUTE, algorithm=None, architectures=["Qwen3ForCausalLM"])
    assert [(f.code, f.severity) for f in found] == [(RUNTIME_CUTE_DSL, Severity.FAIL)]
    assert "DualGemm" in found[0].message
    found = runtime_problems(NO_CUTE, algorithm=None, architectures=["KimiK25ForConditionalGeneration"])
    assert [(f.code, f.severity) for f in found] == [(RUNTIME_CUTE_DSL, Severity.WARN)]  # the same kind: a warning
    assert "not importable" in found[0].message


def test_an_older_fact_without_runtime_judges_nothing_more():
    assert runtime_problems(None, algorithm="DDTREE", architectures=[]) == []


def test_sglang_install_fails_a_ddtree_profile_whose_flashinfer_is_missing(tmp_path):
    ctx = make_ctx(healthy_venv(), env={"PYTHONPATH": str(stack_site(tmp_path / "site"))},
                   facts={"nvml": nvml_fact([(10, 3)])}, deep=True)  # the import's answer: --deep
    ctx.facts.seed("sglang_import", {"ok": True, "imported": True, "version": "0.5.23", "import_s": 9.1,
                                     "dflash": {"available": True}, "runtime": NO_FI})
    res = run_check("sglang.install", ctx)
    assert res.status is Status.FAIL and "would stop at start" in res.summary
    assert res.remediation.commands == ["pip install 'flashinfer-python==0.7.2'"]
