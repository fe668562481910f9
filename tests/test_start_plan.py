"""The start plan (doctor.service.startplan / startlog / startwatch / prewarm, host.jit_cache): the parts of real
recorded H200 starts read from their logs, the prediction against them, the capture sizes as SGLang computes them,
the JIT cache check on a real tmpfs and a real directory, the prewarm with an interpreter that fails or hangs (the
start goes on), the record written whole, and `launch --wait` recording a start against its plan end to end."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import tarfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, doctor_env, fix_plan, make_context, run_check, run_doctor
from sglang_stand_in import free_port

from doctor.core.result import Status
from doctor.service import prewarm, startlog, startplan

RESULTS = ROOT / "bench" / "results"


def log_lines(archive: str, member: str) -> list[str]:
    """A server log from a recorded session's archive (bench/results/ddtree-h200-*/logs*.tgz)."""
    with tarfile.open(RESULTS / archive) as tar:
        fh = tar.extractfile(member)
        assert fh is not None
        return io.TextIOWrapper(fh, encoding="utf-8", errors="replace").read().splitlines()


PRODUCT_B = ("ddtree-h200-validate/logs-B.tgz", "aux/product-launch.log")
WARM_L24 = ("ddtree-h200-rev5/logs-3.tgz", "logs/rnd-ddtree-b16-l24-alone.log")
COLD_L4 = ("ddtree-h200-rev5/logs-2.tgz", "logs/rnd-ddtree-b16-alone.log")
BASE_L4 = ("ddtree-h200-rev5/logs-3.tgz", "logs/rnd-base-l4-alone.log")


def test_parts_of_recorded_h200_starts() -> None:
    b = startlog.read_start(log_lines(*PRODUCT_B))
    assert {"load_begin", "memory_pool_end", "engine_ready", "fired_up", "load_end"} <= set(b["found"])
    assert [(c["kind"], c["backend"], c["sizes"], c["s"]) for c in b["captures"]] == [
        ("prefill", "breakable", 58, 3.74), ("verify", "full", 23, 1.80), ("draft", "full", 23, 15.99)]
    assert b["parts"]["weights"] == 0.17 and b["parts"]["drafter"] == 0.01
    assert b["parts"]["startup"] == 33.0 and b["parts"]["warmup"] == 6.0  # 12:22:29 -> 12:23:02, 12:23:49 -> :55
    # 12:23:04 -> 12:23:49 less the captures: DDTree's tree kernels on a cold Triton cache
    assert b["parts"]["kernels"] == pytest.approx(45 - 21.53, abs=0.01)
    base = startlog.read_start(log_lines(*BASE_L4))
    assert [(c["kind"], c["sizes"]) for c in base["captures"]] == [("prefill", 58), ("decode", 8)]
    assert "drafter" not in base["parts"]


def test_a_log_without_landmarks_gives_no_figures() -> None:
    got = startlog.read_start(["plain text", "Traceback (most recent call last):", "[not a stamp] Load weight"])
    assert got["parts"] == {} and got["captures"] == [] and got["found"] == []


def test_capture_sizes_are_sglangs() -> None:
    g = startplan.constants()["graphs"]
    assert len(startplan.capture_sizes(g["speculative"], 48)) == 23  # validate B: bs=[1..8, 10..32/2, 40, 44, 48]
    assert startplan.capture_sizes(g["decode"], 32) == [1, 2, 4, 8, 12, 16, 24, 32]  # rnd-base-l4-alone
    assert len(startplan.capture_sizes(g["prefill"], 8192)) == 58
    assert startplan.capture_sizes(g["speculative"], 50)[-1] == 50  # the max is captured too
    plan = startplan.graph_plan(["--speculative-algorithm", "DDTREE", "--max-running-requests", "48"], g)
    assert plan["kinds"] == {"prefill": 58, "verify": 23, "draft": 23}
    assert plan["max_bs_from"] == "--max-running-requests"
    assert startplan.graph_plan(["--disable-cuda-graph"], g)["kinds"] == {}
    listed = startplan.graph_plan(["--cuda-graph-bs", "1", "2", "4", "--cuda-graph-bs-prefill=64,128", "--tp", "1"], g)
    assert listed["kinds"] == {"prefill": 2, "decode": 3} and listed["max_bs"] == 4


def inputs_for(layers: int, max_bs: int, triton_entries: int, compiled: list[str]) -> dict:
    args = ["--speculative-algorithm", "DDTREE", "--cuda-graph-max-bs-decode", str(max_bs)]
    return {"gpu_name": "NVIDIA H200", "compute_capability": "9.0", "tp": 1, "server_args": args,
            "algorithm": "DDTREE", "target": {"bytes": 50_000_000, "resident_bytes": 50_000_000, "layers": layers},
            "drafter": {"bytes": 4_000_000, "resident_bytes": 4_000_000, "layers": 2}, "meminfo": {},
            "flashinfer": {"installed": True, "version": "0.7.2", "compiled": compiled, "cache": "/c"},
            "triton_cache": {"path": "/t", "entries": triton_entries}, "import_s": None}


BUILT = ["0.7.2/90a/norm", "0.7.2/90a/sampling"]


def _logged_and_predicted(log: tuple[str, str], inputs: dict) -> tuple[float, float, dict]:
    """First log line to 'fired up' as the log shows it, and the same parts predicted."""
    plan = startplan.predict(inputs, startplan.constants()).to_dict()
    actual = startlog.read_start(log_lines(*log))
    logged = sum(actual["parts"].get(p, 0.0) for p in ("startup", "weights", "drafter", "kv_cache", "cuda_graphs",
                                                         "kernels", "warmup"))
    pred = {p["name"]: p["seconds"] for p in plan["parts"]}
    predicted = sum(pred.get(p, 0.0) for p in ("startup", "weights", "drafter", "kv_cache", "cuda_graphs", "kernels",
                                               "jit", "warmup"))
    rows = {r["part"]: r for r in startplan.compare(plan, actual, launched_to_ready_s=None)}
    assert rows["graphs+kernels+jit"]["actual_s"] is not None and rows["total"]["actual_s"] is None
    return logged, predicted, {"pred": pred, "actual": actual["parts"]}


def test_prediction_within_20_percent_of_a_recorded_warm_start() -> None:
    """A warm start the constants were measured on: the model reproduces its own data within the issue's 20%."""
    logged, predicted, why = _logged_and_predicted(WARM_L24, inputs_for(24, 32, 500, BUILT))
    assert abs(predicted - logged) <= 0.2 * logged, (predicted, logged, why)


@pytest.mark.parametrize(("log", "inputs"), [
    (COLD_L4, inputs_for(4, 32, 0, ["0.7.2/90a/sampling"])),
    (BASE_L4, dict(inputs_for(4, 32, 0, ["0.7.2/90a/sampling"]), algorithm=None, drafter=None,
                   server_args=["--cuda-graph-max-bs-decode", "32"])),
])
def test_older_cold_starts_beside_a_training_are_underpredicted(log: tuple[str, str], inputs: dict) -> None:
    """rev5's first cold servers compiled FlashInfer's norm themselves (the bench's prewarm built sampling first:
    norm is missing from their inputs) and started while the trained pair trained on the same host: the constants,
    now measured on a launch with the host to itself (call4), predict them low, by less than a third. Said here so
    that a change of the model that moves them is seen."""
    logged, predicted, why = _logged_and_predicted(log, inputs)
    assert 0.7 * logged <= predicted < logged, (predicted, logged, why)


def test_the_plan_names_what_is_avoidable() -> None:
    cold = startplan.predict(inputs_for(61, 256, 0, []), startplan.constants())
    parts = {p.name: p for p in cold.parts}
    assert parts["jit"].seconds == pytest.approx(107.0 + 40.1) and parts["jit"].avoidable_s == parts["jit"].seconds
    assert "prewarm" in parts["jit"].advice
    assert parts["cuda_graphs"].avoidable_s >= 15.9 + 5.1 + 6.3  # the Triton compiles of an empty cache
    beside = inputs_for(4, 32, 800, [])
    beside["flashinfer"]["building"] = {"modules": ["norm", "sampling"], "elapsed_s": 10.0}
    got = {p.name: p for p in startplan.predict(beside, startplan.constants()).parts}
    to_first_forward = sum(got[n].seconds for n in ("interpreter", "startup", "weights", "drafter", "kv_cache"))
    # built at once: norm is done before the first forward; what is left of sampling when the rehearsal after the
    # captures calls it
    assert to_first_forward > 40.1 - 10.0
    after_captures = to_first_forward + got["cuda_graphs"].seconds + got["kernels"].seconds
    assert got["jit"].seconds == pytest.approx(107.0 - 10.0 - after_captures, abs=0.1) and got["jit"].seconds > 30
    warm = startplan.predict(inputs_for(61, 256, 800, BUILT), startplan.constants())
    assert warm.total_s < cold.total_s - 200 and {p.name: p for p in warm.parts}["jit"].seconds == 0
    bounded = dict(inputs_for(61, 256, 800, BUILT), server_args=["--speculative-algorithm", "DDTREE",
                                                                  "--cuda-graph-max-bs-decode", "256",
                                                                  "--max-running-requests", "16"])
    graphs = {p.name: p for p in startplan.predict(bounded, startplan.constants()).parts}["cuda_graphs"]
    assert "--cuda-graph-max-bs-decode 16" in graphs.advice and graphs.avoidable_s > 5
    lines = startplan.render(cold)
    assert lines[0].startswith("start plan: healthy about") and any("save" in line for line in lines)


def test_weights_from_disk_and_page_cache_and_the_advice() -> None:
    gib = 1024**3
    inputs = dict(inputs_for(61, 32, 800, BUILT), target={"bytes": 100 * gib, "resident_bytes": 0, "layers": 61},
                  meminfo={"MemAvailable": 400 * gib})
    k = startplan.constants()["kinds"]["h200"]
    part = {p.name: p for p in startplan.predict(inputs, startplan.constants()).parts}["weights"]
    assert part.seconds == pytest.approx(k["load_overhead_s"]["value"] + 100 / k["disk_gibps"]["value"], rel=0.01)
    assert "check --deep" in part.advice and part.avoidable_s > 0
    partly = dict(inputs, meminfo={"MemAvailable": 40 * gib})
    part = {p.name: p for p in startplan.predict(partly, startplan.constants()).parts}["weights"]
    assert "last-to-first" in part.advice and 0 < part.avoidable_s < 40 / k["disk_gibps"]["value"]
    small = dict(inputs, meminfo={"MemAvailable": 2 * gib})
    part = {p.name: p for p in startplan.predict(small, startplan.constants()).parts}["weights"]
    assert "do not fit" in part.advice and part.avoidable_s == 0


def test_residency_is_read_with_mincore(tmp_path: Path) -> None:
    from doctor.model.residency import Residency, model_residency

    (tmp_path / "a.safetensors").write_bytes(os.urandom(4 << 20))
    fd = os.open(tmp_path / "a.safetensors", os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    res = Residency()
    got = model_residency(str(tmp_path), res)
    assert got["bytes"] == 4 << 20 and got["files"] == 1
    assert got["resident_bytes"] is not None and got["resident_bytes"] < 4 << 20  # dropped pages are not resident
    (tmp_path / "a.safetensors").read_bytes()
    assert model_residency(str(tmp_path), res)["resident_bytes"] == 4 << 20
    os.mkfifo(tmp_path / "b.safetensors")  # never waited on: named as an error
    assert "b.safetensors" in model_residency(str(tmp_path), res)["error"]


# -- host.jit_cache: a real tmpfs and a real directory ----------------------------------------------------------

def _tmpfs_dir() -> Path:
    shm = Path("/dev/shm")
    from doctor.core.fileio import read_text
    from doctor.host.facts import mount_of

    mount = mount_of(str(shm), read_text("/proc/self/mountinfo", 1 << 24, "mounts"))
    if not shm.is_dir() or not mount or mount["fstype"] != "tmpfs":
        pytest.fail("/dev/shm is not a tmpfs on this host: the test needs one")
    return shm


def test_jit_cache_on_tmpfs_warns_and_the_fixer_plans_a_persistent_one(tmp_path: Path) -> None:
    shm = _tmpfs_dir()
    volatile = Path(os.path.join(shm, f"k26-test-triton-{os.getpid()}"))
    env_file = tmp_path / "svc.env"
    env = {"HOME": str(tmp_path), "TRITON_CACHE_DIR": str(volatile), "PATH": os.environ.get("PATH", "")}
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\nenv_file = "{env_file}"\n')
    ctx = make_context({"config": str(cfg)}, live=True, env=env)
    res = run_check("host.jit_cache", ctx)
    assert res.status is Status.WARN and res.has("host.jit_cache.volatile"), res.summary
    assert "tmpfs" in res.summary and str(volatile) in res.summary
    assert not volatile.exists(), "check creates nothing"
    plan = fix_plan("host.jit_cache", make_context({"config": str(cfg)}, live=True, env=env))
    argv = [a.argv for a in plan if hasattr(a, "argv")]
    assert ["install", "-d", "-o", ctx.fact("jit_caches")["user"], "-m", "0750", "/var/cache/sglang-k26/triton"] in argv
    writes = [a for a in plan if hasattr(a, "new_text")]
    assert writes and "TRITON_CACHE_DIR=/var/cache/sglang-k26/triton" in writes[0].new_text


def test_jit_cache_on_a_real_directory_passes() -> None:
    """Caches under a home on a persistent disk: the tests' own per-user cache directory (never /tmp, which
    systemd-tmpfiles empties at boot on Debian and Ubuntu); nothing is created there."""
    home = Path(os.environ.get("K26_TEST_WHEEL_CACHE") or Path.home() / ".cache" / "k26-doctor-tests") / "no-home"
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "")}
    res = run_check("host.jit_cache", make_context({}, live=True, env=env))
    assert res.status is Status.PASS and res.has("host.jit_cache.persistent"), res.summary
    assert str(home / ".triton" / "cache") in res.summary and not home.exists()


def test_jit_cache_not_writable_for_the_service_user(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    nobody = "nobody"
    env = {"HOME": str(tmp_path), "TRITON_CACHE_DIR": str(locked / "triton"), "PATH": os.environ.get("PATH", "")}
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\nuser = "{nobody}"\n')
    res = run_check("host.jit_cache", make_context({"config": str(cfg)}, live=True, env=env))
    assert res.has("host.jit_cache.not_writable") and res.status is Status.WARN, res.summary
    assert str(tmp_path) in res.summary


def test_a_cache_that_systemd_tmpfiles_empties_at_boot_is_volatile() -> None:
    """/tmp on a disk is still emptied at every boot where tmpfiles.d says `D /tmp` (Debian, Ubuntu)."""
    from doctor.host.jitcache import boot_wipes, judge_jit_cache, wiped_by

    wipes = boot_wipes({"tmp.conf": "# comment\nD /tmp 1777 root root -\nq /var/tmp 1777 root root 30d\n",
                        "x.conf": "R! /var/cache/old-*\nd /run/lock 0755 root root -\n"})
    assert [w["path"] for w in wipes] == ["/tmp", "/var/cache/old-*"]
    assert wiped_by("/tmp/triton", wipes) == "tmp.conf: D /tmp 1777 root root -"
    assert wiped_by("/var/tmp/triton", wipes) is None and wiped_by("/tmpx/a", wipes) is None
    fact = {"user": "sglang", "caches": {"triton": {
        "path": "/tmp/triton", "var": "TRITON_CACHE_DIR", "from": "TRITON_CACHE_DIR", "exists": True,
        "fstype": "ext4", "mount_point": "/", "writable": True, "wiped_at_boot_by": "tmp.conf: D /tmp"}}}
    found = judge_jit_cache(fact)
    assert [f.code for f in found] == ["host.jit_cache.volatile"] and "systemd-tmpfiles" in found[0].message


def test_the_found_module_is_the_version_and_architecture_asked() -> None:
    from doctor.host.jitcache import module_compiled

    assert module_compiled(["0.7.2/90a/sampling"], "sampling", "0.7.2", "9.0")
    assert not module_compiled(["0.7.2/100a/sampling"], "sampling", "0.7.2", "9.0")
    assert not module_compiled(["0.7.1/90a/sampling"], "sampling", "0.7.2", "9.0")
    assert module_compiled(["0.7.2/90a_100a/norm"], "norm", None, "10.0")


# -- the prewarm never blocks a start -------------------------------------------------------------------------

def _interpreter(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_failing_interpreter_is_said_not_raised(tmp_path: Path) -> None:
    plan = prewarm.plan_prewarm(_interpreter(tmp_path, "echo 'ImportError: no flashinfer' >&2; exit 3"), {},
                                ["sampling"], "/c", "9.0")
    assert plan is not None and plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.env["FLASHINFER_CUDA_ARCH_LIST"] == "9.0"
    run = prewarm.Prewarm(plan).start()
    out = run.finish(30)
    assert not out.ok and "status 3" in out.reason and "no flashinfer" in out.reason
    assert run.log and not Path(run.log).exists()  # its output file goes with it
    missing = prewarm.Prewarm(prewarm.PrewarmPlan([str(tmp_path / "absent")], {}, ["norm"], "/c")).start()
    assert "cannot start" in missing.finish(5).reason


def test_a_hanging_prewarm_is_stopped_at_its_deadline(tmp_path: Path) -> None:
    plan = prewarm.plan_prewarm(_interpreter(tmp_path, "sleep 60"), {}, ["norm"], "/c", "9.0")
    assert plan is not None
    start = time.monotonic()
    out = prewarm.Prewarm(plan).start().finish(0.5)
    assert not out.ok and "not finished" in out.reason and time.monotonic() - start < 10


def test_the_probe_under_an_interpreter_without_flashinfer() -> None:
    """The real probe under this interpreter, which has no FlashInfer: nothing to compile, said so, no warning."""
    plan = prewarm.plan_prewarm(sys.executable, dict(os.environ), ["sampling", "norm"], "/c", "9.0")
    assert plan is not None
    out = prewarm.Prewarm(plan).start().finish(60)
    assert out.ok and "not installed" in out.reason and out.modules == []


FAILING_FLASHINFER = {"__init__.py": "", "jit/__init__.py": "",
                      "jit/norm.py": "class S:\n    def build_and_load(self):\n        raise RuntimeError('no nvcc')\n"
                                     "def gen_norm_module():\n    return S()\n",
                      "jit/sampling.py": "def gen_sampling_module():\n    raise ImportError('no sources')\n"}


def fake_flashinfer(site: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (site / "flashinfer" / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / "flashinfer" / rel).write_text(text)
    return site


def test_the_probe_reports_each_module_that_fails(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path / "site", FAILING_FLASHINFER)
    env = dict(os.environ, PYTHONPATH=str(site))
    plan = prewarm.plan_prewarm(sys.executable, env, ["sampling", "norm"], "/c", "9.0")
    assert plan is not None
    out = prewarm.Prewarm(plan).start().finish(60)
    assert not out.ok and [m["module"] for m in out.modules] == ["sampling", "norm"]
    assert "no sources" in out.modules[0]["error"] and "no nvcc" in out.modules[1]["error"]
    assert "sampling, norm failed" in out.reason


# A FlashInfer whose build runs a driver that, like ninja, starts the compiler in a process group of its own and
# stops it on SIGTERM (a SIGKILL of the driver would leave the compiler running).
DRIVER = """
import os, signal, subprocess, sys
children = []
def stop(*_):
    for c in children:
        os.killpg(c.pid, signal.SIGKILL)
    sys.exit(1)
signal.signal(signal.SIGTERM, stop)  # before the first compiler starts, as ninja does
children.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
with open(os.environ["K26_TEST_PIDFILE"], "w") as fh:
    fh.write(str(children[0].pid))
children[0].wait()
"""
HANGING_NORM = f"""
import subprocess, sys
class Spec:
    def build_and_load(self):
        subprocess.run([sys.executable, "-c", {DRIVER!r}], check=True)
def gen_norm_module():
    return Spec()
"""


def _gone(pid: int, within: float = 15) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("who", ["probe", "doctor"])
def test_a_hung_compiler_is_stopped_at_the_deadline(tmp_path: Path, who: str) -> None:
    """A compiler that hangs never holds a start: at the prewarm's deadline (the probe's own, or the doctor's when
    it stops waiting) the group gets SIGTERM first, so the ninja-like driver stops the compiler it runs in a group
    of its own, then SIGKILL; FlashInfer's lock is released with them."""
    fake_flashinfer(tmp_path / "site", {"__init__.py": "", "jit/__init__.py": "", "jit/norm.py": HANGING_NORM})
    pidfile = tmp_path / "compiler.pid"
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), K26_TEST_PIDFILE=str(pidfile))
    plan = prewarm.plan_prewarm(sys.executable, env, ["norm"], "/c", "9.0",
                                deadline_s=2.0 if who == "probe" else 600)
    assert plan is not None and plan.argv[2] == "--deadline"
    run = prewarm.Prewarm(plan).start()
    if who == "doctor":
        until = time.monotonic() + 30
        while not pidfile.exists() and time.monotonic() < until:
            time.sleep(0.1)
    out = run.finish(30 if who == "probe" else 0.0)
    assert not out.ok and ("deadline reached" in out.reason if who == "probe" else "not finished" in out.reason)
    assert _gone(int(pidfile.read_text())), "the compiler outlived the prewarm's deadline"
    assert run.log and not Path(run.log).exists()


def test_no_prewarm_without_the_architecture() -> None:
    assert prewarm.plan_prewarm(sys.executable, {}, ["norm"], "/c", None) is None
    assert prewarm.plan_prewarm(sys.executable, {"FLASHINFER_CUDA_ARCH_LIST": "9.0a"}, ["norm"], "/c", None)
    assert prewarm.plan_prewarm(sys.executable, {}, [], "/c", "9.0") is None


# -- the record ---------------------------------------------------------------------------------------------------

def test_record_is_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = startplan.record(str(tmp_path), {"n": 1, "args": ["--api-key", "sk-live-1234567890abcdef"]}, now=0)
    assert json.loads(path.read_text())["n"] == 1 and (tmp_path / "start" / "last.json").exists()
    assert "sk-live-1234567890abcdef" not in path.read_text()  # the server arguments' secrets are redacted

    def fail(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    monkeypatch.setattr(os, "rename", fail)
    with pytest.raises(OSError):
        startplan.record(str(tmp_path), {"n": 2}, now=60)
    monkeypatch.undo()
    assert json.loads((tmp_path / "start" / "last.json").read_text())["n"] == 1
    assert sorted(p.name for p in (tmp_path / "start").iterdir()) == ["19700101T000000Z.json", "last.json"]


# -- launch --wait: the plan, the start, the record -------------------------------------------------------------

SERVER = r'''
import sys, time, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
def say(msg):
    sys.stderr.write(time.strftime("[%Y-%m-%d %H:%M:%S] ") + msg + "\n"); sys.stderr.flush()
say("server_args=...")
say("Load weight begin. avail mem=139.13 GB")
say("Load weight end. elapsed=0.17 s, type=DeepseekV3ForCausalLM, avail mem=139.11 GB, mem usage=0.02 GB.")
say("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 9267201, KV size: 39.77 GB")
say("Memory pool end. avail mem=99.24 GB")
say("Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=17, avail mem=89.56 GB")
say("Capture target verify CUDA graph end. bs=[1, 2, 3, 4], elapsed=0.40 s, mem usage=0.25 GB, avail mem=89.31 GB.")
say("Engine startup timings (s): load_weight=0.18")
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
srv = ThreadingHTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
say("The server is fired up and ready to roll!")
time.sleep(1.5)
'''


def _service(tmp_path: Path, prewarm_release: Path | None = None) -> tuple[Path, Path]:
    """A service interpreter whose `-m sglang.launch_server` is SERVER and whose prewarm (a FlashInfer whose builds
    fail) starts once ``prewarm_release`` exists (at most 120 s; at once without one): whether it is still running
    when the server is ready is the test's choice, not the machine's load; and the config of a server on a free
    port."""
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    site = fake_flashinfer(tmp_path / "fi-site", FAILING_FLASHINFER)
    py = tmp_path / "venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    hold = (f'n=0; while [ ! -e {prewarm_release} ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n + 1)); done; '
            if prewarm_release else "")
    py.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then shift 2; '
                  f'exec {sys.executable} {server} "$@"; fi\n'
                  f'case "$1" in *jit_prewarm.py) {hold}export PYTHONPATH={site}:$PYTHONPATH;; esac\n'
                  f'exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\nhost = "127.0.0.1"\nport = {free_port()}\n')
    return py, cfg


def _launch(tmp_path: Path, py: Path, cfg: Path, *gate: str) -> tuple[str, dict]:
    state = tmp_path / "state"
    res = run_doctor("launch", "--config", str(cfg), "--python", str(py), "--model-path", str(tmp_path / "m"),
                     "--draft-model-path", str(tmp_path / "d"), "--state-dir", str(state), *gate,
                     "--no-flag-check", "--wait", "--wait-interval", "0.1",
                     env=doctor_env(FLASHINFER_CUDA_ARCH_LIST="9.0", HOME=str(tmp_path)), timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stderr, json.loads((state / "start" / "last.json").read_text())


def test_launch_wait_prewarms_shows_the_plan_and_records_the_start(tmp_path: Path) -> None:
    """`launch --wait` with a gate (one check, which passes): the prewarm runs under the service's interpreter
    beside the check and fails there (no FlashInfer): said, and the server starts anyway; the plan is shown before
    the start; once /health answers 200 the actual parts are printed against the plan and recorded."""
    py, cfg = _service(tmp_path)
    err, entry = _launch(tmp_path, py, cfg, "--only", "host.port")
    assert "prewarm: compiling the JIT modules" in err and "warning: prewarm:" in err and "the start goes on" in err
    assert err.index("prewarm: compiling") < err.index("host.port") < err.index("start plan: healthy about")
    assert err.index("start plan: healthy about") < err.index("exec:") < err.index("server ready")
    assert "start plan against the start" in err and "Load weight end" in err  # the server's lines pass through
    assert entry["actual"]["parts"]["weights"] == 0.17 and entry["actual"]["captures"][0]["sizes"] == 4
    assert entry["ready_after_s"] > 0 and entry["prewarm"]["ok"] is False
    assert {r["part"] for r in entry["comparison"]} >= {"startup", "weights", "graphs+kernels+jit", "total"}


def test_without_a_gate_the_prewarm_goes_on_beside_the_server(tmp_path: Path) -> None:
    """`launch --no-check` (the unit's ExecStart): nothing to overlap the prewarm with but the server's own
    start-up, so it is left running beside the server, never waited for; the plan counts what is left of it."""
    release = tmp_path / "release-prewarm"
    py, cfg = _service(tmp_path, prewarm_release=release)
    err, entry = _launch(tmp_path, py, cfg, "--no-check")
    assert "goes on beside the server" in err and entry["inputs"]["flashinfer"]["building"]["modules"]
    log = err.split("(log: ", 1)[1].split(")", 1)[0]
    assert Path(log).exists(), "the prewarm still runs beside the ready server: its log is kept"
    release.touch()
    deadline = time.monotonic() + 60  # it ends by itself (FlashInfer is absent here)
    while time.monotonic() < deadline and '"modules"' not in Path(log).read_text():
        time.sleep(0.2)
    assert '"modules"' in Path(log).read_text()
    Path(log).unlink()
