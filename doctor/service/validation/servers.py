"""The servers of a validation: each started exactly as ``launch`` starts the profile's server (one builder,
``doctor.service.launcher.build_plan``), with the speculative algorithm, budget and port of its role, in a
process group of its own, its output in a log file; stopped with SIGTERM to the group, then SIGKILL.

Only the DDTREE servers of a validation get ``SGLANG_DDTREE_UNVALIDATED_WORKER=1`` (the configuration is what is
being validated); the profile's own environment never needs it.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from doctor.core import proc
from doctor.core.settings import Settings
from doctor.service.launcher import LaunchPlan, build_plan
from doctor.service.readiness import ReadyOutcome, health_url, wait_ready

OPT_IN = "SGLANG_DDTREE_UNVALIDATED_WORKER"
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class Role:
    """One server of a validation: ``base`` (no speculation), ``dflash`` or ``ddtree-<budget>``."""

    name: str
    algorithm: str | None
    budget: int | None = None

    @property
    def is_ddtree(self) -> bool:
        return self.algorithm == "DDTREE"


def roles(budgets: list[int]) -> list[Role]:
    """The base server, DFLASH, then DDTREE at each budget: the order a sequential validation runs them."""
    return [Role("base", None), Role("dflash", "DFLASH")] + [Role(f"ddtree-{b}", "DDTREE", b) for b in budgets]


def role_settings(settings: Settings, role: Role, port: int) -> Settings:
    """The profile's settings with the role's algorithm, budget and port; everything else as ``launch`` has it."""
    out = copy.deepcopy(settings)
    server = dict(out.profile.get("server") or {})
    server.pop("speculative_algorithm", None)
    server.pop("ddtree_budget", None)
    if role.algorithm:
        server["speculative_algorithm"] = role.algorithm
    if role.budget is not None:
        server["ddtree_budget"] = role.budget
    server["port"] = port
    out.profile = {**out.profile, "server": server}
    return out


def role_plan(settings: Settings, role: Role, port: int, extra: list[str] | tuple[str, ...] = (),
              environ: dict[str, str] | None = None) -> LaunchPlan:
    """The role's server command and environment (``launch``'s builder), the opt-in on DDTREE's alone."""
    plan = build_plan(role_settings(settings, role, port), list(extra), environ=environ)
    plan.env.pop(OPT_IN, None)
    if role.is_ddtree:
        plan.env[OPT_IN] = "1"
    return plan


class Server:
    """A started server: its process (leader of its own group), log and health URL."""

    def __init__(self, role: Role, plan: LaunchPlan, port: int, host: str, log_path: Path) -> None:
        self.role, self.plan, self.port, self.log_path = role, plan, port, log_path
        self.url = health_url(host, port, "/").rstrip("/")
        self.proc: subprocess.Popen[Any] | None = None
        self.started = 0.0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.plan.argv, env=self.plan.env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        proc.track(self.proc)
        self.started = time.monotonic()

    def wait_healthy(self, timeout_s: float, progress: IO[str] | None) -> ReadyOutcome:
        assert self.proc is not None
        return wait_ready(self.url + "/health", timeout_s, interval_s=1.0, exited=self.proc.poll, progress=progress)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after ``grace_s``; then SIGKILL to whatever of the
        group is left (a scheduler child that outlived its leader still holds GPU memory). Its exit status."""
        p = self.proc
        if p is None:
            return None
        try:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    p.terminate()
                try:
                    p.wait(grace_s)
                except subprocess.TimeoutExpired:
                    proc.kill_group(p)
                    p.wait()
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        finally:
            proc.untrack(p)
        return p.returncode

    def log_tail(self, limit: int = 4000) -> str:
        from doctor.core.fileio import read_or_none

        data = read_or_none(self.log_path, 64 << 20) or b""
        return data[-limit:].decode("utf-8", "replace")


def start_server(settings: Settings, role: Role, port: int, extra: list[str] | tuple[str, ...], log_dir: Path,
                 launcher: Callable[[Server], None] | None = None) -> Server:
    """Build and start the role's server (``launcher``: a test's replacement of ``Server.start``)."""
    host = str(settings.server.host)
    server = Server(role, role_plan(settings, role, port, extra), port, host, log_dir / f"{role.name}.log")
    (launcher or Server.start)(server)
    return server
