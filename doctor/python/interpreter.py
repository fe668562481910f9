"""What the ``--python`` path is, in words: the one root cause when it is not the service's interpreter.

Every check of what is installed runs a probe under ``--python``. When that path does not exist, is a
directory, cannot be executed or is some other program (``/bin/ls``, ``/bin/true``), each probe fails in its
own way ("ls exited with 2", "probe printed no JSON result") and each check would offer its own fix, down
to installing torch with ``/nonexistent -m pip``. ``python.venv`` says once what the path is
(``describe``); every check that needs the interpreter depends on it and is blocked while it fails.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from doctor.host.access import ownership

ELF_MAGIC = b"\x7fELF"


def nearest_existing(path: str) -> str | None:
    """The deepest ancestor directory of ``path`` that exists (where to look for the right interpreter)."""
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.isdir(parent):
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up
    return parent or None


def file_kind(path: str) -> str:
    """``an ELF executable``, ``a script for /bin/sh``, ``a file``: what the first bytes say."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return "a file"
    if head.startswith(ELF_MAGIC):
        return "an ELF executable"
    if head.startswith(b"#!"):
        line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
        return f"a script for {line.split()[0]}" if line else "a script"
    return "a file"


def path_facts(python: str) -> dict[str, Any]:
    """What ``python`` is on disk, before anything runs it: ``kind`` is missing, dangling, directory,
    not_executable or file; with the owner and mode of what is there, or the nearest existing directory."""
    out: dict[str, Any] = {}
    if not os.path.lexists(python):
        out["kind"] = "missing"
        out["nearest"] = nearest_existing(python)
        return out
    if not os.path.exists(python):
        out["kind"] = "dangling"
        return out
    try:
        st = os.stat(python)
    except OSError as exc:
        out["kind"] = "unreadable"
        out["error"] = exc.strerror or str(exc)
        return out
    out["access"] = ownership(python)
    if stat.S_ISDIR(st.st_mode):
        out["kind"] = "directory"
    elif not stat.S_ISREG(st.st_mode):
        out["kind"] = "special"
    elif not os.access(python, os.X_OK):
        out["kind"] = "not_executable"
    else:
        out["kind"] = "file"
        out["file"] = file_kind(python)
    return out


def describe(v: dict[str, Any]) -> str | None:
    """The sentence ``python.venv`` fails with when ``--python`` is not a Python interpreter, else None."""
    py = v.get("python")
    kind = v.get("kind")
    access = v.get("access") or {}
    if kind == "missing" or (kind is None and not v.get("exists")):
        near = v.get("nearest")
        return f"{py} does not exist" + (f" (nearest existing directory: {near})" if near else "")
    if kind == "dangling":
        chain = " -> ".join(v.get("link_chain") or [])
        return f"{py} is a dangling symlink ({chain})" if chain else f"{py} is a dangling symlink"
    if kind == "directory":
        return f"{py} is a directory, not an interpreter"
    if kind == "special":
        return f"{py} is not a regular file ({access.get('perms', '?')})"
    if kind == "not_executable":
        return (f"{py} cannot be executed (mode {access.get('mode', '?')}, owned by "
                f"{access.get('owner', '?')}:{access.get('group', '?')})")
    if kind == "unreadable":
        return f"{py} cannot be read: {v.get('error')}"
    if v.get("starts"):
        return None
    what = v.get("file") or "a program"
    return f"{py} does not run as Python: it is {what}; {v.get('start_error')}"


def not_python_error(rc: int | None, stdout: str, stderr: str) -> str:
    """How a program that is not Python answered ``-I -c 'print(version)'`` (what it printed: ``start_output``)."""
    said = (stderr or stdout).strip()
    return f"asked for its version, it exited {rc}" + (" printing nothing" if not said else "")


def start_output(stdout: str, stderr: str, limit: int = 400) -> str:
    """The last lines it printed, for the details."""
    text = (stderr or stdout).strip()
    return text[-limit:]
