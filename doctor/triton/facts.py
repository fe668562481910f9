"""Facts of Triton's toolchain: a Triton-style C extension build (probe ``cbuild``) and every ptxas Triton
could use, its CUDA release and the targets it accepts."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from doctor.core import proc
from doctor.core.fileio import open_regular
from doctor.core.registry import collector
from doctor.facts.store import CollectOptions
from doctor.host.facts import parse_env_file, service_env
from doctor.stack.service_probe import STACK_PROBE_TIMEOUT, probe_service, stack_probe

CBUILD_TIMEOUT = 150.0
PTXAS_TIMEOUT = 20.0
@collector("triton_build", timeout=CBUILD_TIMEOUT + 5)
def collect_triton_build(opts: CollectOptions) -> dict[str, Any]:
    """A C extension built with Triton's compiler, flags and libcuda search, then loaded."""
    out = probe_service(opts, "cbuild", [], CBUILD_TIMEOUT)
    out["os_release"] = read_os_release()
    return out


def read_os_release(path: str = "/etc/os-release") -> dict[str, str]:
    """``/etc/os-release`` (ID, ID_LIKE, VERSION_ID...): which package manager and names a fix uses."""
    for candidate in (path, "/usr/lib/os-release"):
        try:
            with open_regular(candidate) as fh:
                return parse_env_file(fh.read(65536).decode("utf-8", "replace"))
        except OSError:
            continue
    return {}


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
    from doctor.stack.cuda_arch import parse_cc

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


