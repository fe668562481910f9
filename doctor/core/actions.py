"""The changes a fixer may make, each able to say exactly what it will do before doing it.

mlenvdoctor-style: ``describe()`` is the plan (commands, files, diffs); ``apply()`` does it.
Every file change keeps a backup and goes through a temporary file, fsync and rename, so a file
is either as it was or as planned, even when interrupted.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import os
import shlex
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.core import proc
from doctor.core.fileio import DEFAULT_LIMIT, atomic_write, read_capped, read_text


class ActionError(Exception):
    """An action could not be applied; the message says why and what was left as it was."""


@dataclass
class Action:
    """One change. Subclasses set ``summary`` and implement ``details`` and ``apply``."""

    summary: str
    needs_root: bool = False

    def details(self) -> list[str]:
        """Lines shown under the summary in the plan (a diff, a command line...)."""
        return []

    def apply(self, backup_dir: Path) -> str:
        """Do it; return one line saying what was done. Raise ``ActionError`` on failure."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, object]:
        return {"kind": type(self).__name__, "summary": self.summary, "details": self.details(),
                "needs_root": self.needs_root}


@dataclass
class RunCommand(Action):
    argv: list[str] = field(default_factory=list)
    timeout: float = 900.0
    env: dict[str, str] | None = None

    def details(self) -> list[str]:
        return ["$ " + shlex.join(self.argv)]

    def apply(self, backup_dir: Path) -> str:
        if self.needs_root and os.geteuid() != 0:
            raise ActionError(f"needs root: run `sudo {shlex.join(self.argv)}` or the fixer as root")
        env = None
        if self.env:
            env = dict(os.environ)
            env.update(self.env)
        res = proc.run(self.argv, self.timeout, env=env)
        if not res.ok:
            raise ActionError(f"`{shlex.join(self.argv)}` failed: {res.why()}")
        return f"ran `{shlex.join(self.argv)}`"


@dataclass
class WriteFile(Action):
    """Replace (or create) a text file atomically, with a backup of the old content."""

    path: str = ""
    new_text: str = ""
    mode: int | None = None

    def old_text(self) -> str | None:
        try:
            return read_text(self.path, DEFAULT_LIMIT, "a text file to rewrite")
        except FileNotFoundError:
            return None

    def details(self) -> list[str]:
        old = self.old_text()
        diff = difflib.unified_diff(
            (old or "").splitlines(keepends=True), self.new_text.splitlines(keepends=True),
            fromfile=self.path if old is not None else "/dev/null", tofile=self.path)
        return [line.rstrip("\n") for line in diff]

    def apply(self, backup_dir: Path) -> str:
        target = Path(self.path)
        old = self.old_text()
        backup = None
        if old is not None:
            backup = backup_file(target, backup_dir)
        mode = self.mode if self.mode is not None else (target.stat().st_mode & 0o7777 if old is not None else 0o644)
        atomic_write(target, self.new_text.encode("utf-8"), mode)
        return f"wrote {target}" + (f" (backup {backup})" if backup else " (new file)")


@dataclass
class StopProcess(Action):
    """Stop one process by PID, after checking it is still the same process (start time)."""

    pid: int = 0
    start_ticks: int | None = None  # /proc/PID/stat field 22 when planned
    cmdline: str = ""
    grace_s: float = 10.0

    def details(self) -> list[str]:
        return [f"$ kill -TERM {self.pid}    # {self.cmdline[:200]}",
                f"  then SIGKILL if still alive after {self.grace_s:g}s"]

    def apply(self, backup_dir: Path) -> str:
        if self.start_ticks is not None and process_start_ticks(self.pid) != self.start_ticks:
            raise ActionError(f"PID {self.pid} is no longer the process that was planned; left alone")
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return f"PID {self.pid} had already exited"
        except PermissionError:
            raise ActionError(f"not allowed to signal PID {self.pid}: run as its owner or root") from None
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            if process_start_ticks(self.pid) != self.start_ticks or not os.path.exists(f"/proc/{self.pid}"):
                return f"stopped PID {self.pid} (SIGTERM)"
            time.sleep(0.1)
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return f"killed PID {self.pid} (SIGKILL after {self.grace_s:g}s)"


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot; tells a reused PID apart."""
    try:
        stat = read_text(f"/proc/{pid}/stat", 1 << 16, "a process status", errors="replace")
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def backup_file(target: Path, backup_dir: Path) -> Path:
    """Copy ``target`` under ``backup_dir`` keeping its absolute path, fsynced; returns the copy."""
    dest = backup_dir / str(Path(target).resolve()).lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(dest, read_capped(target, DEFAULT_LIMIT, "a file to back up"), Path(target).stat().st_mode & 0o7777)
    return dest


def new_backup_dir(state_dir: str) -> Path:
    """A fresh directory for this run's backups: ``<state_dir>/backups/<UTC time>``.

    Falls back to ``~/.local/state/k26-doctor`` when the state directory is not writable.
    """
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    for base in (Path(state_dir), Path.home() / ".local/state/k26-doctor"):
        if base.exists() and not base.is_dir():  # a file where the state directory should be: never elsewhere
            raise ActionError(f"the state directory {base} is not a directory: give --state-dir a directory")
        try:
            path = base / "backups" / stamp
            path.mkdir(parents=True, exist_ok=False)
            return path
        except OSError:
            continue
    raise ActionError(f"no writable state directory for backups ({state_dir}, ~/.local/state/k26-doctor)")


class Plan(list):  # type: ignore[type-arg]
    """What a fixer returns: its actions in order (a list of ``Action``) and ``notes``, what it chose
    not to touch and why (shown with the plan). ``Plan()`` means nothing can be done automatically."""

    def __init__(self, actions: Iterable[Action] = (), notes: Iterable[str] = ()) -> None:
        super().__init__(actions)
        self.notes: list[str] = [str(n) for n in notes]

    @property
    def actions(self) -> list[Action]:
        return list(self)

    @classmethod
    def of(cls, value: Any) -> Plan:
        """A fixer's answer as a ``Plan`` (a plugin's fixer may still return a plain list of actions)."""
        if isinstance(value, Plan):
            return value
        return cls(value or ())
