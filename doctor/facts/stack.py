"""Collectors for the service's Python stack: interpreter, packages, Triton's toolchain, torch, SGLang.

Everything that needs the service's interpreter runs as a probe under it (``doctor/probes``), with
a deadline; nothing here imports torch, triton or sglang. Facts (all JSON):

* ``stack``: interpreter facts, installed distributions, package locations (probe ``stack``).
* ``triton_build``: a Triton-style C extension build and load (probe ``cbuild``).
* ``torch_info``: torch's CUDA runtime and compiled targets (probe ``torch_info``; ``--deep`` matmul).
* ``sglang_import``: SGLang imported for real, DFlash kernel availability (probe ``sglang_import``).
* ``ptxas``: every ptxas Triton could use, its CUDA release and the targets it accepts.
* ``kernels``: every package's GPU code (SASS/PTX) and libtorch ABI, read from the files (probe ``kernels``).
* ``libcuda``: the libcuda.so.1 the service's loader resolves, the kernel module's version (probe ``libcuda``).
* ``venv``: the environment's files read from outside (works even when the interpreter cannot start).

The service's environment is ``opts.env`` plus the profile's ``server.env_file`` (what systemd gives
the service), so a fix written to that file is seen by the next check.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

from doctor import proc
from doctor.facts import CollectOptions
from doctor.facts.host import parse_env_file, service_env
from doctor.registry import collector

STACK_PROBE_TIMEOUT = 30.0
CBUILD_TIMEOUT = 150.0
TORCH_TIMEOUT = 120.0
TORCH_DEEP_TIMEOUT = 300.0
SGLANG_TIMEOUT = 240.0
PTXAS_TIMEOUT = 20.0
KERNELS_TIMEOUT = 60.0
LIBCUDA_TIMEOUT = 30.0
MAX_SCRIPTS = 5000
SHEBANG_BYTES = 1024

_memo_lock = threading.Lock()


# -- the service's environment ------------------------------------------------------------------

def _probe(opts: CollectOptions, probe: str, args: list[str], timeout: float) -> dict[str, Any]:
    env, env_info = service_env(opts)
    data, res = proc.run_probe(opts.python, probe, args, timeout=timeout, env=env)
    if data is None:
        return {"ok": False, "error": res.why(), "timed_out": res.timed_out, "python": opts.python,
                "stderr_tail": (res.stderr or "")[-2000:], "service_env": env_info}
    data["probe_s"] = round(res.duration_s, 3)
    data["service_env"] = env_info
    return data


def stack_probe(opts: CollectOptions) -> dict[str, Any]:
    """The ``stack`` probe's result, run once per run (cached on ``opts``) for the facts that share it."""
    with _memo_lock:
        cell = opts.__dict__.setdefault("_k26_stack_probe", {"lock": threading.Lock()})
    with cell["lock"]:
        if "value" not in cell:
            cell["value"] = _probe(opts, "stack", [], STACK_PROBE_TIMEOUT)
        return cell["value"]


@collector("stack", timeout=STACK_PROBE_TIMEOUT + 5)
def collect_stack(opts: CollectOptions) -> dict[str, Any]:
    """The service interpreter, its include dir and Python.h, installed distributions and package paths."""
    return stack_probe(opts)


@collector("triton_build", timeout=CBUILD_TIMEOUT + 5)
def collect_triton_build(opts: CollectOptions) -> dict[str, Any]:
    """A C extension built with Triton's compiler, flags and libcuda search, then loaded."""
    out = _probe(opts, "cbuild", [], CBUILD_TIMEOUT)
    out["os_release"] = read_os_release()
    return out


def read_os_release(path: str = "/etc/os-release") -> dict[str, str]:
    """``/etc/os-release`` (ID, ID_LIKE, VERSION_ID...): which package manager and names a fix uses."""
    for candidate in (path, "/usr/lib/os-release"):
        try:
            with open(candidate, encoding="utf-8", errors="replace") as fh:
                return parse_env_file(fh.read(65536))
        except OSError:
            continue
    return {}


@collector("torch_info", timeout=TORCH_DEEP_TIMEOUT + 5)
def collect_torch_info(opts: CollectOptions) -> dict[str, Any]:
    """torch's version, CUDA runtime, compiled targets and GPUs; with --deep, a matmul per GPU."""
    if opts.deep:
        return _probe(opts, "torch_info", ["--deep"], TORCH_DEEP_TIMEOUT)
    return _probe(opts, "torch_info", [], TORCH_TIMEOUT)


@collector("sglang_import", timeout=SGLANG_TIMEOUT + 5)
def collect_sglang_import(opts: CollectOptions) -> dict[str, Any]:
    """SGLang imported under the service interpreter; whether DFlash's sampling kernel is available."""
    return _probe(opts, "sglang_import", [], SGLANG_TIMEOUT)


@collector("kernels", timeout=KERNELS_TIMEOUT + 5)
def collect_kernels(opts: CollectOptions) -> dict[str, Any]:
    """Every installed package's fat binaries and cubins (headers only) and the torch symbols its libraries need."""
    return _probe(opts, "kernels", [], KERNELS_TIMEOUT)


@collector("libcuda", timeout=LIBCUDA_TIMEOUT + 5)
def collect_libcuda(opts: CollectOptions) -> dict[str, Any]:
    """The libcuda.so.1 the service's loader resolves (path, version, cuInit) and the kernel module's version."""
    return _probe(opts, "libcuda", [], LIBCUDA_TIMEOUT)


# -- ptxas ---------------------------------------------------------------------------------------

_RELEASE = re.compile(r"release (\d+\.\d+)")
_SM = re.compile(r"'(sm_\d+[af]?)'")


def ptx_isa_for(release: str) -> str:
    """The newest PTX ISA a ptxas of CUDA ``release`` reads (Triton's ``ptx_get_version``)."""
    major, minor = (int(x) for x in release.split(".")[:2])
    if major >= 13:
        n = 90 + (major - 13) * 10 + minor
    elif major == 12:
        n = 80 + minor - (1 if minor >= 6 else 0)
    elif major == 11:
        n = 70 + minor
    else:
        n = 63 + minor
    return f"{n // 10}.{n % 10}"


def inspect_ptxas(path: str, proof_arch: str | None) -> dict[str, Any]:
    """Run one ptxas: its CUDA release, the ``sm_*`` values its ``--gpu-name`` accepts, and a proof compile."""
    entry: dict[str, Any] = {"path": path, "exists": os.path.isfile(path),
                             "executable": os.access(path, os.X_OK)}
    if not entry["exists"]:
        return entry
    res = proc.run([path, "--version"], PTXAS_TIMEOUT)
    if not res.ok:
        entry["error"] = res.why()
        return entry
    m = _RELEASE.search(res.stdout + res.stderr)
    entry["release"] = m.group(1) if m else None
    help_res = proc.run([path, "--help"], PTXAS_TIMEOUT)
    text = re.sub(r"\s+", " ", help_res.stdout)
    allowed = text.split("--gpu-name", 1)[1] if "--gpu-name" in text else ""
    names = set(_SM.findall(allowed.split("--", 1)[0] if allowed else ""))
    entry["targets"] = sorted(names, key=lambda t: (int(re.sub(r"\D", "", t)), t))
    if proof_arch and entry["release"]:
        entry["proof"] = compile_proof(path, proof_arch, entry["release"])
    return entry


def compile_proof(ptxas: str, arch: str, release: str) -> dict[str, Any]:
    """Assemble a one-instruction kernel for ``arch`` in a temporary directory (no GPU needed)."""
    ptx = f".version {ptx_isa_for(release)}\n.target {arch}\n.address_size 64\n.visible .entry k26_probe() {{ ret; }}\n"
    with tempfile.TemporaryDirectory(prefix="k26-doctor-ptxas-") as tmp:
        src = os.path.join(tmp, "probe.ptx")
        Path(src).write_text(ptx)
        res = proc.run([ptxas, f"--gpu-name={arch}", src, "-o", os.path.join(tmp, "probe.cubin")], PTXAS_TIMEOUT)
    out: dict[str, Any] = {"arch": arch, "ok": res.ok}
    if not res.ok:
        out["error"] = res.why()
    return out


def profile_arch(profile: dict[str, Any]) -> str | None:
    """The target Triton compiles for on the profile's GPU: ``sm_XYa`` from 9.0 on, else ``sm_XY``."""
    from doctor.cuda_arch import parse_cc

    gpu = profile.get("gpu") if isinstance(profile, dict) else None
    cc = parse_cc(gpu.get("compute_capability")) if isinstance(gpu, dict) else None
    if cc is None:
        return None
    n = cc[0] * 10 + cc[1]
    return f"sm_{n}{'a' if n >= 90 else ''}"


@collector("ptxas", timeout=STACK_PROBE_TIMEOUT + 60)
def collect_ptxas(opts: CollectOptions) -> dict[str, Any]:
    """Every ptxas Triton could use (env overrides, bundled, torch's, NVIDIA wheels, the toolkit), run."""
    stack = stack_probe(opts)
    env, env_info = service_env(opts)
    arch = profile_arch(opts.profile)
    out: dict[str, Any] = {"proof_arch": arch, "env": {}, "candidates": [], "service_env": env_info}
    for key in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH"):
        if env.get(key):
            out["env"][key] = env[key]
    if not stack.get("ok"):
        out["error"] = f"service interpreter probe failed: {stack.get('error')}"
    triton = stack.get("triton") or {}
    out["triton"] = {"dir": triton.get("dir"), "blackwell_ptxas_from_arch": triton.get("blackwell_ptxas_from_arch"),
                     "version": ((stack.get("distributions") or {}).get("triton") or {}).get("version")}
    seen: set[str] = set()

    def add(path: str | None, source: str) -> None:
        if not path or path in seen:
            return
        seen.add(path)
        entry = inspect_ptxas(path, arch)
        entry["source"] = source
        out["candidates"].append(entry)

    for key, value in out["env"].items():
        add(value, key)
    for tool, info in (triton.get("bin") or {}).items():
        add(info.get("path"), f"triton bundled {tool}")
    add((stack.get("torch") or {}).get("ptxas"), "torch/bin/ptxas")
    for path in stack.get("nvidia_ptxas") or []:
        add(path, "nvidia-cuda-nvcc wheel")
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            add(os.path.join(home, "bin", "ptxas"), f"CUDA toolkit ({home})")
    for d in (env.get("PATH") or "").split(os.pathsep):
        if d and os.path.isfile(os.path.join(d, "ptxas")):
            add(os.path.join(d, "ptxas"), "PATH")
            break
    return out


# -- the environment on disk ---------------------------------------------------------------------

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
        with open(path, "rb") as fh:
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


@collector("venv", timeout=30)
def collect_venv(opts: CollectOptions) -> dict[str, Any]:
    """The service environment's files: pyvenv.cfg and its home, bin/python, scripts' shebangs, site-packages."""
    python = os.path.expanduser(opts.python)
    if os.sep not in python:  # "python3": what the service would run, found on its PATH
        python = shutil.which(python, path=service_env(opts)[0].get("PATH")) or python
    python = os.path.abspath(python)
    out: dict[str, Any] = {"python": python, "exists": os.path.lexists(python)}
    out["resolved"] = os.path.realpath(python)
    out["resolves"] = os.path.exists(python)
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
    out["link_chain"] = chain
    root = env_root(python)
    out["root"] = str(root) if root else None
    cfg_path = root / "pyvenv.cfg" if root else None
    out["is_venv"] = bool(cfg_path and cfg_path.is_file())
    if out["is_venv"] and root is not None and cfg_path is not None:
        try:
            with open(cfg_path, encoding="utf-8", errors="replace") as fh:
                cfg = parse_pyvenv_cfg(fh.read(65536))  # a few lines; never read a hostile giant
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
    else:
        out["conda"] = bool(root and (root / "conda-meta").is_dir())
    run = proc.run([python, "-I", "-c", "import sys,json;print(json.dumps([list(sys.version_info[:3]),"
                    "sys.prefix,sys.base_prefix]))"], 20)
    if run.ok:
        import json

        try:
            ver, prefix, base = json.loads(run.stdout.strip().splitlines()[-1])
            out["starts"] = True
            out["runtime"] = {"version_info": ver, "prefix": prefix, "base_prefix": base}
        except (ValueError, IndexError):
            out["starts"] = False
            out["start_error"] = "the interpreter printed no version"
    else:
        out["starts"] = False
        out["start_error"] = run.why()
    return out


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
