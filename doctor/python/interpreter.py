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

from doctor.core.fileio import open_regular
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
        with open_regular(path) as fh:  # never waits on a FIFO
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


NEEDS_SCRIPT = (
    "import json, os, sys, sysconfig\n"
    "p = sysconfig.get_paths()\n"
    "lib = sysconfig.get_config_var('LIBDIR') or ''\n"
    "ld = sysconfig.get_config_var('LDLIBRARY') or ''\n"
    "shared = bool(sysconfig.get_config_var('Py_ENABLE_SHARED'))\n"
    "print(json.dumps({'executable': os.path.realpath(sys.executable), 'prefix': sys.prefix,\n"
    " 'base_prefix': getattr(sys, 'base_prefix', sys.prefix), 'stdlib': p.get('stdlib'),\n"
    " 'platstdlib': p.get('platstdlib'), 'purelib': p.get('purelib'), 'platlib': p.get('platlib'),\n"
    " 'dynload': os.path.join(p.get('platstdlib') or '', 'lib-dynload'),\n"
    " 'libpython': os.path.join(lib, ld) if shared and lib and ld else None}))\n"
)


def needed_paths(python: str, timeout: float = 20.0) -> tuple[list[tuple[str, str, str]], str | None]:
    """What starting ``python`` reads and runs, as ``(what, path, need)``: the path as given and the binary it
    resolves to (executed), ``pyvenv.cfg``, the standard library and its extension modules, ``libpython`` when
    the build is shared, the environment's site-packages. Asked of the interpreter itself (as this user); when
    it cannot answer, only the paths that do not need it, and why."""
    from doctor.core import proc

    out: list[tuple[str, str, str]] = [("the interpreter", python, "x")]
    root = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    if os.path.isfile(os.path.join(root, "pyvenv.cfg")):
        out.append(("pyvenv.cfg", os.path.join(root, "pyvenv.cfg"), "r"))
    res = proc.run([python, "-I", "-c", NEEDS_SCRIPT], timeout)
    if not res.ok:
        return out, res.why()
    import json

    try:
        info = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return out, "the interpreter printed no paths"
    out.append(("the interpreter's binary", info["executable"], "x"))
    for key, what in (("stdlib", "the standard library"), ("platstdlib", "the standard library"),
                      ("dynload", "the standard library's extension modules"), ("purelib", "site-packages"),
                      ("platlib", "site-packages")):
        path = info.get(key)
        if path and os.path.isdir(path) and path not in {p for _, p, _ in out}:
            out.append((what, path, "rx"))
    if info.get("libpython") and os.path.exists(info["libpython"]):
        out.append(("libpython", info["libpython"], "r"))
    return out, None
