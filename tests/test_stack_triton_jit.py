"""triton.jit for real on the CPU: the B300 failure reproduced with a headerless interpreter and real gcc.

The B300 service's venv sat on an interpreter without ``Python.h``; Triton's first kernel died in
``compile_module_from_src`` with ``fatal error: Python.h: No such file or directory``. Here a pyenv
prefix is copied without that one header, a venv is made from the copy, and the check must say
exactly that, and name where the headers come from.
"""

from __future__ import annotations

import os

import pytest
from stack_support import (
    fake_libcuda_dir,
    headless_prefix,
    headless_venv,
    healthy_venv,
    make_ctx,
    make_venv,
    nvml_fact,
    pyenv_python,
    run_check,
    workdir,
)

from doctor.core.result import Status
from doctor.triton.facts import collect_triton_build
from fixes.triton import fix_triton_jit, package_plan


def libcuda_env() -> dict[str, str]:
    d = str(fake_libcuda_dir())
    return {"TRITON_LIBCUDA_PATH": d, "LD_LIBRARY_PATH": d}


def jit_ctx(python, env=None):
    ctx = make_ctx(python, env=env, facts={"nvml": nvml_fact([(10, 3)])})
    return ctx


def test_b300_failure_reproduced_python_h_missing():
    ctx = jit_ctx(headless_venv(), env=libcuda_env())
    res = run_check("triton.jit", ctx)
    assert res.status is Status.FAIL
    assert "Python.h" in res.summary and "No such file or directory" in res.summary
    assert str(headless_prefix() / "include" / "python3.12") in res.summary
    # the exact compiler command Triton would run, with Triton's flags
    cmd = res.details["cmd"]
    assert cmd[2:7] == ["-O3", "-shared", "-fPIC", "-Wno-psabi", "-o"] and "-l:libcuda.so.1" in cmd
    # a pyenv interpreter: headers belong in its own prefix, no apt package helps
    assert res.details["interpreter"]["kind"] == "pyenv"
    assert res.remediation and res.remediation.commands == ["pyenv install --force 3.12.1"]
    assert fix_triton_jit(ctx, res) == []


def test_conda_interpreter_without_headers_points_at_conda():
    base = headless_prefix(under="miniconda3/envs", conda=True)
    py = make_venv(base / "bin" / "python3.12", workdir() / "venv-conda-headless")
    res = run_check("triton.jit", jit_ctx(py, env=libcuda_env()))
    assert res.status is Status.FAIL and "Python.h" in res.summary
    assert res.details["interpreter"]["kind"] == "conda"
    assert res.remediation.commands == [f"conda install -p {base} --force-reinstall python=3.12.1"]


def test_same_venv_layout_with_headers_builds_and_loads():
    res = run_check("triton.jit", jit_ctx(healthy_venv(), env=libcuda_env()))
    assert res.status is Status.PASS, res.summary
    assert "gcc" in res.summary and "libcuda via TRITON_LIBCUDA_PATH" in res.summary
    assert res.details["linked_libcuda"] is True


@pytest.mark.parametrize("driver", [True, False])
def test_missing_libcuda_fails_even_when_headers_are_there(driver):
    """With the NVIDIA kernel module loaded, a libcuda.so.1 Triton cannot find is Triton's failure; on a host
    with no driver at all it is the driver's absence, which gpu.driver judges (one root cause, not two)."""
    ctx = jit_ctx(healthy_venv(), env={"LD_LIBRARY_PATH": "/nonexistent"})
    ctx.facts.seed("libcuda", {"kernel_module": {"present": driver, "version": "580.159.04" if driver else None}})
    res = run_check("triton.jit", ctx)
    if os.path.exists("/sbin/ldconfig") and "libcuda.so.1" in os.popen("/sbin/ldconfig -p").read():
        assert res.status is Status.PASS  # a host with a driver
    elif driver:
        assert res.status is Status.FAIL and "libcuda.so.1" in res.summary
    else:
        assert res.status is Status.SKIP and res.cause == "gpu.driver" and "libcuda.so.1" in res.summary


def test_no_compiler_on_path():
    env = {**libcuda_env(), "PATH": "/nonexistent-bin"}
    ctx = jit_ctx(healthy_venv(), env=env)
    res = run_check("triton.jit", ctx)
    assert res.status is Status.FAIL and "no C compiler" in res.summary


def test_cc_pointing_nowhere_fails_like_triton_would():
    res = run_check("triton.jit", jit_ctx(healthy_venv(), env={**libcuda_env(), "CC": "/opt/gcc/bin/gcc-missing"}))
    assert res.status is Status.FAIL and "gcc-missing" in res.summary


def test_unrunnable_interpreter_is_a_clear_fail():
    res = run_check("triton.jit", jit_ctx("/nonexistent/venv/bin/python"))
    assert res.status is Status.FAIL and "/nonexistent/venv/bin/python" in res.summary


def test_fact_records_os_release_for_the_fixer():
    ctx = jit_ctx(healthy_venv(), env=libcuda_env())
    fact = collect_triton_build(ctx.facts.options)
    assert fact["ok"] and fact["stage"] == "done"
    assert fact["os_release"].get("ID")


# -- the fixer on a system interpreter (plans only: nothing here runs apt) ---------------------

def system_build_fact(os_release, python_h=False, cc=True):
    return {"ok": False, "stage": "compile" if cc else "compiler", "cc": "/usr/bin/gcc" if cc else None,
            "cc_path": "/usr/bin/gcc" if cc else None, "py_include": "/usr/include/python3.12", "python_h": python_h,
            "error": "/tmp/x/cuda_utils.c:7:10: fatal error: Python.h: No such file or directory",
            "libcuda": {"dirs": ["/usr/lib/x86_64-linux-gnu"], "found_by": "ldconfig -p", "error": None},
            "os_release": os_release}


UBUNTU = {"ID": "ubuntu", "ID_LIKE": "debian", "VERSION_ID": "24.04"}
ROCKY = {"ID": "rocky", "ID_LIKE": "rhel centos fedora", "VERSION_ID": "9.4"}


def system_ctx(build):
    stack = {"ok": True, "python": {"version": "3.12.3", "base_prefix": "/usr", "include": "/usr/include/python3.12"}}
    return make_ctx("/opt/venv/bin/python", facts={"triton_build": build, "stack": stack})


def test_system_python_on_ubuntu_names_the_dev_package_and_plans_apt():
    """Ubuntu 24.04's python3 is 3.12: its headers are python3-dev (which pulls python3.12-dev)."""
    ctx = system_ctx(system_build_fact(UBUNTU))
    res = run_check("triton.jit", ctx)
    assert res.status is Status.FAIL and "Python.h" in res.summary
    assert res.remediation.commands == ["apt-get install -y python3-dev"]
    assert "Ubuntu 24.04 has them in python3-dev" in res.remediation.text
    plan = fix_triton_jit(ctx, res)
    assert [a.argv for a in plan] == [["apt-get", "update"],
                                      ["apt-get", "install", "-y", "--no-install-recommends", "python3-dev"]]
    assert all(a.needs_root for a in plan)
    assert plan[1].details() == ["$ apt-get install -y --no-install-recommends python3-dev"]


DEBIAN12 = {"ID": "debian", "VERSION_ID": "12", "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)"}


def test_a_system_python_the_release_does_not_package_gets_no_package():
    """Debian 12 packages Python 3.11 only: there is no python3.12-dev to install (the issue's advice)."""
    ctx = system_ctx(system_build_fact(DEBIAN12))
    res = run_check("triton.jit", ctx)
    assert res.status is Status.FAIL
    assert res.remediation.commands == [] and "python3.12-dev" not in res.remediation.text
    assert "Debian 12 packages Python.h only for Python 3.11" in res.remediation.text
    assert fix_triton_jit(ctx, res) == []


def test_rhel_family_uses_dnf_or_yum():
    plan = package_plan(ROCKY, "3.12", need_headers=True, need_cc=True, which=lambda t: None)
    assert plan[0].argv == ["yum", "install", "-y", "python3.12-devel", "gcc"]  # Rocky 9 is RHEL 9's
    plan = package_plan(ROCKY, "3.12", need_headers=True, need_cc=False, which=lambda t: "/usr/bin/dnf")
    assert plan[0].argv[:3] == ["dnf", "install", "-y"]


def test_missing_compiler_only_plans_build_essential():
    ctx = system_ctx(system_build_fact(UBUNTU, python_h=True, cc=False))
    res = run_check("triton.jit", ctx)
    assert res.status is Status.FAIL and "no C compiler" in res.summary
    assert fix_triton_jit(ctx, res)[-1].argv[-1] == "build-essential"


def test_unknown_os_plans_nothing():
    assert package_plan({"ID": "alpine"}, "3.12", need_headers=True, need_cc=True) == []


@pytest.mark.parametrize("version", ["3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"])
def test_probes_run_on_every_supported_service_python(version):
    """The service may run any Python >= 3.8: the stdlib-only probes must work on each."""
    from doctor.core import proc

    python = str(pyenv_python(version))
    stack, res = proc.run_probe(python, "stack", timeout=60)
    assert stack is not None, res.why()
    assert stack["python"]["version"] == version and stack["python"]["python_h"] is True
    build, res = proc.run_probe(python, "cbuild", timeout=120, env={**os.environ, **libcuda_env()})
    assert build is not None and build["ok"] and build["stage"] == "done", (res.why(), build)
    for probe, module in (("torch_info", "torch"), ("sglang_import", "sglang")):
        data, res = proc.run_probe(python, probe, timeout=120)
        assert data is not None, res.why()
        # either the package imports (someone installed it there) or the probe names it as missing
        assert data["ok"] or data.get("missing_module") == module, data
