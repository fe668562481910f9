"""FlashInfer's JIT modules (and SGLang's DDTree tree kernels) compiled ahead, in parallel with ``launch``'s checks:
the start's avoidable minutes.

A DFLASH/DDTREE server compiles FlashInfer's ``sampling`` module at its first start on a cache without it (~107 s
on the H200) and every server compiles ``norm`` (~40 s), after the weights loaded, at the worst moment. ``launch``
starts ``doctor/probes/jit_prewarm.py`` under the service's interpreter (``--python``) with the service's
environment (so into the very cache the server will read) while its checks run, then waits for it at most until
its deadline. The GPU is not touched: the devices are hidden and the architecture named
(``FLASHINFER_CUDA_ARCH_LIST``), which FlashInfer reads instead of asking a device.

A failed or unfinished prewarm never blocks a start that the checks allow: it is said, and the start goes on (the
server compiles what is missing, waiting on FlashInfer's own lock for a build still running). ``check`` never
prewarms (it changes nothing).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from doctor.core import proc
from doctor.core.fileio import read_text

PROBE = proc.PROBES_DIR / "jit_prewarm.py"
DEFAULT_WAIT_S = 600.0  # the prewarm's deadline when the launch has none (--timeout)


@dataclass
class PrewarmPlan:
    """What the prewarm runs: the command, the environment, the modules, where they go."""

    argv: list[str]
    env: dict[str, str]
    modules: list[str]
    cache: str

    def describe(self) -> list[str]:
        """The plan, shown before anything runs."""
        return [f"prewarm: compiling the JIT modules {', '.join(self.modules)} (FlashInfer's into {self.cache}) "
                f"while the checks run, one process each (GPU not used; what is not done by the start goes on beside "
                f"the server, which waits on FlashInfer's lock for a module being built; a failure does not stop the "
                f"start): {shlex.join(self.argv)}"]


@dataclass
class PrewarmOutcome:
    ok: bool
    reason: str
    modules: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    absent: bool = False  # FlashInfer is not installed in the service's environment


def arch_list(compute_capability: str | None) -> str | None:
    """``FLASHINFER_CUDA_ARCH_LIST`` for a GPU of this compute capability ("9.0" -> "9.0"; FlashInfer adds the
    architecture suffix as it does for a device), None when not known."""
    if not compute_capability:
        return None
    parts = compute_capability.strip().split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return compute_capability.strip()


def plan_prewarm(python: str, env: dict[str, str], modules: list[str], cache: str,
                 compute_capability: str | None, deadline_s: float = DEFAULT_WAIT_S) -> PrewarmPlan | None:
    """The prewarm of ``modules`` under ``python`` with the service's ``env``, which stops itself (its whole process
    group) after ``deadline_s``; None when nothing is to be compiled or the GPU's architecture is not known
    (FlashInfer would then ask a device, which the checks must not see)."""
    if not modules:
        return None
    run_env = dict(env)
    if not run_env.get("FLASHINFER_CUDA_ARCH_LIST"):
        arch = arch_list(compute_capability)
        if arch is None:
            return None
        run_env["FLASHINFER_CUDA_ARCH_LIST"] = arch
    run_env["CUDA_VISIBLE_DEVICES"] = ""
    run_env["PYTHONDONTWRITEBYTECODE"] = "1"
    return PrewarmPlan([python, str(PROBE), "--deadline", f"{deadline_s:g}", *modules], run_env, list(modules), cache)


class Prewarm:
    """A running prewarm: ``start`` it, then ``finish(wait_s)`` or ``detach()``. Its own process group, registered
    with ``doctor.core.proc`` (killed if the doctor exits first) until detached. Its output goes to a file (the
    ``log``), never a pipe: a prewarm left running beside the server outlives the doctor's exec."""

    def __init__(self, plan: PrewarmPlan) -> None:
        self.plan = plan
        self.child: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.error: str | None = None
        self.log: str | None = None

    def start(self, log_dir: str | None = None) -> Prewarm:
        self.started = time.monotonic()
        try:
            fd, self.log = tempfile.mkstemp(prefix="k26-prewarm-", suffix=".log", dir=log_dir)
        except OSError:
            fd, self.log = tempfile.mkstemp(prefix="k26-prewarm-", suffix=".log")
        try:
            self.child = subprocess.Popen(self.plan.argv, env=self.plan.env, stdin=subprocess.DEVNULL, stdout=fd,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            self.error = f"cannot start {self.plan.argv[0]}: {exc.strerror or exc}"
            self._drop_log()
            return self
        finally:
            os.close(fd)
        proc.track(self.child)
        return self

    def running(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def detach(self) -> None:
        """Leave it running beside the server (FlashInfer's lock makes the server wait for a module being built
        rather than build it twice): no longer killed when the doctor exits."""
        if self.child is not None:
            proc.untrack(self.child)

    def _drop_log(self) -> None:
        if self.log:
            try:
                os.unlink(self.log)
            except OSError:
                pass

    def output(self) -> str:
        try:
            return read_text(self.log, 1 << 20, "the prewarm's log", errors="replace") if self.log else ""
        except OSError:
            return ""

    def outcome_if_done(self) -> PrewarmOutcome | None:
        """The outcome once it has ended on its own (never waits, never stops it); None while it runs."""
        if self.child is not None and self.child.poll() is None:
            return None
        return self.finish(0.0)

    def finish(self, wait_s: float) -> PrewarmOutcome:
        """Wait at most ``wait_s`` more; a prewarm still running then is stopped. Never raises."""
        if self.child is None:
            return PrewarmOutcome(False, self.error or "not started")
        try:
            self.child.wait(timeout=max(0.0, wait_s))
        except subprocess.TimeoutExpired:
            stop_group(self.child)
            proc.untrack(self.child)
            self._drop_log()
            return PrewarmOutcome(False, f"not finished within its deadline ({wait_s:.0f} s left): stopped; the "
                                  "server compiles what is missing", seconds=time.monotonic() - self.started)
        proc.untrack(self.child)
        took = time.monotonic() - self.started  # until now: for a prewarm read after the start, not its own time
        out = self.output()
        self._drop_log()
        result = _last_json(out)
        took = _own_time(result, took)
        if self.child.returncode != 0 or result is None:
            tail = out.strip().splitlines()[-1:] or [""]
            return PrewarmOutcome(False, f"{self.plan.argv[0]} exited with status {self.child.returncode}"
                                  + (f": {tail[0][-300:]}" if tail[0] else ""), seconds=took)
        if result.get("absent"):
            return PrewarmOutcome(True, "FlashInfer is not installed in the service's environment: nothing to compile",
                                  seconds=took, absent=True)
        mods = [m for m in result.get("modules") or [] if isinstance(m, dict)]
        failed = [m for m in mods if not m.get("ok")]
        done = ", ".join(f"{m.get('module')} {m.get('seconds')} s" for m in mods if m.get("ok"))
        absent = bool(result.get("flashinfer_absent"))  # SGLang's modules built, FlashInfer not installed
        if failed:
            return PrewarmOutcome(False, f"{', '.join(str(m.get('module')) for m in failed)} failed: "
                                  f"{last_line(failed[0].get('error'))}" + (f" (built: {done})" if done else ""),
                                  mods, took, absent)
        return PrewarmOutcome(True, f"built or found {done} in {took:.0f} s", mods, took, absent)


def _own_time(result: dict[str, Any] | None, waited: float) -> float:
    """The prewarm's own time, start to end, as its probe reports it (``wall_s``); else ``waited``, the time until
    it was read (for a prewarm left beside the server: after the server's /health 200, not its own time)."""
    wall = (result or {}).get("wall_s")
    if not isinstance(wall, (int, float)) or isinstance(wall, bool):
        return waited
    try:
        own = float(wall)  # a 400-digit integer raised OverflowError here: launch's traceback at its start
    except OverflowError:
        return waited
    # the probe started after the doctor's clock did: its own time is finite and within the time waited
    return own if math.isfinite(own) and 0.0 <= own <= waited + 1.0 else waited


GRACE_S = 5.0


def stop_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the prewarm's process group, so that ninja stops the compilers it runs in process groups of their
    own (a SIGKILL would leave them compiling), then SIGKILL to what is left; reaped."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    end = time.monotonic() + GRACE_S
    try:
        child.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    while time.monotonic() < end:  # the rest of the group (ninja) stops its compilers, then itself
        try:
            os.killpg(child.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.05)
    proc.kill_group(child)
    child.wait()


def last_line(text: Any) -> str:
    """The last non-empty line of a build's error (ninja's "FAILED: ..." output runs to pages), at most 300 chars."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return (lines[-1] if lines else "")[-300:]


def _last_json(text: str | None) -> dict[str, Any] | None:
    for line in reversed((text or "").strip().splitlines()):
        if line.strip().startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None
