"""The libcuda the service's loader resolves, with real shared objects built by gcc placed first on
LD_LIBRARY_PATH and the kernel module's version file given to the probe; then judged."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from file_modules import load_file
from stack_support import fake_libcuda, fake_libcuda_stub

from doctor.core import proc
from doctor.core.result import Result
from doctor.facts.shape import problem
from doctor.stack import libcuda
from doctor.stack.facts import LIBCUDA_SHAPE
from doctor.stack.libcuda import datacenter_gpu

KMD = "580.159.04"
OPEN_KMD = (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {KMD}  Release Build  "
            "(dvs-builder@U22-I3-AF03-09-1)  Wed Oct  1 10:00:00 UTC 2026\nGCC version:  gcc version 12.3.0\n")
def judge(fact: dict, gpu_names: list[str] | None) -> Result:
    """cuda.libcuda's judgement of one fact, as the check's result (status, summary, remediation, details)."""
    return Result.judging(lambda: libcuda.judge(fact, gpu_names))


def proc_version(tmp_path: Path, text: str = OPEN_KMD) -> Path:
    f = tmp_path / "version"
    f.write_text(text)
    return f


def run(ld_path: list[Path], version_file: Path | str, *extra: str) -> dict:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "LD_LIBRARY_PATH": os.pathsep.join(str(p) for p in ld_path)}
    data, res = proc.run_probe(sys.executable, "libcuda", ["--proc-version", str(version_file), *extra],
                               timeout=60, env=env)
    assert data is not None, res.why()
    assert problem(data, LIBCUDA_SHAPE) is None  # what the probe records is what the collector declares
    return data


def test_matching_libcuda_passes(tmp_path):
    fact = run([fake_libcuda(KMD)], proc_version(tmp_path))
    res = fact["resolved"]
    assert res["loaded"] and res["version"] == KMD and res["path"].endswith(f"libcuda.so.{KMD}")
    assert res["driver_get_version"] == {"rc": 0, "cuda": 13000} and res["cu_init"] == 0
    assert fact["kernel_module"]["version"] == KMD and fact["kernel_module"]["open"]
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "pass" and f"matches the kernel module {KMD}" in v.summary


def test_older_libcuda_first_on_ld_library_path_is_803_with_the_exact_fix(tmp_path):
    wrong, right = fake_libcuda("570.86.10", cuda=12080), fake_libcuda(KMD)
    fact = run([wrong, right], proc_version(tmp_path))
    assert fact["resolved"]["version"] == "570.86.10"
    assert [c["version"] for c in fact["ld_library_path_candidates"]] == ["570.86.10", KMD]
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "fail" and "error 803" in v.summary and f"LD_LIBRARY_PATH entry {wrong}" in v.summary
    assert f"Remove {wrong} from the service's LD_LIBRARY_PATH" in v.remediation.text
    assert v.remediation.commands == [f"export LD_LIBRARY_PATH={right}"]
    assert f"{right}/libcuda.so.1" in v.remediation.text  # the one matching the kernel module


def test_forward_compatibility_on_a_datacenter_gpu_passes(tmp_path):
    fact = run([fake_libcuda("590.44.01", cuda=13010)], proc_version(tmp_path))
    v = judge(fact, ["NVIDIA H200"] * 2)
    assert v.status == "pass" and v.summary.startswith("forward compatibility: libcuda 590.44.01")


def test_forward_compatibility_on_a_geforce_is_804(tmp_path):
    compat = fake_libcuda("590.44.01", cuda=13010)
    fact = run([compat], proc_version(tmp_path))
    v = judge(fact, ["NVIDIA GeForce RTX 5090"])
    assert v.status == "fail" and "error 804" in v.summary and "GeForce RTX 5090 cannot use it" in v.summary
    assert v.remediation.commands == ["unset LD_LIBRARY_PATH"]


def test_forward_compatibility_unknown_gpu_or_no_nvml_warns(tmp_path):
    fact = run([fake_libcuda("590.44.01", cuda=13010)], proc_version(tmp_path))
    assert judge(fact, None).status == "warn" and "NVML could not name" in judge(fact, None).summary
    assert judge(fact, ["NVIDIA Mystery 9000"]).status == "warn"


def test_cuinit_saying_804_is_believed(tmp_path):
    fact = run([fake_libcuda(KMD, cuinit_rc=804)], proc_version(tmp_path))
    assert fact["resolved"]["cu_init"] == 804
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "fail" and "error 804" in v.summary


def test_the_toolkits_link_stub_first_on_the_path_fails_with_the_exact_fix(tmp_path):
    """As on the lent H200 (bench/results/h200x1-device-session): /usr/local/cuda/lib64/stubs/libcuda.so first
    on LD_LIBRARY_PATH. The loader takes it; cuInit answers 34; the driver's own libcuda is further down."""
    stub, right = fake_libcuda_stub(), fake_libcuda(KMD)
    fact = run([stub, right], proc_version(tmp_path))
    assert fact["resolved"]["path"] == f"{stub}/libcuda.so.1" and fact["resolved"]["version"] is None
    assert fact["resolved"]["cu_init"] == 34
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "fail" and "link stub" in v.summary and f"LD_LIBRARY_PATH entry {stub}" in v.summary
    assert "34 (CUDA_ERROR_STUB_LIBRARY" in v.summary
    assert v.remediation.commands == [f"export LD_LIBRARY_PATH={right}"]
    assert f"{right}/libcuda.so.1" in v.remediation.text


def test_the_link_stub_is_known_by_its_directory_without_cuinit(tmp_path):
    fact = run([fake_libcuda_stub()], proc_version(tmp_path), "--no-init")
    assert "cu_init" not in fact["resolved"]
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "fail" and "link stub" in v.summary and "cuInit returned" not in v.summary


def test_an_unversioned_libcuda_whose_cuinit_fails_fails(tmp_path):
    fact = run([fake_libcuda_stub(cuinit_rc=999)], proc_version(tmp_path))
    fact["resolved"]["path"] = fact["resolved"]["realpath"] = "/opt/vendor/lib/libcuda.so.1"  # not under stubs/
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "fail" and "carries no driver version" in v.summary and "999 (CUDA_ERROR_UNKNOWN" in v.summary
    fact["resolved"]["cu_init"] = 0
    assert judge(fact, ["NVIDIA H200"]).status == "warn"


@pytest.mark.parametrize(("rc", "name"), [(100, "CUDA_ERROR_NO_DEVICE"), (304, "CUDA_ERROR_OPERATING_SYSTEM"),
                                          (12345, None)])
def test_the_right_libcuda_whose_cuinit_fails_is_no_pass(tmp_path, rc, name):
    fact = run([fake_libcuda(KMD, cuinit_rc=rc)], proc_version(tmp_path))
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "fail" and f"matches the kernel module {KMD}, but cuInit returned {rc}" in v.summary
    assert (name or "(") in v.summary if name else f"returned {rc}" in v.summary
    assert "ls -l /dev/nvidia*" in v.remediation.commands


def test_no_init_flag_skips_cuinit(tmp_path):
    fact = run([fake_libcuda(KMD)], proc_version(tmp_path), "--no-init")
    assert "cu_init" not in fact["resolved"]


def test_no_driver_at_all_skips(tmp_path):
    fact = run([tmp_path], tmp_path / "absent")
    assert not fact["kernel_module"]["present"]
    if fact["resolved"]["loaded"]:
        pytest.skip("this machine's loader finds a libcuda.so.1 of its own")
    v = judge(fact, None)
    assert v.status == "skip" and "no NVIDIA driver" in v.summary


def test_kernel_module_without_libcuda_fails(tmp_path):
    fact = run([tmp_path], proc_version(tmp_path))
    if fact["resolved"]["loaded"]:
        pytest.skip("this machine's loader finds a libcuda.so.1 of its own")
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "fail" and f"kernel module {KMD} is loaded" in v.summary
    assert "libnvidia-compute-580" in v.remediation.text


def test_proprietary_module_text_and_unreadable_version(tmp_path):
    text = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {KMD}  Sat Aug 19 01:15:15 UTC 2026\n"
    fact = run([fake_libcuda(KMD)], proc_version(tmp_path, text))
    assert fact["kernel_module"]["version"] == KMD and not fact["kernel_module"]["open"]
    fact = run([fake_libcuda(KMD)], proc_version(tmp_path, "garbage\n"))
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "warn" and "unreadable" in v.summary


def load_probe():
    return load_file(proc.PROBES_DIR / "libcuda.py", "libcuda_probe", register=False)


def test_ld_so_conf_includes_are_followed(tmp_path):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "ld.so.conf").write_text(f"include {tmp_path}/conf.d/*.conf\n/usr/local/lib # local\n")
    (tmp_path / "conf.d" / "cuda-compat.conf").write_text("/usr/local/cuda-13.1/compat\n")
    (tmp_path / "conf.d" / "loop.conf").write_text(f"include {tmp_path}/ld.so.conf\n")
    found = load_probe().ld_so_conf(str(tmp_path / "ld.so.conf"))
    assert found == {"/usr/local/cuda-13.1/compat": str(tmp_path / "conf.d" / "cuda-compat.conf"),
                     "/usr/local/lib": str(tmp_path / "ld.so.conf")}


def test_loader_cache_origin_names_the_conf_file_and_ldconfig(tmp_path):
    """A libcuda found through the loader cache: the fix removes its directory from the file that lists it."""
    compat = fake_libcuda("590.44.01", cuda=13010)
    fact = run([compat], proc_version(tmp_path))
    # As recorded on a host where the directory came from /etc/ld.so.conf.d rather than LD_LIBRARY_PATH:
    fact["ld_library_path"] = ""
    fact["ldconfig"] = [{"path": str(compat / "libcuda.so.1"), "realpath": str(compat / "libcuda.so.590.44.01"),
                         "version": "590.44.01", "conf": "/etc/ld.so.conf.d/000_cuda-compat.conf"}]
    v = judge(fact, ["NVIDIA GeForce RTX 4090"])
    assert v.status == "fail" and "the loader cache, from /etc/ld.so.conf.d/000_cuda-compat.conf" in v.summary
    assert v.remediation.commands[0] == f"sudo sed -i '\\#^{compat}/*$#d' /etc/ld.so.conf.d/000_cuda-compat.conf"
    assert v.remediation.commands[1] == "sudo ldconfig"


@pytest.mark.parametrize(("name", "supported"), [
    ("NVIDIA B300 SXM6 AC", True), ("NVIDIA H200", True), ("NVIDIA A10", True), ("NVIDIA L40S", True),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", True), ("NVIDIA GeForce RTX 4090", False),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", False), ("NVIDIA Mystery 9000", None)])
def test_forward_compatibility_table(name, supported):
    assert datacenter_gpu(name) is supported


def test_unused_forward_compatibility_directories_do_not_warn(tmp_path):
    """Every CUDA container image ships /usr/local/cuda/compat (on the lent H200: 580.95.05 beside a 580.159.04
    driver); unused, it is listed in the details, not warned about. On LD_LIBRARY_PATH it would be loaded."""
    right = fake_libcuda(KMD)
    fact = run([right], proc_version(tmp_path))
    fact["compat_dirs"] = [{"path": "/usr/local/cuda/compat/libcuda.so.1", "version": "580.95.05",
                            "realpath": "/usr/local/cuda-13.0/compat/libcuda.so.580.95.05", "exists": True,
                            "dir": "/usr/local/cuda/compat"}]
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "pass" and v.details["compat_dirs"] == fact["compat_dirs"]
    older = fake_libcuda("570.86.10", cuda=12080)
    fact = run([right, older], proc_version(tmp_path))
    v = judge(fact, ["NVIDIA H200"])
    assert v.status == "warn" and f"{older}/libcuda.so.1 (570.86.10)" in v.summary
