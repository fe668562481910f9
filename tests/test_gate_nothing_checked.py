"""Nothing checked is never a pass (issue 13): selections that name nothing, empty or missing inputs,
checks not judged for want of facts, a site plugin that does not load. Run as users run the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from conftest import ROOT, penv, run_doctor, schema

SNAP = ROOT / "tests" / "fixtures" / "snapshots" / "b300x8-healthy.json"


@pytest.mark.parametrize("args, needle", [
    (["check", "--only", "gpu.nvlnk"], "did you mean gpu.nvlink?"),
    (["check", "--only", "gpu.nvlnk", "--strict", "--format", "json"], "did you mean gpu.nvlink?"),
    (["check", "--only", "gpu.nvlnk", "--format", "junit"], "did you mean gpu.nvlink?"),
    (["check", "--only", "stack.nosuch"], "matches no registered check"),
    (["check", "--only", "gpu.nv*x"], "matches no registered check"),
    (["check", "--skip", "hots.port"], "did you mean host.port"),
    (["check", "--ignore", "nosuch"], "--ignore 'nosuch' matches no registered check"),
    (["fix", "--only", "nosuch"], "--only 'nosuch' matches no registered check"),
    (["launch", "--only", "gpu.nvlnk", "--no-flag-check"], "did you mean gpu.nvlink?"),
    (["check", "--only", "model.shards.deep", "--skip", "model.*"], "the selection runs no check"),
])
def test_a_selection_that_names_nothing_is_a_usage_error(args: list[str], needle: str) -> None:
    out = run_doctor(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert needle in out.stderr
    assert out.stdout == "", "no report (no JSON 'pass', no JUnit tests=0) for a run that judged nothing"


def test_an_ignore_in_the_config_that_names_nothing_is_invalid(tmp_path: Path) -> None:
    cfg = tmp_path / "k26.toml"
    cfg.write_text('[doctor]\nignore = ["gpu.heath"]\n')
    out = run_doctor("check", "--config", str(cfg), "--only", "host.env")
    assert out.returncode == 2 and "did you mean gpu.health" in out.stderr


def test_a_deep_check_named_alone_runs_as_with_deep(tmp_path: Path) -> None:
    """--only model.shards.deep without --deep hashes (it is what was asked), never "skip: run with --deep"."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    js = json.loads(run_doctor("check", "--only", "model.shards.deep", "--model-path", str(model),
                               "--format", "json").stdout)
    (res,) = js["results"]
    assert "run with --deep" not in res["summary"] and js["doctor"]["deep"] is True


@pytest.mark.parametrize("flag", ["--model-path", "--draft-model-path", "--python", "--state-dir", "--patches-dir"])
def test_an_empty_path_is_invalid(flag: str) -> None:
    out = run_doctor("check", "--only", "model.config", flag, "")
    assert out.returncode == 2 and f"{flag} is empty" in out.stderr and out.stdout == ""


def test_an_empty_path_in_the_config_is_invalid(tmp_path: Path) -> None:
    cfg = tmp_path / "k26.toml"
    cfg.write_text('[model]\npath = ""\n')
    out = run_doctor("check", "--config", str(cfg), "--only", "model.config")
    assert out.returncode == 2 and "[model] path = ''" in out.stderr


def test_a_missing_required_input_fails(tmp_path: Path) -> None:
    """A profile with no model path: the model checks fail (said once), they do not skip and pass."""
    profile = tmp_path / "bare.toml"
    src = (ROOT / "doctor" / "profiles" / "b300-tp8-ddtree.toml").read_text()
    profile.write_text(src.replace('path = "/models/Kimi-K2.6"\n', "").replace('path = "/models/Kimi-K2.6-DFlash"\n',
                                                                                ""))
    out = run_doctor("check", "--profile", str(profile), "--only", "model.shards", "--only", "model.config",
                     "--only", "model.drafter", "--format", "json")
    assert out.returncode == 1, out.stdout
    by = {r["id"]: r for r in json.loads(out.stdout)["results"]}
    assert by["model.shards"]["status"] == "fail" and "--model-path" in by["model.shards"]["summary"]
    assert by["model.config"]["status"] == "fail" and by["model.config"]["cause"] == "model.shards"
    assert by["model.drafter"]["status"] == "fail" and "--draft-model-path" in by["model.drafter"]["summary"]
    text = run_doctor("check", "--profile", str(profile), "--only", "model.shards", "--only", "model.config").stdout
    assert text.count("no model path") == 1 and re.search(r"same cause \(1\): model\.config$", text, re.M)
    last = text.rstrip().splitlines()
    step = " ".join(" ".join(last[max(i for i, ln in enumerate(last) if ln.startswith("next: ")):]).split())
    assert step == "next: k26-doctor check --model-path MODEL_DIR (MODEL_DIR: the directory of Kimi-K2.6's weights)"


def test_a_snapshot_missing_most_facts_fails_under_strict() -> None:
    # sglang.ddtree judges this recording from the facts it has (TP 8 on sm 10.3: not a validated DDTREE
    # configuration, a failure of its own), so it is left out of what this test is about: what is not judged
    snap = ["--from-snapshot", str(SNAP), "--skip", "sglang.ddtree"]
    js = json.loads(run_doctor("check", *snap, "--strict", "--format", "json").stdout)
    jsonschema.validate(js, schema())
    unjudged = js["summary"]["unjudged"]
    assert len(unjudged) >= 10 and js["summary"]["status"] == "fail"
    assert all(r.get("unjudged") for r in js["results"] if r["id"] in unjudged)
    strict = run_doctor("check", *snap, "--strict")
    assert strict.returncode == 1 and "not judged:" in strict.stdout
    lenient = run_doctor("check", *snap, "--format", "json")
    assert lenient.returncode == 0 and json.loads(lenient.stdout)["summary"]["unjudged"] == unjudged
    junit = ET.fromstring(run_doctor("check", *snap, "--strict", "--format", "junit").stdout)
    kinds = [f.get("type") for f in junit.iter("failure")]
    assert kinds.count("unjudged") == len(unjudged) and int(junit.get("failures")) >= len(unjudged)
    junit = ET.fromstring(run_doctor("check", *snap, "--format", "junit").stdout)
    skipped = [s.get("message") for s in junit.iter("skipped")]
    assert sum(1 for m in skipped if m.startswith("not judged: ")) == len(unjudged)


def test_junit_never_reports_zero_tests() -> None:
    from doctor.app import Report
    from doctor.core.runner import RunOutcome
    from doctor.core.settings import resolve
    from doctor.report.junit import to_junit

    suite = ET.fromstring(to_junit(Report(resolve({}, environ={}), RunOutcome([], 0.0))))
    assert suite.get("tests") == "1" and suite.get("errors") == "1"
    assert [c.get("name") for c in suite.iter("testcase")] == ["doctor.selection"]


def test_launch_refuses_a_check_not_judged_and_ignore_accepts_it(plugin_site: str, tmp_path: Path) -> None:
    """The gate: a check of the run that could not be judged stops the start even without --strict."""
    env = penv(plugin_site, SITE_UNJUDGED="1")
    args = ["--only", "site.unjudged", "--model-path", str(tmp_path), "--python", "/bin/true", "--no-flag-check"]
    check = run_doctor("check", "--only", "site.unjudged", env=env)
    assert check.returncode == 0 and "not judged: the site's inventory file" in check.stdout
    assert run_doctor("check", "--only", "site.unjudged", "--strict", env=env).returncode == 1
    refused = run_doctor("launch", *args, env=env)
    assert refused.returncode == 1 and "could not be judged for want of facts: site.unjudged" in refused.stderr
    accepted = run_doctor("launch", *args, "--ignore", "site.unjudged", env=env)
    assert accepted.returncode == 0, accepted.stderr  # the gate opened: /bin/true ran as the "server"
    assert "exec: /bin/true -m sglang.launch_server" in accepted.stderr


def test_a_broken_plugin_fails_the_json_report_closed(plugin_site: str) -> None:
    out = run_doctor("check", "--only", "host.env", "--format", "junit", env=penv(plugin_site, SITE_BROKEN="1"))
    assert out.returncode == 1
    suite = ET.fromstring(out.stdout)
    case = next(c for c in suite.iter("testcase") if c.get("name") == "doctor.plugin.site")
    assert case.find("error") is not None and "misconfigured on purpose" in case.find("error").get("message")


def test_the_quick_start_says_once_which_interpreter_was_judged() -> None:
    """--python not given: if the doctor's own interpreter has no SGLang, say so once at the top with the
    config line, instead of per-check fixes that install torch and SGLang into the doctor's environment."""
    has_sglang = subprocess.run([sys.executable, "-c", "import importlib.util as u; "
                                 "raise SystemExit(0 if u.find_spec('sglang') else 1)"]).returncode == 0
    out = run_doctor("check", "--only", "stack.versions", "--only", "sglang.install", "--only", "torch.arch",
                     "--format", "json")
    js = json.loads(out.stdout)
    notices = js["doctor"]["notices"]
    commands = [c for r in js["results"] for c in (r["remediation"] or {}).get("commands", [])]
    if has_sglang:
        assert notices == []
        return
    assert [n["id"] for n in notices] == ["doctor.python"]
    assert '[doctor] python = "' in notices[0]["summary"]
    assert not [c for c in commands if "-m pip install" in c], commands
    text = run_doctor("check", "--only", "stack.versions", "--only", "sglang.install").stdout
    assert text.count("--python is not set") == 1 and text.index("--python is not set") < text.index("stack.versions")
    given = json.loads(run_doctor("check", "--only", "stack.versions", "--python", sys.executable,
                                  "--format", "json").stdout)
    assert given["doctor"]["notices"] == []  # --python given: the fixes are the user's to take
    assert any("-m pip install" in c for r in given["results"] for c in (r["remediation"] or {})["commands"])

