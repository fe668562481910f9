"""Checks of Triton's toolchain on the service host: the C build of its runtime helpers and its ptxas.

Triton builds C helpers (``cuda_utils.c``, one launcher per kernel signature) with the host's C
compiler against the interpreter's ``Python.h`` on first use, and assembles every kernel with ptxas
for the GPU's architecture. Both failed or can fail on a fresh B300 host; both are judged here from
the facts of ``doctor.stack.facts`` (``triton_build``, ``ptxas``).
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from doctor.core.registry import check
from doctor.core.result import Remediation, Result
from doctor.python.headers import family, headers_advice
from doctor.stack import compat
from doctor.stack.cuda_arch import cc_str
from doctor.stack.judging import gpu_ccs, probe_failed, service_python
from doctor.triton.toolchain import good_ptxas, interpreter_kind, no_driver, ptxas_choice, triton_arch

# -- triton.jit ----------------------------------------------------------------------------------

@check("triton.jit", "Triton can build its runtime helpers: C compiler, Python.h, libcuda",
       needs=("triton_build", "stack", "libcuda"), depends=("python.venv",), fixer="triton.jit.headers", timeout=180)
def triton_jit(ctx: Any) -> Result:
    """Repeats what Triton's runtime does on the first kernel (``triton/runtime/build.py``): picks the
    C compiler (``CC``, else gcc, else clang), compiles a small C extension with Triton's flags
    against ``Python.h`` from the service interpreter's sysconfig include directory (a venv uses its
    base interpreter's), links ``libcuda.so.1`` found as Triton finds it (``TRITON_LIBCUDA_PATH``,
    ``ldconfig -p``, ``LD_LIBRARY_PATH``), and loads the result. No GPU needed.

    This is exactly how the B300 service failed its first start: ``fatal error: Python.h: No such
    file or directory`` from ``compile_module_from_src``. Fix by hand: for a system interpreter
    install its headers (Debian/Ubuntu ``python3.X-dev`` plus ``build-essential``; Fedora/RHEL
    ``python3-devel gcc``); a pyenv, uv or conda interpreter keeps its headers in its own prefix, so
    reinstall that interpreter.
    """
    build = ctx.fact("triton_build")
    if not isinstance(build, dict):
        return Result.failed("no build result recorded")
    if "stage" not in build:
        return probe_failed(ctx, build, "run Triton's build steps")
    details = {k: build.get(k) for k in ("cc", "cc_from", "cc_path", "cc_version", "py_include", "python_h",
                                         "cmd", "stage", "libcuda", "linked_libcuda", "compile_s")}
    include = build.get("py_include") or "?"
    kind = interpreter_kind(ctx, build)
    details["interpreter"] = kind
    if build.get("stage") == "compiler" or not build.get("cc_path"):
        what = build.get("cc") or "gcc/clang"
        return Result.failed(f"Triton finds no C compiler ({build.get('error') or what + ' not found'})",
                             _headers_remedy(kind, build, compiler=True), **details)
    if build.get("stage") == "compile":
        line = build.get("error") or "compile failed"
        if not build.get("python_h"):
            summary = f"Python.h is missing from {include}: Triton cannot build its runtime ({line})"
        else:
            summary = f"{os.path.basename(str(build.get('cc')))} cannot build a Triton helper: {line}"
        return Result.failed(summary, _headers_remedy(kind, build, compiler=False), output=build.get("output"),
                             **details)
    libcuda = build.get("libcuda") or {}
    if build.get("stage") == "load":
        err = str(build.get("error"))
        if "libcuda" in err:
            return Result.failed(f"built, but libcuda.so.1 cannot be loaded: {err}", _libcuda_remedy(), **details)
        return Result.failed(f"built, but {service_python(ctx)} cannot load it: {err}", Remediation(
            "The headers do not match this interpreter (another Python's include dir?). Reinstall the headers "
            "of exactly this interpreter."), **details)
    if libcuda.get("error") and no_driver(ctx):
        return Result.blocked(f"compiler and Python.h work; libcuda.so.1 comes with the NVIDIA driver, which is not "
                              f"installed here (gpu.driver judges it): {libcuda['error']}", "gpu.driver", **details)
    if libcuda.get("error"):
        return Result.failed(f"compiler and Python.h work, but Triton will not find libcuda.so.1: {libcuda['error']}",
                             _libcuda_remedy(), **details)
    cc_name = (build.get("cc_version") or build.get("cc") or "").strip()
    return Result.passed(f"{cc_name} built and loaded a Triton-style extension against {include}"
                         f" (libcuda via {libcuda.get('found_by')})", **details)


def _headers_remedy(kind: dict[str, Any], build: dict[str, Any], compiler: bool) -> Remediation:
    """The package of this distribution that holds the interpreter's headers, or its own prefix's answer."""
    os_release = build.get("os_release") or {}
    if compiler and build.get("python_h"):
        _, fam = family(os_release)
        return Remediation("Install a C compiler, or point CC at one in the service's environment.",
                           [shlex.join([*fam.get("install", ["apt-get", "install", "-y"]),
                                        fam.get("compiler", "build-essential")])])
    advice = headers_advice(os_release, kind["major_minor"], kind["base_prefix"], kind["version"],
                            conda=kind["kind"] == "conda", compiler=compiler)
    return Remediation(advice.text, advice.commands)


def _libcuda_remedy() -> Remediation:
    return Remediation("Triton links libcuda.so.1 from the NVIDIA driver: install the driver's user-space "
                       "libraries, refresh the linker cache, or set TRITON_LIBCUDA_PATH to the directory holding it.",
                       ["ldconfig -p | grep libcuda", "sudo ldconfig"])


# -- triton.ptxas --------------------------------------------------------------------------------


@check("triton.ptxas", "The ptxas Triton will use knows the GPU architecture (e.g. sm_103a)",
       needs=("ptxas", "nvml"), depends=("python.venv",), fixer="triton.ptxas.env", timeout=120)
def triton_ptxas(ctx: Any) -> Result:
    """Triton compiles every kernel to PTX and assembles it with ptxas for ``sm_<cc>a``. It uses
    ``TRITON_PTXAS_PATH`` (or, from Triton 3.6 for arch >= 100, ``TRITON_PTXAS_BLACKWELL_PATH``) when
    that binary runs, else the one bundled in triton/backends/nvidia/bin. Each candidate is run: its
    ``--help`` lists the targets it accepts, and a one-instruction kernel is assembled for the profile's
    GPU. Triton 3.5.x bundles only ptxas 12.8, which rejects ``sm_103a`` (B300); 3.6 adds a 12.9
    ptxas-blackwell. Fix by hand: upgrade Triton, or point the variable at a CUDA >= 12.9 ptxas (torch's
    torch/bin/ptxas, the nvidia-cuda-nvcc wheel's, or the toolkit's) in the service's environment file.
    """
    fact = ctx.fact("ptxas")
    if not isinstance(fact, dict):
        return Result.failed("no ptxas reading recorded")
    triton = fact.get("triton") or {}
    if not triton.get("dir"):
        if fact.get("error"):
            return Result.failed(f"cannot look for Triton's ptxas: {fact['error']}")
        return Result.blocked(f"Triton is not installed in {service_python(ctx)}; stack.versions judges that",
                              "stack.versions")
    ccs, where, source = gpu_ccs(ctx)
    if not ccs:
        return Result.not_judged("no GPU to judge: NVML sees none and the profile names no compute_capability",
                                 **source)
    verdicts = []
    failures = []
    for cc in ccs:
        arch = triton_arch(cc)
        pick = ptxas_choice(fact, cc)
        chosen = pick["chosen"]
        item: dict[str, Any] = {"cc": cc_str(cc), "arch": arch, "var": pick["var"], "override": pick["override"],
                                "ptxas": chosen and chosen.get("path"), "release": chosen and chosen.get("release")}
        verdicts.append(item)
        if chosen is None:
            failures.append(f"Triton {triton.get('version')} finds no working {pick['tool']} for {arch}")
            continue
        proof = chosen.get("proof") or {}
        knows = arch in (chosen.get("targets") or [])
        if proof.get("arch") == arch and not proof.get("ok"):
            knows = False
            item["proof_error"] = proof.get("error")
        item["knows"] = knows
        label = f"{chosen.get('source')} (CUDA {chosen.get('release')})"
        if pick["override"] and chosen.get("path") != pick["override"]:
            label += f"; {pick['var']}={pick['override']} does not run, so Triton falls back to it"
        if not knows:
            failures.append(f"Triton {triton.get('version')} uses {label}, which rejects {arch} ({where})")
        else:
            item["label"] = label
    good = good_ptxas(fact, [v["arch"] for v in verdicts])
    details = {"gpus": where, **source, "triton": triton, "verdicts": verdicts, "usable": good,
               "candidates": fact.get("candidates")}
    if failures:
        need = {compat.ptxas_min_cuda(v["arch"]) for v in verdicts if not v.get("knows")} - {None}
        cmds = [shlex.join([service_python(ctx), "-m", "pip", "install", "triton>=3.6"])]
        var = verdicts[0]["var"]
        if good:
            cmds.append(f"echo '{var}={good[0]}' >> {ctx.expect('server.env_file') or '<service env file>'}")
        text = (f"Upgrade Triton (3.6 bundles a ptxas that knows Blackwell Ultra; it comes with torch >= 2.10), or set "
                f"{var} to a ptxas from CUDA >= {min(need) if need else '12.9'}"
                + (f": usable here: {', '.join(good)}" if good else ": none found on this host")
                + ". `k26-doctor fix --apply` writes it into the service's environment file.")
        return Result.failed("; ".join(failures), Remediation(text, cmds), **details)
    summary = "; ".join(f"{v['arch']}: {v['label']}" for v in verdicts)
    if source.get("source") == "profile":
        summary += f" (judged for the profile's GPU; NVML unavailable: {source.get('nvml')})"
    return Result.passed(summary, **details)


