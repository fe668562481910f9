"""``check --format openmetrics``: the renderer's series, the textfile written whole, and the real consumers:
``promtool check metrics`` (Prometheus' own linter), the official Python client's OpenMetrics parser, a Debian
``prometheus-node-exporter`` started here with its textfile collector (scraped over HTTP on loopback), and the
shipped alerting rules under ``promtool test rules``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import fleet_plugin
import pytest
from conftest import ROOT, doctor_env, run_doctor
from slurm_cluster import free_ports

from doctor.app import Report
from doctor.core.datafile import read_toml
from doctor.core.result import Result, Status
from doctor.core.runner import RunOutcome
from doctor.core.settings import resolve
from doctor.report import openmetrics
from doctor.service.textfile import PREVIOUS_LIMIT

PROMTOOL = shutil.which("promtool")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
RULES = ROOT / "deploy" / "prometheus" / "k26-doctor.rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "k26-doctor.rules.test.yml"
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
needs_exporter = pytest.mark.skipif(NODE_EXPORTER is None,
                                    reason="node_exporter not installed (apt-get install prometheus-node-exporter)")


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample, through the official client's OpenMetrics parser (strict: it requires ``# EOF``)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        assert fam.type == "gauge", fam
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    hits = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def report_of(*results: Result, strict: bool = False, interrupted: bool = False) -> Report:
    for i, res in enumerate(results):
        res.id = res.id or f"x.check{i}"
    settings = resolve({"strict": strict or None}, environ={})
    return Report(settings, RunOutcome(list(results), 1.25, interrupted), started_at=1000.0, finished_at=1001.5)


def _r(cid: str, res: Result, duration: float = 0.5) -> Result:
    res.id, res.duration_s = cid, duration
    return res


# -- the renderer ----------------------------------------------------------------------------------------------
def test_one_series_per_check_and_status_and_the_run_series() -> None:
    rep = report_of(_r("gpu.nvlink", Result.failed("2 pairs without NVLink")), _r("host.disk", Result.passed("ok")),
                    _r("model.shards.deep", Result.not_judged("nothing to compare with"), 2.0))
    text = openmetrics.to_openmetrics(rep)
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    samples = parse(text)
    base = {"profile": "b300-tp8-ddtree"}
    for cid, status in (("gpu.nvlink", "fail"), ("host.disk", "pass"), ("model.shards.deep", "skip")):
        for s in ("pass", "warn", "fail", "skip", "error"):
            assert value(samples, openmetrics.CHECK_STATUS, check=cid, status=s, affects="node", **base) == \
                (s == status)
    # the version is on one series only: an upgrade changes no other series' identity
    assert value(samples, openmetrics.BUILD_INFO, version=openmetrics.__version__, **base) == 1
    assert [k for k in samples if ("version", openmetrics.__version__) in k[1]] == [
        (openmetrics.BUILD_INFO, frozenset({"version": openmetrics.__version__, **base}.items()))]
    # why gpu.nvlink failed: a bounded code (no finding here: <check>.<status>)
    assert [dict(k[1])["code"] for k in samples if k[0] == openmetrics.CHECK_REASON] == ["gpu.nvlink.fail"]
    assert value(samples, openmetrics.CHECK_UNJUDGED, check="model.shards.deep") == 1
    assert value(samples, openmetrics.CHECK_UNJUDGED, check="gpu.nvlink") == 0
    assert value(samples, openmetrics.CHECK_DURATION, check="model.shards.deep") == 2.0
    assert [value(samples, openmetrics.VERDICT, status=s) for s in ("pass", "warn", "fail")] == [0, 0, 1]
    assert value(samples, openmetrics.RUN_DURATION) == 1.25
    assert value(samples, openmetrics.RUN_STARTED) == 1000.0
    assert value(samples, openmetrics.LAST_RUN) == 1001.5
    assert value(samples, openmetrics.RUN_INTERRUPTED) == 0
    # the status and unjudged series of 3 checks, 3 verdicts, no sample timestamps (the textfile collector refuses them)
    assert len([k for k in samples if k[0] == openmetrics.CHECK_STATUS]) == 15
    assert not re.search(r"^\S+\{[^}]*\} \S+ \S+$", text, re.M)


def test_the_gpus_are_labelled_as_dcgm_labels_them_and_a_failure_says_its_code() -> None:
    import json

    snap = ROOT / "tests" / "fixtures" / "snapshots" / "b300x8-link-down.json"
    res = run_doctor("check", "--from-snapshot", str(snap), "--only", "gpu.*", "--format", "openmetrics")
    samples = parse(res.stdout)
    devices = json.loads(snap.read_text())["facts"]["nvml"]["devices"]
    gpus = sorted((dict(k[1])["gpu"], dict(k[1])["UUID"], dict(k[1])["device"]) for k in samples
                  if k[0] == openmetrics.GPU_INFO)
    assert gpus == sorted((str(d["index"]), d["uuid"], f"nvidia{d['index']}") for d in devices) and len(gpus) == 8
    reasons = [dict(k[1]) for k in samples if k[0] == openmetrics.CHECK_REASON]
    assert reasons == [{"check": "gpu.nvlink", "code": "gpu.nvlink.link_down", "affects": "node",
                        "profile": "b300-tp8-ddtree"}]
    # a run that read no GPU (no nvml fact) has no GPU series
    assert openmetrics.GPU_INFO not in openmetrics.to_openmetrics(report_of(_r("host.disk", Result.passed("ok"))))


def test_strict_turns_a_warning_into_a_failing_verdict_and_interruption_shows() -> None:
    warn = _r("host.exposure", Result.warned("listens on 0.0.0.0 without --api-key"))
    assert value(parse(openmetrics.to_openmetrics(report_of(warn))), openmetrics.VERDICT, status="warn") == 1
    samples = parse(openmetrics.to_openmetrics(report_of(warn, strict=True, interrupted=True)))
    assert value(samples, openmetrics.VERDICT, status="fail") == 1
    assert value(samples, openmetrics.RUN_INTERRUPTED) == 1


def test_label_values_are_escaped() -> None:
    res = _r('site.odd"id\\with\nnewline', Result.passed("ok"))
    rep = report_of(res)
    rep.settings.profile_name = "/etc/k26/my \"profile\".toml"
    samples = parse(openmetrics.to_openmetrics(rep))
    assert value(samples, openmetrics.CHECK_UNJUDGED, check='site.odd"id\\with\nnewline') == 0
    assert value(samples, openmetrics.RUN_DURATION, profile="/etc/k26/my \"profile\".toml") == 1.25


def test_the_start_marker_keeps_the_last_verdict_and_only_a_file_of_ours() -> None:
    labels = {"profile": "b300-tp8-ddtree"}
    last = openmetrics.to_openmetrics(report_of(_r("gpu.nvlink", Result.failed("no NVLink"))))
    marked = openmetrics.started_marker(last, 2000.0, labels)
    samples = parse(marked)
    assert value(samples, openmetrics.RUN_STARTED) == 2000.0  # this run
    assert value(samples, openmetrics.LAST_RUN) == 1001.5  # the last finished one, as it was
    assert value(samples, openmetrics.CHECK_STATUS, check="gpu.nvlink", status="fail") == 1
    assert openmetrics.started_marker(marked, 3000.0, labels).count(openmetrics.RUN_STARTED + "{") == 1
    for foreign in ("node_load1 3\n", "garbage\x00\n", "", last.replace("# EOF\n", ""),
                    "# HELP k26_doctor_x y\n# EOF\n", last + "node_load1 3\n# EOF\n"):
        only = parse(openmetrics.started_marker(foreign, 2000.0, labels))
        assert list(only) == [(openmetrics.RUN_STARTED, frozenset(labels.items()))], foreign


# -- the command --------------------------------------------------------------------------------------------
def plugin_env(tmp_path: Path, verdict: str) -> dict[str, str]:
    site = fleet_plugin.install(tmp_path)
    return doctor_env(PYTHONPATH=str(site), K26_FLEET_VERDICT=str(fleet_plugin.verdict_file(tmp_path, verdict)))


@needs_promtool
def test_check_writes_the_textfile_whole_and_promtool_accepts_it(tmp_path: Path) -> None:
    out = tmp_path / "textfile" / "k26-doctor.prom"
    out.parent.mkdir()
    env = plugin_env(tmp_path, "fail on purpose")
    res = run_doctor("check", "--only", "fleet.*", "--only", "host.disk", "--format", "openmetrics",
                     "--output", str(out), env=env)
    assert res.returncode == 1, res.stderr  # the verdict is still the exit code
    assert "fleet.verdict" in res.stdout  # the text report goes to stdout (the journal)
    assert sorted(p.name for p in out.parent.iterdir()) == ["k26-doctor.prom"]  # no temporary file left
    assert out.stat().st_mode & 0o777 == 0o644  # node_exporter's user reads it
    text = out.read_text()
    lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    samples = parse(text)
    assert value(samples, openmetrics.CHECK_STATUS, check="fleet.verdict", status="fail") == 1
    assert value(samples, openmetrics.VERDICT, status="fail") == 1
    assert value(samples, openmetrics.RUN_STARTED) <= value(samples, openmetrics.LAST_RUN) <= time.time()
    # to stdout without --output, the same series
    res = run_doctor("check", "--only", "fleet.*", "--format", "openmetrics", env=env)
    assert res.returncode == 1 and res.stdout.endswith("# EOF\n")
    assert subprocess.run([PROMTOOL, "check", "metrics"], input=res.stdout, capture_output=True, text=True,
                          timeout=30).returncode == 0


def test_the_launch_gate_writes_its_verdict_as_a_textfile_too(tmp_path: Path) -> None:
    import socket

    with socket.socket() as holder:  # the port is taken: the gate refuses, and says so in the textfile
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[server]\nhost = "127.0.0.1"\nport = {holder.getsockname()[1]}\n')
        out = tmp_path / "gate.prom"
        res = run_doctor("launch", "--config", str(cfg), "--only", "host.port", "--format", "openmetrics",
                         "--output", str(out))
    assert res.returncode == 1 and "not launching" in res.stderr, res.stderr
    assert "host.port" in res.stderr and "# EOF" not in res.stderr  # the text report on stderr
    samples = parse(out.read_text())
    assert value(samples, openmetrics.CHECK_STATUS, check="host.port", status="fail") == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_textfile_that_cannot_be_written_is_an_invalid_invocation(tmp_path: Path) -> None:
    for target in (tmp_path / "absent" / "k.prom", tmp_path):
        res = run_doctor("check", "--only", "host.disk", "--format", "openmetrics", "--output", str(target))
        assert res.returncode == 2, res.stdout + res.stderr
        assert "Traceback" not in res.stderr
    res = run_doctor("fix", "--format", "openmetrics")
    assert res.returncode == 2 and "openmetrics" in res.stderr
    out = tmp_path / "k.prom"  # an invalid selection leaves the last verdict as it was: no start of a run
    assert run_doctor("check", "--only", "host.disk", "--format", "openmetrics", "--output", str(out)).returncode < 2
    before = out.read_bytes()
    for bad in (["--only", "host.dsik"], ["--while-serving", "--only", "host.port"]):
        res = run_doctor("check", *bad, "--format", "openmetrics", "--output", str(out))
        assert res.returncode == 2 and out.read_bytes() == before, res.stderr


def test_a_fifo_or_a_device_as_the_textfile_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "k.prom"
    os.mkfifo(fifo)
    for target in (fifo, Path(os.devnull)):
        res = run_doctor("check", "--only", "host.disk", "--format", "openmetrics", "--output", str(target),
                         timeout=60)
        assert res.returncode == 2 and "not a regular file" in res.stderr, res.stderr
    assert fifo.is_fifo()


def test_a_hostile_previous_file_is_replaced_not_read(tmp_path: Path) -> None:
    out = tmp_path / "k.prom"
    with open(out, "wb") as fh:  # larger than any file of ours: not read into memory, not kept
        fh.truncate(PREVIOUS_LIMIT + 1)
    res = run_doctor("check", "--only", "host.disk", "--format", "openmetrics", "--output", str(out))
    assert res.returncode in (0, 1), res.stderr
    samples = parse(out.read_text())
    assert value(samples, openmetrics.CHECK_STATUS, check="host.disk", status="pass") in (0, 1)


def _wait_for(pred, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


@needs_promtool
def test_a_run_killed_midway_leaves_its_start_after_the_last_finish(tmp_path: Path) -> None:
    out = tmp_path / "k.prom"
    env = plugin_env(tmp_path, "pass")
    assert run_doctor("check", "--only", "fleet.*", "--format", "openmetrics", "--output", str(out),
                      env=env).returncode == 0
    first = parse(out.read_text())
    fleet_plugin.verdict_file(tmp_path, "sleep 60")
    proc = subprocess.Popen([sys.executable, "-m", "doctor", "check", "--only", "fleet.*", "--format", "openmetrics",
                             "--output", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        _wait_for(lambda: value(parse(out.read_text()), openmetrics.RUN_STARTED) > value(first, openmetrics.LAST_RUN))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # as systemd's TimeoutStartSec or the OOM killer would
        proc.wait(10)
    text = out.read_text()
    assert subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=30).returncode == 0
    left = parse(text)
    assert value(left, openmetrics.LAST_RUN) == value(first, openmetrics.LAST_RUN)  # the last verdict, as it was
    assert value(left, openmetrics.CHECK_STATUS, check="fleet.verdict", status="pass") == 1
    assert value(left, openmetrics.RUN_STARTED) > value(left, openmetrics.LAST_RUN)  # "never finished" reads this


# -- node_exporter serves it ----------------------------------------------------------------------------------
README = ROOT / "README.md"


def readme_grep() -> list[str]:
    """The README's ``curl -s localhost:9100/metrics | grep ...`` example: the grep's argv."""
    import shlex

    line = next(ln for ln in README.read_text().splitlines() if ln.startswith("curl -s localhost:9100/metrics | grep"))
    argv = shlex.split(line.split("|", 1)[1].split("#", 1)[0])
    assert argv[0] == "grep"
    return argv


def explicit_disk(tmp_path: Path, env: dict[str, str]) -> Path:
    """host.disk's inputs made explicit: the places it measures are this test's own directory and no free space is
    required, so its verdict is a pass on a machine whose disk is nearly full too (the verdict under test is the
    textfile's, not this machine's disk). Returns the config file; ``env`` gets TMPDIR and the Triton cache."""
    env.update(TMPDIR=str(tmp_path), TRITON_CACHE_DIR=str(tmp_path / "triton"), SGLANG_LOG_DIR=str(tmp_path))
    cfg = tmp_path / "disk.toml"
    cfg.write_text(f"[host]\nmin_free_gib = 0\npaths = [{json.dumps(str(tmp_path))}]\n")
    return cfg


@needs_exporter
def test_node_exporter_serves_the_textfile_and_the_readmes_grep_finds_the_failure(tmp_path: Path) -> None:
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    env = plugin_env(tmp_path, "fail on purpose")
    cfg = explicit_disk(tmp_path, env)  # host.disk passes whatever this machine's free space
    res = run_doctor("check", "--config", str(cfg), "--only", "fleet.*", "--only", "host.disk", "--format",
                     "openmetrics", "--output", str(textdir / "k26-doctor.prom"), env=env)
    assert res.returncode == 1, res.stderr
    (port,) = free_ports(1)
    assert NODE_EXPORTER is not None
    proc = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                             "--collector.textfile", f"--collector.textfile.directory={textdir}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        body = ""

        def scraped() -> bool:
            nonlocal body
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    body = resp.read().decode()
                return True
            except OSError:
                return proc.poll() is not None

        _wait_for(scraped, 30)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert "node_textfile_scrape_error 0" in body, body[-2000:]
    lines = body.splitlines()
    assert any(ln.startswith(f'{openmetrics.CHECK_UNJUDGED}{{check="fleet.verdict"') and ln.endswith(" 0")
               for ln in lines), body[-3000:]
    assert any(ln.startswith(f'{openmetrics.CHECK_STATUS}{{affects="node",check="host.disk"') for ln in lines)
    assert any(ln.startswith(openmetrics.LAST_RUN + "{") for ln in lines)
    assert f'{openmetrics.VERDICT}{{profile="b300-tp8-ddtree",status="fail"}} 1' in lines, \
        [ln for ln in lines if ln.startswith(openmetrics.VERDICT)]
    # the README's example, as written, on what node_exporter serves (it sorts the labels)
    grep = subprocess.run(readme_grep(), input=body, capture_output=True, text=True, timeout=30)
    assert grep.returncode == 0, grep.stderr
    assert grep.stdout.splitlines() == [
        'k26_doctor_check_reason_info{affects="node",check="fleet.verdict",code="fleet.verdict.fail",'
        'profile="b300-tp8-ddtree"} 1',
        'k26_doctor_check_status{affects="node",check="fleet.verdict",profile="b300-tp8-ddtree",status="fail"} 1',
        'k26_doctor_verdict{profile="b300-tp8-ddtree",status="fail"} 1'], grep.stdout


def promtool_test_of(text: str, instance: str, alerts: dict[str, list[dict]]) -> dict:
    """A ``promtool test rules`` file whose input is the textfile ``text`` as Prometheus scrapes it from
    ``instance`` for ten minutes, and whose expected alerts at 5m are ``alerts`` (alert name -> exp_alerts)."""
    series = []
    for (name, labels), val in parse(text).items():
        inner = ",".join(f'{k}="{openmetrics.escape_label(v)}"' for k, v in
                         sorted({**dict(labels), "instance": instance, "job": "node"}.items()))
        series.append({"series": f"{name}{{{inner}}}", "values": f"{val:g}x10"})
    return {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series,
                       "alert_rule_test": [{"eval_time": "5m", "alertname": name, "exp_alerts": exp}
                                           for name, exp in alerts.items()]}]}


@needs_promtool
def test_the_healthy_b300_pages_nothing_and_warns_of_its_configuration(tmp_path: Path) -> None:
    """The textfile of the synthetic healthy B300 node with the default profile, under the shipped rules:
    sglang.ddtree (not validated for this configuration, by design) warns; nothing is critical. A degraded NVLink
    on the same node pages, with its reason."""
    import yaml

    def alert(check: str, failure: str, severity: str, code: str) -> dict:
        labels = {"severity": severity, "instance": "b300:9100", "job": "node", "check": check, "affects": failure,
                  "status": "fail", "profile": "b300-tp8-ddtree"}
        judged = f"The last k26-doctor run on b300:9100 (b300-tp8-ddtree) judged {check} fail ({code}): "
        tail = f" On the node: k26-doctor check --only {check} -v"
        if failure == "node":
            return {"exp_labels": labels, "exp_annotations": {
                "summary": f"k26-doctor: {check} fail on b300:9100",
                "description": judged + "the node is broken, the server will not start there or runs degraded." + tail}}
        return {"exp_labels": labels, "exp_annotations": {
            "summary": f"k26-doctor: the configuration fails {check} on b300:9100",
            "description": judged + "the deployment's configuration, not the node; it blocks the launch until it is "
                                    "changed or validated." + tail}}

    for name, expected in (
            ("b300x8-healthy", {"K26DoctorCheckFailing": [],
                                "K26DoctorConfigurationFailing": [alert("sglang.ddtree", "deployment", "warning",
                                                                        "sglang.ddtree.refused")]}),
            ("b300x8-link-down", {"K26DoctorCheckFailing": [alert("gpu.nvlink", "node", "critical",
                                                                  "gpu.nvlink.link_down")]})):
        res = run_doctor("check", "--from-snapshot", str(ROOT / "tests" / "fixtures" / "snapshots" / f"{name}.json"),
                         "--format", "openmetrics")
        assert res.returncode == 1, res.stderr
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=res.stdout, capture_output=True, text=True,
                              timeout=30)
        assert lint.returncode == 0, lint.stdout + lint.stderr
        test = tmp_path / f"{name}.test.yml"
        test.write_text(yaml.safe_dump(promtool_test_of(res.stdout, "b300:9100", expected)))
        out = subprocess.run([PROMTOOL, "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, name + out.stdout + out.stderr
    # the test can fail: the healthy node expected to page is refused
    test = tmp_path / "wrong.test.yml"
    res = run_doctor("check", "--from-snapshot", str(ROOT / "tests" / "fixtures" / "snapshots" /
                                                     "b300x8-healthy.json"), "--format", "openmetrics")
    test.write_text(yaml.safe_dump(promtool_test_of(res.stdout, "b300:9100", {"K26DoctorCheckFailing": [
        alert("sglang.ddtree", "deployment", "critical", "sglang.ddtree.refused")]})))
    out = subprocess.run([PROMTOOL, "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


# -- the alerting rules -----------------------------------------------------------------------------------------
@needs_promtool
def test_the_alerting_rules_pass_their_promtool_tests_and_fail_when_broken(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    res = subprocess.run([PROMTOOL, "test", "rules", str(RULES_TEST)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    # The tests can fail: a rule that never fires for an unfinished run is caught.
    broken = tmp_path / "prometheus"
    shutil.copytree(RULES.parent, broken)
    rules = broken / RULES.name
    rules.write_text(rules.read_text().replace("k26_doctor_run_started_timestamp_seconds unless",
                                               "k26_doctor_last_run_timestamp_seconds unless"))
    res = subprocess.run([PROMTOOL, "test", "rules", str(broken / RULES_TEST.name)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode != 0 and "K26DoctorRunNeverFinished" in res.stdout + res.stderr


def test_the_rules_thresholds_follow_the_periodic_run() -> None:
    import yaml

    data = read_toml(ROOT / "doctor" / "data" / "fleet.toml")
    timer, alerts = data["timer"], data["alerts"]
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    stale = re.search(r"> (\d+)", rules["K26DoctorVerdictStale"]["expr"])
    unfinished = re.search(r"> (\d+)\)", rules["K26DoctorRunNeverFinished"]["expr"])
    assert stale and int(stale.group(1)) == alerts["stale_after_s"]
    assert unfinished and int(unfinished.group(1)) == alerts["unfinished_after_s"]
    from doctor.service.timer import RANDOM_DELAY_S

    # One run that hangs until systemd stops it does not make the verdict stale ("never finished" says that)...
    assert alerts["stale_after_s"] > 2 * (timer["interval_s"] + RANDOM_DELAY_S) + timer["run_timeout_s"]
    assert alerts["unfinished_after_s"] > timer["run_timeout_s"]  # systemd stops a hung run first
    every = {m for r in rules.values() for m in re.findall(r"k26_doctor_\w+", r["expr"])}
    assert every <= set(openmetrics.HELP), every - set(openmetrics.HELP)  # every series an alert reads is rendered
    failing = rules["K26DoctorCheckFailing"]["expr"]
    assert Status.FAIL.value in failing and Status.ERROR.value in failing
