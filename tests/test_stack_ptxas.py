"""triton.ptxas with Triton 3.6.0's real ptxas binaries (12.8 and ptxas-blackwell 12.9), run on the CPU.

Triton 3.5.x bundles only ptxas 12.8, which rejects sm_103a: the check must fail for a B300 and the
fixer must point TRITON_PTXAS_PATH at a ptxas that knows it, in the service's environment file.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from stack_support import (
    NO_NVML,
    healthy_venv,
    make_ctx,
    nvml_fact,
    run_check,
    stack_site,
    triton_package,
    workdir,
)

from doctor.core.actions import new_backup_dir
from doctor.core.result import Status
from doctor.host.facts import parse_env_file
from doctor.triton.facts import collect_ptxas, ptx_isa_for
from fixes.triton import fix_triton_ptxas, set_env_line


def ptxas_ctx(flavour, *, ccs=((10, 3),), env_file=None, extra_env=None, profile="b300-tp8-ddtree", nvml=True):
    site = triton_package(flavour)
    env = {"PYTHONPATH": str(site), **(extra_env or {})}
    facts = {"nvml": nvml_fact(list(ccs)) if nvml else NO_NVML}
    return make_ctx(healthy_venv(), env=env, facts=facts, env_file=env_file, profile=profile)


@pytest.fixture(scope="module")
def good_ptxas() -> Path:
    """A ptxas that knows sm_103a: Triton's own ptxas-blackwell (CUDA 12.9), copied elsewhere."""
    d = workdir() / "toolkit-bin"
    if not d.exists():
        d.mkdir()
        shutil.copy2(triton_package("3.6") / "triton/backends/nvidia/bin/ptxas-blackwell", d / "ptxas")
    return d / "ptxas"


def test_ptx_isa_versions_follow_triton():
    assert [ptx_isa_for(r) for r in ("12.8", "12.9", "13.0", "12.4", "11.8")] == ["8.7", "8.8", "9.0", "8.4", "7.8"]


@pytest.mark.network
def test_triton_36_on_b300_uses_ptxas_blackwell():
    res = run_check("triton.ptxas", ptxas_ctx("3.6"))
    assert res.status is Status.PASS, res.summary
    assert "ptxas-blackwell (CUDA 12.9)" in res.summary and "sm_103a" in res.summary
    verdict = res.details["verdicts"][0]
    assert verdict["var"] == "TRITON_PTXAS_BLACKWELL_PATH" and verdict["knows"] is True


@pytest.mark.network
def test_triton_36_on_h200_uses_plain_ptxas():
    res = run_check("triton.ptxas", ptxas_ctx("3.6", ccs=[(9, 0)], profile="h200-tp8"))
    assert res.status is Status.PASS and "sm_90a" in res.summary and "CUDA 12.8" in res.summary


@pytest.mark.network
def test_triton_35_on_b300_fails_with_both_ways_out(tmp_path, good_ptxas):
    res = run_check("triton.ptxas", ptxas_ctx("3.5", env_file=str(tmp_path / "svc.env"),
                                              extra_env={"PATH": f"{good_ptxas.parent}:/usr/bin:/bin"}))
    assert res.status is Status.FAIL
    assert "3.5.1" in res.summary and "rejects sm_103a" in res.summary and "CUDA 12.8" in res.summary
    proof = res.details["verdicts"][0]
    assert proof["var"] == "TRITON_PTXAS_PATH"
    assert "triton>=3.6" in res.remediation.commands[0]
    assert str(good_ptxas) in res.details["usable"]


@pytest.mark.network
def test_fixer_writes_env_file_with_backup_and_check_passes_after(tmp_path, good_ptxas):
    env_file = tmp_path / "etc" / "sglang-k26.env"
    env_file.parent.mkdir()
    env_file.write_text("# site settings\nNCCL_CUMEM_ENABLE=1\nexport TRITON_PTXAS_PATH=/old/machine/ptxas\n")
    env_file.chmod(0o640)
    extra = {"PATH": f"{good_ptxas.parent}:/usr/bin:/bin"}
    ctx = ptxas_ctx("3.5", env_file=str(env_file), extra_env=extra)
    res = run_check("triton.ptxas", ctx)
    assert res.status is Status.FAIL
    # /old/machine/ptxas does not run: Triton (and the check) fall back to the bundled 12.8 one
    assert "does not run" in res.summary
    plan = fix_triton_ptxas(ctx, res)
    assert len(plan) == 1 and "TRITON_PTXAS_PATH" in plan[0].summary
    chosen = res.details["usable"][0]  # the first that knows sm_103a (a toolkit's if present, else ours)
    assert str(good_ptxas) in res.details["usable"]
    diff = "\n".join(plan[0].details())
    assert f"+TRITON_PTXAS_PATH={chosen}" in diff and "-export TRITON_PTXAS_PATH=/old/machine/ptxas" in diff
    before = env_file.read_text()
    backups = new_backup_dir(str(tmp_path / "state"))
    plan[0].apply(backups)
    after = env_file.read_text()
    assert parse_env_file(after)["TRITON_PTXAS_PATH"] == chosen
    assert "NCCL_CUMEM_ENABLE=1" in after and "# site settings" in after
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o640
    backup = backups / str(env_file.resolve()).lstrip("/")
    assert backup.read_text() == before
    again = run_check("triton.ptxas", ptxas_ctx("3.5", env_file=str(env_file), extra_env=extra))
    assert again.status is Status.PASS, again.summary
    assert again.details["verdicts"][0]["ptxas"] == chosen
    assert fix_triton_ptxas(ptxas_ctx("3.5", env_file=str(env_file), extra_env=extra), again) == []


@pytest.mark.network
def test_fixer_plans_nothing_when_no_ptxas_knows_the_gpu(tmp_path):
    ctx = ptxas_ctx("3.5", env_file=str(tmp_path / "svc.env"), extra_env={"PATH": "/nonexistent",
                                                                          "CUDA_HOME": "/nonexistent"})
    ptxas = collect_ptxas(ctx.facts.options)
    others = [c for c in ptxas["candidates"] if c["source"] != "triton bundled ptxas" and c.get("release")]
    ctx.facts.seed("ptxas", ptxas)
    res = run_check("triton.ptxas", ctx)
    assert res.status is Status.FAIL
    if not others:  # no toolkit on this host
        assert fix_triton_ptxas(ctx, res) == [] and "none found" in res.remediation.text


@pytest.mark.network
def test_without_nvml_judges_profile_arch():
    res = run_check("triton.ptxas", ptxas_ctx("3.6", nvml=False))
    assert res.status is Status.PASS and "profile" in res.summary


def test_no_triton_installed_skips():
    ctx = make_ctx(healthy_venv(), env={"PYTHONPATH": str(stack_site(workdir() / "site-no-triton", triton=None))},
                   facts={"nvml": nvml_fact([(10, 3)])})
    assert run_check("triton.ptxas", ctx).status is Status.SKIP


@pytest.mark.network
def test_a_ptxas_that_hangs_or_crashes_is_not_trusted(tmp_path):
    bad = tmp_path / "ptxas"
    bad.write_text("#!/bin/sh\necho 'segfault' >&2\nexit 139\n")
    bad.chmod(0o755)
    ctx = ptxas_ctx("3.6", extra_env={"TRITON_PTXAS_BLACKWELL_PATH": str(bad)})
    res = run_check("triton.ptxas", ctx)
    assert res.status is Status.PASS and "does not run" in res.summary  # falls back, as Triton does


def test_set_env_line():
    assert set_env_line("", "A", "1") == "A=1\n"
    assert set_env_line("A=0\nB=2\nA=3\n", "A", "1") == "A=1\nB=2\n"
    assert set_env_line("B=2", "A", "1") == "B=2\nA=1\n"


@pytest.mark.network
def test_env_file_is_what_the_service_sees(tmp_path):
    env_file = tmp_path / "svc.env"
    env_file.write_text(f"TRITON_PTXAS_BLACKWELL_PATH={triton_package('3.6')}/triton/backends/nvidia/bin/ptxas\n")
    ctx = ptxas_ctx("3.6", env_file=str(env_file))
    res = run_check("triton.ptxas", ctx)
    # the env file overrides the blackwell ptxas with the 12.8 one: sm_103a is rejected
    assert res.status is Status.FAIL and "rejects sm_103a" in res.summary
    assert os.path.basename(res.details["verdicts"][0]["ptxas"]) == "ptxas"
