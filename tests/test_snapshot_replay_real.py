"""A real recording replays to the verdicts the live run gave on that host.

``h200x1-all-facts.json`` is ``k26-doctor snapshot --profile h200-tp8 --tp 1`` on the lent 1x H200 machine
(driver 580.159.04, torch 2.11.0+cu130, triton 3.6.0, Python 3.12.3); ``tests/fixtures/live/h200x1-check.json`` is
``k26-doctor check --profile h200-tp8 --tp 1 --format json`` run right after it on the same machine
(bench/device_batch.sh). Replaying the facts here, with no GPU, must give the same verdict and the same
one-line summary for every check, judged under the profile's [stack] pins as they were recorded (the built-in
profiles have since moved to the torch SGLang 0.5.23 requires: a config file restores the recorded pins)."""

from __future__ import annotations

import json

from conftest import ROOT, run_doctor

SNAP = ROOT / "tests" / "fixtures" / "snapshots" / "h200x1-all-facts.json"
LIVE = ROOT / "tests" / "fixtures" / "live" / "h200x1-check.json"


def recorded_stack_config(tmp_path) -> str:
    """A config file holding the [stack] pins of the profile the snapshot recorded."""
    stack = json.loads(SNAP.read_text())["options"]["profile"]["stack"]
    path = tmp_path / "recorded-stack.toml"
    path.write_text("[stack]\n" + "".join(f'{k} = "{v}"\n' for k, v in stack.items()))
    return str(path)


def test_real_h200_snapshot_replays_to_the_live_verdicts(tmp_path) -> None:
    out = run_doctor("check", "--from-snapshot", str(SNAP), "--config", recorded_stack_config(tmp_path),
                     "--format", "json")
    replay = json.loads(out.stdout)
    live = json.loads(LIVE.read_text())
    assert replay["doctor"]["profile"] == "h200-tp8" and replay["doctor"]["tp"] == 1, "recorded profile and TP"
    got = {r["id"]: (r["status"], r["summary"]) for r in replay["results"]}
    want = {r["id"]: (r["status"], r["summary"]) for r in live["results"]}
    # Checks added after the recording are judged from the same facts too; every recorded one must agree.
    assert set(want) <= set(got)
    assert {k: got[k] for k in want} == want
    assert out.returncode == 1  # the recorded machine had no SGLang and no model: those checks fail there too
    assert want["gpu.arch"][0] == "pass" and want["triton.jit"][0] == "pass" and want["torch.arch"][0] == "pass"


def test_the_current_profile_names_the_torch_sglang_requires() -> None:
    """Without the recorded pins, the same host fails stack.versions on torch 2.11 (SGLang 0.5.23 needs 2.14.1)."""
    out = json.loads(run_doctor("check", "--from-snapshot", str(SNAP), "--only", "stack.versions", "--format",
                                "json").stdout)
    summary = out["results"][0]["summary"]
    assert out["results"][0]["status"] == "fail" and "torch 2.11.0 does not match the profile's ==2.14.1" in summary


def test_real_snapshot_judged_under_another_profile() -> None:
    """The same recorded H200 under the B300 profile: architecture and memory fail, named."""
    out = json.loads(run_doctor("check", "--from-snapshot", str(SNAP), "--profile", "b300-tp8-ddtree", "--tp", "8",
                                "--only", "gpu.*", "--format", "json").stdout)
    by = {r["id"]: r for r in out["results"]}
    assert by["gpu.arch"]["status"] == "fail" and "9.0" in by["gpu.arch"]["summary"]
    assert by["gpu.count"]["status"] == "fail"
    assert by["gpu.memory"]["status"] == "fail" and "260 GiB" in by["gpu.memory"]["summary"]
