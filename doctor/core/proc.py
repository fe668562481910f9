"""Child processes with deadlines: the only way to bound a call that may hang in C.

A thread blocked in a driver call cannot be killed; a process can. Everything that imports
torch/triton/sglang, calls a compiler, or may hang in a driver runs through here, in its own
process group, and the whole group is killed at the deadline so that nothing outlives ``check``.

Every deadline is also bounded by the run's (``doctor.core.deadline``): a probe started by a check that is
late, or by fix planning after the checks, never runs past the run; one that would start after the run's
deadline is not started. Every live child is registered: ``kill_all`` (called when the CLI exits, and at
interpreter exit) kills the process groups still running, e.g. the probe of a check abandoned at its
deadline, so no process outlives the doctor.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.core import deadline

PROBES_DIR = Path(__file__).resolve().parents[1] / "probes"
_LIVE: dict[int, subprocess.Popen[Any]] = {}  # pid -> child (its own process group), while it may run
_LIVE_LOCK = threading.Lock()


def track(proc: subprocess.Popen[Any]) -> None:
    """Register a child that ``kill_all`` must not leave behind (``run`` does it for its own)."""
    with _LIVE_LOCK:
        _LIVE[proc.pid] = proc


def untrack(proc: subprocess.Popen[Any]) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(proc.pid, None)


def kill_all() -> int:
    """Kill every registered child still running (its whole process group); how many were. Never raises."""
    with _LIVE_LOCK:
        live = list(_LIVE.values())
        _LIVE.clear()
    killed = 0
    for proc in live:
        if proc.poll() is None:
            kill_group(proc)
            killed += 1
        try:
            proc.wait(timeout=1)
        except (subprocess.TimeoutExpired, OSError):
            pass
    return killed


atexit.register(kill_all)


@dataclass
class CommandResult:
    argv: list[str]
    returncode: int | None  # None when it timed out or could not start
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    start_error: str | None = None  # e.g. "No such file or directory: /opt/venv/bin/python"
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and not self.timed_out and self.start_error is None
                and not self.extra.get("no_result"))

    def why(self) -> str:
        """One line saying how it went wrong, for a result summary."""
        if self.start_error:
            return f"could not start {self.argv[0]}: {self.start_error}"
        if self.timed_out and self.extra.get("not_started"):
            return f"{Path(self.argv[0]).name} was not started: {self.extra['not_started']}"
        if self.timed_out:
            return f"{Path(self.argv[0]).name} did not finish within {self.extra.get('timeout')}s (killed)"
        if self.extra.get("no_result"):
            return (f"{self.argv[0]} exited with {self.returncode} and printed no probe result: it is not a "
                    "Python interpreter that runs the doctor's probe scripts")
        tail = (self.stderr or self.stdout).strip().splitlines()
        last = tail[-1] if tail else ""
        return f"{Path(self.argv[0]).name} exited with {self.returncode}" + (f": {last}" if last else "")


def run(
    argv: list[str],
    timeout: float,
    *,
    env: dict[str, str] | None = None,
    input: str | None = None,
    cwd: str | None = None,
) -> CommandResult:
    """Run ``argv`` (no shell) with a hard deadline (bounded by the run's); kill its whole process group
    when late. After the run's deadline nothing is started (``timed_out``, ``extra["not_started"]``)."""
    if deadline.clip(timeout) <= 0:
        return CommandResult(list(argv), None, timed_out=True, extra={"timeout": 0, "not_started": deadline.ended()})
    started = start(argv, env=env, cwd=cwd, with_input=input is not None)
    if isinstance(started, CommandResult):
        return started
    return finish(started, timeout, input=input)


@dataclass
class Started:
    """A child ``start`` began (registered for ``kill_all``): ``finish`` waits for it."""

    proc: subprocess.Popen[str]
    argv: list[str]
    began: float


def start(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
          with_input: bool = False) -> Started | CommandResult:
    """Start ``argv`` in a process group of its own (``finish`` waits for it); a ``CommandResult`` when it
    cannot start, or when the run's deadline has passed. For children that run side by side: start them all,
    then finish each."""
    began = time.monotonic()
    if deadline.clip(1.0) <= 0:
        return CommandResult(list(argv), None, timed_out=True, extra={"timeout": 0, "not_started": deadline.ended()})
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if with_input else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(list(argv), None, start_error=exc.strerror or str(exc),
                             duration_s=time.monotonic() - began)
    track(proc)
    return Started(proc, list(argv), began)


def finish(started: Started, timeout: float, *, input: str | None = None) -> CommandResult:
    """Wait for a ``start``ed child at most ``timeout`` seconds (bounded by the run's deadline); past it, its
    whole process group is killed."""
    proc, argv, began = started.proc, started.argv, started.began
    timeout = max(0.0, deadline.clip(timeout))
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = _drain(proc)
        return CommandResult(argv, None, out, err, timed_out=True,
                             duration_s=time.monotonic() - began, extra={"timeout": round(timeout, 2)})
    except BaseException:  # KeyboardInterrupt: leave nothing behind
        kill_group(proc)
        raise
    finally:
        untrack(proc)
    return CommandResult(argv, proc.returncode, out, err, duration_s=time.monotonic() - began)


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL ``proc``'s process group (it leads one: ``start_new_session``) and ``proc`` itself; a group or
    process already gone is no error. The caller reaps it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def _drain(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=2)
    except (subprocess.TimeoutExpired, ValueError):
        return "", ""
    return out or "", err or ""


def run_probe(
    python: str,
    probe: str,
    args: list[str] | None = None,
    *,
    timeout: float,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any] | None, CommandResult]:
    """Run ``doctor/probes/<probe>.py`` under the service's interpreter and parse its JSON.

    Probes are standalone scripts (stdlib only, Python 3.8+): the service's environment does not
    have k26-doctor installed. A probe prints exactly one JSON object on its last stdout line.
    Returns ``(data or None, CommandResult)``; ``None`` means it failed (see ``CommandResult.why``).
    """
    script = PROBES_DIR / f"{probe}.py"
    # -I would drop PYTHONPATH the service may rely on; -s/-E too. Keep the environment as the
    # service would see it, but never write bytecode next to the service's files.
    run_env = dict(os.environ if env is None else env)
    run_env["PYTHONDONTWRITEBYTECODE"] = "1"
    # What the service's libraries leave in the temporary directory when imported (torch's inductor
    # cache directory, Triton's build directories) goes to a directory of the probe's own, removed after:
    # `check` leaves nothing behind.
    scratch = tempfile.mkdtemp(prefix="k26-probe-", dir=run_env.get("TMPDIR") or None)
    run_env["TMPDIR"] = scratch
    try:
        res = run([python, str(script), *(args or [])], timeout, env=run_env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not res.ok:
        return None, res
    for line in reversed(res.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line), res
            except json.JSONDecodeError:
                break
    res.extra["no_result"] = True  # e.g. --python /bin/true: exit 0, nothing printed
    return None, res
