"""CUDA binary compatibility rules, the compat data, cuda.compat and torch.arch judged on recorded facts.

The torch_info facts are what torch 2.11.0+cu130 really reported on the H200 reference host
(tests/fixtures/snapshots/reference/h200x2-nvml.json): sm_75..sm_120, no sm_103.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import ci_requirements
import pytest
from hypothesis import given
from hypothesis import strategies as st
from stack_support import NO_NVML, load_reference, make_ctx, nvml_fact, run_check

from doctor.core.result import Status
from doctor.stack import compat
from doctor.stack.cuda_arch import best_match, parse_cc, parse_target

TORCH_211 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def torch_fact(flags=TORCH_211, cuda="13.0", version="2.11.0+cu130", **extra):
    return {"ok": True, "version": version, "cuda": cuda, "arch_flags": flags, "cuda_available": True,
            "devices": [], **extra}


def test_reference_host_torch_flags_are_what_we_assume():
    ref = load_reference()
    version, cuda, flags = ref["torch"][0], ref["torch"][1], ref["torch"][2]
    assert (version, cuda, flags) == ("2.11.0+cu130", "13.0", TORCH_211)


@pytest.mark.parametrize(("flags", "cc", "how", "target"), [
    (TORCH_211, (10, 3), "cubin", "sm_100"),      # B300 runs torch 2.11's sm_100 cubins
    (TORCH_211, (10, 0), "exact", "sm_100"),
    (TORCH_211, (9, 0), "exact", "sm_90"),
    (TORCH_211, (8, 9), "cubin", "sm_86"),
    (TORCH_211, (12, 1), "cubin", "sm_120"),
    (["sm_100a"], (10, 3), "none", None),          # arch-specific: exactly 10.0 only
    (["sm_100f"], (10, 3), "cubin", "sm_100f"),    # family-specific: 10.x with minor >= 0
    (["sm_103f"], (10, 0), "none", None),
    (["sm_90", "compute_90"], (10, 3), "ptx", "compute_90"),
    (["compute_100a"], (10, 3), "none", None),
    (["sm_120"], (10, 3), "none", None),           # another major never runs
    (["sm_80", "sm_86", "sm_89"], (8, 9), "exact", "sm_89"),
    (["sm_80", "sm_86"], (8, 7), "cubin", "sm_86"),
])
def test_best_match(flags, cc, how, target):
    m = best_match(flags, cc)
    assert (m.how, m.target) == (how, target), m.note


def test_arch_specific_note_explains_itself():
    m = best_match(["sm_100a", "sm_90a"], (10, 3))
    assert not m.ok and "sm_100a" in m.note and "exact GPU" in m.note


@given(st.integers(1, 12), st.integers(0, 9), st.integers(1, 12), st.integers(0, 9))
def test_cubin_rule_property(tm, tn, gm, gn):
    t = parse_target(f"sm_{tm}{tn}")
    assert t is not None
    assert t.runs_on((gm, gn)) == (gm == tm and gn >= tn)
    ptx = parse_target(f"compute_{tm}{tn}")
    assert ptx.runs_on((gm, gn)) == ((gm, gn) >= (tm, tn))


@pytest.mark.parametrize(("value", "cc"), [([10, 3], (10, 3)), ("10.3", (10, 3)), ("sm_103", (10, 3)), (90, (9, 0)),
                                           ("9.0", (9, 0)), ("junk", None), (True, None), (None, None), ([1], None)])
def test_parse_cc(value, cc):
    assert parse_cc(value) == cc


def test_compat_table():
    assert compat.min_driver("13.0") == "580.65.06"
    assert compat.min_driver("12.8") == "570.26"
    assert compat.minor_compat_min_driver("12.4") == "525.60.13"
    assert compat.triton_for_torch("2.11.0+cu130") == "3.6.0"
    assert compat.triton_for_torch("2.9.1") == "3.5.1"
    assert compat.sglang_pins("0.5.23") == {"sglang_kernel": "0.4.10", "flashinfer": "0.7.2"}
    assert compat.cuda_from_nvml(13000) == "13.0" and compat.cuda_from_nvml(12080) == "12.8"
    assert compat.cuda_from_nvml(True) is None and compat.cuda_from_nvml("13000") is None
    assert compat.ptxas_min_cuda("sm_103a") == "12.9"
    assert compat.arch_info("10.3")["min_cuda"] == "12.9" and compat.arch_info("7.2") == {}


# -- torch.arch -----------------------------------------------------------------------------------

def test_torch_arch_b300_runs_sm100_cubins():
    ctx = make_ctx("/nonexistent/python", facts={"torch_info": torch_fact(), "nvml": nvml_fact([(10, 3)] * 8)})
    res = run_check("torch.arch", ctx)
    assert res.status is Status.PASS, res.summary
    assert "no sm_103" in res.summary and "sm_100" in res.summary and "10.3" in res.summary


def test_torch_arch_fails_when_nothing_runs():
    ctx = make_ctx("/nonexistent/python", facts={"torch_info": torch_fact(["sm_80", "sm_90a"]),
                                                 "nvml": nvml_fact([(10, 3)])})
    res = run_check("torch.arch", ctx)
    assert res.status is Status.FAIL and "no kernels" in res.summary
    assert res.remediation and "torch==2.14.1" in res.remediation.commands[0]
    assert "Blackwell Ultra (B300, GB300) (10.3) needs a torch built with CUDA >= 12.9" in res.remediation.text


def test_torch_arch_ptx_only_warns():
    ctx = make_ctx("/x", facts={"torch_info": torch_fact(["sm_90", "compute_90"]), "nvml": nvml_fact([(10, 0)])})
    assert run_check("torch.arch", ctx).status is Status.WARN


def test_torch_arch_without_nvml_judges_the_profile_gpu_and_says_so():
    res = run_check("torch.arch", make_ctx("/x", facts={"torch_info": torch_fact(), "nvml": NO_NVML}))
    assert res.status is Status.PASS and "profile" in res.summary and "NVML unavailable" in res.summary


def test_torch_arch_cpu_build_fails():
    res = run_check("torch.arch", make_ctx("/x", facts={"torch_info": torch_fact(None, cuda=None,
                                                                                  version="2.13.0+cpu"),
                                                      "nvml": nvml_fact([(9, 0)])}))
    assert res.status is Status.FAIL and "CPU-only" in res.summary


def test_torch_arch_deep_matmul_failure_is_reported():
    info = torch_fact(matmul=[{"index": 0, "ok": True}, {"index": 1, "ok": False,
                                                         "error": "RuntimeError: CUDA error: no kernel image is "
                                                                  "available for execution on the device"}])
    ctx = make_ctx("/x", facts={"torch_info": info, "nvml": nvml_fact([(9, 0)] * 2)}, deep=True)
    res = run_check("torch.arch", ctx)
    assert res.status is Status.FAIL and "GPU 1" in res.summary and "no kernel image" in res.summary


def test_torch_arch_broken_torch_import_is_a_clear_fail():
    info = {"ok": False, "error": "import torch failed: OSError: libcudnn.so.9: cannot open shared object file"}
    res = run_check("torch.arch", make_ctx("/x", facts={"torch_info": info, "nvml": nvml_fact([(9, 0)])}))
    assert res.status is Status.FAIL and "libcudnn" in res.summary


# -- cuda.compat ----------------------------------------------------------------------------------

def test_cuda_compat_reference_host_passes():
    ref = load_reference()
    nvml = nvml_fact([(9, 0)] * 2, driver=ref["driver"], cuda=ref["cuda_driver"], name="NVIDIA H200")
    res = run_check("cuda.compat", make_ctx("/x", facts={"nvml": nvml, "torch_info": torch_fact()}))
    assert res.status is Status.PASS and "580.159.04" in res.summary


def test_cuda_compat_driver_too_old_fails_with_minimum():
    nvml = nvml_fact([(9, 0)], driver="570.124.06", cuda=12080)
    res = run_check("cuda.compat", make_ctx("/x", facts={"nvml": nvml, "torch_info": torch_fact()}))
    assert res.status is Status.FAIL and "580.65.06" in res.summary


def test_cuda_compat_minor_version_compatibility_warns():
    nvml = nvml_fact([(9, 0)], driver="550.54.14", cuda=12040)
    info = torch_fact(cuda="12.8", version="2.11.0+cu128")
    res = run_check("cuda.compat", make_ctx("/x", facts={"nvml": nvml, "torch_info": info}))
    assert res.status is Status.WARN and "minor-version" in res.summary
    assert res.details["mode"] == "minor-version-compat"


def test_cuda_compat_below_family_minimum_fails():
    nvml = nvml_fact([(9, 0)], driver="520.61.05", cuda=11080)
    info = torch_fact(cuda="12.8", version="2.11.0+cu128")
    assert run_check("cuda.compat", make_ctx("/x", facts={"nvml": nvml, "torch_info": info})).status is Status.FAIL


def test_cuda_compat_skips_without_nvml_and_never_passes():
    res = run_check("cuda.compat", make_ctx("/x", facts={"nvml": NO_NVML, "torch_info": torch_fact()}))
    assert res.status is Status.SKIP and "NVML" in res.summary


def test_cuda_compat_runtime_differs_from_profile_warns():
    info = torch_fact(cuda="12.9", version="2.11.0+cu129")
    res = run_check("cuda.compat", make_ctx("/x", facts={"nvml": nvml_fact([(10, 3)]), "torch_info": info}))
    assert res.status is Status.WARN and "13.0" in res.summary


def torch_python() -> str:
    """An interpreter with torch: $K26_TEST_TORCH_PYTHON, else this one if torch is installed (not imported)."""
    if os.environ.get("K26_TEST_TORCH_PYTHON"):
        return os.environ["K26_TEST_TORCH_PYTHON"]
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    ci_requirements.unavailable(ci_requirements.reason(["torch"], sys.executable, "for the torch_info probe")
                                + "; or set K26_TEST_TORCH_PYTHON to a venv with torch")


def test_torch_info_probe_with_real_cpu_torch():
    from doctor.stack.facts import collect_torch_info

    ctx = make_ctx(torch_python(), facts={"nvml": NO_NVML})
    info = collect_torch_info(ctx.facts.options)
    assert info["ok"] and info["version"].startswith("2.") and info["import_s"] > 0
    ctx.facts.seed("torch_info", info)
    res = run_check("torch.arch", ctx)
    if info["cuda"] is None:
        assert res.status is Status.FAIL and "CPU-only" in res.summary
    else:
        assert info["arch_flags"] and info["version"] in res.summary


def test_cuda_compat_without_any_driver_reading_is_an_error_not_a_pass():
    nvml = {"available": True, "driver_version": None, "cuda_driver_version": None, "devices": []}
    res = run_check("cuda.compat", make_ctx("/x", facts={"nvml": nvml, "torch_info": torch_fact(cuda="11.2")}))
    assert res.status is Status.ERROR and "cannot judge" in res.summary


def test_cuda_compat_torch_cannot_initialise_cuda_fails_with_torchs_words():
    info = torch_fact(cuda_available=False, cuda_warnings=[
        "CUDA initialization: The NVIDIA driver on your system is too old (found version 12080)."])
    res = run_check("cuda.compat", make_ctx("/x", facts={"nvml": nvml_fact([(9, 0)]), "torch_info": info}))
    assert res.status is Status.FAIL and "driver on your system is too old" in res.summary
