"""Child processes with deadlines: the only way to bound a call that may hang in C.

A thread blocked in a driver call cannot be killed; a process can. Everything that imports
torch/triton/sglang, calls a compiler, or may hang in a driver runs through here, in its own
process group, and the whole group is killed at the deadline so that nothing outlives ``check``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROBES_DIR = Path(__file__).resolve().parents[1] / "probes"


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
        return self.returncode == 0 and not self.timed_out and self.start_error is None

    def why(self) -> str:
        """One line saying how it went wrong, for a result summary."""
        if self.start_error:
            return f"could not start {self.argv[0]}: {self.start_error}"
        if self.timed_out:
            return f"{Path(self.argv[0]).name} did not finish within {self.extra.get('timeout')}s (killed)"
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
    """Run ``argv`` (no shell) with a hard deadline; kill its whole process group when late."""
    started = start(argv, env=env, cwd=cwd, with_input=input is not None)
    if isinstance(started, CommandResult):
        return started
    return finish(started, timeout, input=input)


@dataclass
class Started:
    """A child ``start`` began: ``finish`` waits for it."""

    proc: subprocess.Popen[str]
    argv: list[str]
    began: float


def start(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
          with_input: bool = False) -> Started | CommandResult:
    """Start ``argv`` in a process group of its own (``finish`` waits for it); a ``CommandResult`` when it
    cannot start. For children that run side by side: start them all, then finish each."""
    began = time.monotonic()
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
    return Started(proc, list(argv), began)


def finish(started: Started, timeout: float, *, input: str | None = None) -> CommandResult:
    """Wait for a ``start``ed child at most ``timeout`` seconds; past it, its whole process group is killed."""
    proc, argv, began = started.proc, started.argv, started.began
    try:
        out, err = proc.communicate(input=input, timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = _drain(proc)
        return CommandResult(argv, None, out, err, timed_out=True,
                             duration_s=time.monotonic() - began, extra={"timeout": timeout})
    except BaseException:  # KeyboardInterrupt: leave nothing behind
        _kill_group(proc)
        raise
    return CommandResult(argv, proc.returncode, out, err, duration_s=time.monotonic() - began)


def _kill_group(proc: subprocess.Popen[str]) -> None:
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
    res.returncode = res.returncode if res.returncode else -1
    res.stderr = (res.stderr + "\nprobe printed no JSON result").strip()
    return None, res
