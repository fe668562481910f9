"""gpu.multicast on recorded GPU snapshots (tests/fixtures/snapshots: the B300 and PCIe recordings are synthetic
and marked so; the real H200 recordings hold NVML facts but no multicast reading), real config files for the
server's arguments, SGLang's real flag history, and the real probe run on this machine."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import make_context, run_check

from doctor.gpu import multicast
from doctor.sglang.flag_history import load_history

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
ENFORCE = "--enforce-disable-flashinfer-allreduce-fusion"


def facts(name: str) -> dict:
    data = json.loads((SNAPSHOTS / f"{name}.json").read_text(encoding="utf-8"))
    return data["facts"]


def config(tmp_path: Path, args: list[str]) -> str:
    path = tmp_path / "k26.toml"
    path.write_text("[server]\nargs = " + json.dumps(args) + "\n", encoding="utf-8")
    return str(path)


def run(fs: dict, tmp_path: Path, args: list[str] | None = None, version: str = "0.5.23"):
    fs = {**fs, "sglang_flags": {"python": "/opt/sglang/venv/bin/python", "found": True, "version": version}}
    flags = {"tp": 8, **({"config": config(tmp_path, args)} if args is not None else {})}
    return run_check("gpu.multicast", make_context(flags, facts=fs))


def release_without_enforce() -> str:
    hist = load_history()
    first = min(a for a, _ in hist.runs(ENFORCE))
    return hist.releases[first - 1]


def test_nvswitch_host_with_multicast_passes_and_says_what_it_cannot_judge(tmp_path: Path) -> None:
    result = run(facts("b300x8-healthy"), tmp_path)
    assert result.status.value == "pass" and result.has(multicast.SUPPORTED), result.summary
    assert "GPU0-GPU7" in result.summary and "not judged: whether another NVLS user" in result.summary


ASK = ["--enable-flashinfer-allreduce-fusion"]


def test_pcie_host_fails_and_names_the_flag_the_installed_release_has(tmp_path: Path) -> None:
    result = run(facts("rtxpro6000x8-pcie"), tmp_path, args=ASK)
    assert result.status.value == "fail" and result.has(multicast.UNSUPPORTED), result.summary
    assert "no NVSwitch fabric" in result.summary and "Device does not support multicasting" in result.summary
    assert f"Add {ENFORCE}" in result.remediation.text and "0.5.23 accepts it" in result.remediation.text
    assert "Remove --enable-flashinfer-allreduce-fusion" in result.remediation.text


def test_sm120_without_a_flag_asking_for_it_needs_no_multicast(tmp_path: Path) -> None:
    """SGLang turns the fusion on by itself only on SM90/SM100 (doctor/data/multicast.toml): RTX PRO 6000 is
    sm_120."""
    result = run(facts("rtxpro6000x8-pcie"), tmp_path)
    assert result.status.value == "pass" and result.has(multicast.NOT_NEEDED), result.summary
    assert "only on SM90/SM100" in result.summary


def test_hopper_or_blackwell_without_multicast_fails_with_no_flag_given(tmp_path: Path) -> None:
    fs = copy.deepcopy(facts("rtxpro6000x8-pcie"))
    for d in fs["nvml"]["devices"]:
        d["compute_capability"] = [10, 3]
    result = run(fs, tmp_path)
    assert result.has(multicast.UNSUPPORTED) and "SGLang turns it on by itself" in result.summary, result.summary


def test_a_release_without_the_flag_is_never_told_to_use_it(tmp_path: Path) -> None:
    old = release_without_enforce()
    result = run(facts("rtxpro6000x8-pcie"), tmp_path, args=ASK, version=old)
    assert result.has(multicast.UNSUPPORTED)
    assert f"Add {ENFORCE}" not in result.remediation.text and f"SGLang {old} has no {ENFORCE}" in \
        result.remediation.text


def test_the_profile_turning_the_fusion_off_needs_no_multicast(tmp_path: Path) -> None:
    result = run(facts("rtxpro6000x8-pcie"), tmp_path, args=[ENFORCE])
    assert result.status.value == "pass" and result.has(multicast.NOT_NEEDED), result.summary


def test_a_flag_that_asks_for_symmetric_memory_fails_even_with_the_fusion_off(tmp_path: Path) -> None:
    result = run(facts("rtxpro6000x8-pcie"), tmp_path, args=[ENFORCE, "--enable-torch-symm-mem"])
    assert result.has(multicast.UNSUPPORTED) and "Remove --enable-torch-symm-mem" in result.remediation.text


def test_fabric_not_started_is_gpu_fabric_s_cause_before_any_reading(tmp_path: Path) -> None:
    result = run(facts("b300x8-fabric-not-started"), tmp_path)
    assert result.status.value == "skip" and result.cause == "gpu.fabric", (result.status, result.summary)


def test_a_real_h200_recording_without_a_reading_is_not_judged_never_a_pass(tmp_path: Path) -> None:
    fs = facts("h200x2-reference")
    assert "multicast" not in fs
    result = run(fs, tmp_path)
    assert result.status.value != "pass" and not result.findings, result.summary


def test_other_processes_on_the_group_warn_that_nvls_objects_cannot_be_read(tmp_path: Path) -> None:
    fs = facts("b300x8-stale-process")
    fs["multicast"] = facts("b300x8-healthy")["multicast"]
    result = run(fs, tmp_path)
    assert result.status.value == "warn" and result.has(multicast.SHARED), result.summary
    assert "Failed to bind NVLink SHARP" in result.summary


@pytest.mark.parametrize(("reading", "by"), [
    ({"ok": True, "loaded": True, "cu_init": 802, "cu_init_error": "CUDA_ERROR_SYSTEM_NOT_READY"}, "gpu.fabric"),
    ({"ok": True, "loaded": False, "error": "libcuda.so.1: cannot open shared object file"}, "cuda.libcuda"),
])
def test_a_driver_that_cannot_answer_names_the_check_that_judges_why(reading: dict, by: str, tmp_path: Path) -> None:
    fs = {**facts("b300x8-healthy"), "multicast": reading}
    result = run(fs, tmp_path)
    assert result.cause == by, (result.status, result.summary)


def test_one_gpu_unread_is_not_judged(tmp_path: Path) -> None:
    fs = facts("b300x8-healthy")
    mc = copy.deepcopy(fs["multicast"])
    mc["devices"][3] = {"ordinal": 3, "pci_bus_id": mc["devices"][3]["pci_bus_id"], "rc": 1,
                        "error": "CUDA_ERROR_INVALID_VALUE", "call": "cuDeviceGetAttribute"}
    result = run({**fs, "multicast": mc}, tmp_path)
    assert result.status.value == "error" and "GPU3: CUDA_ERROR_INVALID_VALUE" in result.summary, result.summary


def test_the_real_probe_reads_attributes_and_never_creates_a_multicast_object(tmp_path: Path) -> None:
    source = (Path(multicast.__file__).parents[1] / "probes" / "multicast.py").read_text(encoding="utf-8")
    assert "cuMulticastCreate" not in source.replace("``cuMulticastCreate``", "")
    from doctor.facts.store import CollectOptions
    from doctor.gpu.facts import collect_multicast

    ctx = make_context({"tp": 8})
    fact = collect_multicast(CollectOptions.from_settings(ctx.settings))
    assert fact["ok"] is True and fact["attribute"] == 132
    if fact["loaded"] and fact.get("cu_init") == 0:
        assert all("multicast_supported" in d or "error" in d for d in fact["devices"])
    elif not fact["loaded"]:
        assert "libcuda.so.1" in fact["error"]


def test_bus_ids_of_nvml_and_cuda_are_one_key() -> None:
    assert multicast.bus_key("00000000:2A:00.0") == multicast.bus_key("0000:2a:00.0") == "0:2a:00.0"


def test_explain_names_the_flag_that_turns_the_fusion_off() -> None:
    from conftest import run_doctor

    out = run_doctor("explain", "gpu.multicast")
    text = " ".join(out.stdout.split())
    assert out.returncode == 0, out.stderr
    for words in ("multicast-supported attribute", "never a multicast object", ENFORCE, "--enable-torch-symm-mem",
                  "NCCL_NVLS_ENABLE=0", "Device does not support multicasting", "nvidia-smi -q -d FABRIC"):
        assert words in text, (words, out.stdout)
