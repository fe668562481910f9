"""stack.versions and sglang.install from real package metadata read by the real probe.

Each stack package's top-level ``__init__`` raises ImportError: the metadata probe must never import
them. sglang.install then imports the real SGLang 0.5.23 sources (unpacked from the released wheel)
under a real interpreter, where its dependencies are missing, and must name the missing module.
"""

from __future__ import annotations

import functools
import shlex
import zipfile
from pathlib import Path

import pytest
from sglang_wheels import release_requires, wheel_for
from stack_support import healthy_venv, make_ctx, nvml_fact, run_check, stack_site, workdir, write_dist

from doctor.core.result import Status


def versions_ctx(site, **kw):
    paths = site if isinstance(site, str) else str(site)
    return make_ctx(healthy_venv(), env={"PYTHONPATH": paths}, facts={"nvml": nvml_fact([(10, 3)])}, **kw)


def test_profile_stack_passes(tmp_path):
    res = run_check("stack.versions", versions_ctx(stack_site(tmp_path / "site")))
    assert res.status is Status.PASS, res.summary
    assert "torch 2.14.1+cu130" in res.summary and "triton 3.8.0" in res.summary
    assert "sglang-kernel 0.4.10" in res.summary
    assert res.details["components"]["torch"]["pins_triton"] == "~=3.8.0" and res.details["unmet"] == []


def test_sglangs_torch_pin_overridden_by_the_config_is_a_warning(tmp_path):
    """The DDTree test stack (torch 2.11 + sglang-kernel 0.4.5 + sglang 0.5.23): pinned on purpose, not silent."""
    site = stack_site(tmp_path / "site", torch="2.11.0+cu130", triton="3.6.0", torch_triton_pin="3.6.0",
                      kernel="0.4.5")
    ctx = versions_ctx(site)
    ctx.settings.profile["stack"].update(torch="==2.11.0", triton="==3.6.0", sglang_kernel="==0.4.5")
    res = run_check("stack.versions", ctx)
    assert res.status is Status.WARN, res.summary
    assert "sglang 0.5.23 pins sglang-kernel 0.4.10, installed 0.4.5 (the profile pins it deliberately)" in res.summary
    assert "sglang 0.5.23 requires torch==2.14.1, installed 2.11.0+cu130 (the profile pins it deliberately)" \
        in res.summary
    torch = [u for u in res.details["unmet"] if u["requirement"] == "torch==2.14.1"]
    assert torch and torch[0]["overridden_by_profile"] and "profile pins it deliberately" in torch[0]["text"]


def test_a_matrix_pin_the_profile_does_not_override_still_fails(tmp_path):
    """The profile pins torch and sglang-kernel but not triton: torch's triton pin is not overridden."""
    site = stack_site(tmp_path / "site", torch="2.11.0+cu130", triton="3.5.1", torch_triton_pin="3.6.0",
                      kernel="0.4.5")
    ctx = versions_ctx(site)
    ctx.settings.profile["stack"].update(torch="==2.11.0", triton="", sglang_kernel="==0.4.5")
    res = run_check("stack.versions", ctx)
    assert res.status is Status.FAIL and "torch 2.11.0+cu130 pins triton 3.6.0, installed 3.5.1" in res.summary
    assert "sglang 0.5.23 pins sglang-kernel 0.4.10, installed 0.4.5 (the profile pins it deliberately)" \
        in res.details["warnings"]


# -- the DDTree validation stack under its own profile (real metadata, the real profile file) ------------

DDTREE_PROFILE = Path(__file__).resolve().parents[1] / "bench" / "ddtree" / "profiles" / "h200-tiny-ddtree.toml"


def ddtree_stack(dest: Path, flashinfer: bool) -> Path:
    """torch 2.11.0, triton 3.6.0, sglang-kernel 0.4.5 (and flashinfer-python 0.7.2) with the Requires-Dist their
    releases declare, SGLang 0.5.23's own dist-info from its wheel: the GPU host's validation stack."""
    for name, version in (("torch", "2.11.0"), ("triton", "3.6.0"), ("sglang-kernel", "0.4.5"),
                          *((("flashinfer-python", "0.7.2"),) if flashinfer else ())):
        write_dist(dest, name, version, release_requires(name, version))
    with zipfile.ZipFile(wheel_for("0.5.23")) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if n.startswith("sglang-0.5.23.dist-info/")])
    return dest


def ddtree_ctx(site: Path):
    return make_ctx(healthy_venv(), profile=str(DDTREE_PROFILE), env={"PYTHONPATH": str(site)},
                    facts={"nvml": nvml_fact([(9, 0)], name="NVIDIA H200")})


@pytest.mark.network
def test_ddtree_stack_under_its_profile_fails_only_on_the_missing_flashinfer(tmp_path):
    """The profile pins torch 2.11.0 and sglang-kernel 0.4.5 on purpose: SGLang 0.5.23's torch==2.14.1 and
    sglang-kernel 0.4.10 are warnings (from its Requires-Dist and from the matrix alike); flashinfer-python,
    which SGLang 0.5.23 requires and the profile pins too, is missing: the one failure, named once."""
    res = run_check("stack.versions", ddtree_ctx(ddtree_stack(tmp_path / "site", flashinfer=False)))
    assert res.status is Status.FAIL and res.summary == "flashinfer-python is not installed (profile: ==0.7.2)"
    assert "sglang 0.5.23 requires torch==2.14.1, installed 2.11.0 (the profile pins it deliberately)" \
        in res.details["warnings"]
    assert "sglang 0.5.23 pins sglang-kernel 0.4.10, installed 0.4.5 (the profile pins it deliberately)" \
        in res.details["warnings"]
    words = shlex.split(res.remediation.commands[0])
    assert "flashinfer-python==0.7.2" in words and "torch==2.11.0" in words and "sglang-kernel==0.4.5" in words


@pytest.mark.network
def test_ddtree_stack_with_flashinfer_warns_naming_sglangs_torch_pin(tmp_path):
    res = run_check("stack.versions", ddtree_ctx(ddtree_stack(tmp_path / "site", flashinfer=True)))
    assert res.status is Status.WARN, res.summary
    assert "sglang 0.5.23 requires torch==2.14.1, installed 2.11.0 (the profile pins it deliberately)" in res.summary
    assert "torch 2.11.0, triton 3.6.0, sglang 0.5.23, sglang-kernel 0.4.5, flashinfer-python 0.7.2" in res.summary
    assert all(u["overridden_by_profile"] for u in res.details["unmet"]), res.details["unmet"]


def test_torch_older_than_the_profiles_pin_fails(tmp_path):
    site = stack_site(tmp_path / "site", torch="2.11.0+cu130", triton="3.6.0", torch_triton_pin="3.6.0")
    res = run_check("stack.versions", versions_ctx(site))
    assert res.status is Status.FAIL
    assert "torch 2.11.0+cu130 does not match the profile's ==2.14.1" in res.summary
    assert "sglang 0.5.23 requires torch==2.14.1, installed 2.11.0+cu130" in res.summary
    assert "torch==2.14.1" in shlex.split(res.remediation.commands[0])


def test_torch_triton_pin_mismatch_fails(tmp_path):
    res = run_check("stack.versions", versions_ctx(stack_site(tmp_path / "site", triton="3.5.1")))
    assert res.status is Status.FAIL
    assert "torch 2.14.1+cu130 pins triton ~=3.8.0, installed 3.5.1" in res.summary
    assert "triton 3.5.1 does not match the profile's ==3.8.0" in res.summary
    assert "torch 2.14.1+cu130 requires triton~=3.8.0" in res.summary  # pip-check style, from Requires-Dist
    assert "triton==3.8.0" in shlex.split(res.remediation.commands[0])


def test_sglang_kernel_mismatch_fails(tmp_path):
    res = run_check("stack.versions", versions_ctx(stack_site(tmp_path / "site", kernel="0.4.3")))
    assert res.status is Status.FAIL and "sglang 0.5.23 pins sglang-kernel 0.4.10, installed 0.4.3" in res.summary


def test_missing_packages_are_named_once(tmp_path):
    res = run_check("stack.versions", versions_ctx(stack_site(tmp_path / "site", flashinfer=None)))
    assert res.status is Status.FAIL
    assert res.summary.count("flashinfer") == 1 and "flashinfer-python is not installed" in res.summary


def test_marker_for_another_platform_is_not_a_requirement(tmp_path):
    site = stack_site(tmp_path / "site")
    res = run_check("stack.versions", versions_ctx(site))
    assert not any("av" == u["requirement"].split("=")[0] for u in res.details["unmet"])


def test_duplicate_copies_on_sys_path_warn(tmp_path):
    first = stack_site(tmp_path / "a")
    second = tmp_path / "b"
    write_dist(second, "triton", "3.5.1")
    res = run_check("stack.versions", versions_ctx(f"{first}:{second}"))
    assert res.status is Status.WARN and "two copies of triton" in res.summary and "3.8.0 imports" in res.summary


def test_invalid_version_fails_without_traceback(tmp_path):
    site = stack_site(tmp_path / "site")
    for info in site.glob("flashinfer_python-*.dist-info"):
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flashinfer-python\nVersion: not-a-version\n"
                                       "Requires-Dist: torch >= = 2\n")
    res = run_check("stack.versions", versions_ctx(site))
    assert res.status is Status.FAIL and "invalid version 'not-a-version'" in res.summary


def test_undecodable_metadata_is_named(tmp_path):
    site = stack_site(tmp_path / "site")
    info = next(site.glob("flashinfer_python-*.dist-info"))
    (info / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.7.2\n\xff\xfe\n")
    res = run_check("stack.versions", versions_ctx(site))
    assert res.status is Status.FAIL
    assert "unreadable package metadata" in res.summary and "flashinfer_python-0.7.2.dist-info" in res.summary


def test_bad_profile_specifier_fails(tmp_path):
    ctx = versions_ctx(stack_site(tmp_path / "site"))
    ctx.settings.profile["stack"]["torch"] = "=>2.11"
    res = run_check("stack.versions", ctx)
    assert res.status is Status.FAIL and "'=>2.11' is not a version specifier" in res.summary


# -- sglang.install on the real SGLang sources -----------------------------------------------------

@functools.cache
def sglang_site(version: str):
    """The whole released wheel unpacked (sources and dist-info), nothing else: its dependencies are absent."""
    site = workdir() / f"site-sglang-{version}"
    with zipfile.ZipFile(wheel_for(version)) as zf:
        zf.extractall(site, [n for n in zf.namelist() if n.endswith((".py", "METADATA", "RECORD", "WHEEL"))])
    return site


@pytest.mark.network
def test_real_sglang_without_its_dependencies_fails_naming_the_module():
    res = run_check("sglang.install", versions_ctx(sglang_site("0.5.23"), deep=True))
    assert res.status is Status.FAIL
    assert "sglang 0.5.23 is installed but `import sglang` fails: ModuleNotFoundError" in res.summary
    assert "is missing" in res.remediation.text and "sglang==0.5.23" in shlex.split(res.remediation.commands[0])


@pytest.mark.network
def test_real_sglang_without_its_dependencies_fails_naming_them_without_importing():
    """The default tier: the same install fails from the metadata, naming the missing requirements."""
    res = run_check("sglang.install", versions_ctx(sglang_site("0.5.23")))
    assert res.status is Status.FAIL and "sglang 0.5.23 is installed but" in res.summary
    assert "torch==2.14.1" in res.details["requirements"]["missing"] and "are missing" in res.remediation.text
    assert "sglang==0.5.23" in shlex.split(res.remediation.commands[0])
    assert "sglang_import" not in res.details and "import_s" not in res.details


@pytest.mark.network
def test_real_sglang_wrong_version_fails_before_importing():
    res = run_check("sglang.install", versions_ctx(sglang_site("0.5.13.post1")))
    assert res.status is Status.FAIL and "sglang 0.5.13.post1 installed, the profile pins ==0.5.23" in res.summary


@pytest.mark.network
def test_real_sglang_metadata_pins_are_the_matrix():
    """The compat table's SGLang pins are what the released wheels declare."""
    from packaging.requirements import Requirement

    from doctor.stack import compat

    for version in ("0.5.23", "0.5.13.post1"):
        meta = next(sglang_site(version).glob("sglang-*.dist-info/METADATA")).read_text()
        reqs = {Requirement(line.split(":", 1)[1].strip()).name.replace("_", "-"): str(
            Requirement(line.split(":", 1)[1].strip()).specifier) for line in meta.splitlines()
            if line.startswith("Requires-Dist:")}
        pins = compat.sglang_pins(version)
        assert reqs["sglang-kernel"] == f"=={pins['sglang_kernel']}"
        assert reqs["flashinfer-python"] == f"=={pins['flashinfer']}"


def test_sglang_not_installed(tmp_path):
    res = run_check("sglang.install", versions_ctx(stack_site(tmp_path / "site", sglang=None)))
    assert res.status is Status.FAIL and "not installed" in res.summary


@pytest.mark.parametrize(("dflash", "status", "words"), [
    ({"available": True}, Status.PASS, "DFlash sampling kernel available"),
    ({"available": False}, Status.WARN, "verify greedily"),
    ({"available": None, "error": "RuntimeError: CUDA unavailable"}, Status.WARN, "cannot tell"),
])
def test_dflash_kernel_availability(tmp_path, dflash, status, words):
    ctx = versions_ctx(stack_site(tmp_path / "site"), deep=True)  # the import's answer: --deep
    ctx.facts.seed("sglang_import", {"ok": True, "imported": True, "version": "0.5.23", "import_s": 9.1,
                                          "dflash": dflash})
    res = run_check("sglang.install", ctx)
    assert res.status is status and words in res.summary


def test_a_source_tree_shadowing_the_installed_sglang_is_named(tmp_path):
    shadow = tmp_path / "checkout" / "python"
    (shadow / "sglang").mkdir(parents=True)
    (shadow / "sglang" / "__init__.py").write_text("raise ImportError('stale checkout')\n")
    site = stack_site(tmp_path / "site")
    res = run_check("sglang.install", versions_ctx(f"{shadow}:{site}", deep=True))  # imported: the checkout raises
    assert res.status is Status.FAIL and "stale checkout" in res.summary
    assert f"would load {shadow / 'sglang'}, not the installed {site}" in res.summary
    res = run_check("sglang.install", versions_ctx(f"{shadow}:{site}"))  # from files: fails too, naming the checkout
    assert res.status is Status.FAIL and f"would load {shadow / 'sglang'}, not the installed {site}" in res.summary


@pytest.mark.network
def test_sglang_jit_kernels_without_nvcc_warn():
    site = sglang_site("0.5.23")  # has sglang/kernels/jit: DFlash tree sampling is JIT-built with nvcc
    ctx = make_ctx(healthy_venv(), env={"PYTHONPATH": str(site), "CUDA_HOME": "/nonexistent/cuda"},
                   facts={"nvml": nvml_fact([(10, 3)])}, deep=True)
    ctx.facts.seed("sglang_import", {"ok": True, "imported": True, "version": "0.5.23", "import_s": 9.1,
                                          "dflash": {"available": True}})
    res = run_check("sglang.install", ctx)
    assert res.status is Status.WARN and "nvcc" in res.summary and "/nonexistent/cuda/bin/nvcc" in res.summary
    assert res.details["jit_nvcc"]["found_by"] == "CUDA_HOME/CUDA_PATH"


def test_a_hung_interpreter_is_a_clear_fail_within_the_deadline(tmp_path, monkeypatch):
    import time

    from doctor.stack import service_probe

    hang = tmp_path / "bin" / "python"
    hang.parent.mkdir()
    hang.write_text("#!/bin/sh\nsleep 60\n")
    hang.chmod(0o755)
    monkeypatch.setattr(service_probe, "STACK_PROBE_TIMEOUT", 1.0)
    start = time.monotonic()
    res = run_check("stack.versions", make_ctx(hang))
    assert time.monotonic() - start < 10
    assert res.status is Status.FAIL and "did not finish within 1.0s (killed)" in res.summary
