"""gpu.p2p: ACS control read from binary configuration spaces in a sysfs tree, the IOMMU mode, the pairs judged.

The trees are built in tmp_path as the kernel lays sysfs out (``tests/sysfs_tree.py``): devices nested
under their bridges, ``bus/pci/devices`` links, 4096-byte ``config`` files with a real capability chain
(PCI Express capability, then AER -> ACS -> Secondary PCIe from 0x100), IOMMU groups with their type.
"""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sysfs_tree import (
    ACS_REDIRECT_ON,
    SysfsTree,
    bridge_config,
    config_space,
    gpu_config,
    switched_host,
)

from doctor import app
from doctor.core.result import Result, Status
from doctor.facts.store import CollectOptions
from doctor.gpu import pcie
from doctor.gpu.facts import collect_pcie

SNAPS = Path(__file__).parent / "fixtures" / "snapshots"
GPUS = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]


def proc_dir(tmp_path: Path, cmdline: str = "BOOT_IMAGE=/vmlinuz ro", cpu: str = "GenuineIntel") -> Path:
    d = tmp_path / "proc"
    d.mkdir(exist_ok=True)
    (d / "cmdline").write_text(cmdline + "\n")
    (d / "cpuinfo").write_text(f"processor\t: 0\nvendor_id\t: {cpu}\n")
    return d


# -- the configuration space -------------------------------------------------------------------------

def test_the_capability_chain_is_walked_from_0x100() -> None:
    cfg = bridge_config("downstream", ACS_REDIRECT_ON)
    assert len(cfg) == 4096
    caps, problem = pcie.ext_capabilities(cfg)
    assert problem is None and caps == [(0x100, 0x0001, 2), (0x148, 0x000D, 1), (0x158, 0x0019, 1)]


def test_acs_control_bits_are_decoded_and_the_redirects_named() -> None:
    acs = pcie.read_acs(bridge_config("downstream", ACS_REDIRECT_ON))
    assert acs["present"] is True and (acs["offset"], acs["control_offset"]) == (0x148, 0x14E)
    assert acs["control"] == 0x001D and acs["capability"] == 0x005F
    assert [k for k, v in acs["enabled"].items() if v] == ["source_validation", "p2p_request_redirect",
                                                           "p2p_completion_redirect", "upstream_forwarding"]
    assert acs["redirects"] == ["p2p_request_redirect", "p2p_completion_redirect"]
    egress = pcie.read_acs(bridge_config("downstream", 1 << 5))
    assert egress["redirects"] == ["p2p_egress_control"]
    assert pcie.acs_names(egress["enabled"]) == ["P2P Egress Control"]
    off = pcie.read_acs(bridge_config("downstream", 0))
    assert off["present"] is True and off["redirects"] == [] and not any(off["enabled"].values())


def test_no_acs_capability_is_present_false() -> None:
    acs = pcie.read_acs(bridge_config("upstream", None))
    assert acs["present"] is False and acs["error"] is None and acs["redirects"] == []


def test_the_offset_is_found_not_assumed() -> None:
    cfg = config_space(vendor=0x1000, device=1, class_code=0x060400, bridge=True, port="downstream",
                       acs_control=ACS_REDIRECT_ON, acs_at=0x2A0)
    acs = pcie.read_acs(cfg)
    assert acs["offset"] == 0x2A0 and acs["control_offset"] == 0x2A6
    fact = {"bridges": {"0000:17:00.0": {"bdf": "0000:17:00.0", "acs": acs}}}
    assert pcie.setpci_command(pcie.bridge_acs(fact, "0000:17:00.0")) == "sudo setpci -s 0000:17:00.0 0x2a6.w=0000"
    fact["bridges"]["0000:17:00.0;reboot"] = fact["bridges"]["0000:17:00.0"]  # a hand-edited snapshot's name
    assert pcie.setpci_command(pcie.bridge_acs(fact, "0000:17:00.0;reboot")) is None


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: struct.pack_into("<I", c, 0x148, 0x000D | 1 << 16 | 0x148 << 20), "loops back to 0x148"),
    (lambda c: struct.pack_into("<I", c, 0x100, 0x0001 | 2 << 16 | 0x040 << 20), "outside the configuration"),
    (lambda c: c.__setitem__(slice(0x100, 0x104), b"\xff\xff\xff\xff"), "does not answer"),
])
def test_hostile_chains_end_with_the_problem_named(mutate: Any, needle: str) -> None:
    cfg = bytearray(bridge_config("downstream", ACS_REDIRECT_ON))
    mutate(cfg)
    caps, problem = pcie.ext_capabilities(bytes(cfg))
    assert len(caps) <= 3 and problem is not None and needle in problem


def test_a_non_root_read_of_64_bytes_cannot_judge_acs() -> None:
    acs = pcie.read_acs(bridge_config("downstream", ACS_REDIRECT_ON)[:64])
    assert acs["present"] is None and "not readable (64 bytes read)" in acs["error"]
    assert pcie.header_info(bridge_config("downstream", 0)[:64]) == {
        "vendor": "0x1000", "device": "0xc010", "class": "0x060400", "header_type": 1}


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=4096))
def test_any_bytes_give_an_answer(data: bytes) -> None:
    acs = pcie.read_acs(data)
    assert acs["present"] in (True, False, None)
    json.dumps(acs)


# -- the sysfs tree --------------------------------------------------------------------------------

def test_bridges_are_found_by_walking_up_the_device_path(tmp_path: Path) -> None:
    switched_host(tmp_path / "sys", GPUS, acs_control=ACS_REDIRECT_ON, group_type="DMA-FQ")
    out = pcie.read_pcie(str(tmp_path / "sys"), str(proc_dir(tmp_path, "ro intel_iommu=on")))
    by = {g["bdf"]: g for g in out["gpus"]}
    assert sorted(by) == GPUS
    assert by["0000:18:00.0"]["upstream"] == ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0"]
    assert by["0000:2a:00.0"]["upstream"] == ["0000:15:01.0", "0000:16:00.0", "0000:17:01.0"]
    assert out["bridges"]["0000:17:00.0"]["acs"]["redirects"] == ["p2p_request_redirect", "p2p_completion_redirect"]
    assert out["bridges"]["0000:16:00.0"]["acs"]["present"] is False  # a switch's upstream port has none
    assert out["bridges"]["0000:15:01.0"]["acs"]["control"] == 0  # root port: ACS off
    assert out["iommu"]["mode"] == "translated" and out["iommu"]["vendor"] == "intel"
    assert out["iommu"]["cmdline"] == {"intel_iommu": "on"} and by["0000:18:00.0"]["iommu_group_type"] == "DMA-FQ"
    json.dumps(out)


def test_only_nvidia_gpus_are_taken(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path / "sys")
    tree.add(["pci0000:00", "0000:00:02.0"], gpu_config())
    tree.add(["pci0000:00", "0000:00:03.0"], config_space(vendor=0x10DE, device=0x22A3, class_code=0x068000,
                                                          bridge=False, port="endpoint"))  # an NVSwitch
    tree.add(["pci0000:00", "0000:00:04.0"], config_space(vendor=0x8086, device=1, class_code=0x030000,
                                                          bridge=False, port="endpoint"))
    assert pcie.find_gpus(str(tmp_path / "sys")) == ["0000:00:02.0"]


@pytest.mark.parametrize("group_type,unit,cmdline,mode", [
    ("identity", "dmar0", "ro intel_iommu=on iommu=pt", "passthrough"),
    ("DMA", "ivhd0", "ro", "translated"),
    (None, None, "ro", "off"),
    (None, "dmar0", "ro intel_iommu=on iommu=pt", "passthrough"),  # a kernel without the group type file
    (None, "dmar0", "ro intel_iommu=on", "unknown"),
])
def test_iommu_mode(tmp_path: Path, group_type: str | None, unit: str | None, cmdline: str, mode: str) -> None:
    tree = switched_host(tmp_path / "sys", GPUS[:2], acs_control=0, group_type=group_type, iommu_unit=unit)
    if group_type is None and unit:  # groups exist, their type file does not
        (tree.root / "kernel" / "iommu_groups" / "7").mkdir()
    out = pcie.read_pcie(str(tmp_path / "sys"), str(proc_dir(tmp_path, cmdline)))
    assert out["iommu"]["mode"] == mode, out["iommu"]


def test_path_bridges_below_the_common_ancestor() -> None:
    a = ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0"]
    b = ["0000:15:01.0", "0000:16:00.0", "0000:17:01.0"]
    c = ["0000:37:01.0", "0000:38:00.0", "0000:39:00.0"]
    assert pcie.path_bridges(a, b) == ["0000:17:00.0", "0000:17:01.0"]
    assert pcie.path_bridges(a, c) == [*a, *c]
    assert pcie.path_bridges([], []) == []


def test_a_missing_sysfs_is_data(tmp_path: Path) -> None:
    out = pcie.read_pcie(str(tmp_path / "nothing"), str(tmp_path / "noproc"))
    assert out["gpus"] == [] and "does not exist" in out["errors"][0] and out["iommu"]["mode"] == "off"


def test_the_live_collector_reads_this_machine() -> None:
    out = collect_pcie(CollectOptions())
    json.dumps(out)
    assert out["sysfs_root"] == "/sys" and out["iommu"]["mode"] in ("passthrough", "translated", "off", "unknown")


# -- gpu.p2p ---------------------------------------------------------------------------------------

def snap(name: str) -> dict[str, Any]:
    return json.loads((SNAPS / name).read_text())


def judge(doc: dict[str, Any], profile: str = "rtxpro6000-ep8") -> Result:
    settings_ = app.settings_from_flags({"profile": profile, "only": ["gpu.p2p"]})
    settings_.snapshot = doc
    return {r.id: r for r in app.run(settings_)[0].results}["gpu.p2p"]


def with_pcie(doc: dict[str, Any], tmp_path: Path, **kw: Any) -> dict[str, Any]:
    """The snapshot with its ``pcie`` fact read from a tree built here (real reader, real files)."""
    bdfs = [pcie.norm_bdf(d["pci_bus_id"]) for d in doc["facts"]["nvml"]["devices"]]
    cmdline = kw.pop("cmdline", "ro")
    cpu = kw.pop("cpu", "AuthenticAMD")
    switched_host(tmp_path / "sys", bdfs, **kw)
    out = copy.deepcopy(doc)
    out["facts"]["pcie"] = pcie.read_pcie(str(tmp_path / "sys"), str(proc_dir(tmp_path, cmdline, cpu)))
    return out


def test_acs_redirect_and_translation_on_pcie_pairs_fail_with_the_exact_fix() -> None:
    res = judge(snap("rtxpro6000x8-acs-redirect.json"))
    assert res.status is Status.FAIL
    assert "P2P of 28 PCIe pair(s) goes through the root complex" in res.summary
    assert "P2P Request Redirect" in res.summary and "8 bridge(s)" in res.summary
    assert "IOMMU group type DMA" in res.summary
    cmds = res.remediation.commands
    assert "sudo setpci -s 0000:15:00.0 0x14e.w=0000" in cmds and "sudo setpci -s 0000:75:01.0 0x14e.w=0000" in cmds
    assert not any("0000:14:00.0" in c or "0000:13:01.0" in c for c in cmds)  # no ACS / ACS off: left alone
    assert any("--args='iommu=pt'" in c for c in cmds)  # AMD: iommu=pt alone
    assert sorted(res.details["redirecting_bridges"]["0000:15:00.0"])[0] == "GPU0-GPU1"


def test_clean_pcie_host_passes() -> None:
    res = judge(snap("rtxpro6000x8-pcie.json"))
    assert res.status is Status.PASS
    assert res.summary == "28 PCIe pair(s): no ACS redirect on the 16 bridge(s) between them; IOMMU passthrough"


def test_nvlink_pairs_are_not_judged_by_acs() -> None:
    """The B300 host has ACS redirect on and the IOMMU translating, but every pair is NVLink: that passes, saying so."""
    doc = snap("b300x8-healthy.json")
    assert doc["facts"]["pcie"]["iommu"]["mode"] == "translated"
    res = judge(doc, "b300-tp8-ddtree")
    assert res.status is Status.PASS and "all 28 pair(s) use NVLink" in res.summary
    assert "do not affect NVLink P2P" in res.summary
    assert len(res.details["readings"]["bridges_with_acs_redirect"]) == 8


def test_only_the_pcie_pair_of_an_nvlink_host_is_judged(tmp_path: Path) -> None:
    doc = with_pcie(snap("b300x8-healthy.json"), tmp_path, acs_control=ACS_REDIRECT_ON, group_type="identity",
                    iommu_unit="dmar0", cmdline="ro intel_iommu=on iommu=pt", cpu="GenuineIntel")
    pair = next(p for p in doc["facts"]["nvml"]["pairs"] if (p["a"], p["b"]) == (0, 1))
    pair["p2p_nvlink"] = "not_supported"
    res = judge(doc, "b300-tp8-ddtree")
    assert res.status is Status.FAIL and "P2P of 1 PCIe pair(s)" in res.summary
    assert res.details["pcie_pairs"] == ["GPU0-GPU1"] and res.details["nvlink_pairs"] == 27
    assert [r["redirect"] for r in res.details["pairs"]] == [["0000:17:00.0", "0000:17:01.0"]]
    assert not any("iommu" in c for c in res.remediation.commands)  # passthrough: only ACS to fix


def test_intel_translation_names_intel_iommu_on(tmp_path: Path) -> None:
    doc = with_pcie(snap("rtxpro6000x8-pcie.json"), tmp_path, acs_control=0, group_type="DMA-FQ",
                    iommu_unit="dmar0", cmdline="ro intel_iommu=on", cpu="GenuineIntel")
    res = judge(doc)
    assert res.status is Status.FAIL and "ACS" not in res.summary and "IOMMU group type DMA-FQ" in res.summary
    assert any("--args='intel_iommu=on iommu=pt'" in c for c in res.remediation.commands)


def test_not_root_is_cannot_judge_not_pass(tmp_path: Path) -> None:
    doc = with_pcie(snap("rtxpro6000x8-pcie.json"), tmp_path, acs_control=ACS_REDIRECT_ON, group_type="identity",
                    iommu_unit="ivhd0")
    for br in doc["facts"]["pcie"]["bridges"].values():  # what a non-root reader gets: 64 bytes
        path = tmp_path / "sys" / "bus" / "pci" / "devices" / br["bdf"] / "config"
        path.write_bytes(path.read_bytes()[:64])
    doc["facts"]["pcie"] = pcie.read_pcie(str(tmp_path / "sys"), str(tmp_path / "proc"))
    res = judge(doc)
    assert res.status is Status.SKIP and "needs root" in res.summary and "IOMMU passthrough" in res.summary


def test_unknown_iommu_mode_warns(tmp_path: Path) -> None:
    doc = with_pcie(snap("rtxpro6000x8-pcie.json"), tmp_path, acs_control=0, group_type=None, iommu_unit="ivhd0")
    (tmp_path / "sys" / "kernel" / "iommu_groups" / "3").mkdir()
    doc["facts"]["pcie"] = pcie.read_pcie(str(tmp_path / "sys"), str(tmp_path / "proc"))
    res = judge(doc)
    assert res.status is Status.WARN and "IOMMU mode is unknown" in res.summary


def test_gpus_directly_on_the_root_bus(tmp_path: Path) -> None:
    """A VM: the GPUs sit on the root bus, no bridge to read; with no IOMMU that is a pass that says so."""
    doc = snap("rtxpro6000x8-pcie.json")
    tree = SysfsTree(tmp_path / "sys")
    for d in doc["facts"]["nvml"]["devices"]:
        bdf = pcie.norm_bdf(d["pci_bus_id"])
        tree.add([f"pci{bdf[:7]}", bdf], gpu_config())
    doc["facts"]["pcie"] = pcie.read_pcie(str(tmp_path / "sys"), str(proc_dir(tmp_path)))
    res = judge(doc)
    assert res.status is Status.PASS and "no PCIe bridge is visible" in res.summary and "IOMMU off" in res.summary


def test_old_snapshots_without_the_fact_cannot_judge_pcie_pairs() -> None:
    doc = snap("rtxpro6000x8-pcie.json")
    del doc["facts"]["pcie"]
    res = judge(doc)
    assert res.status is Status.SKIP and "not recorded in the snapshot" in res.summary


@pytest.mark.parametrize("bad", [[], "x", {"gpus": "nope"}, {"bridges": {"0000:15:00.0": 5}, "gpus": []}])
def test_malformed_pcie_fact_gives_a_verdict(bad: Any) -> None:
    doc = snap("rtxpro6000x8-pcie.json")
    doc["facts"]["pcie"] = bad
    res = judge(doc)
    assert res.status in (Status.FAIL, Status.SKIP), res.summary
    assert res.traceback is None



JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 2**20) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
BASE = snap("rtxpro6000x8-acs-redirect.json")


@settings(max_examples=60, deadline=None)
@given(top=st.fixed_dictionaries({}, optional={k: JSON for k in ("gpus", "bridges", "iommu", "errors")}),
       gpu=st.fixed_dictionaries({}, optional={k: JSON for k in ("bdf", "upstream", "iommu_group_type")}),
       bridge=st.fixed_dictionaries({}, optional={k: JSON for k in ("acs", "bdf", "config_bytes")}),
       acs=st.fixed_dictionaries({}, optional={k: JSON for k in ("present", "redirects", "enabled",
                                                                 "control_offset", "error")}))
@example(top={}, gpu={}, bridge={}, acs={"redirects": ["x"], "enabled": 3, "control_offset": "0x14e"})
def test_hostile_pcie_facts_never_crash(top: dict[str, Any], gpu: dict[str, Any], bridge: dict[str, Any],
                                        acs: dict[str, Any]) -> None:
    doc = copy.deepcopy(BASE)
    fact = doc["facts"]["pcie"]
    fact["gpus"][0].update(gpu)
    first = next(iter(fact["bridges"].values()))
    first["acs"].update(acs)
    first.update(bridge)
    fact.update(top)
    res = judge(doc)
    assert res.traceback is None, (res.summary, res.traceback)
