"""Slurm: ``k26-doctor slurm-health`` drains a node with the failing root cause as its reason and resumes a drain
of its own once the checks pass. Judged (pure) on real reports, then against a real single-node cluster started
here (munged, slurmctld, slurmd from the distribution's packages, on loopback): run by hand, by slurmd itself as
``HealthCheckProgram`` through the shipped wrapper, and as a job's ``Prolog``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import fleet_plugin
import pytest
import slurm_cluster
from conftest import ROOT, signal_once_started

from doctor.app import Report
from doctor.core.result import Result, Status
from doctor.core.runner import RunOutcome
from doctor.core.settings import resolve
from doctor.service import slurm

WRAPPER = ROOT / "deploy" / "slurm" / "k26-doctor-slurm-health"
PREFIX = slurm.slurm_table()["reason_prefix"]


# -- the judgement, on real reports ---------------------------------------------------------------------------------
def report_of(*results: Result, strict: bool = False) -> Report:
    return Report(resolve({"strict": strict or None}, environ={}), RunOutcome(list(results), 0.1))


def res(cid: str, r: Result, cause: str | None = None, failure: str = "node") -> Result:
    r.id, r.cause, r.failure = cid, cause, failure
    return r


IDLE = slurm.NodeState("gpu01", ["IDLE"])


def test_scontrol_node_lines_are_read() -> None:
    line = ("NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 OS=Linux 6.8.0 #1 SMP PREEMPT_DYNAMIC "
            "State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu "
            "Reason=k26-doctor: gpu.nvlink: 2 pairs [root@2026-12-01T09:04:02]")
    node = slurm.parse_node(line)
    assert node == slurm.NodeState("gpu01", ["IDLE", "DRAIN"], "k26-doctor: gpu.nvlink: 2 pairs")
    assert node.drained and node.drained_by(PREFIX) and not node.busy
    busy = slurm.parse_node("NodeName=gpu02 State=MIXED+DRAIN Reason=maintenance [alice@2026-12-01T08:00:00]")
    assert busy is not None and busy.busy and busy.drained and not busy.drained_by(PREFIX)
    down = slurm.parse_node("NodeName=gpu03 State=DOWN+NOT_RESPONDING Weight=1")
    assert down is not None and down.states == ["DOWN", "NOT_RESPONDING"] and down.reason is None
    assert slurm.parse_node("") is None and slurm.parse_node("slurm_load_node error: Unable to contact") is None


def test_a_failure_drains_with_its_root_cause_once() -> None:
    rep = report_of(res("gpu.driver", Result.failed("NVML not loaded: libnvidia-ml.so.1 missing")),
                    res("cuda.compat", Result.failed("no driver reading"), cause="gpu.driver"),
                    res("host.disk", Result.errored("df timed out")),
                    res("gpu.count", Result.skipped("same cause"), cause="gpu.driver"),
                    res("host.env", Result.passed("ok")))
    d = slurm.node_action(rep, IDLE)
    assert d.action == "drain" and d.exit_code == 1
    assert d.reason == f"{PREFIX} gpu.driver: NVML not loaded: libnvidia-ml.so.1 missing (+1 more: host.disk)"


def test_the_reason_is_one_bounded_line_without_secrets() -> None:
    long = "proxy https://alice:s3cret@proxy.example:3128 refused\nthen " + "x" * 500
    rep = report_of(res("host.env", Result.failed(long)), *[res(f"site.c{i}", Result.failed("no")) for i in range(40)])
    reason = slurm.node_action(rep, IDLE).reason
    assert reason is not None and len(reason) <= slurm.slurm_table()["reason_max_chars"]
    assert "s3cret" not in reason and "\n" not in reason and reason.startswith(f"{PREFIX} host.env: proxy")
    assert "+40 more" in reason


def test_resume_only_a_drain_of_ours_and_never_touch_someone_elses() -> None:
    ours = slurm.NodeState("gpu01", ["IDLE", "DRAIN"], f"{PREFIX} gpu.nvlink: 2 pairs")
    admin = slurm.NodeState("gpu01", ["IDLE", "DRAIN"], "maintenance: PSU swap")
    ok = report_of(res("host.disk", Result.passed("ok")))
    bad = report_of(res("gpu.nvlink", Result.failed("2 pairs")))
    assert (slurm.node_action(ok, ours).action, slurm.node_action(ok, ours).exit_code) == ("resume", 0)
    assert (slurm.node_action(ok, admin).action, slurm.node_action(ok, admin).exit_code) == ("keep", 0)
    d = slurm.node_action(bad, admin)
    assert (d.action, d.exit_code) == ("keep", 1) and "someone else" in d.lines[0]
    same = slurm.node_action(bad, ours)  # the same reason: nothing to do
    assert (same.action, same.exit_code) == ("keep", 1)
    changed = slurm.NodeState("gpu01", ["IDLE", "DRAIN"], f"{PREFIX} host.disk: full")
    assert slurm.node_action(bad, changed).action == "drain"  # a new root cause replaces our old reason
    assert (slurm.node_action(ok, IDLE).action, slurm.node_action(ok, IDLE).exit_code) == ("keep", 0)


def test_a_check_not_judged_drains_nothing_unless_asked_and_is_said() -> None:
    rep = report_of(res("model.shards.deep", Result.not_judged("nothing to compare with")),
                    res("host.disk", Result.passed("ok")))
    d = slurm.node_action(rep, IDLE)
    assert (d.action, d.exit_code) == ("keep", 0)
    assert "not judged" in d.lines[0] and "model.shards.deep" in d.lines[0]
    for drained in (slurm.node_action(rep, IDLE, drain_unjudged=True),
                    slurm.node_action(report_of(*rep.results, strict=True), IDLE)):
        assert drained.action == "drain"
        assert drained.reason == f"{PREFIX} not judged: model.shards.deep: nothing to compare with"
    warn = report_of(res("host.exposure", Result.warned("0.0.0.0 without --api-key")), strict=True)
    assert slurm.node_action(warn, IDLE).action == "drain"  # --strict: warnings fail
    assert slurm.node_action(report_of(res("x", Result(Status.WARN, "w"))), IDLE).action == "keep"


def test_a_failure_of_the_deployments_configuration_never_drains() -> None:
    ddtree = res("sglang.ddtree", Result.failed("DDTREE not validated for tp_size 8"), failure="deployment")
    rep = report_of(ddtree, res("gpu.nvlink", Result.passed("ok")))
    d = slurm.node_action(rep, IDLE)
    assert (d.action, d.reason, d.exit_code) == ("keep", None, 0)
    assert d.lines[0] == ("gpu01: not drained for the deployment's configuration (the same on every node; it blocks "
                          "the launch): configuration: sglang.ddtree: DDTREE not validated for tp_size 8")
    assert d.lines[-1] == "gpu01: the node's checks pass"
    ours = slurm.NodeState("gpu01", ["IDLE", "DRAIN"], f"{PREFIX} gpu.nvlink: 2 pairs")
    assert slurm.node_action(rep, ours).action == "resume"  # the node itself is healthy again
    # a dependent explained by a configuration failure is the configuration's too
    blocked = res("gpu.multicast", Result.failed("flags need multicast"), cause="sglang.flags")
    rep = report_of(res("sglang.flags", Result.failed("unknown flag"), failure="deployment"), blocked)
    assert slurm.node_action(rep, IDLE).action == "keep"
    # beside a node failure: the node drains for its own, the reason names only the node's
    rep = report_of(ddtree, res("gpu.nvlink", Result.failed("2 pairs without NVLink")))
    d = slurm.node_action(rep, IDLE)
    assert d.action == "drain" and d.reason == f"{PREFIX} gpu.nvlink: 2 pairs without NVLink"
    # not judged: only the node's checks count for --drain-unjudged
    rep = report_of(res("sglang.install", Result.not_judged("no stack fact"), failure="deployment"))
    assert slurm.node_action(rep, IDLE, drain_unjudged=True).action == "keep"


def test_an_interrupted_run_leaves_the_node_as_it_is_and_exits_130() -> None:
    """decide_node's interrupted row: a run stopped before it finished says nothing about the node's hardware, so
    the node is neither drained (not for the checks it stopped, not for a failure seen before it stopped) nor
    resumed, one line says so, and the exit is the interrupted one."""
    def interrupted(*results: Result) -> Report:
        return Report(resolve({}, environ={}), RunOutcome(list(results), 0.1, interrupted=True))

    def stopped(cid: str) -> Result:
        return res(cid, Result.errored("interrupted (Ctrl-C) before it finished", interrupted=True))

    ours = slurm.NodeState("gpu01", ["IDLE", "DRAIN"], f"{PREFIX} gpu.nvlink: 2 pairs")
    theirs = slurm.NodeState("gpu01", ["IDLE", "DRAIN"], "maintenance: PSU")
    runs = [interrupted(res("host.disk", Result.passed("ok")), stopped("gpu.nvlink")),
            interrupted(res("gpu.nvlink", Result.failed("2 pairs")), stopped("host.disk")),
            interrupted(res("sglang.ddtree", Result.failed("not validated"), failure="deployment"),
                        res("fleet.verdict", Result.not_judged("no facts")), stopped("host.disk"))]
    for node in (IDLE, ours, theirs):
        for rep in runs:
            for drain_unjudged in (False, True):
                d = slurm.node_action(rep, node, drain_unjudged=drain_unjudged)
                assert (d.action, d.reason, d.exit_code) == ("keep", None, 130)
                assert d.lines == [f"gpu01: {slurm.INTERRUPTED_LINE}"]
    assert "interrupted" in slurm.INTERRUPTED_LINE and "nothing was changed" in slurm.INTERRUPTED_LINE


def test_the_healthy_b300_with_the_default_profile_is_left_up() -> None:
    """The synthetic healthy B300 node fails sglang.ddtree by design (the profile's DDTREE is not validated for
    TP8 on sm_103): a configuration failure, so Slurm keeps the node up, and resumes a drain of ours."""
    from doctor.app import run, settings_from_flags

    snap = ROOT / "tests" / "fixtures" / "snapshots" / "b300x8-healthy.json"
    report, _ = run(settings_from_flags({"from_snapshot": str(snap)}))
    assert report.decision().exit_code == 1  # the launch is blocked
    d = slurm.node_action(report, IDLE)
    assert (d.action, d.exit_code) == ("keep", 0) and "sglang.ddtree" in d.lines[0]
    assert slurm.node_action(report, slurm.NodeState("gpu01", ["IDLE", "DRAIN"], f"{PREFIX} x")).action == "resume"


def test_serving_is_a_node_with_jobs_outside_a_prolog() -> None:
    busy = slurm.NodeState("gpu01", ["ALLOCATED"])
    assert slurm.serving("auto", busy, {}) is True
    assert slurm.serving("auto", busy, {"SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_ID": "7"}) is False
    assert slurm.serving("auto", IDLE, {}) is False
    assert slurm.serving("yes", IDLE, {}) is True and slurm.serving("no", busy, {}) is False
    assert slurm.node_name(None, {"SLURMD_NODENAME": "gpu07"}) == "gpu07"
    assert slurm.node_name("gpu08", {"SLURMD_NODENAME": "gpu07"}) == "gpu08"


# -- a real cluster ------------------------------------------------------------------------------------------------
WHY_NOT = slurm_cluster.why_not()
needs_cluster = pytest.mark.skipif(WHY_NOT is not None, reason=f"no Slurm cluster here: {WHY_NOT}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm_cluster.Cluster]:
    root = tmp_path_factory.mktemp("slurm")
    # slurmd runs these itself; each acts only while the test that needs it has switched it on
    for name, script in (("health", "hc"), ("prolog", "prolog")):
        gate = root / f"{name}.on"
        (root / f"{script}.sh").write_text(
            f"#!/bin/sh\n[ -e {gate} ] || exit 0\nK26_DOCTOR_SLURM_DEFAULTS={root}/defaults exec {WRAPPER}\n")
        (root / f"{script}.sh").chmod(0o755)
    extra = (f"HealthCheckProgram={root}/hc.sh\nHealthCheckInterval=2\nHealthCheckNodeState=ANY\n"
             f"Prolog={root}/prolog.sh\n")
    c = slurm_cluster.Cluster(root, extra).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def node(cluster: slurm_cluster.Cluster, tmp_path: Path) -> Iterator[dict]:
    """A port to hold, a config whose host.port judges it, the plugin; the node idle and undrained after."""
    (port,) = slurm_cluster.free_ports(1)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[server]\nhost = "127.0.0.1"\nport = {port}\n')
    site = fleet_plugin.install(tmp_path)
    verdict = fleet_plugin.verdict_file(tmp_path, "pass")
    yield {"port": port, "cfg": cfg, "site": site, "verdict": verdict, "tmp": tmp_path}
    for f in ("health.on", "prolog.on"):
        (cluster.root / f).unlink(missing_ok=True)
    cluster.scontrol("update", f"nodename={cluster.node}", "state=resume")


def health(cluster: slurm_cluster.Cluster, n: dict, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    argv = [*cluster.prefix, sys.executable, "-m", "doctor", "slurm-health", "--config", str(n["cfg"]), *args]
    e = cluster.env(PYTHONPATH=f"{ROOT}:{n['site']}", K26_FLEET_VERDICT=str(n["verdict"]), NO_COLOR="1", **env)
    e.pop("K26_DOCTOR_CONFIG", None)
    return subprocess.run(argv, capture_output=True, text=True, env=e, timeout=120, stdin=subprocess.DEVNULL)


def wait_until(pred, what: str, cluster: slurm_cluster.Cluster, timeout: float = 45) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}: {cluster.show()}\n{cluster.logs()}")


@needs_cluster
def test_a_failing_check_drains_the_node_and_passing_resumes_it(cluster: slurm_cluster.Cluster, node: dict) -> None:
    with cluster.holding(node["port"]):
        r = health(cluster, node, "--only", "host.port")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "DRAIN" in cluster.states()
        assert cluster.reason().startswith(f"{PREFIX} host.port: 127.0.0.1:{node['port']} is in use")
        again = health(cluster, node, "--only", "host.port")
        assert again.returncode == 1 and "still drained" in again.stdout
    dry = health(cluster, node, "--only", "host.port", "--dry-run")
    assert dry.returncode == 0 and "(dry run)" in dry.stdout and "DRAIN" in cluster.states()  # changed nothing
    r = health(cluster, node, "--only", "host.port")
    assert r.returncode == 0 and "resume" in r.stdout, r.stdout + r.stderr
    assert "DRAIN" not in cluster.states() and cluster.reason() is None


@needs_cluster
def test_a_drain_by_someone_else_is_left_alone(cluster: slurm_cluster.Cluster, node: dict) -> None:
    drain = cluster.scontrol("update", f"nodename={cluster.node}", "state=drain", "reason=maintenance: PSU")
    assert drain.returncode == 0, drain.stderr
    with cluster.holding(node["port"]):
        r = health(cluster, node, "--only", "host.port")
    assert r.returncode == 1 and "someone else" in r.stdout
    r = health(cluster, node, "--only", "host.port")
    assert r.returncode == 0 and "left drained" in r.stdout
    assert "DRAIN" in cluster.states() and cluster.reason().startswith("maintenance: PSU")


@needs_cluster
def test_a_check_not_judged_is_said_and_drains_only_when_asked(cluster: slurm_cluster.Cluster, node: dict) -> None:
    node["verdict"].write_text("unjudged")
    r = health(cluster, node, "--only", "fleet.*")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not judged for want of facts (not drained for them" in r.stdout and "fleet.verdict" in r.stdout
    assert "DRAIN" not in cluster.states()
    r = health(cluster, node, "--only", "fleet.*", "--drain-unjudged")
    assert r.returncode == 1 and "DRAIN" in cluster.states()
    assert cluster.reason().startswith(f"{PREFIX} not judged: fleet.verdict: nothing to compare with")
    node["verdict"].write_text("crash")  # a check that crashes is an error: a failure, the node stays drained
    r = health(cluster, node, "--only", "fleet.*")
    assert r.returncode == 1 and cluster.reason().startswith(f"{PREFIX} fleet.verdict: check crashed")


@needs_cluster
def test_an_interrupted_health_check_changes_nothing_and_exits_130(cluster: slurm_cluster.Cluster,
                                                                  node: dict) -> None:
    """Ctrl-C while a check runs: the checks it stopped are no verdict on the node, so an undrained node is not
    drained and a drain of ours is neither resumed nor rewritten; one line says so, and the exit is 130."""
    def interrupted() -> subprocess.CompletedProcess[str]:
        node["verdict"].write_text("sleep 100")
        started = Path(str(node["verdict"]) + ".started")
        started.unlink(missing_ok=True)
        argv = [*cluster.prefix, sys.executable, "-m", "doctor", "slurm-health", "--config", str(node["cfg"]),
                "--only", "fleet.*"]
        env = cluster.env(PYTHONPATH=f"{ROOT}:{node['site']}", K26_FLEET_VERDICT=str(node["verdict"]), NO_COLOR="1")
        env.pop("K26_DOCTOR_CONFIG", None)
        # the checks are running once fleet.verdict has started
        return signal_once_started(argv, started, signal.SIGINT, env=env, what="fleet.verdict")

    said = f"{cluster.node}: {slurm.INTERRUPTED_LINE}"
    r = interrupted()
    assert r.returncode == 130, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == said and f"{cluster.node}: drain" not in r.stdout
    assert "DRAIN" not in cluster.states()
    node["verdict"].write_text("fail a broken node")
    assert health(cluster, node, "--only", "fleet.*").returncode == 1
    reason = cluster.reason()
    assert reason.startswith(f"{PREFIX} fleet.verdict: the test asks for a failure")
    r = interrupted()
    assert r.returncode == 130 and r.stdout.splitlines()[-1] == said, r.stdout + r.stderr
    assert "DRAIN" in cluster.states() and cluster.reason() == reason


@needs_cluster
def test_what_scontrol_cannot_do_is_an_exit_status_not_a_traceback(cluster: slurm_cluster.Cluster, node: dict,
                                                                    tmp_path: Path) -> None:
    r = health(cluster, node, "--only", "host.port", "--node", "no-such-node")
    assert r.returncode == 2 and "Slurm knows no node 'no-such-node'" in r.stderr
    elsewhere = tmp_path / "slurm.conf"
    (dead,) = slurm_cluster.free_ports(1)
    elsewhere.write_text("\n".join(f"SlurmctldPort={dead}" if ln.startswith("SlurmctldPort=") else ln
                                   for ln in cluster.conf.read_text().splitlines()) + "\n")
    started = time.monotonic()
    r = health(cluster, node, "--only", "host.port", "--scontrol-timeout", "1.5", SLURM_CONF=str(elsewhere))
    assert r.returncode == 1 and "cannot read the node from Slurm" in r.stderr, r.stdout + r.stderr
    assert time.monotonic() - started < 60
    r = health(cluster, node, "--only", "host.port", "--scontrol", str(tmp_path / "no-scontrol"))
    assert r.returncode == 1 and "could not start" in r.stderr
    for bad in (["--from-snapshot", str(tmp_path / "x.json")], ["--only", "no.such.check"]):
        r = health(cluster, node, *bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr


@needs_cluster
def test_on_a_node_with_a_job_the_pre_start_checks_are_left_out_but_not_in_the_prolog(
        cluster: slurm_cluster.Cluster, node: dict) -> None:
    job = subprocess.Popen([*cluster.prefix, "srun", "--immediate=20", "-N1", "sleep", "30"], env=cluster.env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_until(lambda: "ALLOCATED" in cluster.states(), "the job to start", cluster)
        with cluster.holding(node["port"]):
            r = health(cluster, node, "--only", "host.*")
            assert r.returncode == 0, r.stdout + r.stderr
            assert "--while-serving: left out" in r.stdout and "DRAIN" not in cluster.states()
            r = health(cluster, node, "--only", "host.*", SLURM_SCRIPT_CONTEXT="prolog_slurmd", SLURM_JOB_ID="1")
            assert r.returncode == 1 and "--while-serving" not in r.stdout
            assert cluster.reason().startswith(f"{PREFIX} host.port")
    finally:
        cluster.cancel_jobs()
        job.wait(30)
    assert cluster.jobs() == []


def settle_undrained(cluster: slurm_cluster.Cluster, timeout: float = 45) -> None:
    """The node undrained and staying so for longer than one HealthCheckInterval (2 s): a health check that was
    running when the previous test switched it off may drain the node after that test's resume."""
    deadline = time.monotonic() + timeout
    calm_since = None
    while time.monotonic() < deadline:
        if "DRAIN" in cluster.states():
            cluster.scontrol("update", f"nodename={cluster.node}", "state=resume")
            calm_since = None
        elif calm_since is None:
            calm_since = time.monotonic()
        elif time.monotonic() - calm_since > 3:
            return
        time.sleep(0.3)
    raise AssertionError(f"the node did not stay undrained: {cluster.show()}")


def _defaults(cluster: slurm_cluster.Cluster, node: dict, flags: str) -> None:
    (cluster.root / "defaults").write_text(
        f'K26_DOCTOR="{sys.executable} -m doctor"\nK26_DOCTOR_CONFIG={node["cfg"]}\nSLURM_CONF={cluster.conf}\n'
        f'K26_DOCTOR_SLURM_FLAGS="{flags}"\nPYTHONPATH={ROOT}\nexport PYTHONPATH\n')


@needs_cluster
def test_slurmd_runs_it_as_health_check_program_through_the_shipped_wrapper(cluster: slurm_cluster.Cluster,
                                                                              node: dict) -> None:
    _defaults(cluster, node, "--only host.port")
    with cluster.holding(node["port"]):
        (cluster.root / "health.on").touch()
        wait_until(lambda: (cluster.reason() or "").startswith(f"{PREFIX} host.port"), "slurmd's health check to drain",
                   cluster)
    wait_until(lambda: "DRAIN" not in cluster.states(), "slurmd's health check to resume", cluster)
    (cluster.root / "health.on").unlink()


@needs_cluster
def test_as_prolog_a_failure_drains_with_our_reason_and_the_job_does_not_run(cluster: slurm_cluster.Cluster,
                                                                           node: dict) -> None:
    _defaults(cluster, node, "--only host.port")
    settle_undrained(cluster)  # the job must meet the prolog, not a drain left by the health check's test
    mark = node["tmp"] / "ran"
    with cluster.holding(node["port"]):
        (cluster.root / "prolog.on").touch()
        job = subprocess.run([*cluster.prefix, "srun", "--immediate=20", "-N1", "touch", str(mark)],
                             env=cluster.env(), capture_output=True, text=True, timeout=90)
    (cluster.root / "prolog.on").unlink()
    assert job.returncode != 0 and "rolog" in job.stderr, job.stderr
    assert not mark.exists()
    assert "DRAIN" in cluster.states() and cluster.reason().startswith(f"{PREFIX} host.port"), cluster.show()


@needs_cluster
def test_a_configuration_failure_leaves_the_node_up_and_resumes_a_drain_of_ours(cluster: slurm_cluster.Cluster,
                                                                               node: dict) -> None:
    node["verdict"].write_text("fail a broken node")
    r = health(cluster, node, "--only", "fleet.*")
    assert r.returncode == 1 and "DRAIN" in cluster.states(), r.stdout + r.stderr
    assert cluster.reason().startswith(f"{PREFIX} fleet.verdict: the test asks for a failure")
    node["verdict"].write_text("config-fail wrong profile")
    r = health(cluster, node, "--only", "fleet.*")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not drained for the deployment's configuration" in r.stdout and "fleet.config" in r.stdout
    assert "resume" in r.stdout and "DRAIN" not in cluster.states() and cluster.reason() is None
    r = health(cluster, node, "--only", "fleet.*")
    assert r.returncode == 0 and "DRAIN" not in cluster.states()
