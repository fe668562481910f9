"""What a check's failure means for the node (``@check(failure=...)``) and where it applies (``applies=``):
declared by every built-in check and validated when the registry loads, carried by every report (``list``, JSON,
JUnit, OpenMetrics), and acted on: on the synthetic healthy B300 node, whose default profile fails
``sglang.ddtree`` by design (DDTREE not validated for TP8 on sm_103), nothing drains, taints or pages."""

from __future__ import annotations

import importlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import fleet_plugin
import pytest
from conftest import ROOT, doctor_env, run_doctor, schema

from doctor.app import render, settings_from_flags
from doctor.core.registry import FAILURES, PLACES, Check, Registry, RegistryError, builtin_modules, declarations
from doctor.core.result import Result

HEALTHY = ROOT / "tests" / "fixtures" / "snapshots" / "b300x8-healthy.json"
LINK_DOWN = ROOT / "tests" / "fixtures" / "snapshots" / "b300x8-link-down.json"


def _ok(ctx: object) -> Result:
    return Result.passed("ok")


def test_every_builtin_check_declares_what_its_failure_means() -> None:
    declared = {}
    for name in builtin_modules(collectors=False):
        for item in declarations(importlib.import_module(name)):
            if isinstance(item, Check):
                declared[item.id] = item
    assert len(declared) > 30
    assert {cid for cid, c in declared.items() if c.failure is None} == set()  # none left to the default
    assert {c.failure for c in declared.values()} == set(FAILURES)
    # the hardware and the host are the node's; what a deployment chooses is the configuration's
    assert {cid for cid in ("gpu.nvlink", "gpu.health", "gpu.driver", "host.disk", "model.shards")
            if declared[cid].failure != "node"} == set()
    assert {cid for cid in ("sglang.ddtree", "sglang.flags", "stack.versions", "host.exposure", "gpu.arch")
            if declared[cid].failure != "deployment"} == set()
    assert all(set(c.applies) <= set(PLACES) and c.applies for c in declared.values())


def test_an_unknown_or_missing_declaration_is_refused_when_the_registry_loads() -> None:
    with pytest.raises(RegistryError, match=r"failure='hardware' is not one of node, deployment"):
        Registry().add(Check("x.one", "One", run=_ok, failure="hardware"))
    with pytest.raises(RegistryError, match=r"applies=\['nowhere'\]"):
        Registry().add(Check("x.one", "One", run=_ok, failure="node", applies=("nowhere",)))
    with pytest.raises(RegistryError, match=r"applies=\[\]"):
        Registry().add(Check("x.one", "One", run=_ok, failure="node", applies=()))
    with pytest.raises(RegistryError, match=r"checks.gpu: check 'gpu.new' does not declare failure="):
        Registry().add(Check("gpu.new", "New", run=_ok, module="checks.gpu"))
    # a site plugin's check that does not say gets the documented default, and a warning says so
    reg = Registry()
    reg.add(Check("site.x", "X", run=_ok, module="site_checks"), source="plugin:site")
    assert reg.checks["site.x"].failure == "node"
    assert reg.warnings == ["plugin:site: check 'site.x' does not declare failure=; counted as 'node' (a failure "
                            "drains, taints and pages)"]


def test_list_shows_the_declarations_and_warns_of_a_plugins_default(tmp_path: Path) -> None:
    env = doctor_env(PYTHONPATH=str(fleet_plugin.install(tmp_path)),
                     K26_FLEET_VERDICT=str(fleet_plugin.verdict_file(tmp_path, "pass")))
    res = run_doctor("list", "--format", "json", env=env)
    assert res.returncode == 0, res.stderr
    items = {c["id"]: c for c in json.loads(res.stdout)}
    assert (items["sglang.ddtree"]["failure"], items["gpu.nvlink"]["failure"]) == ("deployment", "node")
    assert (items["fleet.verdict"]["failure"], items["fleet.config"]["failure"]) == ("node", "deployment")
    assert items["gpu.idle"]["applies"] == ["start"] and items["host.shm"]["applies"] == ["start", "serving"]
    assert "fleet.verdict" in res.stderr and "does not declare failure=" in res.stderr
    assert "fleet.config" not in res.stderr
    res = run_doctor("check", "--only", "fleet.*", "--format", "json", env=env)  # and every run's report says it
    notes = json.loads(res.stdout)["doctor"]["notes"]
    assert [n for n in notes if "does not declare failure=" in n] == [
        "plugin:fleet: check 'fleet.verdict' does not declare failure=; counted as 'node' (a failure drains, taints "
        "and pages)"]
    explained = run_doctor("explain", "sglang.ddtree")
    assert "a failure means: deployment" in explained.stdout


def test_a_plugin_with_an_unknown_failure_is_rejected_whole(tmp_path: Path) -> None:
    site = fleet_plugin.install(tmp_path)
    module = site / "k26_fleet_verdict.py"
    module.write_text(module.read_text().replace('failure="deployment"', 'failure="hardware"'))
    env = doctor_env(PYTHONPATH=str(site), K26_FLEET_VERDICT=str(fleet_plugin.verdict_file(tmp_path, "pass")))
    res = run_doctor("check", "--only", "host.disk", "--format", "json", env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    failed = next(r for r in json.loads(res.stdout)["results"] if r["id"] == "doctor.plugin.fleet")
    assert failed["status"] == "error" and "failure='hardware'" in failed["summary"]
    assert failed["failure"] == "deployment"  # the doctor's own installation: blocks, never drains


def test_the_reports_carry_it() -> None:
    import jsonschema

    res = run_doctor("check", "--from-snapshot", str(LINK_DOWN), "--format", "json")
    report = json.loads(res.stdout)
    jsonschema.validate(report, schema())
    by = {r["id"]: r for r in report["results"]}
    assert (by["gpu.nvlink"]["failure"], by["sglang.ddtree"]["failure"]) == ("node", "deployment")
    assert all(r["failure"] in FAILURES and r["affects"] == r["failure"] for r in report["results"])
    res = run_doctor("check", "--from-snapshot", str(LINK_DOWN), "--format", "junit")
    suite = ET.fromstring(res.stdout)
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["node_failures"] == "gpu.nvlink" and props["deployment_failures"] == "sglang.ddtree"
    case = next(c for c in suite.iter("testcase") if c.get("name") == "sglang.ddtree")
    assert [(p.get("name"), p.get("value")) for p in case.find("properties")] == [("failure", "deployment")]


def test_on_the_healthy_b300_the_report_says_the_configuration_blocks_ddtree_not_the_node() -> None:
    import io

    from doctor.app import run

    report, _ = run(settings_from_flags({"from_snapshot": str(HEALTHY)}))
    failing = [r for r in report.results if r.status.failed]
    assert [(r.id, r.failure) for r in failing] == [("sglang.ddtree", "deployment")]  # by design: not validated
    out = io.StringIO()
    render(report, "text", 0, out, color=False)
    text = " ".join(out.getvalue().split())
    assert ("configuration, not the node: sglang.ddtree blocks the launch until the configuration is changed or "
            "validated (k26-doctor validate); the node itself has no failure: nothing to drain, taint or page") in text
    # a node failure beside it is named as the node's
    report, _ = run(settings_from_flags({"from_snapshot": str(LINK_DOWN)}))
    out = io.StringIO()
    render(report, "text", 0, out, color=False)
    assert "the node's own failures (drain, taint, page): gpu.nvlink" in " ".join(out.getvalue().split())
