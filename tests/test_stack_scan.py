"""The ``kernels`` probe under a real interpreter whose sys.path holds real wheels' files (torch 2.11.0,
sglang-kernel 0.4.10, flashinfer-cubin 0.4.1), and distributions with broken files beside them."""

from __future__ import annotations

import os
import shutil
import sys

import pytest
from interpreters import bare_python
from kernel_wheels import MISSING_0_4_10, cubin_site, kernel_site, torch_site
from stack_support import write_dist

from doctor.core import proc


def probe(*sites, args=(), python: str = sys.executable) -> dict:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(str(s) for s in sites)}
    data, res = proc.run_probe(python, "kernels", list(args), timeout=120, env=env)
    assert data is not None, res.why()
    assert data["ok"], data
    return data


def by_name(data: dict) -> dict:
    return {p["name"]: p for p in data["packages"]}


@pytest.mark.network
def test_real_stack_scanned_from_the_service_interpreter():
    # an interpreter that sees only these sites (the test interpreter may have its own torch: CI installs one)
    data = probe(torch_site(), kernel_site(), cubin_site(), python=str(bare_python()))
    pkgs = by_name(data)
    assert set(pkgs) == {"torch", "sglang-kernel", "flashinfer-cubin"}
    torch = pkgs["torch"]
    assert torch["version"] == "2.11.0" and not torch["errors"]
    files = {f["path"]: f for f in torch["files"]}
    assert files["torch/lib/libtorch_cuda.so"]["sass"][:2] == ["sm_75", "sm_80"]
    assert "sm_103a" in files["torch/lib/libtorch_cuda.so"]["sass"]
    assert files["torch/lib/libtorch_nvshmem.so"]["relocatable"]["ptx"] == ["sm_120"]
    kernel = pkgs["sglang-kernel"]
    assert {f["path"] for f in kernel["files"]} >= {
        "sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so", "sgl_kernel/flash_ops.abi3.so"}
    assert set(kernel["abi"]["missing"]["sgl_kernel/sm90/common_ops.abi3.so"]) == MISSING_0_4_10
    assert len(pkgs["flashinfer-cubin"]["files"]) == 3460
    assert all(f["path"].startswith("flashinfer_cubin/cubins/") for f in pkgs["flashinfer-cubin"]["files"])
    # every distribution's pins, for the Requires-Dist check; the doctor's own location is not one of them
    assert data["distributions"]["sglang-kernel"]["requires"] == ["torch==2.14.1"]
    assert "k26-doctor" not in data["distributions"]
    assert data["torch"]["libraries"] and not data["torch"]["errors"]
    assert data["scan_s"] > 0 and data["files_read"] >= 3479


@pytest.mark.network
def test_the_older_kernel_resolves_and_the_first_copy_on_sys_path_wins():
    data = probe(torch_site(), kernel_site("0.4.5"), kernel_site())
    kernel = by_name(data)["sglang-kernel"]
    assert kernel["version"] == "0.4.5"
    assert kernel["abi"]["missing"] == {} and "sgl_kernel/sm90/common_ops.abi3.so" in kernel["abi"]["checked"]


@pytest.mark.network
def test_without_torch_the_abi_cannot_be_judged():
    # an interpreter without torch of its own (the test interpreter has one under CI)
    kernel = by_name(probe(kernel_site(), python=str(bare_python())))["sglang-kernel"]
    assert "torch is not installed" in kernel["abi"]["error"]


@pytest.mark.network
def test_broken_files_are_named_and_the_rest_is_read(tmp_path):
    real = kernel_site() / "sgl_kernel" / "spatial_ops.abi3.so"
    write_dist(tmp_path, "broken-kernels", "1.0")
    pkg = tmp_path / "broken_kernels"
    pkg.mkdir()
    shutil.copy(real, pkg / "good.so")
    data = real.read_bytes()
    (pkg / "cut.so").write_bytes(data[: len(data) // 2])
    os.mkfifo(pkg / "fifo.so")
    (pkg / "script.so").write_text("/* GNU ld script */\nOUTPUT_FORMAT(elf64-x86-64)\nGROUP ( libc.so.6 )\n")
    record = "".join(f"broken_kernels/{n},,\n" for n in ("good.so", "cut.so", "fifo.so", "script.so", "gone.so",
                                                         "__init__.py"))
    (tmp_path / "broken_kernels-1.0.dist-info" / "RECORD").write_text(record)
    write_dist(tmp_path, "no-record", "2.0")
    os.remove(tmp_path / "no_record-2.0.dist-info" / "RECORD")
    out = probe(tmp_path)
    pkg_out = by_name(out)["broken-kernels"]
    assert [f["path"] for f in pkg_out["files"]] == ["broken_kernels/good.so"]
    errors = {e["path"]: (e["kind"], e["error"]) for e in pkg_out["errors"]}
    assert errors["broken_kernels/cut.so"][0] == "malformed"
    assert errors["broken_kernels/fifo.so"] == ("unreadable", "not a regular file")
    gone = errors["broken_kernels/gone.so"]
    assert gone[0] == "unreadable" and "FileNotFoundError" in gone[1]
    assert "broken_kernels/script.so" not in errors  # a linker script: no GPU code, nothing wrong
    assert out["no_file_list"] == ["no-record"]


def test_a_doctor_that_cannot_be_loaded_is_a_clear_failure(tmp_path):
    """The probe as a lone file (no doctor package beside it): a JSON error, not a traceback."""
    lone = tmp_path / "probes"
    lone.mkdir(parents=True)
    shutil.copy(proc.PROBES_DIR / "kernels.py", lone / "kernels.py")
    # -S: no site-packages, where an installed (or editable) k26-doctor would be found, as under CI.
    res = proc.run([sys.executable, "-S", str(lone / "kernels.py")], 60)
    assert res.ok and '"ok": false' in res.stdout and "cannot load the scanner" in res.stdout
