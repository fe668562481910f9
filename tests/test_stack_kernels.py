"""stack.kernels, torch.arch from the binaries and cuda.libcuda, run as the runner runs them: real probes
under a real interpreter whose sys.path holds real wheels' files, judged against recorded NVML readings."""

from __future__ import annotations

import functools
import subprocess

import pytest
from kernel_wheels import built, cubin_site, fatbinary, host_library, kernel_site, torch_site
from stack_support import NO_NVML, fake_libcuda, healthy_venv, make_ctx, nvml_fact, run_check, workdir, write_dist

from doctor.core.result import Status

B300 = nvml_fact([(10, 3)] * 8)
H200 = nvml_fact([(9, 0)], name="NVIDIA H200")


def ctx_for(*sites, nvml=B300, profile="b300-tp8-ddtree", deep=False, env=None):
    paths = ":".join(str(s) for s in sites)
    return make_ctx(healthy_venv(), env={"PYTHONPATH": paths, **(env or {})}, facts={"nvml": nvml},
                    profile=profile, deep=deep)


@pytest.mark.network
def test_kernels_built_for_another_torch_fail_with_the_symbols_and_the_fix():
    res = run_check("stack.kernels", ctx_for(torch_site(), kernel_site(), cubin_site()))
    assert res.status is Status.FAIL
    assert res.summary.startswith("sglang-kernel 0.4.10: 6 of its libraries need 6 torch symbol(s) torch 2.11.0 "
                                  "does not define")
    assert "import fails with 'undefined symbol'" in res.summary
    assert "built against another torch (torch==2.14.1)" in res.remediation.text
    assert "sglang 0.5.17 with sglang-kernel 0.4.5" in res.remediation.text
    assert res.remediation.commands == [f"{healthy_venv()} -m pip install 'torch==2.14.1'"]
    missing = res.details["abi_missing"]["sglang-kernel 0.4.10"]["sgl_kernel/sm90/common_ops.abi3.so"]
    assert "_ZN3c104cuda19CUDAErrorLogCaptureC1Ev" in missing
    assert "sglang-kernel 0.4.10 requires torch==2.14.1, installed 2.11.0" in res.details["unmet_requirements"]


@pytest.mark.network
def test_details_packages_have_the_contract_shape():
    res = run_check("stack.kernels", ctx_for(torch_site(), kernel_site("0.4.5")))
    pkgs = {p["name"]: p for p in res.details["packages"]}
    assert set(pkgs) == {"torch", "sglang-kernel"}
    for p in pkgs.values():
        assert set(p) == {"name", "version", "files"}
        for f in p["files"]:
            assert set(f) == {"path", "sass", "ptx"} and not f["path"].startswith("/")
    common = next(f for f in pkgs["sglang-kernel"]["files"] if f["path"] == "sgl_kernel/sm90/common_ops.abi3.so")
    assert common["sass"] == ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"]


@pytest.mark.network
@pytest.mark.parametrize(("nvml", "where"), [(B300, "8x NVIDIA B300 SXM6 AC"), (H200, "1x NVIDIA H200")])
def test_the_torch_2_11_stack_passes_on_b300_and_h200(nvml, where):
    res = run_check("stack.kernels", ctx_for(torch_site(), kernel_site("0.4.5"), nvml=nvml))
    assert res.status is Status.PASS, res.summary
    assert res.summary == (f"2 kernel packages (9 files with GPU code) run on {where}; the torch symbols of 6 "
                           "libraries resolve in torch 2.11.0")
    if nvml is B300:  # FA3 (flash_ops) is Hopper-only: noted, not a failure
        assert any("not built for 10.x (e.g. sgl_kernel/flash_ops.abi3.so)" in n for n in res.details["notes"])


@pytest.mark.network
def test_cubins_for_other_gpus_of_the_generation_warn():
    res = run_check("stack.kernels", ctx_for(torch_site(), kernel_site("0.4.5"), cubin_site()))
    assert res.status is Status.WARN
    assert res.summary.startswith("flashinfer-cubin 0.4.1: 104 of 3460 kernel files have code for other 10.x GPUs "
                                  "but not 10.3 (e.g. flashinfer_cubin/cubins/")
    assert "fmha{arch}Kernel_" in res.summary  # fmhaSm100aKernel_... grouped with fmhaSm103aKernel_...


@pytest.mark.network
def test_cubins_for_another_generation_are_only_noted():
    res = run_check("stack.kernels", ctx_for(torch_site(), kernel_site("0.4.5"), cubin_site(), nvml=H200))
    assert res.status is Status.PASS
    assert "flashinfer-cubin 0.4.1 carries no code for 9.0: built for other GPUs" in res.details["notes"]


@pytest.mark.network
def test_a_required_package_without_code_for_the_gpu_fails():
    res = run_check("stack.kernels", ctx_for(torch_site(), kernel_site("0.4.5"), nvml=nvml_fact([(7, 5)])))
    assert res.status is Status.FAIL
    assert res.summary.startswith("sglang-kernel 0.4.5 has no code that runs on 7.5 (sm_80, sm_86, sm_89, sm_90,")


@functools.cache
def ptx_only_site() -> str:
    """A distribution named sgl-kernel whose one library holds PTX only (compute_90, PTX ISA 8.7)."""
    site = workdir() / "site-ptx-only"
    write_dist(site, "sgl-kernel", "0.0.1")
    (site / "ptxonly").mkdir(parents=True)
    d = built()
    fb = d / "ptx87.fatbin"
    subprocess.run([str(fatbinary()), "--64", f"--create={fb}", f"--image3=kind=ptx,sm=90,file={d / 'k_87ptx.ptx'}"],
                   check=True, timeout=120)
    lib = host_library([fb], "ptxonly")
    (site / "ptxonly" / "ops.so").write_bytes(lib.read_bytes())
    (site / "sgl_kernel-0.0.1.dist-info" / "RECORD").write_text("ptxonly/ops.so,,\n")
    return str(site)


@pytest.mark.network
def test_ptx_only_runs_by_jit_when_the_driver_knows_its_isa():
    res = run_check("stack.kernels", ctx_for(torch_site(), ptx_only_site()))
    assert res.status is Status.WARN and res.details["driver_ptx_isa"] == "9.0"
    assert "sgl-kernel 0.0.1: 1 kernel files run on 10.3 only by JIT-compiling PTX at first use" in res.summary


@pytest.mark.network
def test_ptx_newer_than_the_driver_is_no_code_at_all():
    res = run_check("stack.kernels", ctx_for(torch_site(), ptx_only_site(), nvml=nvml_fact([(10, 3)], cuda=12060)))
    assert res.status is Status.FAIL and res.details["driver_ptx_isa"] == "8.5"
    assert "sgl-kernel 0.0.1 has no code that runs on 10.3 (PTX only): sm_90 PTX (ISA 8.7) is newer than the " \
           "driver's PTX ISA 8.5" in res.summary


@pytest.mark.network
def test_without_nvml_the_profile_gpu_is_judged_and_ptx_isa_assumed():
    res = run_check("stack.kernels", ctx_for(torch_site(), ptx_only_site(), nvml=NO_NVML))
    assert res.details["gpus"] == "the profile's GPU (10.3)" and res.details["driver_ptx_isa"] is None
    assert any("assumed it JIT-compiles" in n for n in res.details["notes"])


def test_no_gpu_code_anywhere_fails(tmp_path):
    write_dist(tmp_path, "numpy-like", "1.0")
    res = run_check("stack.kernels", ctx_for(tmp_path))
    assert res.status is Status.FAIL and "no installed package carries GPU code" in res.summary


# -- torch.arch from the binaries ---------------------------------------------------------------------------

@pytest.mark.network
def test_torch_arch_reads_libtorch_cuda_without_importing_torch():
    ctx = ctx_for(torch_site())
    res = run_check("torch.arch", ctx)
    assert res.status is Status.PASS, res.summary
    assert res.summary == ("torch 2.11.0+cu130 on 8x NVIDIA B300 SXM6 AC: no sm_103; 10.3 runs the sm_100 cubins "
                           "(binary compatible within major 10)")
    assert res.details["targets_from"] == "torch/lib/libtorch_cuda.so (fat binary)"
    assert "sm_103a" in res.details["arch_flags"]  # arch-specific extras are read, not counted as torch's set
    assert "torch_info" not in ctx.facts._values  # torch was never imported


@pytest.mark.network
def test_torch_arch_on_h200_reads_as_the_recorded_import_did():
    res = run_check("torch.arch", ctx_for(torch_site(), nvml=H200))
    assert res.summary == "torch 2.11.0+cu130 on 1x NVIDIA H200: has sm_90 for 9.0"  # the live H200 run's words


@pytest.mark.network
def test_torch_arch_deep_imports_torch():
    """--deep keeps the real import and matmul: here torch's Python files are absent, so the import fails."""
    res = run_check("torch.arch", ctx_for(torch_site(), deep=True))
    assert res.status is Status.FAIL and "torch cannot be imported" in res.summary


def test_torch_arch_cpu_build_and_absent_torch(tmp_path):
    cpu = tmp_path / "cpu"
    write_dist(cpu, "torch", "2.13.0+cpu", top_level="torch")
    (cpu / "torch" / "version.py").write_text("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n")
    res = run_check("torch.arch", ctx_for(cpu))
    assert res.status is Status.FAIL and "2.13.0+cpu is a CPU-only build" in res.summary
    res = run_check("torch.arch", ctx_for(tmp_path / "empty"))
    assert res.status is Status.FAIL and "torch is not installed" in res.summary


# -- cuda.libcuda ------------------------------------------------------------------------------------------

def test_cuda_libcuda_runs_the_probe_with_the_service_environment():
    lib = fake_libcuda("580.159.04")
    res = run_check("cuda.libcuda", ctx_for(env={"LD_LIBRARY_PATH": str(lib)}))
    assert res.details["libcuda"] == str(lib / "libcuda.so.580.159.04") and res.details["cu_init"] == 0
    if res.details["kernel_module"] is None:  # no NVIDIA kernel module on this machine
        assert res.status is Status.WARN and "kernel module's version is unreadable" in res.summary
    else:
        assert res.status in (Status.PASS, Status.FAIL)
