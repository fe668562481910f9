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
from doctor.facts.store import CollectOptions
from doctor.stack.service_probe import STACK_PROBE_TIMEOUT, probe_service, stack_probe

TORCH_TIMEOUT = 120.0
TORCH_DEEP_TIMEOUT = 300.0
KERNELS_TIMEOUT = 60.0
LIBCUDA_TIMEOUT = 30.0


# -- the service's environment ------------------------------------------------------------------


@collector("stack", timeout=STACK_PROBE_TIMEOUT + 5)
def collect_stack(opts: CollectOptions) -> dict[str, Any]:
    """The service interpreter, its include dir and Python.h, installed distributions and package paths."""
    return stack_probe(opts)


@collector("torch_info", timeout=TORCH_DEEP_TIMEOUT + 5)
def collect_torch_info(opts: CollectOptions) -> dict[str, Any]:
    """torch's version, CUDA runtime, compiled targets and GPUs; with --deep, a matmul per GPU."""
    if opts.deep:
        return probe_service(opts, "torch_info", ["--deep"], TORCH_DEEP_TIMEOUT)
    return probe_service(opts, "torch_info", [], TORCH_TIMEOUT)


@collector("kernels", timeout=KERNELS_TIMEOUT + 5)
def collect_kernels(opts: CollectOptions) -> dict[str, Any]:
    """Every installed package's fat binaries and cubins (headers only) and the torch symbols its libraries need."""
    return probe_service(opts, "kernels", [], KERNELS_TIMEOUT)


@collector("libcuda", timeout=LIBCUDA_TIMEOUT + 5)
def collect_libcuda(opts: CollectOptions) -> dict[str, Any]:
    """The libcuda.so.1 the service's loader resolves (path, version, cuInit) and the kernel module's version."""
    return probe_service(opts, "libcuda", [], LIBCUDA_TIMEOUT)


# -- ptxas ---------------------------------------------------------------------------------------


# -- the environment on disk ---------------------------------------------------------------------


