"""Probe: build a tiny C extension exactly the way Triton's runtime builds its helpers, then load it.

Triton compiles ``cuda_utils.c`` and a launcher per kernel signature on first use
(``triton/runtime/build.py`` ``_build``): ``$CC`` else gcc else clang, the interpreter's sysconfig
include directory (where ``Python.h`` must be), ``-l:libcuda.so.1`` from ``TRITON_LIBCUDA_PATH`` /
``ldconfig -p`` / ``LD_LIBRARY_PATH``. This probe repeats that in a temporary directory, with the
same compiler, flags and search rules, under the service's interpreter and environment, so that a
missing ``Python.h`` or compiler shows up in seconds instead of at the service's first kernel.
Needs no GPU: without libcuda it still builds (and says libcuda is missing). Stdlib only, Python >= 3.8.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from importlib import util

NAME = "k26_triton_probe"
SOURCE = rf"""
#include <Python.h>
#ifdef K26_WITH_CUDA_H
#include "cuda.h"
#endif
static PyMethodDef k26_methods[] = {{{{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef k26_module = {{PyModuleDef_HEAD_INIT, "{NAME}", NULL, -1, k26_methods}};
PyMODINIT_FUNC PyInit_{NAME}(void) {{ return PyModule_Create(&k26_module); }}
"""


def pick_cc():
    """``CC``, else gcc, else clang: triton/runtime/build.py's order."""
    cc = os.environ.get("CC")
    if cc is not None:
        return cc, "CC"
    gcc = shutil.which("gcc")
    clang = shutil.which("clang")
    if gcc is not None:
        return gcc, "PATH (gcc)"
    if clang is not None:
        return clang, "PATH (clang)"
    return None, None


def py_include_dir():
    if hasattr(sysconfig, "get_default_scheme"):
        scheme = sysconfig.get_default_scheme()
    else:
        scheme = sysconfig._get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def libcuda_dirs():
    """triton/backends/nvidia/driver.py ``libcuda_dirs``: returns (dirs, how, error)."""
    env_path = os.environ.get("TRITON_LIBCUDA_PATH")
    if env_path:
        ok = os.path.exists(os.path.join(env_path, "libcuda.so.1"))
        return [env_path], "TRITON_LIBCUDA_PATH", None if ok else f"TRITON_LIBCUDA_PATH={env_path} has no libcuda.so.1"
    locs = []
    err = None
    try:
        res = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, timeout=20, check=False)
        out = res.stdout.decode(errors="ignore")
        locs = [line.split()[-1] for line in out.splitlines() if "libcuda.so.1" in line]
    except (OSError, subprocess.SubprocessError) as exc:
        err = f"/sbin/ldconfig -p failed: {exc}"
    dirs = [os.path.dirname(loc) for loc in locs]
    how = "ldconfig -p"
    ld_path = os.environ.get("LD_LIBRARY_PATH")
    if ld_path and not dirs:
        dirs = [d for d in ld_path.split(":") if d and os.path.exists(os.path.join(d, "libcuda.so.1"))]
        how = "LD_LIBRARY_PATH"
    if any(os.path.exists(os.path.join(d, "libcuda.so.1")) for d in dirs):
        return dirs, how, None
    msg = "libcuda.so.1 not found by ldconfig -p or in LD_LIBRARY_PATH"
    if locs:
        msg = f"ldconfig lists libcuda.so.1 at {locs} but the files are missing"
    return dirs, None, (err + "; " + msg) if err else msg


def triton_nvidia_dir():
    try:
        spec = util.find_spec("triton")  # top-level: searches sys.path, executes nothing
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(next(iter(spec.submodule_search_locations)), "backends", "nvidia")


def cc_version(cc):
    try:
        out = subprocess.run([cc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20,
                             check=False).stdout.decode(errors="replace")
        return out.strip().splitlines()[0] if out.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def error_line(text):
    """The compiler's first line that says ``error`` (what a person needs to read)."""
    for line in text.splitlines():
        if "error" in line.lower():
            return line.strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else None


def main():
    out = {"ok": False}
    cc, cc_from = pick_cc()
    include = py_include_dir()
    out.update({"cc": cc, "cc_from": cc_from, "py_include": include,
                "python_h": os.path.isfile(os.path.join(include, "Python.h")),
                "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX")})
    dirs, how, cuda_err = libcuda_dirs()
    out["libcuda"] = {"dirs": dirs, "found_by": how, "error": cuda_err}
    nv = triton_nvidia_dir()
    out["triton_nvidia_dir"] = nv
    if cc is None:
        out["stage"] = "compiler"
        out["error"] = "no C compiler: CC is unset and neither gcc nor clang is on PATH"
        print(json.dumps(out))
        return
    resolved = shutil.which(cc) if not os.path.isabs(cc) else (cc if os.path.exists(cc) else None)
    out["cc_path"] = resolved
    out["cc_version"] = cc_version(cc) if resolved else None
    tmp = tempfile.mkdtemp(prefix="k26-doctor-cbuild-")
    try:
        src = os.path.join(tmp, NAME + ".c")
        with open(src, "w") as fh:
            fh.write(SOURCE)
        so = os.path.join(tmp, NAME + (out["ext_suffix"] or ".so"))
        include_dirs = []
        library_dirs = []
        libraries = []
        ccflags = []
        if nv and os.path.isfile(os.path.join(nv, "include", "cuda.h")):
            include_dirs.append(os.path.join(nv, "include"))
            ccflags.append("-DK26_WITH_CUDA_H")
        if cuda_err is None:
            libraries.append("-l:libcuda.so.1")
            library_dirs = ([os.path.join(nv, "lib")] if nv else []) + dirs
        include_dirs += [tmp, include]
        cmd = [cc, src, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so]
        cmd += libraries + ["-L" + d for d in library_dirs] + ["-I" + d for d in include_dirs] + ccflags
        out["cmd"] = cmd
        out["linked_libcuda"] = bool(libraries)
        start = time.monotonic()
        try:
            res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, check=False)
        except OSError as exc:
            out.update(stage="compile", error=f"cannot run {cc}: {exc.strerror or exc}")
            print(json.dumps(out))
            return
        except subprocess.TimeoutExpired:
            out.update(stage="compile", error=f"{cc} did not finish within 120s")
            print(json.dumps(out))
            return
        text = res.stdout.decode(errors="replace")
        out["compile_s"] = round(time.monotonic() - start, 3)
        out["returncode"] = res.returncode
        out["output"] = text[-4000:]
        if res.returncode != 0:
            out.update(stage="compile", error=error_line(text) or f"{cc} exited with {res.returncode}")
            print(json.dumps(out))
            return
        try:
            spec = util.spec_from_file_location(NAME, so)
            mod = util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except Exception as exc:  # ImportError: undefined symbol, wrong ABI, libcuda not loadable
            out.update(stage="load", error=f"{type(exc).__name__}: {exc}")
            print(json.dumps(out))
            return
        out.update(ok=True, stage="done")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
