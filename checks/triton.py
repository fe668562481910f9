"""Checks of Triton's toolchain on the service host: the C build of its runtime helpers and its ptxas.

Triton builds C helpers (``cuda_utils.c``, one launcher per kernel signature) with the host's C
compiler against the interpreter's ``Python.h`` on first use, and assembles every kernel with ptxas
for the GPU's architecture. Both failed or can fail on a fresh B300 host; both are judged by
``doctor/triton/`` from the facts ``triton_build`` and ``ptxas`` (``doctor/triton/facts.py``).
"""

from __future__ import annotations

from doctor.core.context import Context
from doctor.core.registry import check
from doctor.core.result import Result
from doctor.stack.cuda_arch import judged_ccs
from doctor.triton.jit import judge_jit
from doctor.triton.ptxas import judge_ptxas


@check("triton.jit", "Triton can build its runtime helpers: C compiler, Python.h, libcuda",
       needs=("triton_build", "stack", "libcuda"), depends=("python.venv",), fixer="triton.jit.headers", timeout=180,
       failure="deployment")
def triton_jit(ctx: Context) -> Result:
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
    return Result.of(judge_jit(build, ctx.optional("stack"), ctx.optional("libcuda"), ctx.settings.python))


@check("triton.ptxas", "The ptxas Triton will use knows the GPU architecture (e.g. sm_103a)",
       needs=("ptxas", "nvml"), depends=("python.venv",), fixer="triton.ptxas.env", timeout=120, failure="deployment")
def triton_ptxas(ctx: Context) -> Result:
    """Triton compiles every kernel to PTX and assembles it with ptxas for ``sm_<cc>a``. It uses
    ``TRITON_PTXAS_PATH`` (or, from Triton 3.6 for arch >= 100, ``TRITON_PTXAS_BLACKWELL_PATH``) when
    that binary runs, else the one bundled in triton/backends/nvidia/bin. Each candidate is run: its
    ``--help`` lists the targets it accepts, and a one-instruction kernel is assembled for the profile's
    GPU. Triton 3.5.x bundles only ptxas 12.8, which rejects ``sm_103a`` (B300); 3.6 adds a 12.9
    ptxas-blackwell. Fix by hand: upgrade Triton, or point the variable at a CUDA >= 12.9 ptxas (torch's
    torch/bin/ptxas, the nvidia-cuda-nvcc wheel's, or the toolkit's) in the service's environment file.
    """
    gpus = judged_ccs(lambda: ctx.fact("nvml"), ctx.settings)
    return Result.of(judge_ptxas(ctx.fact("ptxas"), gpus, ctx.settings))
