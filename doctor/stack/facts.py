"""Collectors for the service's Python stack: interpreter, packages, Triton's toolchain, torch, SGLang.

Everything that needs the service's interpreter runs as a probe under it (``doctor/probes``), with
a deadline; nothing here imports torch, triton or sglang. Facts (all JSON):

* ``stack``: interpreter facts, installed distributions, package locations, torch/version.py's constants, what
  SGLang's server imports at start found on disk (probe ``stack``; nothing imported).
* ``triton_build``: a Triton-style C extension build and load (probe ``cbuild``).
* ``torch_info``: torch imported: its CUDA runtime and compiled targets (probe ``torch_info``; ``--deep`` matmul);
  read by cuda.compat and torch.arch only under ``--deep`` or when a recording lacks the file facts.
* ``sglang_import``: SGLang imported for real, DFlash kernel availability (probe ``sglang_import``; ``--deep``,
  ``launch``, or a recording without ``stack``'s ``sglang_runtime``).
* ``ptxas``: every ptxas Triton could use, its CUDA release and the targets it accepts.
* ``kernels``: every package's GPU code (SASS/PTX) and libtorch ABI, read from the files (probe ``kernels``).
* ``libcuda``: the libcuda.so.1 the service's loader resolves, the kernel module's version (probe ``libcuda``).
* ``venv``: the environment's files read from outside (works even when the interpreter cannot start).

The service's environment is ``opts.env`` plus the profile's ``server.env_file`` (what systemd gives
the service), so a fix written to that file is seen by the next check.
"""

from __future__ import annotations

from typing import Any

from doctor.core.registry import collector
from doctor.facts.shape import NUM, mapping, opt
from doctor.facts.store import CollectOptions
from doctor.stack.service_probe import PROBE_SHAPE, STACK_PROBE_TIMEOUT, probe_service, stack_probe

TORCH_TIMEOUT = 120.0
TORCH_DEEP_TIMEOUT = 300.0
KERNELS_TIMEOUT = 60.0
LIBCUDA_TIMEOUT = 30.0


# -- the service's environment ------------------------------------------------------------------


# What the stack, triton and sglang checks read of these facts (doctor.facts.shape).
DIST = {"name": str, "version": opt(str), "requires": opt([str]), "location": opt(str)}
RUNTIME = {"from": opt(str), "flashinfer": opt({"found": opt(bool), "importable": opt(bool), "error": opt(str),
                                                "package_dir": opt(str), "jit_dirs": opt(mapping(bool))}),
           "cute_dsl": opt({"found": opt(bool), "error": opt(str)}),
           "dflash": opt({"available": opt(bool), "error": opt(str)})}
# The nvcc a JIT build runs and the headers under its toolkit (probe ``find_nvcc``): the release macros read from
# the real cuda_runtime_api.h / cuda.h (13000 = 13.0).
NVCC = {"exists": opt(bool), "nvcc": opt(str), "found_by": opt(str), "release": opt(str), "home": opt(str),
        "include": opt(str), "includes": opt([str]), "cuda_runtime_h": opt(bool),
        "cudart_version": opt(int), "cuda_version": opt(int)}
STACK_SHAPE = {
    **PROBE_SHAPE, "distributions": opt(mapping(DIST)),
    "packages": opt(mapping({"found": opt(bool), "dirs": opt([str]), "origin": opt(str)})),
    "python": opt((str, {"markers": opt(mapping(str)), "version": opt(str), "base_prefix": opt(str),  # str: the
                         "include": opt(str), "base_is_conda": opt(bool), "executable": opt(str),   # probe did not
                         "in_venv": opt(bool)})),                                                   # run (its path)
    "torch": opt({"dir": opt(str), "ptxas": opt(str), "version_py": opt(mapping(opt(str)))}),
    "triton": opt(dict), "sglang_runtime": opt(RUNTIME),
    "sglang_jit": opt(NVCC),
    "flashinfer_jit": opt({"version": opt(str), "compiled": opt([str]), "cache_dir": opt(str), "ninja": opt(str),
                           "ninja_beside_python": opt(str), "writable": opt(bool), "writable_checked": opt(str),
                           "base_from": opt(str), "nvcc": opt(NVCC)}),
    "duplicates": opt([{"name": str, "shadowed_by": opt(str), "version": opt(str)}]),
    "metadata_errors": opt([str]), "env": opt(mapping(str)), "nvidia_ptxas": opt(list),
}
TORCH_INFO_SHAPE = {
    **PROBE_SHAPE, "missing_module": opt(str), "version": opt(str), "cuda": opt(str), "cuda_available": opt(bool),
    "cuda_warnings": opt([str]), "cuda_error": opt(str), "arch_flags": opt([str]), "targets_from": opt(str),
    "matmul": opt([{"ok": opt(bool), "index": opt(int), "error": opt(str), "max_abs_err": opt(NUM)}]),
}
KERNEL_FILE = {"path": str, "sass": opt([str]), "ptx": opt([str]), "ptx_isa": opt(mapping(opt(str)))}
KERNELS_SHAPE = {
    **PROBE_SHAPE, "distributions": opt(mapping(DIST)), "torch": opt({"version": opt(str)}),
    "packages": opt([{"name": str, "version": opt(str), "files": opt([KERNEL_FILE]),
                      "abi": opt({"error": opt(str), "checked": opt(list), "missing": opt(mapping([str]))}),
                      "errors": opt([{"kind": opt(str), "path": opt(str), "error": opt(str)}])}]),
    "scan_s": opt(NUM), "files_read": opt(int),
}
LIBRARY = {"path": opt(str), "realpath": opt(str), "version": opt(str), "conf": opt(str)}
LIBCUDA_SHAPE = {
    **PROBE_SHAPE, "kernel_module": opt({"version": opt(str), "present": opt(bool), "error": opt(str),
                                         "text": opt(str), "path": opt(str)}),
    "resolved": opt({"loaded": opt(bool), "version": opt(str), "path": opt(str), "realpath": opt(str),
                     "cu_init": opt(int), "cu_init_error": opt(str), "error": opt(str),
                     "driver_get_version": opt({"rc": opt(int), "cuda": opt(int), "error": opt(str)})}),
    "ld_library_path": opt(str), "compat_dirs": opt([LIBRARY]), "ldconfig": opt([LIBRARY]),
    "ld_library_path_candidates": opt([LIBRARY]),
}


@collector("stack", timeout=STACK_PROBE_TIMEOUT + 5, shape=STACK_SHAPE)
def collect_stack(opts: CollectOptions) -> dict[str, Any]:
    """The service interpreter, its include dir and Python.h, installed distributions and package paths."""
    return stack_probe(opts)


@collector("torch_info", timeout=TORCH_DEEP_TIMEOUT + 5, shape=TORCH_INFO_SHAPE)
def collect_torch_info(opts: CollectOptions) -> dict[str, Any]:
    """torch's version, CUDA runtime, compiled targets and GPUs; with --deep, a matmul per GPU."""
    if opts.deep:
        return probe_service(opts, "torch_info", ["--deep"], TORCH_DEEP_TIMEOUT)
    return probe_service(opts, "torch_info", [], TORCH_TIMEOUT)


@collector("kernels", timeout=KERNELS_TIMEOUT + 5, shape=KERNELS_SHAPE)
def collect_kernels(opts: CollectOptions) -> dict[str, Any]:
    """Every installed package's fat binaries and cubins (headers only) and the torch symbols its libraries need."""
    return probe_service(opts, "kernels", [], KERNELS_TIMEOUT)


@collector("libcuda", timeout=LIBCUDA_TIMEOUT + 5, shape=LIBCUDA_SHAPE)
def collect_libcuda(opts: CollectOptions) -> dict[str, Any]:
    """The libcuda.so.1 the service's loader resolves (path, version, cuInit) and the kernel module's version."""
    return probe_service(opts, "libcuda", [], LIBCUDA_TIMEOUT)


# -- ptxas ---------------------------------------------------------------------------------------


# -- the environment on disk ---------------------------------------------------------------------


