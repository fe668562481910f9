"""Each GPU check's verdict on each snapshot (real recordings and synthetic scenarios), the advice
they give, and what they do with bad facts."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import make_context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doctor import app
from doctor.core.context import Context
from doctor.core.registry import load
from doctor.core.result import Result, Status
from doctor.core.runner import execute

SNAPS = Path(__file__).parent / "fixtures" / "snapshots"
GPU_IDS = ["gpu.arch", "gpu.count", "gpu.driver", "gpu.fabric", "gpu.health", "gpu.idle", "gpu.memory",
           "gpu.nvlink", "gpu.p2p_bandwidth", "gpu.fabric.manager", "gpu.fabric.nvlsm", "gpu.p2p", "gpu.multicast",
           "gpu.pcie_width"]
P, W, F, S, E = "pass", "warn", "fail", "skip", "error"


def verdicts(snapshot: str, profile: str, tp: int | None = None) -> dict[str, str]:
    """Run every GPU check (with --deep) through the real runner on a snapshot file."""
    flags = {"from_snapshot": str(SNAPS / snapshot), "profile": profile, "tp": tp, "deep": True, "only": ["gpu.*"]}
    report = app.run(app.settings_from_flags(flags))[0]
    return {r.id: r.status.value for r in report.results}


def results(snapshot: str | dict[str, Any], profile: str, tp: int | None = None) -> dict[str, Result]:
    doc = snapshot if isinstance(snapshot, dict) else json.loads((SNAPS / snapshot).read_text())
    flags = {"profile": profile, "tp": tp, "deep": True, "only": ["gpu.*"]}
    settings_ = app.settings_from_flags(flags)
    settings_.snapshot = doc
    report = app.run(settings_)[0]
    return {r.id: r for r in report.results}


#     driver count arch memory idle health nvlink fabric p2p_bandwidth | fabric.manager fabric.nvlsm p2p | multicast
#     | pcie_width (every recording with its link widths read has them at x16: pass)
def row(driver: str, count: str, arch: str, memory: str, idle: str, health: str, nvlink: str, fabric: str,
        bw: str, fm: str, nvlsm: str, p2p: str, mc: str, pcie: str = "pass") -> dict[str, str]:
    return {"gpu.driver": driver, "gpu.count": count, "gpu.arch": arch, "gpu.memory": memory, "gpu.idle": idle,
            "gpu.health": health, "gpu.nvlink": nvlink, "gpu.fabric": fabric, "gpu.p2p_bandwidth": bw,
            "gpu.fabric.manager": fm, "gpu.fabric.nvlsm": nvlsm, "gpu.p2p": p2p, "gpu.multicast": mc,
            "gpu.pcie_width": pcie}


# The first nine columns are the verdicts these snapshots gave before the fabric software and PCIe facts existed:
# a snapshot without the new facts must judge the old checks the same, and the new ones "cannot judge" (skip).
# gpu.multicast (last column) passes only on a reading: every GPU of the group supporting multicast with the fabric
# ready and no other process on them (b300x8-healthy), or no GPU supporting it where nothing the server starts needs
# it (rtxpro6000x8-pcie: sm_120, where SGLang does not turn FlashInfer's fusion on by itself, and neither profile
# asks for a multicast user). A fabric not ready blocks it on gpu.fabric; a recording without the multicast fact is
# not judged; TP 1 needs no multicast. MULTICAST_WHY below tells these skips apart.
VERDICTS = [
    # real 2x H200 (converted): 2 of 8 GPUs; the recording's fabric read failed (TypeError) -> error
    ("h200x2-reference.json", "h200-tp8", None, row(P, F, P, P, P, P, P, E, S, S, S, P, S, S)),
    ("h200x2-reference.json", "h200-tp8", 2, row(P, P, P, P, P, P, P, E, S, S, S, P, S, S)),
    ("h200x2-reference.json", "b300-tp8-ddtree", 2, row(P, P, F, F, P, P, P, E, S, S, S, P, S, S)),
    ("b300x8-healthy.json", "b300-tp8-ddtree", None, row(P, P, P, P, P, P, P, P, P, P, P, P, P)),
    ("b300x8-link-down.json", "b300-tp8-ddtree", None, row(P, P, P, P, P, P, F, P, P, S, S, P, S)),
    ("b300x8-fabric-not-started.json", "b300-tp8-ddtree", None, row(P, P, P, P, P, P, F, F, F, S, S, S, S)),
    ("b300x8-fabric-in-progress.json", "b300-tp8-ddtree", None, row(P, P, P, P, P, P, F, F, S, P, F, S, S)),
    ("b300x8-fabric-manager-mismatch.json", "b300-tp8-ddtree", None, row(P, P, P, P, P, P, F, F, S, F, F, S, S)),
    ("b300x8-stale-process.json", "b300-tp8-ddtree", None, row(P, P, P, W, F, P, P, P, P, S, S, P, S)),
    ("rtxpro6000x8-pcie.json", "b300-tp8-ddtree", None, row(P, P, F, F, P, P, F, S, W, S, S, P, P)),
    ("rtxpro6000x8-pcie.json", "rtxpro6000-ep8", None, row(P, P, P, P, P, P, P, S, W, S, S, P, P)),
    ("rtxpro6000x8-acs-redirect.json", "rtxpro6000-ep8", None, row(P, P, P, P, P, P, P, S, W, S, S, F, S)),
    ("h200x8.json", "h200-tp8", None, row(P, P, P, P, P, P, P, P, P, P, S, P, S)),
    ("h200x8.json", "b300-tp8-ddtree", None, row(P, P, F, F, P, P, P, P, P, P, F, P, S)),
]
if (SNAPS / "h200x1-real.json").exists():
    VERDICTS += [
        ("h200x1-real.json", "h200-tp8", None, row(P, F, P, P, P, P, S, S, S, S, S, S, S)),
        ("h200x1-real.json", "h200-tp8", 1, row(P, P, P, P, P, P, S, S, S, S, S, S, S)),
    ]

# Why gpu.multicast gave its verdict on each row of VERDICTS: the finding's code, else what kind of skip it is
# ("unrecorded": no multicast fact, never a pass; "gpu.fabric": blocked by that check; "inapplicable": TP 1).
MULTICAST_WHY = {
    ("h200x2-reference.json", "h200-tp8", None): "unrecorded",
    ("h200x2-reference.json", "h200-tp8", 2): "unrecorded",
    ("h200x2-reference.json", "b300-tp8-ddtree", 2): "unrecorded",
    ("b300x8-healthy.json", "b300-tp8-ddtree", None): "gpu.multicast.supported",
    ("b300x8-link-down.json", "b300-tp8-ddtree", None): "unrecorded",
    ("b300x8-fabric-not-started.json", "b300-tp8-ddtree", None): "gpu.fabric",
    ("b300x8-fabric-in-progress.json", "b300-tp8-ddtree", None): "gpu.fabric",
    ("b300x8-fabric-manager-mismatch.json", "b300-tp8-ddtree", None): "gpu.fabric",
    ("b300x8-stale-process.json", "b300-tp8-ddtree", None): "unrecorded",
    ("rtxpro6000x8-pcie.json", "b300-tp8-ddtree", None): "gpu.multicast.not_needed",
    ("rtxpro6000x8-pcie.json", "rtxpro6000-ep8", None): "gpu.multicast.not_needed",
    ("rtxpro6000x8-acs-redirect.json", "rtxpro6000-ep8", None): "unrecorded",
    ("h200x8.json", "h200-tp8", None): "unrecorded",
    ("h200x8.json", "b300-tp8-ddtree", None): "unrecorded",
    ("h200x1-real.json", "h200-tp8", None): "unrecorded",
    ("h200x1-real.json", "h200-tp8", 1): "inapplicable",
}


def multicast_why(res: Result) -> str:
    if res.findings:
        return res.findings[0].code
    if res.cause:
        return res.cause
    return "unrecorded" if res.unjudged else "inapplicable"


@pytest.mark.parametrize("snapshot,profile,tp,expected", VERDICTS,
                         ids=[f"{s}-{p}-tp{t or 'P'}" for s, p, t, _ in VERDICTS])
def test_verdicts(snapshot: str, profile: str, tp: int | None, expected: dict[str, str]) -> None:
    assert verdicts(snapshot, profile, tp) == expected


@pytest.mark.parametrize("snapshot,profile,tp", [v[:3] for v in VERDICTS],
                         ids=[f"{s}-{p}-tp{t or 'P'}" for s, p, t, _ in VERDICTS])
def test_multicast_says_why(snapshot: str, profile: str, tp: int | None) -> None:
    """A skip of gpu.multicast is one of three kinds; the table above gives only the status."""
    res = results(snapshot, profile, tp)["gpu.multicast"]
    assert multicast_why(res) == MULTICAST_WHY[(snapshot, profile, tp)], res.summary


def test_all_gpu_checks_registered() -> None:
    checks = {c.id: c for c in load(plugins=False).sorted_checks() if c.id.startswith("gpu.")}
    assert set(GPU_IDS) <= set(checks)
    assert checks["gpu.p2p_bandwidth"].deep and not any(checks[i].deep for i in GPU_IDS if i != "gpu.p2p_bandwidth")
    assert checks["gpu.idle"].fixer == "gpu.idle" and checks["gpu.fabric"].fixer == "gpu.fabric"
    for cid in GPU_IDS:
        assert "nvml" in checks[cid].needs and checks[cid].explain
    assert checks["gpu.fabric.nvlsm"].fixer == "gpu.fabric.nvlsm" and "pcie" in checks["gpu.p2p"].needs


def test_nvlink_matrix_like_nvidia_smi() -> None:
    res = results("b300x8-healthy.json", "b300-tp8-ddtree")["gpu.nvlink"]
    rows = res.details["matrix"]
    assert rows[0].split() == [f"GPU{i}" for i in range(8)] + ["NVLinks"]
    assert rows[1].split() == ["GPU0", "X"] + ["NV18"] * 7 + ["18/18"]
    assert rows[8].split() == ["GPU7"] + ["NV18"] * 7 + ["X", "18/18"]
    assert res.exhibit == "\n".join(rows)
    ref = results("h200x2-reference.json", "h200-tp8", 2)["gpu.nvlink"]
    assert ref.details["matrix"][1].split() == ["GPU0", "X", "NV18", "18/18"]  # NVML topology said PHB (30)


def test_pcie_under_tp8_points_at_the_ep_profile_with_the_measured_figures() -> None:
    res = results("rtxpro6000x8-pcie.json", "b300-tp8-ddtree")
    nv = res["gpu.nvlink"]
    assert nv.status is Status.FAIL
    assert "PCIe only" in nv.summary and "26 tok/s" in nv.summary and "65 tok/s" in nv.summary
    assert "--profile rtxpro6000-ep8" in nv.summary
    assert "k26-doctor check --profile rtxpro6000-ep8" in nv.remediation.commands
    assert nv.details["measured_tok_s"] == {"tp8_pcie": 26, "ep8_pcie": 65}
    assert nv.details["matrix"][1].split()[2] in ("PXB", "NODE")
    assert "--profile rtxpro6000-ep8" in res["gpu.arch"].remediation.text


def test_link_down_names_the_gpu() -> None:
    nv = results("b300x8-link-down.json", "b300-tp8-ddtree")["gpu.nvlink"]
    assert "GPU5 17/18" in nv.summary and "degraded" in nv.summary
    assert nv.details["active_links"]["GPU5"] == 17
    assert nv.details["matrix"][6].split()[-1] == "17/18"


def test_fabric_not_started_says_start_fabric_manager() -> None:
    res = results("b300x8-fabric-not-started.json", "b300-tp8-ddtree")
    fab = res["gpu.fabric"]
    assert "not started on GPU0" in fab.summary and "inactive" in fab.summary
    assert "sudo systemctl start nvidia-fabricmanager" in fab.remediation.commands
    assert "580.159.04" in fab.remediation.text
    assert "fabric" in res["gpu.nvlink"].summary and "rtxpro6000" not in res["gpu.nvlink"].summary
    assert "system not yet initialized" in res["gpu.p2p_bandwidth"].summary


def test_stale_processes_listed_with_pid_cmdline_memory() -> None:
    idle = results("b300x8-stale-process.json", "b300-tp8-ddtree")["gpu.idle"]
    assert "9 process(es)" in idle.summary and "PID 41230 (sglang::scheduler_TP0) 235.0 GiB on GPU0" in idle.summary
    assert "not visible from this PID namespace" in idle.summary
    assert "sudo systemctl stop sglang-k26-ddtree.service" in idle.remediation.commands
    assert [p["pid"] for p in idle.details["processes"]] == [*range(41230, 41238), 3912877]


def test_arch_names_the_profile_for_the_gpus_found() -> None:
    arch = results("h200x8.json", "b300-tp8-ddtree")["gpu.arch"]
    assert "compute capability 9.0" in arch.summary and "expects 10.3" in arch.summary
    assert arch.details["matching_profiles"][0] == "h200-tp8"


def test_memory_reports_free_for_model_fit() -> None:
    mem = results("b300x8-stale-process.json", "b300-tp8-ddtree")["gpu.memory"]
    assert mem.details["free_min_bytes"] == 288_045_776_896 - 235 * 2**30 - 600 * 2**20
    assert len(mem.details["per_gpu"]) == 8 and "0.85" in mem.summary


# -- mutations of a healthy host ---------------------------------------------------------------------

def healthy() -> dict[str, Any]:
    return json.loads((SNAPS / "b300x8-healthy.json").read_text())


def nvml_of(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["facts"]["nvml"]


def judge(doc: dict[str, Any], cid: str, profile: str = "b300-tp8-ddtree", tp: int | None = None) -> Result:
    return results(doc, profile, tp)[cid]


def test_mixed_gpus_fail_arch() -> None:
    doc = healthy()
    nvml_of(doc)["devices"][3].update(name="NVIDIA B200", compute_capability=[10, 0])
    res = judge(doc, "gpu.arch")
    assert res.status is Status.FAIL and "mixed GPUs" in res.summary and "GPU3" in res.summary


@pytest.mark.parametrize("field,value,status,text", [
    ("ecc_uncorrected", {"volatile": 2, "aggregate": 2}, F, "2 uncorrected ECC"),
    ("row_remap", {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}, F, "remapping pending"),
    ("row_remap", {"correctable": 0, "uncorrectable": 9, "pending": False, "failure": True}, F, "remapping failed"),
    ("retired_pages_pending", True, F, "retired pages pending"),
    ("mig_mode", {"current": 1, "pending": 1}, F, "MIG mode on"),
    ("mig_mode", {"current": 0, "pending": 1}, F, "MIG mode pending"),
    ("clock_event_names", ["hw_slowdown", "hw_thermal_slowdown"], W, "hardware thermal slowdown"),
    ("persistence_mode", 0, W, "persistence mode off"),
    ("lost", True, F, "GPU2 is lost"),
])
def test_health(field: str, value: Any, status: str, text: str) -> None:
    doc = healthy()
    nvml_of(doc)["devices"][2][field] = value
    res = judge(doc, "gpu.health")
    assert res.status.value == status and text in res.summary, res.summary


def test_health_not_supported_is_listed_not_judged() -> None:
    doc = healthy()
    for d in nvml_of(doc)["devices"]:
        d.update(ecc_uncorrected={"volatile": None, "aggregate": None}, row_remap=None, mig_mode=None,
                 clock_event_names=None, persistence_mode=None, ecc_mode=None)
        d["errors"] = {k: "NotSupported" for k in ("ecc_uncorrected.volatile", "row_remap", "mig_mode",
                                                   "clock_event_reasons", "persistence_mode", "ecc_mode")}
    res = judge(doc, "gpu.health")
    assert res.status is Status.SKIP
    assert "row_remap" in res.details["per_gpu"]["GPU0"]["not_supported"]


def test_pcie_width_narrower_than_the_gpu_can_warns_naming_it() -> None:
    """A link trained at x8 of x16 warns (node failure: the fleet sends that node for repair) with the lspci
    command on that GPU's bus; an idle GPU's lower generation is recorded, never judged."""
    doc = healthy()
    for d in nvml_of(doc)["devices"]:
        d["pcie"]["gen_current"] = 1  # idle: power saving
    assert judge(doc, "gpu.pcie_width").status is Status.PASS
    dev = nvml_of(doc)["devices"][3]
    dev["pcie"]["width_current"] = 8
    res = judge(doc, "gpu.pcie_width")
    assert res.status is Status.WARN and res.failure == "node"
    assert res.summary == "GPU3: PCIe link at x8 of x16: host-to-device copies at 50% of the rate"
    assert res.remediation and res.remediation.commands[0] == (
        f"sudo lspci -vv -s {dev['pci_bus_id'][-12:]} | grep -E 'LnkCap:|LnkSta:'")
    assert res.details["per_gpu"]["GPU3"]["width_current"] == 8 and res.has("gpu.pcie_width.narrow")


def test_pcie_width_unread_is_not_judged_and_not_supported_is_listed() -> None:
    doc = healthy()
    dev = nvml_of(doc)["devices"][5]
    dev["pcie"]["width_current"] = None
    res = judge(doc, "gpu.pcie_width")
    assert res.status is Status.SKIP and res.unjudged and "GPU5" in res.summary, res.summary
    dev.setdefault("errors", {})["pcie.width_current"] = "NotSupported"
    res = judge(doc, "gpu.pcie_width")
    assert res.status is Status.PASS and res.summary.endswith("; GPU5: NotSupported"), res.summary
    for d in nvml_of(doc)["devices"]:
        d["pcie"] = {"gen_max": None, "width_max": None, "gen_current": None, "width_current": None}
        d["errors"] = {"pcie.width_max": "NotSupported", "pcie.width_current": "NotSupported"}
    res = judge(doc, "gpu.pcie_width")
    assert res.status is Status.SKIP and not res.unjudged and "NotSupported" in res.summary


def test_pcie_width_a_bus_id_that_is_not_one_stays_off_the_command_line() -> None:
    doc = healthy()
    dev = nvml_of(doc)["devices"][0]
    dev["pcie"]["width_current"], dev["pci_bus_id"] = 4, "0000:5D:00.0; rm -rf /"
    res = judge(doc, "gpu.pcie_width")
    assert res.status is Status.WARN and "x4 of x16" in res.summary
    assert res.remediation and res.remediation.commands[0] == "sudo lspci -vv | grep -E 'LnkCap:|LnkSta:'"


def test_count_with_cuda_visible_devices_problems() -> None:
    doc = healthy()
    n = nvml_of(doc)
    n["devices"] = n["devices"][:3]
    n["visible"].update(cuda_visible_devices="0,1,2,GPU-nope,4", indices=[0, 1, 2], ignored=["GPU-nope", "4"],
                        problems=["CUDA_VISIBLE_DEVICES entry 'GPU-nope': no GPU has this UUID; CUDA ignores it and "
                                  "every entry after it"])
    res = judge(doc, "gpu.count")
    assert res.status is Status.FAIL and "GPU-nope" in res.summary and res.details["visible"] == 3


def test_count_hidden_by_cuda_visible_devices() -> None:
    doc = healthy()
    n = nvml_of(doc)
    n["devices"] = n["devices"][:4]
    n["visible"].update(cuda_visible_devices="0,1,2,3", indices=[0, 1, 2, 3])
    res = judge(doc, "gpu.count")
    assert res.status is Status.FAIL and "hides GPUs" in res.remediation.text


def test_driver_library_and_module_mismatch() -> None:
    doc = healthy()
    nvml_of(doc)["kernel_module_version"] = "575.57.08"
    res = judge(doc, "gpu.driver")
    assert res.status is Status.FAIL and "575.57.08" in res.summary and "sudo reboot" in res.remediation.commands


def test_driver_unavailable_fails_and_the_rest_skip() -> None:
    doc = healthy()
    doc["facts"]["nvml"] = {"available": False, "error": "nvmlInit failed: DriverNotLoaded: kernel module not loaded",
                            "error_kind": "DriverNotLoaded", "devices": []}
    res = results(doc, "b300-tp8-ddtree")
    assert res["gpu.driver"].status is Status.FAIL and "sudo modprobe nvidia" in res["gpu.driver"].remediation.commands
    assert all(res[c].status is Status.SKIP for c in GPU_IDS if c != "gpu.driver")


@pytest.mark.parametrize("state,status_code,status,text", [
    ("in_progress", 0, F, "in progress"),
    ("completed", 27, F, "completed with an error"),
])
def test_fabric_states(state: str, status_code: int, status: str, text: str) -> None:
    doc = healthy()
    for d in nvml_of(doc)["devices"]:
        d["fabric"].update(state_name=state, status=status_code, status_name="NotReady" if status_code else "Success")
    res = judge(doc, "gpu.fabric")
    assert res.status.value == status and text in res.summary


def test_fabric_degraded_health_warns() -> None:
    doc = healthy()
    nvml_of(doc)["devices"][4]["fabric"]["health_summary"] = "limited_capacity"
    assert judge(doc, "gpu.fabric").status is Status.WARN


def test_fabric_manager_version_mismatch_in_advice() -> None:
    doc = json.loads((SNAPS / "b300x8-fabric-not-started.json").read_text())
    nvml_of(doc)["fabric_manager"]["version"] = "570.133.20"
    res = judge(doc, "gpu.fabric")
    assert "570.133.20" in res.remediation.text and "580.159.04" in res.remediation.text


@pytest.mark.parametrize("rate,status", [(765.0, P), (600.0, W), (200.0, F)])
def test_bandwidth_thresholds(rate: float, status: str) -> None:
    doc = healthy()
    for p in doc["facts"]["p2p_bandwidth"]["pairs"]:
        if {p["src"], p["dst"]} == {2, 6}:
            p["gb_per_s"] = rate
    res = judge(doc, "gpu.p2p_bandwidth")
    assert res.status.value == status
    if status != P:
        assert "GPU2-GPU6" in res.summary


def test_bandwidth_wrong_data_and_failed_probe() -> None:
    doc = healthy()
    doc["facts"]["p2p_bandwidth"]["pairs"][0]["data_ok"] = False
    assert judge(doc, "gpu.p2p_bandwidth").status is Status.FAIL
    doc = healthy()
    doc["facts"]["p2p_bandwidth"] = {"measured": False, "probe_failed": True,
                                     "reason": "the bandwidth probe failed under /x/python: python did not finish"}
    assert judge(doc, "gpu.p2p_bandwidth").status is Status.ERROR
    doc["facts"]["p2p_bandwidth"] = {"measured": False, "reason": "measured only with --deep"}
    assert judge(doc, "gpu.p2p_bandwidth").status is Status.SKIP


def test_bandwidth_a_hung_pair_fails_that_pair_by_name() -> None:
    """The probe's per-pair deadline killed the child of pair 2-5: the check fails naming it (not 'missing'),
    and points at gpu.p2p; the other 27 pairs were measured."""
    doc = healthy()
    bw = doc["facts"]["p2p_bandwidth"]
    bw["pairs"] = [p for p in bw["pairs"] if {p["src"], p["dst"]} != {2, 5}]
    bw["failed_pairs"] = [{"a": 2, "b": 5, "timed_out": True, "seconds": 30.0,
                           "error": "no answer within 30 s: killed"}]
    res = judge(doc, "gpu.p2p_bandwidth")
    assert res.status is Status.FAIL
    assert res.summary == ("GPU-to-GPU copies did not complete for 1 pair(s): GPU2-GPU5 (hung: no answer within 30 s: "
                           "killed)")
    assert "gpu.p2p" in res.remediation.text and res.details["missing"] == [] and len(res.details["pairs"]) == 27


def test_bandwidth_one_gpu_is_skipped() -> None:
    res = judge(healthy(), "gpu.p2p_bandwidth", tp=1)
    assert res.status is Status.SKIP and "no pair" in res.summary


def test_nvlink_pair_without_nvlink() -> None:
    doc = healthy()
    for p in nvml_of(doc)["pairs"]:
        if p["a"] == 0 and p["b"] == 7:
            p["p2p_nvlink"] = "not_supported"
    res = judge(doc, "gpu.nvlink")
    assert res.status is Status.FAIL and "GPU0-GPU7" in res.summary and res.details["matrix"][1].split()[8] == "SYS"


def test_nvlink_unreadable_pair_is_an_error_not_a_pass() -> None:
    doc = healthy()
    nvml_of(doc)["pairs"][0].update(p2p_nvlink=None, errors={"p2p_nvlink": "NoPermission"})
    res = judge(doc, "gpu.nvlink")
    assert res.status is Status.ERROR and "NoPermission" in res.summary


# -- bad facts never crash a check -----------------------------------------------------------------

GPU_CHECKS = {c.id: c for c in load(plugins=False).sorted_checks() if c.id in GPU_IDS}
json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats(allow_nan=False)
                           | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                       max_size=6), max_leaves=25)
KEYS = ["available", "devices", "pairs", "visible", "driver_version", "kernel_module_version", "cuda_driver_version"]
DEV_KEYS = ["index", "cuda_index", "name", "compute_capability", "memory", "processes", "nvlink", "fabric",
            "ecc_uncorrected", "row_remap", "mig_mode", "clock_event_names", "errors", "lost", "pcie"]


def _ctx(nvml: Any, bw: Any, tp: int = 8) -> Context:
    return make_context({"profile": "b300-tp8-ddtree", "tp": tp, "deep": True},
                        facts={"nvml": nvml, "p2p_bandwidth": bw})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(top=st.fixed_dictionaries({}, optional={k: json_values for k in KEYS}),
       dev=st.fixed_dictionaries({}, optional={k: json_values for k in DEV_KEYS}), bw=json_values)
def test_hostile_facts_never_raise(top: dict[str, Any], dev: dict[str, Any], bw: Any) -> None:
    base = copy.deepcopy(_BASE)
    base.update(top)
    if isinstance(base.get("devices"), list) and base["devices"] and isinstance(base["devices"][0], dict):
        base["devices"][0].update(dev)
    ctx = _ctx(base, bw)
    for cid, chk in GPU_CHECKS.items():
        res = execute(chk, ctx)  # the runner: a malformed fact is a fail naming it, never a traceback
        assert isinstance(res, Result), cid
        assert not res.summary.startswith("check crashed"), (cid, res.summary)
        json.dumps(res.details, default=str)


_BASE = nvml_of(healthy())


@pytest.mark.parametrize("value", ["not a dict", 42, None, [], {"available": True, "devices": "x"}])
def test_malformed_fact_fails_clearly(value: Any) -> None:
    ctx = _ctx(value, {"measured": False})
    for cid, chk in GPU_CHECKS.items():
        res = execute(chk, ctx)
        assert res.status in (Status.FAIL, Status.SKIP, Status.ERROR), (cid, res.summary)
        assert not res.summary.startswith("check crashed"), (cid, res.summary)


def test_direct_nvlink_bridge_counts_links_to_the_peer() -> None:
    from doctor.gpu import links

    doc = json.loads((SNAPS / "h200x2-reference.json").read_text())
    a, b = nvml_of(doc)["devices"]
    for me, peer in ((a, b), (b, a)):
        me["nvlink"]["links"] = [{"link": n, "active": True, "version": 6, "remote_type": "gpu",
                                  "remote_pci_bus_id": peer["pci_bus_id"] if n < 4 else "00000000:99:00.0"}
                                 for n in range(6)]
    assert links.pair_links(a, b) == 4
    assert links.pair_label(nvml_of(doc), a, b) == "NV4"
    assert links.expected_pair_gbps(nvml_of(doc), a, b, None)[0] == 100.0


def test_fewer_links_than_the_profile_fail_even_when_equal() -> None:
    doc = healthy()
    for d in nvml_of(doc)["devices"]:
        for link in d["nvlink"]["links"][12:]:
            link["active"] = False
    res = judge(doc, "gpu.nvlink")
    assert res.status is Status.FAIL and "fewer active links than the profile's 18" in res.summary


def test_long_command_lines_keep_head_and_tail() -> None:
    doc = json.loads((SNAPS / "b300x8-stale-process.json").read_text())
    cmd = "/opt/k26/venv/bin/python3 -m sglang.launch_server " + "--flag x " * 40 + "--port 30001"
    nvml_of(doc)["devices"][0]["processes"][0]["cmdline"] = cmd
    idle = judge(doc, "gpu.idle")
    assert "/opt/k26/venv/bin/python3" in idle.summary and "--port 30001" in idle.summary and " ... " in idle.summary
    assert idle.details["processes"][0]["cmdline"] == cmd
