"""The foundation end to end: a real plugin distribution, the runner's deadlines, crashes,
dependencies, ignores, reports, snapshots and exit codes, through the CLI as users run it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import doctor_env, interruptible, penv, run_doctor, schema

jsonschema = pytest.importorskip("jsonschema")


def test_plugin_checks_are_listed_with_their_source(plugin_site: str) -> None:
    out = run_doctor("list", "--format", "json", env=penv(plugin_site))
    assert out.returncode == 0, out.stderr
    items = {c["id"]: c for c in json.loads(out.stdout)}
    assert {"host.disk", "host.port", "host.env"} <= set(items)
    assert items["site.ok"]["source"] == "plugin:site"
    assert items["site.deep"]["deep"] is True
    assert items["site.fixable"]["fixer"] == "site.write-fixed"


def test_passing_run_exits_0_and_report_validates(plugin_site: str) -> None:
    out = run_doctor("check", "--only", "site.*", "--format", "json", env=penv(plugin_site))
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    jsonschema.validate(report, schema())
    ids = [r["id"] for r in report["results"]]
    assert "site.deep" not in ids, "deep checks only run with --deep"
    assert report["summary"]["status"] == "pass"
    assert report["summary"]["counts"]["pass"] == len(ids) - report["summary"]["counts"]["skip"]


def test_deep_adds_the_slow_checks(plugin_site: str) -> None:
    out = run_doctor("check", "--only", "site.*", "--deep", "--format", "json", env=penv(plugin_site))
    assert "site.deep" in [r["id"] for r in json.loads(out.stdout)["results"]]


def test_failure_skips_dependents_and_exits_1(plugin_site: str) -> None:
    out = run_doctor("check", "--only", "site.*", "--format", "json", env=penv(plugin_site, SITE_FAIL="1"))
    assert out.returncode == 1
    report = json.loads(out.stdout)
    jsonschema.validate(report, schema())
    by = {r["id"]: r for r in report["results"]}
    assert by["site.fail"]["status"] == "fail"
    assert by["site.fail"]["remediation"]["commands"] == ["unset SITE_FAIL"]
    assert by["site.after"]["status"] == "skip"
    assert "site.fail" in by["site.after"]["summary"]
    assert report["summary"]["status"] == "fail"


def test_ignore_reports_warn_never_hides_and_strict_fails(plugin_site: str) -> None:
    env = penv(plugin_site, SITE_FAIL="1")
    out = run_doctor("check", "--only", "site.fail", "--ignore", "site.fail", "--format", "json", env=env)
    assert out.returncode == 0
    (res,) = json.loads(out.stdout)["results"]
    assert res["status"] == "warn" and res["ignored"] == "fail" and "site policy violated" in res["summary"]
    strict = run_doctor("check", "--only", "site.fail", "--ignore", "site.fail", "--strict", env=env)
    assert strict.returncode == 1
    assert "site.fail" in strict.stdout


def test_ignore_from_config_file(plugin_site: str, tmp_path: Path) -> None:
    cfg = tmp_path / "k26.toml"
    cfg.write_text('[doctor]\nignore = ["site.fail"]\n')
    out = run_doctor("check", "--only", "site.fail", "--config", str(cfg), env=penv(plugin_site, SITE_FAIL="1"))
    assert out.returncode == 0, out.stdout
    assert "[ignored fail]" in out.stdout


def test_crash_is_an_error_with_one_line_and_traceback_only_with_v(plugin_site: str) -> None:
    env = penv(plugin_site, SITE_CRASH="1")
    out = run_doctor("check", "--only", "site.crash", env=env)
    assert out.returncode == 1
    assert "check crashed: RuntimeError: boom from the site plugin" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    verbose = run_doctor("check", "--only", "site.crash", "-v", env=env)
    assert "Traceback (most recent call last)" in verbose.stdout
    js = json.loads(run_doctor("check", "--only", "site.crash", "--format", "json", env=env).stdout)
    assert js["results"][0]["status"] == "error"
    jsonschema.validate(js, schema())


def test_hung_check_becomes_error_and_run_ends_on_time(plugin_site: str) -> None:
    start = time.monotonic()
    out = run_doctor("check", "--only", "site.*", "--format", "json", env=penv(plugin_site, SITE_HANG="60"))
    elapsed = time.monotonic() - start
    assert elapsed < 20, f"a 60 s hang held the doctor for {elapsed:.1f}s"
    by = {r["id"]: r for r in json.loads(out.stdout)["results"]}
    assert by["site.hang"]["status"] == "error" and "timed out after 1s" in by["site.hang"]["summary"]
    assert by["site.ok"]["status"] == "pass", "one hung check must not take the others down"
    assert out.returncode == 1


def test_timeout_flag_overrides_the_check_deadline(plugin_site: str) -> None:
    out = run_doctor("check", "--only", "site.hang", "--timeout", "3", "--format", "json",
                     env=penv(plugin_site, SITE_HANG="1.5"))
    assert json.loads(out.stdout)["results"][0]["status"] == "pass"


def test_ctrl_c_ends_promptly_with_a_partial_report(plugin_site: str, tmp_path: Path) -> None:
    started = tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-m", "doctor", "check", "--only", "site.*", "--timeout", "120"],
                            env=penv(plugin_site, SITE_HANG="100", SITE_HANG_LAST="1", SITE_STARTED=str(started)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)  # SIGINT as a terminal gives it, however the suite started
    deadline = time.monotonic() + 120  # the checks are running once site.hang has started (however slow the host)
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "site.hang never started"  # (once the quick checks finished: SITE_HANG_LAST)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert time.monotonic() - t0 < 10
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in out
    assert "site.ok" in out, "checks that finished are still reported"


def test_junit_has_one_testcase_per_check(plugin_site: str) -> None:
    out = run_doctor("check", "--only", "site.*", "--format", "junit", env=penv(plugin_site, SITE_FAIL="1",
                                                                                  SITE_CRASH="1"))
    suite = ET.fromstring(out.stdout)
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {"site.ok", "site.fail", "site.after", "site.crash", "site.hang", "site.fixable"}
    assert cases["site.fail"].find("failure") is not None
    assert cases["site.crash"].find("error") is not None
    assert cases["site.after"].find("skipped") is not None
    assert suite.get("failures") == "1" and suite.get("errors") == "1"


def test_output_file_and_text_glyphs(plugin_site: str, tmp_path: Path) -> None:
    dest = tmp_path / "r.json"
    out = run_doctor("check", "--only", "site.ok", "--format", "json", "--output", str(dest), env=penv(plugin_site))
    assert out.returncode == 0
    assert json.loads(dest.read_text())["results"][0]["id"] == "site.ok"
    assert "site.ok" in out.stdout and "\033[" not in out.stdout  # NO_COLOR / not a terminal


def test_broken_plugin_fails_closed_with_the_import_error_under_v(plugin_site: str) -> None:
    """A site plugin is site policy: when it cannot load, check (and launch) fail closed, naming it."""
    env = penv(plugin_site, SITE_BROKEN="1")
    out = run_doctor("check", "--only", "host.env", env=env)
    assert out.returncode == 1, out.stdout
    assert "doctor.plugin.site" in out.stdout and "site plugin 'site' failed to load" in out.stdout
    assert "misconfigured on purpose" in out.stdout  # the message is the plugin's own
    assert "Traceback" not in out.stdout
    assert "--ignore doctor.plugin.site" not in out.stdout  # not a check id: --ignore would refuse it
    verbose = run_doctor("check", "--only", "host.env", "-v", env=env)
    assert "Traceback (most recent call last)" in verbose.stdout and "ImportError" in verbose.stdout
    js = json.loads(run_doctor("check", "--only", "host.env", "--format", "json", env=env).stdout)
    assert js["summary"]["status"] == "fail"
    assert {r["id"]: r["status"] for r in js["results"]}["doctor.plugin.site"] == "error"
    jsonschema.validate(js, schema())
    launch = run_doctor("launch", "--only", "host.env", "--model-path", "/nonexistent", "--no-flag-check",
                        env=env)
    assert launch.returncode == 1 and "not launching" in launch.stderr
    disabled = run_doctor("check", "--only", "host.env", env=penv(plugin_site, SITE_BROKEN="1",
                                                                  K26_DOCTOR_DISABLE_PLUGINS="site"))
    assert disabled.returncode == 0, disabled.stdout  # turned off knowingly, by name


def test_a_plugin_with_an_unresolved_reference_is_rejected_by_name(plugin_site: str) -> None:
    out = run_doctor("list", "--format", "json", env=penv(plugin_site, SITE_UNRESOLVED="1"))
    assert out.returncode == 0, out.stderr
    ids = {c["id"] for c in json.loads(out.stdout)}
    assert "host.env" in ids and not any(i.startswith("site.") for i in ids), "the plugin is rejected whole"
    assert "plugin failed to load: site" in out.stderr
    assert "check 'site.unresolved' names fixer 'site.no-such-fixer', which is not registered" in out.stderr


def test_a_plugin_is_disabled_by_name_from_env_or_config(plugin_site: str, tmp_path: Path) -> None:
    out = run_doctor("list", "--format", "json", env=penv(plugin_site, K26_DOCTOR_DISABLE_PLUGINS="site"))
    assert not any(c["id"].startswith("site.") for c in json.loads(out.stdout))
    cfg = tmp_path / "k26.toml"
    cfg.write_text('[doctor]\ndisable_plugins = ["site"]\n')
    out = run_doctor("check", "--only", "host.env", "--config", str(cfg), "--format", "json",
                     env=penv(plugin_site, SITE_FAIL="1"))
    ids = [r["id"] for r in json.loads(out.stdout)["results"]]
    assert out.returncode == 0 and ids == ["host.env"]  # site.fail would fail if loaded
    out = run_doctor("check", "--only", "site.*", "--config", str(cfg), env=penv(plugin_site, SITE_FAIL="1"))
    assert out.returncode == 2 and "matches no registered check" in out.stderr  # nothing checked: not a pass


@pytest.mark.parametrize("args,needle", [
    (["check", "--profile", "no-such-profile"], "unknown profile"),
    (["check", "--tp", "0"], "must be an integer between 1 and 4096"),
    (["check", "--config", "/nonexistent/k26.toml"], "does not exist"),
    (["explain", "host.nope"], "no check"),
    (["check", "--format", "yaml"], "Invalid value"),
])
def test_invalid_invocation_exits_2(args: list[str], needle: str) -> None:
    out = run_doctor(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert needle in out.stderr


def test_bad_config_toml_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[doctor\nprofile = 3")
    out = run_doctor("check", "--config", str(cfg))
    assert out.returncode == 2 and "not valid TOML" in out.stderr
    cfg.write_text('[doctor]\nbogus = 1\n')
    out = run_doctor("check", "--config", str(cfg))
    assert out.returncode == 2 and "unknown key" in out.stderr


def test_config_from_environment_variable(tmp_path: Path) -> None:
    cfg = tmp_path / "k26.toml"
    cfg.write_text('[doctor]\nprofile = "h200-tp8"\n')
    out = run_doctor("check", "--only", "host.env", "--format", "json",
                     env=doctor_env(K26_DOCTOR_CONFIG=str(cfg)))
    assert json.loads(out.stdout)["doctor"]["profile"] == "h200-tp8"


def test_malformed_snapshot_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "snap.json"
    bad.write_text("{not json")
    out = run_doctor("check", "--from-snapshot", str(bad))
    assert out.returncode == 2 and "not valid JSON" in out.stderr
    bad.write_text('{"kind": "something else"}')
    assert run_doctor("check", "--from-snapshot", str(bad)).returncode == 2


def test_snapshot_redacts_secrets_and_replays(tmp_path: Path) -> None:
    snap = tmp_path / "snap.json"
    secret = "hf_" + "A1b2C3d4E5f6G7h8I9j0KLMNOP"
    env = doctor_env(HF_TOKEN=secret, MY_SERVICE_API_KEY="s3cr3t-value", DB_PASSWORD="hunter2",
                     HARMLESS="plain", SOME_URL=f"https://x/?t={secret}")
    out = run_doctor("snapshot", "--output", str(snap), "--note", "test", env=env)
    assert out.returncode == 0, out.stderr
    text = snap.read_text()
    for s in (secret, "s3cr3t-value", "hunter2"):
        assert s not in text
    data = json.loads(text)
    assert data["kind"] == "k26-doctor-snapshot" and data["note"] == "test"
    assert data["facts"]["env"]["vars"]["HARMLESS"] == "plain"
    assert data["facts"]["env"]["vars"]["HF_TOKEN"] == "<redacted>"
    live = json.loads(run_doctor("check", "--only", "host.*", "--format", "json", env=env).stdout)
    replay = json.loads(run_doctor("check", "--only", "host.*", "--from-snapshot", str(snap), "--format", "json",
                                   env=doctor_env()).stdout)
    assert [(r["id"], r["status"]) for r in replay["results"]] == [(r["id"], r["status"]) for r in live["results"]]
    # Judge a recorded host: the recorded environment had NCCL P2P disabled.
    data["facts"]["env"]["vars"]["NCCL_P2P_DISABLE"] = "1"
    snap.write_text(json.dumps(data))
    replay = run_doctor("check", "--only", "host.env", "--from-snapshot", str(snap), env=doctor_env())
    assert replay.returncode == 1 and "NCCL_P2P_DISABLE=1" in replay.stdout
    assert "judged from snapshot" in replay.stdout


def test_snapshot_missing_fact_skips() -> None:
    from doctor.facts.snapshot import SNAPSHOT_KIND

    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"k26-empty-{os.getpid()}.json"
    path.write_text(json.dumps({"kind": SNAPSHOT_KIND, "schema_version": 1, "facts": {}}))
    try:
        out = json.loads(run_doctor("check", "--only", "host.port", "--from-snapshot", str(path),
                                    "--format", "json").stdout)
    finally:
        path.unlink()
    assert out["results"][0]["status"] == "skip"
    assert "not recorded in the snapshot" in out["results"][0]["summary"]


def test_host_port_in_use_names_the_owner(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    cfg = tmp_path / "k26.toml"
    cfg.write_text(f'[server]\nhost = "127.0.0.1"\nport = {port}\n')
    try:
        out = run_doctor("check", "--only", "host.port", "--config", str(cfg), "--format", "json")
        res = json.loads(out.stdout)["results"][0]
        assert out.returncode == 1 and res["status"] == "fail"
        assert f"PID {os.getpid()}" in res["summary"]
    finally:
        sock.close()
    out = run_doctor("check", "--only", "host.port", "--config", str(cfg))
    assert out.returncode == 0, out.stdout
    probe = socket.socket()
    probe.bind(("127.0.0.1", port))  # the doctor left nothing bound
    probe.close()


def test_host_disk_fails_below_minimum(tmp_path: Path) -> None:
    cfg = tmp_path / "k26.toml"
    cfg.write_text(f'[host]\nmin_free_gib = 100000000\npaths = ["{tmp_path}"]\n')
    out = run_doctor("check", "--only", "host.disk", "--config", str(cfg), "--format", "json")
    res = json.loads(out.stdout)["results"][0]
    assert res["status"] == "fail" and "GiB free <" in res["summary"]


@pytest.mark.parametrize("env,status,needle", [
    ({"NCCL_P2P_DISABLE": "1"}, "fail", "NCCL_P2P_DISABLE=1"),
    ({"CUDA_LAUNCH_BLOCKING": "1"}, "fail", "CUDA_LAUNCH_BLOCKING=1"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "fail", "CUDA_VISIBLE_DEVICES=0,1,2,3"),
    ({"CUDA_VISIBLE_DEVICES": ""}, "fail", "CUDA_VISIBLE_DEVICES="),
    ({"NCCL_DEBUG": "INFO"}, "warn", "NCCL_DEBUG=INFO"),
    ({"NCCL_P2P_DISABLE": "0", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, "pass", "known-bad"),
])
def test_host_env_rules(env: dict[str, str], status: str, needle: str) -> None:
    base = {k: v for k, v in doctor_env().items() if k not in ("NCCL_DEBUG", "CUDA_VISIBLE_DEVICES",
                                                                   "NCCL_P2P_DISABLE", "CUDA_LAUNCH_BLOCKING")}
    base.update(env)
    res = json.loads(run_doctor("check", "--only", "host.env", "--format", "json", env=base).stdout)["results"][0]
    if status == "pass":  # the test's own PYTHONPATH (to import this checkout) is rightly a warning
        assert [f["name"] for f in res["details"]["findings"]] in ([], ["PYTHONPATH"]), res
        return
    assert res["status"] == status, res
    assert needle in res["summary"]


def test_env_file_of_the_profile_is_judged(tmp_path: Path) -> None:
    envf = tmp_path / "sglang.env"
    envf.write_text('# site\nexport TRITON_INTERPRET="1"\n')
    cfg = tmp_path / "k26.toml"
    cfg.write_text(f'[server]\nenv_file = "{envf}"\n')
    res = json.loads(run_doctor("check", "--only", "host.env", "--config", str(cfg), "--format", "json").stdout)
    assert res["results"][0]["status"] == "fail" and "TRITON_INTERPRET=1" in res["results"][0]["summary"]


def test_fix_plans_then_applies_with_backup_and_verifies(plugin_site: str, tmp_path: Path) -> None:
    target = tmp_path / "policy.txt"
    target.write_text("broken\n")
    state = tmp_path / "state"
    env = penv(plugin_site, SITE_FIX_FILE=str(target))
    plan = run_doctor("fix", "--only", "site.fixable", "--state-dir", str(state), env=env)
    assert "+fixed" in plan.stdout and "-broken" in plan.stdout
    assert target.read_text() == "broken\n", "fix without --apply changes nothing"
    refused = run_doctor("fix", "--apply", "--only", "site.fixable", "--state-dir", str(state), env=env)
    assert refused.returncode == 2 and "not a terminal" in refused.stderr
    assert target.read_text() == "broken\n"
    done = run_doctor("fix", "--apply", "--yes", "--only", "site.fixable", "--state-dir", str(state), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert target.read_text() == "fixed\n"
    backups = list(state.glob("backups/*/**/policy.txt"))
    assert len(backups) == 1 and backups[0].read_text() == "broken\n"
    assert "after the fixes" in done.stdout and "says fixed" in done.stdout


def test_explain_prints_the_docstring() -> None:
    out = run_doctor("explain", "host.env")
    assert out.returncode == 0
    assert "NCCL_P2P_DISABLE" in out.stdout and "Fix by hand" in out.stdout


def test_explain_prints_plain_text_not_restructuredtext_quoting() -> None:
    from doctor.core.registry import load

    quoted = [c.id for c in load(plugins=False).checks.values() if "``" in (c.explain or "")]
    assert quoted, "no docstring quotes a literal: nothing to show"
    for cid in quoted[:3]:
        out = run_doctor("explain", cid)
        assert out.returncode == 0 and "``" not in out.stdout and "`" in out.stdout, out.stdout


def test_version_and_help() -> None:
    assert run_doctor("--version").stdout.startswith("k26-doctor")
    helptext = run_doctor("--help").stdout
    for cmd in ("check", "fix", "list", "explain", "snapshot"):
        assert cmd in helptext
