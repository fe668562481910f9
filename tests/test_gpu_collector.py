"""The ``nvml`` collector: every NVML error mapped to data, CUDA_VISIBLE_DEVICES, /proc, isolation.

Without a GPU here, NVML answers come from ``tests/fixtures/fakenvml/pynvml.py`` (error classes,
struct arguments and the tuple P2P index behave as the real binding does); the real library is
used where it can run: its LibraryNotFound on this machine, and everything under ``-m gpu``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from file_modules import load_file

from doctor.core.context import FactUnavailable
from doctor.core.registry import load
from doctor.facts.isolation import collect_isolated
from doctor.facts.store import CollectOptions, FactStore
from doctor.gpu import facts as nvml_mod

FAKE_DIR = Path(__file__).parent / "fixtures" / "fakenvml"
UUIDS = ["GPU-0ee73c7c-ff49-1cbb-61c7-a88f2fc0f94f", "GPU-2503ab35-ae3f-bc62-f0c6-16605ecd596f"]


def machine(**over: Any) -> dict[str, Any]:
    devs = [{"name": "NVIDIA H200", "uuid": u, "bus": f"00000000:00:0{6 + i}.0", "cc": [9, 0],
             "mem": [150754820096, 150109880320, 644939776], "links": [1] * 18, "link_version": 6}
            for i, u in enumerate(UUIDS)]
    m: dict[str, Any] = {"driver": "580.159.04", "cuda": 13000, "devices": devs, "p2p": {"2": 0, "0": 0},
                         "topology": 30}
    m.update(over)
    return m


def fake(m: dict[str, Any]) -> Any:
    mod = load_file(FAKE_DIR / "pynvml.py", f"fakenvml_{id(m)}", register=False)
    mod.MACHINE.update(copy.deepcopy(m))
    return mod


def read(m: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    out = nvml_mod.read_nvml(fake(m), env or {})
    json.dumps(out)  # the fact must be JSON
    return out


def test_healthy_pair_has_the_contract_keys() -> None:
    out = read(machine())
    assert out["available"] is True and out["error"] is None
    assert out["driver_version"] == "580.159.04" and out["cuda_driver_version"] == 13000
    assert out["device_count_total"] == 2 and out["visible"]["cuda_visible_devices"] is None
    d0 = out["devices"][0]
    assert d0["index"] == 0 and d0["name"] == "NVIDIA H200" and d0["uuid"] == UUIDS[0]
    assert d0["compute_capability"] == [9, 0] and d0["pci_bus_id"] == "00000000:00:06.0"
    assert d0["memory"] == {"total": 150754820096, "free": 150109880320, "used": 644939776}
    assert d0["nvlink"]["active"] == 18 and len(d0["nvlink"]["links"]) == 18
    assert d0["nvlink"]["links"][0]["remote_type"] == "switch"
    assert d0["fabric"]["state_name"] == "completed" and d0["fabric"]["api"] == "nvmlDeviceGetGpuFabricInfoV"
    assert out["pairs"] == [{"a": 0, "b": 1, "errors": {}, "p2p_nvlink": "ok", "p2p_read": "ok", "topology": "PHB"}]
    assert out["nvml_calls"] > 50


@pytest.mark.parametrize("code,kind", [(12, "LibraryNotFound"), (9, "DriverNotLoaded"), (4, "NoPermission"),
                                       (18, "LibRmVersionMismatch"), (999, "Unknown")])
def test_init_errors_are_named(code: int, kind: str) -> None:
    out = read(machine(init_error=code))
    assert out["available"] is False and out["error_kind"] == kind
    assert out["error"].startswith(f"nvmlInit failed: {kind}: ")
    assert out["devices"] == [] and out["visible"]["indices"] == []


def test_real_library_missing_here_is_library_not_found() -> None:
    pynvml = pytest.importorskip("pynvml")
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    out = nvml_mod.read_nvml(pynvml, {})
    assert out["available"] is False and out["error_kind"] == "LibraryNotFound"


def test_not_supported_is_per_call_and_per_gpu() -> None:
    m = machine()
    m["devices"][1]["errors"] = {"nvmlDeviceGetEccMode": 3, "nvmlDeviceGetRemappedRows": 3,
                                 "nvmlDeviceGetComputeRunningProcesses": 4}
    out = read(m)
    d0, d1 = out["devices"]
    assert "ecc_mode" not in d0["errors"] and d0["ecc_mode"] == {"current": 1, "pending": 1}
    assert d1["errors"]["ecc_mode"] == "NotSupported" and d1["ecc_mode"] is None
    assert d1["errors"]["row_remap"] == "NotSupported" and d1["row_remap"] is None
    assert d1["errors"]["processes.compute"] == "NoPermission"
    assert d1["processes"] == []  # graphics list still read
    assert d1["memory"] is not None  # other calls unaffected


def test_lost_gpu_stops_reading_that_gpu_only() -> None:
    m = machine()
    m["devices"][1]["lost_at"] = "nvmlDeviceGetMemoryInfo"
    out = read(m)
    d1 = out["devices"][1]
    assert d1["lost"] is True and d1["errors"]["memory"] == "GpuIsLost"
    assert d1["nvlink"] is None and d1["fabric"] is None and d1["processes"] is None
    assert out["devices"][0]["lost"] is False
    assert out["pairs"] == []  # no pair with a lost GPU is queried


def test_handle_error_recorded() -> None:
    m = machine()
    m["devices"][0]["handle_error"] = 4
    out = read(m)
    assert out["devices"][0]["errors"] == {"handle": "NoPermission"}
    assert out["devices"][1]["name"] == "NVIDIA H200"


def test_links_stop_at_invalid_argument_and_inactive_links_count() -> None:
    m = machine()
    m["devices"][1]["links"] = [1] * 11 + [0] + [1] * 6
    out = read(m)
    nv = out["devices"][1]["nvlink"]
    assert nv["supported"] is True and len(nv["links"]) == 18 and nv["active"] == 17
    assert nv["links"][11] == {"link": 11, "active": False}


def test_pcie_gpu_has_no_nvlink() -> None:
    m = machine(p2p={"2": 5, "0": 0}, topology=40)
    for d in m["devices"]:
        d["links"] = "not_supported"
    out = read(m)
    assert out["devices"][0]["nvlink"] == {"supported": False, "links": [], "active": 0, "error": None}
    assert out["pairs"][0]["p2p_nvlink"] == "not_supported" and out["pairs"][0]["topology"] == "NODE"


def test_p2p_index_is_an_int_not_pynvmls_tuple() -> None:
    mod = fake(machine())
    with pytest.raises(Exception) as exc:  # what pynvml's own constant does
        mod.nvmlDeviceGetP2PStatus(mod._Handle(0), mod._Handle(1), mod.NVML_P2P_CAPS_INDEX_READ)
    assert "convert parameter 3" in str(exc.value)
    out = nvml_mod.read_nvml(mod, {})
    assert out["pairs"][0]["p2p_read"] == "ok" and out["pairs"][0]["errors"] == {}


def test_fabric_falls_back_from_v3_to_v2_to_the_old_call() -> None:
    m = machine()
    m["devices"][0]["fabric"] = {"state": 3, "reject_structs": ["c_nvmlGpuFabricInfo_v3_t"]}
    out = read(m)
    assert out["devices"][0]["fabric"]["struct"] == "c_nvmlGpuFabricInfo_v2_t"
    old = read(machine(old_library=True))
    f = old["devices"][0]["fabric"]
    assert f["api"] == "nvmlDeviceGetGpuFabricInfo" and f["state_name"] == "completed"
    assert f["health_mask"] is None


def test_fabric_not_supported_and_not_started() -> None:
    m = machine()
    m["devices"][0]["fabric"] = {"error": 3}
    m["devices"][1]["fabric"] = {"state": 1}
    out = read(m)
    assert out["devices"][0]["fabric"]["error"] == "NotSupported" and out["devices"][0]["fabric"]["state"] is None
    assert out["devices"][1]["fabric"]["state_name"] == "not_started"


def test_cuda_visible_devices_by_uuid_prefix_and_index() -> None:
    out = read(machine(), {"CUDA_VISIBLE_DEVICES": "GPU-2503ab35"})
    assert [d["index"] for d in out["devices"]] == [1] and out["devices"][0]["cuda_index"] == 0
    assert out["pairs"] == []
    out = read(machine(), {"CUDA_VISIBLE_DEVICES": "1,0"})
    assert [(d["index"], d["cuda_index"]) for d in out["devices"]] == [(1, 0), (0, 1)]


def test_cuda_visible_devices_mig_resolves_to_parent() -> None:
    m = machine()
    m["devices"][1]["mig_devices"] = ["MIG-11111111-2222-3333-4444-555555555555"]
    out = read(m, {"CUDA_VISIBLE_DEVICES": "MIG-11111111-2222-3333-4444-555555555555"})
    assert out["visible"]["indices"] == [1] and out["visible"]["mig_entries"]
    out = read(m, {"CUDA_VISIBLE_DEVICES": "MIG-99999999"})
    assert out["visible"]["indices"] == [] and "no MIG device" in out["visible"]["problems"][0]


def test_processes_get_cmdline_and_start_time_from_proc() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "k26-gpu-test-marker"])
    try:
        time.sleep(0.05)
        m = machine()
        m["devices"][0]["procs"] = [{"pid": child.pid, "mem": 5 * 2**30}]
        m["devices"][1]["graphics_procs"] = [{"pid": 2**22 + 12345, "mem": 2**20}]  # no such PID here
        out = read(m)
        p = out["devices"][0]["processes"][0]
        assert p["pid"] == child.pid and p["used_memory"] == 5 * 2**30 and p["types"] == ["compute"]
        assert "k26-gpu-test-marker" in p["cmdline"] and p["uid"] == os.getuid()
        assert isinstance(p["start_ticks"], int) and p["holds_nvidia_device"] is False and p["in_namespace"]
        q = out["devices"][1]["processes"][0]
        assert q["in_namespace"] is False and q["cmdline"] is None
    finally:
        child.kill()
        child.wait()


def test_kernel_module_version_parsed(tmp_path: Path) -> None:
    f = tmp_path / "version"
    f.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)"
                 "  Thu Oct 30 2025\nGCC version:  gcc version 13.3.0\n")
    assert nvml_mod.kernel_module_version(str(f)) == "580.159.04"
    assert nvml_mod.kernel_module_version(str(tmp_path / "missing")) is None


def test_collector_is_isolated_with_a_deadline() -> None:
    coll = load(plugins=False).collectors["nvml"]
    assert coll.isolate is True and coll.timeout <= 20


def _use_fake_in_children(tmp_path: Path, m: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The isolated worker imports ``pynvml`` from the fake (its path rides on sys.path into the child)."""
    desc = tmp_path / "machine.json"
    desc.write_text(json.dumps(m))
    monkeypatch.setenv("FAKE_NVML_MACHINE", str(desc))
    monkeypatch.setenv("PYTHONPATH", str(FAKE_DIR))
    monkeypatch.syspath_prepend(str(FAKE_DIR))


def test_hung_nvml_is_killed_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_fake_in_children(tmp_path, machine(hang_init=True), monkeypatch)
    coll = dataclasses.replace(load(plugins=False).collectors["nvml"], timeout=2.0)
    start = time.monotonic()
    with pytest.raises(FactUnavailable) as exc:
        collect_isolated(coll, CollectOptions(env={}))
    assert time.monotonic() - start < 10
    assert "hung and was killed after 2s" in exc.value.reason


def test_isolated_worker_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_fake_in_children(tmp_path, machine(), monkeypatch)
    store = FactStore(CollectOptions(env={"CUDA_VISIBLE_DEVICES": "0"}))
    value = store.get("nvml")
    assert value["available"] is True and [d["index"] for d in value["devices"]] == [0]


def test_missing_pynvml_is_data_not_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    out = nvml_mod.collect_nvml(CollectOptions(env={}))
    assert out["available"] is False and out["error_kind"] == "ImportError" and "nvidia-ml-py" in out["error"]


def test_service_env_file_sets_cuda_visible_devices(tmp_path: Path) -> None:
    env_file = tmp_path / "sglang.env"
    env_file.write_text("# the unit's EnvironmentFile\nCUDA_VISIBLE_DEVICES=GPU-2503ab35\n")
    opts = CollectOptions(env={"CUDA_VISIBLE_DEVICES": "0"}, profile={"server": {"env_file": str(env_file)}})
    env, info = nvml_mod.service_env(opts)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-2503ab35" and info["cuda_visible_devices_from"] == str(env_file)
    out = nvml_mod.read_nvml(fake(machine()), env)
    assert [d["index"] for d in out["devices"]] == [1]
    missing = nvml_mod.service_env(CollectOptions(env={}, profile={"server": {"env_file": str(tmp_path / "no")}}))
    assert missing[1]["env_file_error"]
