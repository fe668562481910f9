"""Triton's C build of its runtime helpers (triton.jit), as the ``triton_build`` probe repeated it: the C compiler,
``Python.h`` of the service's interpreter, ``libcuda.so.1``, the extension loaded. This is exactly how the B300
service failed its first start (``fatal error: Python.h: No such file or directory``)."""

from __future__ import annotations

import os
import shlex
from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.python.headers import family, headers_advice
from doctor.stack.service_probe import probe_failure
from doctor.triton.toolchain import interpreter_kind, no_driver

NO_HEADERS_OR_COMPILER = ("triton.jit.no_compiler", "triton.jit.no_python_h")  # what the headers fixer installs
DETAIL_KEYS = ("cc", "cc_from", "cc_path", "cc_version", "py_include", "python_h", "cmd", "stage", "libcuda",
               "linked_libcuda", "compile_s")


def headers_remedy(kind: dict[str, Any], build: dict[str, Any], compiler: bool) -> Remediation:
    """The package of this distribution that holds the interpreter's headers, or its own prefix's answer
    (``doctor.python.headers``); a compiler alone when ``Python.h`` is there."""
    os_release = build.get("os_release") or {}
    if compiler and build.get("python_h"):
        _, fam = family(os_release)
        return Remediation("Install a C compiler, or point CC at one in the service's environment.",
                           [shlex.join([*fam.get("install", ["apt-get", "install", "-y"]),
                                        fam.get("compiler", "build-essential")])])
    advice = headers_advice(os_release, kind["major_minor"], kind["base_prefix"], kind["version"],
                            conda=kind["kind"] == "conda", compiler=compiler)
    return Remediation(advice.text, advice.commands)


LIBCUDA_REMEDY = Remediation("Triton links libcuda.so.1 from the NVIDIA driver: install the driver's user-space "
                             "libraries, refresh the linker cache, or set TRITON_LIBCUDA_PATH to the directory holding "
                             "it.", ["ldconfig -p | grep libcuda", "sudo ldconfig"])


def judge_jit(build: dict[str, Any], stack: Any, libcuda_fact: Any, python: str) -> Findings:
    """``build``: the ``triton_build`` fact; ``stack``, ``libcuda_fact``: those facts or None (not recorded);
    ``python``: the service's."""
    if "stage" not in build:
        return probe_failure(python, build, "run Triton's build steps")
    kind = interpreter_kind(stack, build)
    out = Findings(**{k: build.get(k) for k in DETAIL_KEYS}, interpreter=kind)
    include = build.get("py_include") or "?"
    if build.get("stage") == "compiler" or not build.get("cc_path"):
        why = build.get("error") or (build.get("cc") or "gcc/clang") + " not found"
        return out.fail(NO_HEADERS_OR_COMPILER[0], f"Triton finds no C compiler ({why})",
                        headers_remedy(kind, build, compiler=True))
    if build.get("stage") == "compile":
        line = build.get("error") or "compile failed"
        out.details["output"] = build.get("output")
        if not build.get("python_h"):
            return out.fail(NO_HEADERS_OR_COMPILER[1], f"Python.h is missing from {include}: Triton cannot build its "
                            f"runtime ({line})", headers_remedy(kind, build, compiler=False))
        return out.fail("triton.jit.compile", f"{os.path.basename(str(build.get('cc')))} cannot build a Triton "
                        f"helper: {line}", headers_remedy(kind, build, compiler=False))
    libcuda = build.get("libcuda") or {}
    if build.get("stage") == "load":
        err = str(build.get("error"))
        if "libcuda" in err:
            return out.fail("triton.jit.libcuda", f"built, but libcuda.so.1 cannot be loaded: {err}", LIBCUDA_REMEDY)
        return out.fail("triton.jit.load", f"built, but {python} cannot load it: {err}", Remediation(
            "The headers do not match this interpreter (another Python's include dir?). Reinstall the headers "
            "of exactly this interpreter."))
    if libcuda.get("error") and no_driver(libcuda_fact):
        raise NotJudged.blocked(f"compiler and Python.h work; libcuda.so.1 comes with the NVIDIA driver, which is not "
                                f"installed here (gpu.driver judges it): {libcuda['error']}", "gpu.driver",
                                **out.details)
    if libcuda.get("error"):
        return out.fail("triton.jit.libcuda", f"compiler and Python.h work, but Triton will not find libcuda.so.1: "
                        f"{libcuda['error']}", LIBCUDA_REMEDY)
    cc_name = (build.get("cc_version") or build.get("cc") or "").strip()
    return out.info("triton.jit.builds", f"{cc_name} built and loaded a Triton-style extension against {include}"
                    f" (libcuda via {libcuda.get('found_by')})")
