"""Host facts: the service's environment, free space where it writes, the server port."""

from __future__ import annotations

import errno
import os
import re
import socket
from pathlib import Path
from typing import Any

from doctor.core.fileio import read_capped, read_text
from doctor.core.registry import collector
from doctor.facts.redaction import redact
from doctor.facts.shape import mapping, opt, required
from doctor.facts.store import CollectOptions
from doctor.host.access import current_user, ownership


def interpreter_bin_dir(python: str | None) -> str | None:
    """The directory of the service's interpreter as given (a venv's ``bin``, not where its symlink points);
    None for a bare command name, which is found on PATH already."""
    python = str(python or "")
    return os.path.dirname(os.path.abspath(os.path.expanduser(python))) if os.sep in python else None


def with_interpreter_bin(env: dict[str, str], python: str | None) -> dict[str, str]:
    """``env`` with the service interpreter's directory first on PATH, as the venv's ``activate`` would put it.

    The server runs ``/venv/bin/python -m sglang.launch_server`` without activating anything, and FlashInfer's
    JIT runs the ``ninja`` that pip installed beside that python by name."""
    bin_dir = interpreter_bin_dir(python)
    if bin_dir is None:
        return env
    entries = [e for e in env.get("PATH", "").split(os.pathsep) if e]
    if bin_dir in entries:
        return env
    return {**env, "PATH": os.pathsep.join([bin_dir, *entries])}


def service_environment(opts: CollectOptions) -> dict[str, str]:
    """What the service will see: this environment, plus the profile's [server.env] (the launcher sets it),
    with the interpreter's directory on PATH (the launcher puts it there)."""
    env = dict(opts.env)
    for key, value in ((opts.profile.get("server") or {}).get("env") or {}).items():
        env.setdefault(str(key), str(value))
    return with_interpreter_bin(env, opts.python)


def parse_env_file(text: str) -> dict[str, str]:
    """systemd EnvironmentFile syntax: KEY=VALUE lines, # comments, optional quotes."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip()
        if key.startswith("export "):
            key = key[len("export "):].strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key] = value
    return out


def service_env(opts: CollectOptions) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment the service gets and where it came from: this process's environment, the
    profile's [server.env] (the launcher sets it), then the EnvironmentFile systemd applies last.

    Every collector that runs something "as the service would" uses this one function.
    """
    env = service_environment(opts)
    raw = (opts.profile.get("server") or {}).get("env_file") if isinstance(opts.profile, dict) else None
    path = os.path.expanduser(raw) if isinstance(raw, str) and raw else None
    info: dict[str, Any] = {"env_file": path, "env_file_state": None, "env_file_keys": [],
                            "cuda_visible_devices_from": "environment" if "CUDA_VISIBLE_DEVICES" in env else None}
    if path:
        try:
            extra = parse_env_file(read_text(path, 1_000_000, "an environment file", errors="replace"))
        except FileNotFoundError:
            info["env_file_state"], info["env_file_error"] = "missing", "not present"
        except OSError as exc:
            info["env_file_error"] = exc.strerror or str(exc)
            info["env_file_state"] = f"unreadable: {info['env_file_error']}"
        else:
            env.update(extra)
            info["env_file_state"], info["env_file_keys"] = "read", sorted(extra)
            if "CUDA_VISIBLE_DEVICES" in extra:
                info["cuda_visible_devices_from"] = path
    return env, info


# What the host checks read of each fact (doctor.facts.shape): a value without it is "the fact 'X' is malformed".
ACCESS_SHAPE = {"path": str, "owner": str, "uid": int, "group": str, "gid": int, "mode": str, "perms": str,
                "is_dir": bool}
USER_SHAPE = {"user": str, "uid": int, "group": str, "gid": int}
# A CUDA toolkit directory the environment names (CUDA_HOME, CUDA_PATH): what a JIT build needs of it.
TOOLKIT_SHAPE = {"var": str, "path": str, "is_dir": bool, "nvcc": bool, "cuda_runtime_h": bool}
ENV_SHAPE = {"vars": mapping(str), "env_file": opt(str), "env_file_state": opt(str), "env_file_vars": opt([str]),
             "toolkits": opt([TOOLKIT_SHAPE])}
TOOLKIT_VARS = ("CUDA_HOME", "CUDA_PATH")


def toolkit_dirs(env: dict[str, str]) -> list[dict[str, Any]]:
    """Each toolkit directory CUDA_HOME / CUDA_PATH names (set and not empty; a search path is judged from the
    value): a directory, with ``bin/nvcc`` and ``include/cuda_runtime.h``. Stat calls only."""
    out = []
    for var in TOOLKIT_VARS:
        path = env.get(var)
        if not path or not path.strip() or os.pathsep in path:
            continue
        out.append({"var": var, "path": path, "is_dir": os.path.isdir(path),
                    "nvcc": os.path.isfile(os.path.join(path, "bin", "nvcc")),
                    "cuda_runtime_h": os.path.isfile(os.path.join(path, "include", "cuda_runtime.h"))})
    return out
# Each place: measured, or the error that stopped the measure.
DISK_SHAPE = mapping(({"path": required(str), "error": required(str)},
                      {"path": required(str), "measured_at": required(str), "exists": bool, "writable": required(bool),
                       "free_bytes": required(int), "total_bytes": int, "free_inodes": int, "read_only_fs": bool,
                       "access": opt(ACCESS_SHAPE), "user": opt(USER_SHAPE)}))
PORT_SHAPE = {"host": str, "port": (int, str), "free": bool, "errno": opt(str), "error": opt(str),
              "owners": [{"pid": int, "cmdline": str}]}


@collector("env", timeout=5, shape=ENV_SHAPE)
def collect_env(opts: CollectOptions) -> dict[str, Any]:
    """The environment the service gets: process env + profile [server.env] + the env file, redacted."""
    env, info = service_env(opts)
    return {
        "vars": redact(env),
        "env_file": info["env_file"],
        "env_file_state": info["env_file_state"],
        "env_file_vars": info["env_file_keys"],
        "toolkits": toolkit_dirs(env),
    }


def writable_ancestor(path: Path) -> tuple[Path, bool]:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p, os.access(p, os.W_OK)


def disk_targets(opts: CollectOptions) -> dict[str, str]:
    """Where the service writes: the Triton cache, temp files, logs, profile [host] paths."""
    env = service_environment(opts)
    home = env.get("HOME") or str(Path.home())
    targets = {
        "triton_cache": env.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache"),
        "tmp": env.get("TMPDIR") or "/tmp",
    }
    for i, p in enumerate((opts.profile.get("host") or {}).get("paths") or []):
        targets.setdefault(f"path{i}:{p}", os.path.expanduser(p.replace("~", home, 1) if p.startswith("~") else p))
    if env.get("SGLANG_LOG_DIR"):
        targets["sglang_logs"] = env["SGLANG_LOG_DIR"]
    return targets


@collector("disk", timeout=10, shape=DISK_SHAPE)
def collect_disk(opts: CollectOptions) -> dict[str, Any]:
    """statvfs of each place the service writes (or its nearest existing parent)."""
    out: dict[str, Any] = {}
    for name, raw in disk_targets(opts).items():
        path = Path(raw)
        entry: dict[str, Any] = {"path": str(path)}
        try:
            probe, writable = writable_ancestor(path)
            st = os.statvfs(probe)
            entry.update({
                "measured_at": str(probe),
                "exists": path.exists(),
                "writable": writable,
                "free_bytes": st.f_bavail * st.f_frsize,
                "total_bytes": st.f_blocks * st.f_frsize,
                "free_inodes": st.f_favail,
                "read_only_fs": bool(st.f_flag & os.ST_RDONLY),
            })
            if not writable:  # owner and mode: the fix is a chown/chmod, named exactly
                entry["access"] = ownership(str(probe))
                entry["user"] = current_user()
        except OSError as exc:
            entry["error"] = f"{exc.strerror or exc}"
        out[name] = entry
    return out


SHM_PATH = "/dev/shm"
MOUNTINFO = "/proc/self/mountinfo"
SEGMENT_PREFIXES = ("nccl-", "psm_", "sem.mp-")  # NCCL's segments, torch/Python multiprocessing's
MOUNT_SHAPE = {"mount_point": str, "fstype": str, "source": str, "options": str, "super_options": str}
SHM_SHAPE = ({"path": required(str), "error": required(str), "container": opt(dict)},
             {"path": required(str), "total_bytes": required(int), "free_bytes": required(int),
              "read_only": required(bool), "mount": opt(MOUNT_SHAPE), "mount_error": opt(str),
              "segments": opt({"count": int, "bytes": int, "largest": [{"name": str, "bytes": int}]}),
              "container": opt({"dockerenv": bool, "containerenv": bool, "kubernetes": bool})})


def unescape_mount(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: str, mountinfo: str) -> dict[str, str] | None:
    """The mount that holds ``path`` in a mountinfo text: the longest mount point above it, the last one listed
    of equal length (a mount stacked over another hides it)."""
    best: dict[str, str] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 3:
            continue
        point = unescape_mount(fields[4])
        if not (path == point or path.startswith(point.rstrip("/") + "/")):
            continue
        if best is None or len(point) >= len(best["mount_point"]):
            best = {"mount_point": point, "fstype": tail[0], "source": unescape_mount(tail[1]),
                    "options": fields[5], "super_options": tail[2]}
    return best


def shm_segments(path: str) -> dict[str, Any]:
    """The shared-memory segments NCCL and multiprocessing leave in ``path`` (a crashed server leaves them)."""
    found: list[dict[str, Any]] = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                if entry.name.startswith(SEGMENT_PREFIXES) and entry.is_file(follow_symlinks=False):
                    try:
                        found.append({"name": entry.name, "bytes": entry.stat(follow_symlinks=False).st_blocks * 512})
                    except OSError:
                        continue
    except OSError:
        pass
    found.sort(key=lambda e: -e["bytes"])
    return {"count": len(found), "bytes": sum(e["bytes"] for e in found), "largest": found[:5]}


@collector("shm", timeout=10, shape=SHM_SHAPE)
def collect_shm(opts: CollectOptions) -> dict[str, Any]:
    """/dev/shm as the service sees it: statvfs (size, free), the mount that holds it (/proc/self/mountinfo),
    NCCL's leftover segments, and what kind of environment this is (container marker files, Kubernetes'
    variables in the service's environment): the fix differs for each."""
    env = service_environment(opts)
    container = {"dockerenv": os.path.exists("/.dockerenv"), "containerenv": os.path.exists("/run/.containerenv"),
                 "kubernetes": "KUBERNETES_SERVICE_HOST" in env}
    out: dict[str, Any] = {"path": SHM_PATH, "container": container}
    try:
        st = os.statvfs(SHM_PATH)
    except OSError as exc:
        out["error"] = exc.strerror or str(exc)
        return out
    out.update(total_bytes=st.f_blocks * st.f_frsize, free_bytes=st.f_bavail * st.f_frsize,
               read_only=bool(st.f_flag & os.ST_RDONLY))
    try:
        out["mount"] = mount_of(SHM_PATH, read_text(MOUNTINFO, 16 << 20, "a mount table", errors="replace"))
    except OSError as exc:
        out["mount_error"] = exc.strerror or str(exc)
    out["segments"] = shm_segments(SHM_PATH)
    return out


def _port_owner(port: int) -> list[dict[str, Any]]:
    """Which processes listen on ``port`` (from /proc/net/tcp* inodes and /proc/*/fd); best effort."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = read_text(table, 64 << 20, "a socket table", errors="replace").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    owners = []
    if not inodes:
        return owners
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            for fd in (pid_dir / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    cmd = read_capped(pid_dir / "cmdline", 1 << 16, "a command line").replace(b"\0", b" ").decode(
                        errors="replace").strip()
                    owners.append({"pid": int(pid_dir.name), "cmdline": cmd[:300]})
                    break
        except OSError:
            continue
    return owners


@collector("port", timeout=10, shape=PORT_SHAPE)
def collect_port(opts: CollectOptions) -> dict[str, Any]:
    """Bind the server's host:port the way the server would (SO_REUSEADDR), then release it at once."""
    server = opts.profile.get("server") or {}
    host = str(server.get("host", "0.0.0.0"))
    port = server.get("port", 30000)
    out: dict[str, Any] = {"host": host, "port": port}
    try:
        port = int(port)
        if not 0 < port < 65536:
            raise ValueError
    except (TypeError, ValueError):
        out["error"] = f"invalid port {port!r}"
        return out
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        out["error"] = f"cannot resolve host {host!r}: {exc}"
        return out
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        out["free"] = True
    except OSError as exc:
        out["free"] = False
        out["errno"] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        out["error"] = exc.strerror or str(exc)
        out["owners"] = _port_owner(port) if exc.errno == errno.EADDRINUSE else []
    finally:
        sock.close()
    return out


# -- the JIT caches (host.jit_cache; the start plan reads what is compiled) ------------------------------------
JIT_CACHE_ENTRY = ({"path": required(str), "var": str, "from": str, "error": required(str)},
                   {"path": required(str), "var": str, "from": str, "exists": required(bool),
                    "measured_at": str, "fstype": opt(str), "mount_point": opt(str), "writable": opt(bool),
                    "denied_at": opt(str), "entries": opt(int), "wiped_at_boot_by": opt(str)})
JIT_CACHES_SHAPE = {"user": str, "caches": mapping(JIT_CACHE_ENTRY), "flashinfer_compiled": [str]}


def service_user_name(opts: CollectOptions) -> str:
    """The user the service runs as: the profile's [server] user, else the one running the doctor (as the
    unit's ExecStartPre, that is the service's own)."""
    user = (opts.profile.get("server") or {}).get("user") if isinstance(opts.profile, dict) else None
    return str(user) if user else current_user()["user"]


def tmpfiles_configs() -> dict[str, str]:
    """systemd-tmpfiles' effective ``*.conf`` files (a name in /etc replaces it in /run and /usr/lib), as text."""
    from doctor.host.jitcache import TMPFILES_DIRS

    out: dict[str, str] = {}
    for folder in TMPFILES_DIRS:
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".conf"))
        except OSError:
            continue
        for name in names:
            if name in out:
                continue
            try:
                out[name] = read_text(os.path.join(folder, name), 1 << 20, "a tmpfiles.d file", errors="replace")
            except OSError:
                continue
    return out


@collector("jit_caches", timeout=10, shape=JIT_CACHES_SHAPE)
def collect_jit_caches(opts: CollectOptions) -> dict[str, Any]:
    """Where FlashInfer, Triton and SGLang keep their compiled modules for the service (its environment), the
    filesystem of each (/proc/self/mountinfo: tmpfs is wiped at boot), whether the service's user may write it
    (from the mode bits, as doctor.host.access computes them), and FlashInfer's modules compiled there. Stat and
    listdir only: nothing is created."""
    from doctor.host.access import account, first_denied
    from doctor.host.jitcache import boot_wipes, cache_dirs, entry_count, flashinfer_compiled, wiped_by

    env, _ = service_env(opts)  # with the EnvironmentFile, where host.jit_cache's fixer sets the variables
    home = env.get("HOME") or str(Path.home())
    user = service_user_name(opts)
    who = account(user)
    try:
        mounts = read_text(MOUNTINFO, 16 << 20, "a mount table", errors="replace")
    except OSError:
        mounts = ""
    wipes = boot_wipes(tmpfiles_configs())
    caches: dict[str, Any] = {}
    for name, where in cache_dirs(env, home).items():
        entry: dict[str, Any] = dict(where)
        try:
            probe, _ = writable_ancestor(Path(where["path"]))
            mount = mount_of(os.path.realpath(probe), mounts) if mounts else None
            denied = first_denied(str(probe), who, "wx") if who.exists else None
            entry.update(exists=os.path.isdir(where["path"]), measured_at=str(probe),
                         fstype=mount["fstype"] if mount else None, mount_point=mount["mount_point"] if mount else None,
                         writable=(denied is None) if who.exists else None,
                         denied_at=denied["path"] if denied else None, entries=entry_count(where["path"]),
                         wiped_at_boot_by=wiped_by(where["path"], wipes))
        except OSError as exc:
            entry["error"] = exc.strerror or str(exc)
        caches[name] = entry
    fi = caches.get("flashinfer", {}).get("path")
    return {"user": user, "caches": caches, "flashinfer_compiled": flashinfer_compiled(fi) if fi else []}
