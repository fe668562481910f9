"""Shared test helpers: GPU detection for ``@pytest.mark.gpu``, a runner for the CLI as users run it."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import downloads
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bytecode() -> None:
    """Compiled modules for this process and every interpreter the tests start.

    Most tests run the doctor as users run it, a new interpreter each time. With ``PYTHONDONTWRITEBYTECODE`` in
    the caller's environment each of those starts compiles every module of the doctor again
    (``bench/bench_startup.py``: ``list`` 457 ms against 242 ms with bytecode), and pytest rewrites every test
    module again. Bytecode goes where Python puts it (``__pycache__``, which git ignores and
    ``test_check_changes_nothing`` does not count), or under the ``PYTHONPYCACHEPREFIX`` the caller set."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


_bytecode()


def _one_thread_per_worker() -> None:
    """Under pytest-xdist, torch's OpenMP and MKL pools one thread wide in each worker and the children it starts.

    The suite runs one worker per core, and the probes that compute (the patched kernels in Triton's interpreter,
    the KV accounting, the trained drafter pair) each start a pool as wide as the machine: two of them at once on
    2 cores run four threads whose barriers wait on each other (the four SGLang probes together: 114 s of CPU
    against 91 s with one thread each, 78 s against 65 s on the clock). A value the caller set is kept; ``-n 0``
    (one process, the GPU tests' way) keeps torch's default."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")


_one_thread_per_worker()


def interruptible() -> None:
    """``preexec_fn`` of a child a test interrupts: SIGINT as a terminal gives it (default, not blocked).

    A suite started where SIGINT is ignored (``nohup ... &``, ``(trap '' INT; pytest)``, a CI runner) hands that
    to every child: an ignored signal stays ignored across exec, and Python then installs no KeyboardInterrupt
    handler, so a test's Ctrl-C reaches a doctor that never hears it. A blocked one is inherited the same way."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (a runner may hand an ignored SIGTERM down too)


def signal_once_started(argv: list[str], started: Path, signum: int, *, env: dict[str, str],
                        cwd: Path | None = None, what: str = "the child") -> subprocess.CompletedProcess[str]:
    """``argv`` started as a terminal starts it (``interruptible``), sent ``signum`` once ``started`` exists (the
    child's own marker that it reached the point under test: at most 120 s, however slow the host), then read to
    its end (60 s at most); never left running."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            stdin=subprocess.DEVNULL, preexec_fn=interruptible)
    try:
        until = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < until:
            time.sleep(0.05)
        assert started.exists(), proc.communicate(timeout=30) if proc.poll() is not None else f"{what} never started"
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _session_interruptible() -> None:
    """The same for this process, so that every child it starts (xdist's workers, the doctor) inherits it."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_session_interruptible()  # default dispositions however the suite was started
# The environment as the session started, before any test module or test ran: what the probes whose results the
# test cache keeps get (interpreters.probe_env), so that a variable a library sets in this process when a test
# imports it (SGLang's modules set some of theirs) reaches neither their children nor their results' keys.
SESSION_ENV: dict[str, str] = dict(os.environ)


@functools.lru_cache(maxsize=1)
def nvidia_gpu_count() -> int:
    """GPUs NVML sees (0 without driver/library); probed in a child with a deadline so a bad driver can't hang."""
    code = ("import pynvml\ntry:\n pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())\n"
            "except Exception:\n print(0)\n")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
        return int((out.stdout.strip() or "0").splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return 0


def _deselects_network(markexpr: str) -> bool:
    """Whether ``-m EXPR`` leaves out a test marked only ``network`` (``not network``, ``not network and ...``)."""
    if not markexpr.strip():
        return False
    try:
        from _pytest.mark.expression import Expression

        return not Expression.compile(markexpr).evaluate(lambda name, **_: name == downloads.MARK)
    except Exception:  # another pytest's private API: read the expression as text
        return f"not {downloads.MARK}" in " ".join(markexpr.split())


def pytest_configure(config: pytest.Config) -> None:
    """The first run's downloads (tests/downloads.py): refused when ``network`` is deselected, announced on
    the terminal past pytest's capture otherwise."""
    downloads.current["offline"] = _deselects_network(config.getoption("markexpr", "") or "")

    def write(text: str) -> None:
        capture = config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    downloads._writer[:] = [write]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: which test reads the first run's downloads, and whether it may."""
    downloads.current["nodeid"] = item.nodeid
    downloads.current["marked"] = item.get_closest_marker(downloads.MARK) is not None


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` (pyproject's addopts): the longest work first, a file split where its tests share
    nothing (tests/scheduling.py). Any other ``--dist`` is xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    import scheduling

    return scheduling.make_scheduler(config, log)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per core and one more (pyproject's ``--maxprocesses=4`` still caps it).

    Many tests wait on a child or a deadline (a hung probe, a server that never answers, a drain that settles), and
    a worker per core leaves that core idle meanwhile: on 2 cores the suite used 1.74 of them. A third worker runs
    while another waits (on 15 of the slowest files, 156 s -> 142 s, every test passing). ``-n logical`` and
    ``$PYTEST_XDIST_AUTO_NUM_WORKERS`` are xdist's own."""
    if config.option.numprocesses != "auto" or os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    from doctor.model.workers import cpu_count

    return cpu_count() + 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if nvidia_gpu_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with NVML")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Test files whose every test must run in CI (.ci/run installs what they need): there a skip of one of their
# tests that is not marked ``gpu`` is turned into a failure, so a missing install cannot pass as green.
# test_fleet_: node_exporter, promtool, munge + Slurm, the kubernetes client (apt packages and the test extra).
CI_MUST_RUN = ("test_ddtree_", "test_fleet_")


def _must_run_in_ci(path: Path, keywords) -> bool:
    return bool(os.environ.get("CI")) and path.name.startswith(CI_MUST_RUN) and "gpu" not in keywords


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and not hasattr(rep, "wasxfail") and _must_run_in_ci(item.path, item.keywords):
        reason = rep.longrepr[-1] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped under CI, where .ci/run installs what it needs: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    outcome = yield
    rep = outcome.get_result()
    path = getattr(collector, "path", None)
    if rep.skipped and isinstance(collector, pytest.Module) and path and _must_run_in_ci(path, ()):
        reason = rep.longrepr[-1] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"module skipped under CI, where .ci/run installs what it needs: {reason}"


def doctor_env(**extra: str) -> dict[str, str]:
    """An environment for running the doctor as a subprocess from this checkout, deterministic."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + extra.pop("PYTHONPATH") if "PYTHONPATH" in extra else "")
    env.pop("K26_DOCTOR_CONFIG", None)
    env["NO_COLOR"] = "1"
    env.update(extra)
    return env


def run_doctor(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
               input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m doctor ARGS`` as a user would run it (a child process, real exit code)."""
    return subprocess.run([sys.executable, "-m", "doctor", *args], capture_output=True, text=True,
                          env=env or doctor_env(), timeout=timeout, input=input,
                          stdin=None if input is not None else subprocess.DEVNULL)


@pytest.fixture
def doctor() -> object:
    return run_doctor


# What a build leaves in a source tree, and what .gitignore keeps out of a checkout.
_NOT_SOURCE = shutil.ignore_patterns(".git", "__pycache__", "*.py[cod]", "*.egg-info", "build", "dist", ".tox", ".venv",
                                     ".pytest_cache", ".ruff_cache", ".hypothesis", ".benchmarks", ".whl", ".cache",
                                     ".gpu", ".payload")


def source_copy(src: Path, dest: Path) -> Path:
    """A copy of the source tree ``src`` (a checkout as git would give it) to build from: setuptools writes
    ``build/`` and ``*.egg-info`` into the tree it builds, and tests running in parallel
    (tests/test_check_changes_nothing.py) must see this checkout unchanged."""
    shutil.copytree(src, dest, ignore=_NOT_SOURCE, symlinks=True)
    return dest


# -- what a check sees: the one way tests build it --------------------------------------------------------------

def make_context(flags: Any = None, *, facts: dict[str, Any] | None = None, live: bool = False,
                 env: dict[str, str] | None = None, collectors: dict[str, Any] | None = None) -> Any:
    """A check's world as the CLI builds it: ``flags`` resolved against the profile and the config (flags >
    config > profile; ``K26_DOCTOR_CONFIG`` and ``/etc`` play no part; or ``Settings`` already resolved), with
    the run's facts replayed from
    ``facts`` as a snapshot would give them (a fact not in it is "not recorded"), or, with ``live=True``,
    collected on first use with ``facts`` mixed in as recorded readings (``FactStore.seed``). ``env``: the
    environment collectors see (default: this process's)."""
    from doctor.app import KNOWLEDGE, planned_server
    from doctor.core.context import Context
    from doctor.core.settings import Settings, resolve
    from doctor.facts.store import CollectOptions, FactStore

    settings = flags if isinstance(flags, Settings) else resolve(dict(flags or {}), environ={})
    opts = CollectOptions.from_settings(settings)
    if env is not None:
        opts.env = dict(env)
    snapshot = None if live else {"kind": "k26-doctor-snapshot", "schema_version": 1, "facts": dict(facts or {})}
    store = FactStore(opts, snapshot=snapshot, collectors=collectors)
    for name, value in (facts or {}).items() if live else ():
        store.seed(name, value)
    return Context(settings, store, planned_server, knowledge=dict(KNOWLEDGE))


def run_check(check_id: str, ctx: Any, registry: Any = None) -> Any:
    """One check run by the real runner (``doctor.core.runner.execute``) in ``ctx``: its own view of the facts,
    every way it can go wrong a result."""
    from doctor.core.registry import load
    from doctor.core.runner import execute

    return execute((registry or load(plugins=False)).checks[check_id], ctx)


def fix_plan(check_id: str, ctx: Any, registry: Any = None) -> Any:
    """The plan of ``check_id``'s fixer for the check's real result in ``ctx`` (the check run by the runner; the
    fixer sees what ``fix`` gives it: that result, with its findings, and the facts it may read). Asked whatever
    the check said, so that a test shows the fixer itself plans nothing for a result it does not fix."""
    from doctor.core.actions import Plan
    from doctor.core.registry import load

    reg = registry or load(plugins=False)
    chk = reg.checks[check_id]
    res = run_check(check_id, ctx, reg)
    return Plan.of(reg.fixers[chk.fixer].plan(ctx.view(reg.fact_needs(chk)), res))


# -- the site plugin, installed as a real distribution (the plugin tests of several files share it) ------------

@pytest.fixture(scope="session")
def plugin_site() -> str:
    """The site plugin built into a wheel and installed (a real distribution with an entry point): once per
    plugin source and interpreter into the test cache (``sglang_wheels.built_once``), reused by every test
    process and later runs; the tests only read it."""
    import sglang_wheels
    from interpreters import identity

    plugin = ROOT / "tests" / "fixtures" / "site_plugin"

    def build(site: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="k26-plugin-") as tmp:
            work = Path(tmp)
            wheels = work / "wheels"
            src = source_copy(plugin, work / "src")  # the build writes into it
            res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                                  "-w", str(wheels), str(src)], capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, res.stderr
            (whl,) = wheels.glob("k26_site_checks-1.0.0-*.whl")
            res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                                  str(whl)], capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, res.stderr

    site = sglang_wheels.built_once("site-plugin", [plugin], build, extra=identity(sys.executable))
    assert list(site.glob("k26_site_checks-1.0.0.dist-info/entry_points.txt"))
    return str(site)


def penv(site: str, **extra: str) -> dict[str, str]:
    return doctor_env(PYTHONPATH=site, **extra)


def schema() -> dict:
    return json.loads((ROOT / "doctor" / "report" / "report.schema.json").read_text())
