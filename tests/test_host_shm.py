"""host.shm on real tmpfs mounts: a private mount namespace (``unshare``) mounts a tmpfs of a given size over
/dev/shm and the doctor runs there as a user would; the machine's own /dev/shm is read for real too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import doctor_env, make_context, run_check

from doctor.host import shm
from doctor.host.facts import collect_shm, mount_of

MIB = 1024**2


def _can_mount(flag: str) -> bool:
    if shutil.which("unshare") is None:
        return False
    res = subprocess.run(["unshare", flag, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                         capture_output=True, timeout=30)
    return res.returncode == 0


UNSHARE = next((f for f in ("-rm", "-m") if _can_mount(f)), None)
needs_mount = pytest.mark.skipif(UNSHARE is None, reason="no mount namespace with a tmpfs over /dev/shm here "
                                 "(unprivileged user namespaces off, not root): the real /dev/shm test below runs")


def in_tmpfs(size: str, *args: str, fill_mib: int = 0, env: dict[str, str] | None = None) -> dict:
    """``k26-doctor check --only host.shm`` with /dev/shm a fresh tmpfs of ``size``, ``fill_mib`` of it held by a
    file named as NCCL names its segments."""
    fill = f" && fallocate -l {fill_mib}M /dev/shm/nccl-Ab12Cd" if fill_mib else ""
    script = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm{fill} && exec {sys.executable} -m doctor check "
              f"--only host.shm --format json {' '.join(args)}")
    res = subprocess.run(["unshare", UNSHARE, "sh", "-c", script], capture_output=True, text=True,
                         env=env or doctor_env(), timeout=120)
    assert "Traceback" not in res.stderr, res.stderr
    report = json.loads(res.stdout)
    (result,) = [r for r in report["results"] if r["id"] == "host.shm"]
    return result


def codes(result: dict) -> list[str]:
    return [f["code"] for f in result.get("findings", [])]


@needs_mount
def test_a_container_default_64m_shm_fails_at_tp8() -> None:
    result = in_tmpfs("64m", "--tp", "8")
    need = shm.estimate(8)[0]
    assert result["status"] == "fail" and codes(result) == [shm.TOO_SMALL], result
    assert result["details"]["total_mib"] == 64.0 and result["details"]["fstype"] == "tmpfs"
    assert result["details"]["need_mib"] == round(need / MIB, 1) and need > 64 * MIB
    assert "Error while creating shared memory segment" in result["summary"]


@needs_mount
def test_leftover_nccl_segments_that_fill_it_are_named() -> None:
    result = in_tmpfs("256m", "--tp", "2", fill_mib=200)
    assert result["status"] == "fail" and codes(result) == [shm.FULL], result
    assert "nccl-Ab12Cd" in result["summary"] and "1 leftover segment(s) hold 200 MiB" in result["summary"]


@needs_mount
def test_enough_for_the_need_but_under_the_recommendation_warns() -> None:
    result = in_tmpfs("512m", "--tp", "8")
    assert result["status"] == "warn" and codes(result) == [shm.SMALL], result


@needs_mount
def test_a_roomy_tmpfs_passes() -> None:
    result = in_tmpfs("2g", "--tp", "8")
    assert result["status"] == "pass" and codes(result) == [shm.ENOUGH], result


@needs_mount
def test_kubernetes_gets_an_emptydir_of_memory() -> None:
    result = in_tmpfs("64m", "--tp", "8", env=doctor_env(KUBERNETES_SERVICE_HOST="10.0.0.1"))
    text = result["remediation"]["text"]
    assert "emptyDir: {medium: Memory, sizeLimit: 1Gi}" in text and "mountPath: /dev/shm" in text, text


def test_the_real_dev_shm_is_judged_on_its_real_numbers() -> None:
    """This machine's /dev/shm, read for real: the fact is statvfs's, the verdict the one its numbers give."""
    ctx = make_context({"tp": 8}, live=True)
    result = run_check("host.shm", ctx)
    if not os.path.isdir("/dev/shm"):
        assert result.has(shm.MISSING)
        return
    st = os.statvfs("/dev/shm")
    fact = ctx.fact("shm")
    assert fact["total_bytes"] == st.f_blocks * st.f_frsize
    need, _ = shm.estimate(8)
    want = shm.recommended(need)
    total, free = fact["total_bytes"], fact["free_bytes"]
    expected = shm.TOO_SMALL if total < need else shm.FULL if free < need else shm.SMALL if total < want \
        else shm.ENOUGH
    assert result.has(expected), (result.summary, total, free)
    where = "container" if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv") else "host"
    assert result.details["environment"] == where or os.environ.get("KUBERNETES_SERVICE_HOST")


def test_a_host_is_told_to_remount_and_nothing_is_planned() -> None:
    fact = {"path": "/dev/shm", "total_bytes": 64 * MIB, "free_bytes": 64 * MIB, "read_only": False,
            "container": {"dockerenv": False, "containerenv": False, "kubernetes": False}}
    result = run_check("host.shm", make_context({"tp": 8}, facts={"shm": fact}))
    assert result.status.value == "fail" and "mount -o remount,size=1G /dev/shm" in result.remediation.commands
    from doctor.core.registry import load

    assert load(plugins=False).checks["host.shm"].fixer is None


def test_no_dev_shm_fails_and_one_rank_is_not_judged() -> None:
    gone = {"path": "/dev/shm", "error": "No such file or directory", "container": {"dockerenv": True}}
    result = run_check("host.shm", make_context({"tp": 8}, facts={"shm": gone}))
    assert result.has(shm.MISSING) and "--shm-size=1g" in result.remediation.text
    one = run_check("host.shm", make_context({"tp": 1}, facts={"shm": gone}))
    assert one.status.value == "skip" and not one.findings


def test_the_estimate_is_the_data_and_nccls_segment_is_the_size_real_errors_name() -> None:
    table = shm.load_toml(shm.DATA_FILE)
    parts = {p["name"]: p for p in table["part"]}
    # "Error while creating shared memory segment /dev/shm/nccl-... (size 9637888)": buffers + a page
    assert parts["nccl-shm-transport"]["bytes"] + 4096 == 9637888
    assert all(p.get("reason") and p.get("source") for p in table["part"])
    need, split = shm.estimate(8)
    assert need == sum(split.values()) and need > 64 * MIB and shm.recommended(need) >= 1024 * MIB


def test_mountinfo_stacked_mounts_the_last_one_wins() -> None:
    text = ("25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683584k\n"
            "66 25 0:40 / /dev/shm rw,relatime - tmpfs shm rw,size=65536k\n"
            "70 1 0:41 / /dev rw - devtmpfs udev rw\n")
    assert mount_of("/dev/shm", text)["super_options"] == "rw,size=65536k"
    assert collect_shm.__name__ == "collect_shm"


def test_explain_gives_the_fix_per_environment() -> None:
    from conftest import run_doctor

    out = run_doctor("explain", "host.shm")
    text = " ".join(out.stdout.split())
    assert out.returncode == 0, out.stderr
    for words in ("/dev/shm", "shm_estimate.toml", "--shm-size=1g", "emptyDir", "medium: Memory",
                  "mount -o remount,size=1G /dev/shm", "No fixer"):
        assert words in text, (words, out.stdout)
