"""``k26-doctor validate`` as a command: its help, its refusals of an invalid invocation (exit 2), and a whole
run on the fake SGLang of tests/fake_sglang (the launcher's argv as real child processes) with the configuration
read from recorded facts (the H200 recording; this host has no GPU): the record written and readable, the JSON
outcome and timing, a second run resuming without a server start, a failing run writing no record."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import validate_support as vs
from click.testing import CliRunner
from conftest import run_doctor

SNAPS = Path(__file__).resolve().parent / "fixtures" / "snapshots"
H200 = json.loads((SNAPS / "h200x1-all-facts.json").read_text())["facts"]


def test_help_reads_well():
    from doctor.cli import cli

    out = CliRunner().invoke(cli, ["validate", "--help"]).output
    for words in ("Prove DDTree on this host", "--budgets B[,B...]", "--time-budget SECONDS", "--resume / --restart",
                  "--parallel", "--prompts FILE", "Exit 0: pass", "undecided", "2: invalid invocation"):
        assert words in " ".join(out.split()), words


@pytest.mark.parametrize("args, words", [
    (["--profile", "b200-tp8"], "not DDTREE"),
    (["--profile", "b300-tp8-ddtree", "--budgets", "16,x"], "a comma-separated list of integers"),
    (["--profile", "b300-tp8-ddtree", "--budgets", "0"], "each budget from 1 to 4096"),
    (["--profile", "b300-tp8-ddtree", "--prompts", "/nonexistent/prompts.json"], "--prompts /nonexistent"),
])
def test_an_invalid_invocation_is_exit_2(args, words):
    out = run_doctor("validate", *args, timeout=60)
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert "internal error" not in out.stderr


def test_text_prompts_for_a_server_without_a_tokenizer_are_refused(tmp_path):
    out = run_doctor("validate", "--profile", str(vs.profile(tmp_path)), "--state-dir", str(tmp_path / "s"),
                     timeout=60)
    assert out.returncode == 2 and "--skip-tokenizer-init: give --prompts FILE of token ids" in out.stderr


@pytest.fixture
def recorded_host(monkeypatch, tmp_path):
    """The command's facts: the H200 recording's GPUs and stack (with the payload's SGLang beside it), the set's
    installed files as hashed, this host's records and identity read live by the real ddtree_site collector."""
    from doctor.commands import validate as command
    from doctor.sglang.facts import collect_ddtree_site

    stack = json.loads(json.dumps(H200["stack"]))
    for name, version in (("sglang", "0.5.23"), ("sglang-kernel", "0.4.5"), ("flashinfer-python", "0.7.2")):
        stack["distributions"][name] = {"name": name, "version": version, "location": "/site", "requires": []}

    def facts(settings):
        from doctor.facts.store import CollectOptions

        site = collect_ddtree_site(CollectOptions.from_settings(settings))
        table = {"env": H200["env"], "stack": stack, "nvml": H200["nvml"], "ddtree_site": site,
                 "sglang_patches": {"files": {"sglang/srt/speculative/ddtree_site.py": {"sha256": "a" * 64}}}}
        return table.get

    monkeypatch.setattr(command, "_facts", facts)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(vs.FAKE), os.environ.get("PYTHONPATH")) if p))
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"greedy": [[1, 2, 3], [4, 5, 6, 7], [8, 9]], "sampled": [[3, 4, 5]]}))
    return ids


def run(tmp_path: Path, ids: Path, *extra: str, faults: str = "") -> tuple[int, dict]:
    from doctor.commands.validate import validate

    out = tmp_path / "out.json"
    args = ["--profile", str(vs.profile(tmp_path, faults=faults)), "--python", sys.executable, "--state-dir",
            str(tmp_path / "state"), "--prompts", str(ids), "--samples", "300", "--port", str(vs.free_port_base()),
            "--concurrency", "8", "--format", "json", "--output", str(out), *extra]
    code = validate.main(args, standalone_mode=False)
    return code, json.loads(out.read_text())


def test_a_whole_run_writes_the_record_and_resumes(recorded_host, tmp_path, capsys):
    from doctor.sglang.validation.record import read_records

    code, result = run(tmp_path, recorded_host)
    assert code == 0 and result["outcome"] in ("pass", "lossless-not-faster"), result
    budget = result["budgets"]["16"]
    assert budget["greedy"]["identical"] == budget["greedy"]["n"] == 208
    records = read_records(tmp_path / "state")["records"]
    assert len(records) == 1 and records[0]["path"] == budget["record"]
    rec = records[0]["record"]
    assert rec["configuration"]["ddtree_budget"] == 16 and rec["configuration"]["gpu_name"] == "NVIDIA H200"
    assert rec["outcome"] == result["outcome"] and rec["figures"]["greedy"]["outcome"] == "pass"
    assert rec["command"].split()[0] == "k26-doctor"  # (the process's own argv follows: here pytest's worker's)
    t = result["timing"]
    assert t["wall_s"] >= t["starts_s"] + t["requests_s"] and t["overhead_s"] >= 0
    err = capsys.readouterr().err
    assert "3 server start(s) (base, dflash, ddtree-16), one at a time: expected about" in err
    # the same configuration again: every server already measured, none started
    code, again = run(tmp_path, recorded_host)
    err = capsys.readouterr().err
    assert code == 0 and "0 server start(s) (none: all measured)" in err and "started (pid" not in err
    assert again["budgets"]["16"]["record"] == budget["record"]


def test_a_failing_run_writes_no_record(recorded_host, tmp_path):
    from doctor.sglang.validation.record import read_records

    code, result = run(tmp_path, recorded_host, faults="ddtree-16:diverge")
    assert code == 1 and result["outcome"] == "fail" and "record" not in result["budgets"]["16"]
    assert read_records(tmp_path / "state")["records"] == []


def test_launch_hands_the_matched_record_to_the_server(tmp_path, capsys):
    """``launch``'s plan: a DDTREE profile's server looks through the records' directory; after the checks, the
    record sglang.ddtree matched is the one it is given, and a lossless-not-faster record is said, naming DFLASH."""
    from doctor.commands.launch import site_record_env
    from doctor.core.result import Findings, Remediation, Result
    from doctor.service.launcher import build_plan
    from doctor.sglang.validation.record import RECORD_ENV

    settings = vs.settings(tmp_path)
    plan = build_plan(settings)
    assert plan.env[RECORD_ENV] == str(tmp_path / "state" / "ddtree" / "validated")
    matched = Result.of(Findings(record="/s/ddtree/validated/0123456789abcdef.json").info(
        "sglang.ddtree.validated", "DDTREE starts"))
    site_record_env(plan, matched)
    assert plan.env[RECORD_ENV] == "/s/ddtree/validated/0123456789abcdef.json"
    slow = Result.of(Findings(record="/s/r.json").warn("sglang.ddtree.not_faster", "not faster", Remediation("x")))
    site_record_env(plan, slow)
    assert "DFLASH is the faster choice" in capsys.readouterr().err


def test_the_time_budget_ends_it_undecided_with_no_record(recorded_host, tmp_path, capsys):
    from doctor.sglang.validation.record import read_records

    code, result = run(tmp_path, recorded_host, "--time-budget", "2", faults="base:never-healthy")
    assert code == 1 and result["outcome"] == "undecided" and "time budget" in result["stopped"]
    assert result["budgets"]["16"]["outcome"] == "undecided"
    assert read_records(tmp_path / "state")["records"] == []
    assert "stopped cleanly, state kept" in capsys.readouterr().err
