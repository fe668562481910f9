"""Checks of the service's Python stack: CUDA/torch, the kernel packages' GPU code, the libcuda the service loads,
and the versions against the supported matrix.

The B300 service's first start failed after 120 s because Triton could not compile ``cuda_utils.c``
(no ``Python.h`` for the system Python; the venv had been copied from another machine). Each check
here turns one such failure into a second of preflight: it maps the facts of ``doctor.stack.facts``
(and ``nvml`` for the driver and the GPUs) to the judgements of ``doctor/stack/``.
"""

from __future__ import annotations

from doctor.core.context import Context
from doctor.core.registry import check
from doctor.core.result import Result
from doctor.stack import kernels, libcuda, torch_cuda, versions
from doctor.stack.cuda_arch import judged_ccs


@check("cuda.compat", "Driver CUDA version vs the CUDA runtime torch was built with",
       needs=("nvml", "stack", "torch_info"), depends=("python.venv",), timeout=180, failure="deployment")
def cuda_compat(ctx: Context) -> Result:
    """Compares the CUDA version the NVIDIA driver supports (NVML) with the CUDA runtime torch was built
    with: by default ``cuda`` of ``torch/version.py``, parsed from its syntax tree in the ``stack`` probe
    (what ``torch.version.cuda`` returns, without the seconds ``import torch`` costs); with --deep (or a
    recording without that file's reading) torch is imported in a child process, which also tells whether
    torch can use the GPUs at all (``torch.cuda.is_available()``: a runtime question only an import answers).

    A runtime newer than the driver fails at the first CUDA call ("CUDA driver version is insufficient").
    NVIDIA's rules (doctor/data/compat.toml): each toolkit release has a minimum driver (13.0 GA needs
    >= 580.65.06, 12.8 GA >= 570.26); within a major family, minor-version compatibility lets a newer
    runtime run on an older driver of the same family (13.x on >= 580, 12.x on >= 525) with a limited
    feature set (no JIT of newer PTX): warn. Fix by hand: install a driver at least as new as the table
    says, or a torch built for an older CUDA (e.g. the cu128 wheel).
    """
    return Result.of(torch_cuda.judge_compat(ctx.fact, ctx.settings))


@check("torch.arch", "torch has kernels that run on each GPU's architecture",
       needs=("torch_info", "nvml", "kernels", "stack"), depends=("python.venv",), timeout=300, failure="deployment")
def torch_arch(ctx: Context) -> Result:
    """Matches the targets compiled into torch (``torch._C._cuda_getArchFlags()``, read in a child
    process) against every GPU's compute capability by CUDA's binary compatibility rules
    (doctor/stack/cuda_arch.py): an sm_XY cubin runs on sm_XZ with Z >= Y of the same major; arch-specific
    ``a`` targets run only on their exact GPU; PTX (compute_XY) is JIT-compiled for anything newer.

    torch 2.11.0+cu130 has sm_100 and no sm_103: B300 (10.3) runs its sm_100 cubins, which is fine.
    Without a compatible target torch fails with "no kernel image is available for execution on the
    device". By default the targets are read from ``torch/lib/libtorch_cuda.so``'s fat binary and
    ``torch/version.py`` (facts ``kernels`` and ``stack``: torch is not imported); arch-specific
    ``sm_XYa`` kernels count only where no general target runs. With --deep (or a recording without
    those facts) torch is imported in a child process and, with --deep, a small matmul runs on every
    GPU. Fix by hand: install a torch wheel whose CUDA build covers the GPU (cu128 or newer for Blackwell).
    """
    gpus = lambda: judged_ccs(lambda: ctx.fact("nvml"), ctx.settings)  # noqa: E731 (read when needed)
    return Result.of(torch_cuda.judge_arch(ctx.fact, gpus, ctx.settings))


@check("stack.kernels",
       "GPU code (SASS/PTX) of every kernel package vs every GPU, read from the binaries; the libtorch ABI",
       needs=("kernels", "nvml", "stack"), depends=("python.venv",), timeout=120, failure="deployment")
def stack_kernels(ctx: Context) -> Result:
    """Reads every installed package's GPU code from its files (``.nv_fatbin`` of each shared object,
    bare cubins; doctor/stack/fatbin.py, nothing imported) and judges it against every GPU's compute
    capability by CUDA's rules: ``sm_100`` SASS runs on 10.3, ``sm_100a`` does not, ``sm_100f`` runs on
    10.0 and 10.3, PTX JIT-compiles forward when the driver knows its ISA (doctor/stack/kernels.py).
    A required package (torch, sgl-kernel) with no code for a GPU fails ("no kernel image is available");
    kernels built for another GPU of the same generation only (flashinfer's sm_100a cubins on a B300) warn.
    It also resolves each kernel library's undefined torch symbols against the installed torch's
    libraries (a kernel built for another torch fails at import with "undefined symbol", after the
    weights began loading) and reads every installed package's Requires-Dist pins. Fix by hand: install
    the kernel builds made for the installed torch and GPU (the remediation names them).
    """
    gpus = judged_ccs(lambda: ctx.fact("nvml"), ctx.settings)
    return Result.of(kernels.judge_kernels(ctx.fact("kernels"), gpus, ctx.optional("nvml"), ctx.optional("stack"),
                                            ctx.settings.python))


@check("cuda.libcuda", "The libcuda.so.1 the service loads vs the kernel module (803); forward compatibility (804)",
       needs=("libcuda", "nvml"), depends=("python.venv",), timeout=60, failure="node")
def cuda_libcuda(ctx: Context) -> Result:
    """Loads ``libcuda.so.1`` in a child of the service's interpreter, with the service's environment,
    as torch does, and reads which file the loader mapped (``/proc/self/maps``) and its version (its real
    file name), against the kernel module's (``/proc/driver/nvidia/version``); ``cuInit`` says what the
    driver itself thinks. A different version is error 803 (a container's loader cache or an
    LD_LIBRARY_PATH entry); a newer one is CUDA forward compatibility, which only data center GPUs
    support (804 elsewhere). The CUDA toolkit's link stub (``lib64/stubs``, cuInit 34) on the path fails,
    as does any cuInit error from the right library (no device nodes, nvidia-uvm missing). Fix by hand: the
    LD_LIBRARY_PATH value or ld.so.conf line the remediation names, then ``ldconfig``.
    """
    return Result.of(libcuda.judge_libcuda(ctx.fact("libcuda"), ctx.optional("nvml"), ctx.settings.python))


@check("stack.versions", "torch / triton / sglang / sglang-kernel / flashinfer against the supported matrix",
       needs=("stack",), depends=("python.venv",), failure="deployment")
def stack_versions(ctx: Context) -> Result:
    """Reads the installed versions from the service interpreter's package metadata (nothing is
    imported) and compares them with the profile's [stack] pins and the supported matrix
    (doctor/data/compat.toml): torch pins its Triton (2.14.1 -> ~=3.8.0), SGLang 0.5.23 pins
    sglang-kernel 0.4.10 and flashinfer-python 0.7.2. Then, like ``pip check``, evaluates the
    requirements these packages declare on each other. A pin, the matrix's or a package's own, that the
    profile deliberately overrides (the installed version is the one the profile pins) is a warning, the
    same from either source; a package SGLang needs that is missing is named once. Mismatched kernels
    load and then crash or silently miscompute. Fix by hand: install the pinned versions (the remediation
    lists the exact pip command).
    """
    return Result.of(versions.judge_versions(ctx.fact("stack"), ctx.settings))
