"""Facts of the service's Python environment read from outside (works even when the interpreter cannot
start): pyvenv.cfg, the interpreter link, console scripts' shebangs, site-packages."""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from doctor.core import proc
from doctor.core.fileio import open_regular
from doctor.core.registry import collector
from doctor.facts.shape import mapping, opt, required
from doctor.facts.store import CollectOptions
from doctor.host.facts import service_env
from doctor.python.interpreter import not_python_error, path_facts, start_output

MAX_SCRIPTS = 5000
SHEBANG_BYTES = 1024
def env_root(python: str) -> Path | None:
    """``/opt/venv`` for ``/opt/venv/bin/python`` (the path as given, symlinks not followed)."""
    p = Path(os.path.abspath(os.path.expanduser(python)))
    return p.parent.parent if p.parent.name in ("bin", "Scripts") else None


def parse_pyvenv_cfg(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip().lower()] = value.strip()
    return out


def read_shebang(path: Path) -> str | None:
    """The interpreter a script runs: ``#!/x/python`` or pip's ``#!/bin/sh`` + ``'''exec' "/x/python"`` form."""
    try:
        with open_regular(path) as fh:  # a FIFO among the scripts is refused, never waited on
            head = fh.read(SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    lines = head.split(b"\n")
    first = lines[0][2:].decode("utf-8", "replace").strip()
    if first in ("/bin/sh", "/usr/bin/sh") and len(lines) > 1:
        m = re.match(rb"^'''exec' (\"[^\"]+\"|\S+)", lines[1])
        if m:
            return m.group(1).decode("utf-8", "replace").strip('"')
    return first.split()[0] if first else None


def scan_scripts(root: Path) -> dict[str, Any]:
    """Shebangs of the environment's ``bin/`` scripts that name a Python interpreter."""
    bindir = root / "bin"
    scripts: list[dict[str, Any]] = []
    out: dict[str, Any] = {"bin": str(bindir), "scripts": scripts, "scanned": 0, "truncated": False}
    try:
        names = sorted(os.listdir(bindir))
    except OSError as exc:
        out["error"] = exc.strerror or str(exc)
        return out
    for name in names:
        if out["scanned"] >= MAX_SCRIPTS:
            out["truncated"] = True
            break
        path = bindir / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        out["scanned"] += 1
        interp = read_shebang(path)
        if not interp or not os.path.basename(interp).startswith("python"):
            continue
        scripts.append({"name": name, "interpreter": interp, "exists": os.path.exists(interp),
                        "inside": _inside(interp, root)})
    return out


def _inside(path: str, root: Path) -> bool:
    try:
        return os.path.commonpath([os.path.abspath(path), str(root)]) == str(root)
    except ValueError:
        return False


# What python.venv and its fixer read (doctor.facts.shape).
VENV_SHAPE = {
    "python": str, "exists": bool, "resolved": opt(str), "resolves": bool, "link_chain": [str], "root": opt(str),
    "is_venv": bool, "pyvenv_cfg": opt(mapping(str)), "pyvenv_cfg_error": opt(str), "home": opt(str),
    "home_exists": bool, "cfg_version": opt(str), "conda": bool, "bin": opt(str), "truncated": bool, "scanned": int,
    "scripts": [{"name": required(str), "interpreter": required(str), "exists": bool, "inside": bool}],
    "site_packages": [{"path": str, "readable": bool, "error": opt(str), "entries": opt(int)}],
    "starts": bool, "start_error": opt(str),
    "runtime": opt({"version_info": [int], "prefix": opt(str), "base_prefix": opt(str)}), "error": opt(str),
}


@collector("venv", timeout=30, shape=VENV_SHAPE)
def collect_venv(opts: CollectOptions) -> dict[str, Any]:
    """The service environment's files: pyvenv.cfg and its home, bin/python, scripts' shebangs, site-packages."""
    python = _service_python(opts)
    out: dict[str, Any] = {"python": python, "exists": os.path.lexists(python)}
    out.update(path_facts(python))
    out["resolved"] = os.path.realpath(python)
    out["resolves"] = os.path.exists(python)
    out["link_chain"] = _link_chain(python)
    root = env_root(python)
    out["root"] = str(root) if root else None
    cfg_path = root / "pyvenv.cfg" if root else None
    out["is_venv"] = bool(cfg_path and cfg_path.is_file())
    if out["is_venv"] and root is not None and cfg_path is not None:
        out.update(_venv_files(root, cfg_path))
    else:
        out["conda"] = bool(root and (root / "conda-meta").is_dir())
    out.update(_runtime(python))
    return out


def _service_python(opts: CollectOptions) -> str:
    """The interpreter the service runs, as an absolute path: a bare name (``python3``) is looked up on the
    service's PATH, as the service would find it (kept as given where it is not there)."""
    python = os.path.expanduser(opts.python)
    if os.sep not in python:
        python = shutil.which(python, path=service_env(opts)[0].get("PATH")) or python
    return os.path.abspath(python)


def _link_chain(python: str) -> list[str]:
    """Each symlink hop from ``python`` (at most 20: a loop ends there), so that a venv whose interpreter points
    into a removed base install shows where the chain breaks."""
    chain = []
    p = python
    for _ in range(20):
        if not os.path.islink(p):
            break
        try:
            target = os.readlink(p)
        except OSError:
            break
        p = os.path.normpath(os.path.join(os.path.dirname(p), target))
        chain.append(p)
    return chain


def _venv_files(root: Path, cfg_path: Path) -> dict[str, Any]:
    """A venv's pyvenv.cfg (or why it cannot be read), its home, version and conda marker, its scripts' shebangs
    and its site-packages."""
    out: dict[str, Any] = {}
    try:
        with open_regular(cfg_path) as fh:
            cfg = parse_pyvenv_cfg(fh.read(65536).decode("utf-8", "replace"))  # a few lines; never a giant
        out["pyvenv_cfg"] = cfg
    except OSError as exc:
        cfg = {}
        out["pyvenv_cfg_error"] = exc.strerror or str(exc)
    home = cfg.get("home")
    out["home"] = home
    out["home_exists"] = bool(home) and os.path.isdir(home)
    out["cfg_version"] = cfg.get("version") or cfg.get("version_info")
    out["conda"] = (root / "conda-meta").is_dir()
    out.update(scan_scripts(root))
    out["site_packages"] = _site_packages(root)
    return out


def _runtime(python: str) -> dict[str, Any]:
    """Whether the interpreter starts, and its version and prefixes when it does; else why not, with its output
    (a file that runs but is no Python, a timeout, one that cannot be started)."""
    run = proc.run([python, "-I", "-c", "import sys,json;print(json.dumps([list(sys.version_info[:3]),"
                    "sys.prefix,sys.base_prefix]))"], 20)
    if run.ok:
        import json

        try:
            ver, prefix, base = json.loads(run.stdout.strip().splitlines()[-1])
            return {"starts": True, "runtime": {"version_info": ver, "prefix": prefix, "base_prefix": base}}
        except (ValueError, IndexError):
            return {"starts": False, "start_error": not_python_error(run.returncode, run.stdout, run.stderr),
                    "start_output": start_output(run.stdout, run.stderr)}
    return {"starts": False,
            "start_error": (not_python_error(run.returncode, run.stdout, run.stderr)
                            if run.start_error is None and not run.timed_out else run.why()),
            "start_output": start_output(run.stdout, run.stderr)}


def _site_packages(root: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    seen: set[str] = set()
    for lib in ("lib", "lib64"):
        try:
            entries = sorted(os.listdir(root / lib))
        except OSError:
            continue
        for name in entries:
            sp = root / lib / name / "site-packages"
            if name.startswith("python") and sp.is_dir() and os.path.realpath(sp) not in seen:
                seen.add(os.path.realpath(sp))
                item: dict[str, Any] = {"path": str(sp), "readable": os.access(sp, os.R_OK | os.X_OK)}
                try:
                    item["entries"] = len(os.listdir(sp))
                except OSError as exc:
                    item["readable"] = False
                    item["error"] = exc.strerror or str(exc)
                found.append(item)
    return found


