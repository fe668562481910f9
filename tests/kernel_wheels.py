"""Real binary wheels for the stack.kernels tests: their shared objects and cubins, and NVIDIA's tools.

Fetched once with pip into the per-user wheel cache (``sglang_wheels.fetch_wheel``) and unpacked
there once (only what the scanner reads: shared objects, cubins, ``dist-info``, ``torch/version.py``).
All are the x86_64 Linux wheels whatever the test machine, so every run reads the same files:

* sglang-kernel 0.4.10 (built for torch 2.14.1) and 0.4.5 (for torch 2.11.0): 373 + 383 MB;
* torch 2.11.0 (+cu130, the PyPI wheel): 531 MB, its ``torch/lib`` defines the ABI;
* flashinfer-cubin 0.4.1 (the smallest release with Blackwell cubins): 92 MB of bare cubins;
* nvidia-cuda-cuobjdump and nvidia-cuda-nvcc 13.5.37 (``cuobjdump``; ``ptxas`` and ``fatbinary`` to
  build fat binaries whose contents are known): 0.3 + 47 MB.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import downloads
import pytest
from sglang_wheels import fetch_wheel, unpacked
from stack_support import workdir

PLATFORM = ("--only-binary=:all:", "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64")
KERNEL_NEW, KERNEL_OLD = "0.4.10", "0.4.5"
TORCH = "2.11.0"
FLASHINFER_CUBIN = "0.4.1"
CUDA_TOOLS = "13.5.37"


def scanned_member(name: str) -> bool:
    """What an install leaves that the scanner reads."""
    base = name.rsplit("/", 1)[-1]
    return (base.endswith((".so", ".cubin")) or ".so." in base or ".dist-info/" in name
            or name == "torch/version.py")


@downloads.reads("a released binary wheel")
def site(project: str, version: str) -> Path:
    """A site-packages directory holding the wheel's binaries and metadata (shared, read-only by convention)."""
    return unpacked(fetch_wheel(project, version, PLATFORM), scanned_member)


def kernel_site(version: str = KERNEL_NEW) -> Path:
    return site("sglang-kernel", version)


def torch_site() -> Path:
    return site("torch", TORCH)


def cubin_site() -> Path:
    return site("flashinfer-cubin", FLASHINFER_CUBIN)


def _tool(project: str, rel: str) -> Path:
    if platform.machine() != "x86_64":
        pytest.skip(f"NVIDIA's {rel} wheel binaries are x86_64; this machine is {platform.machine()}")
    path = unpacked(fetch_wheel(project, CUDA_TOOLS, PLATFORM), lambda n: n.startswith("nvidia/")) / rel
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


@downloads.reads("the nvidia-cuda-cuobjdump wheel")
def cuobjdump() -> Path:
    return _tool("nvidia-cuda-cuobjdump", "nvidia/cu13/bin/cuobjdump")


@downloads.reads("the nvidia-cuda-nvcc wheel")
def ptxas() -> Path:
    return _tool("nvidia-cuda-nvcc", "nvidia/cu13/bin/ptxas")


@downloads.reads("the nvidia-cuda-nvcc wheel")
def nvcc() -> Path:
    """NVIDIA's real nvcc 13.5 (it answers ``--version`` on its own, without the rest of a toolkit)."""
    return _tool("nvidia-cuda-nvcc", "nvidia/cu13/bin/nvcc")


@downloads.reads("the nvidia-cuda-nvcc wheel")
def fatbinary() -> Path:
    return _tool("nvidia-cuda-nvcc", "nvidia/cu13/bin/fatbinary")


def cuobjdump_list(path: Path, what: str, all_sections: bool = False) -> list[str]:
    """The architectures ``cuobjdump --list-elf|--list-ptx`` names (``sm_90a``), sorted, duplicates removed."""
    import re

    from doctor.stack.fatbin import arch_key

    args = [str(cuobjdump()), *(["-all"] if all_sections else []), f"--list-{what}", str(path)]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    names = set(re.findall(r"\.(sm_\d+[af]?)\.(?:cubin|ptx)$", res.stdout, re.M))
    return sorted(names, key=arch_key)


# What sglang-kernel 0.4.10's Hopper build needs and torch 2.11.0 does not define (it was built against
# torch 2.14.1, which its METADATA requires): as `nm -D --undefined-only` and `nm -D --defined-only` list them too.
MISSING_0_4_10 = {
    "_ZN3c104cuda19CUDAErrorLogCaptureC1Ev",  # c10::cuda::CUDAErrorLogCapture::CUDAErrorLogCapture()
    "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jbPNS0_19CUDAErrorLogCaptureE",
    "_ZN3c1019NotImplementedErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
    "_ZNR5torch7Library4_defEON3c1014FunctionSchemaEPNS1_12OperatorNameERKSt6vectorINS_10headeronly3TagESaIS8_EENS_17"
    "_RegisterOrVerifyE",
    "_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunctionERKSt6vectorINS_"
    "10headeronly3TagESaISB_EE",
}


# -- fat binaries built by NVIDIA's tools, contents known ----------------------------------------------------

KERNEL_PTX = ".version {isa}\n.target sm_{arch}\n.address_size 64\n.visible .entry k26_probe() {{ ret; }}\n"
SASS = ["80", "90", "90a", "100", "100a", "100f", "103a", "103f", "120", "120a", "120f"]


@downloads.reads("the nvidia-cuda-nvcc wheel")
def built() -> Path:
    """Cubins from ptxas and fat binaries from fatbinary (zstd by default, one LZ4, one uncompressed)."""
    d = workdir() / "fatbins"
    d.mkdir()
    for arch in [*SASS, "87ptx"]:
        isa, target = ("8.7", "90") if arch == "87ptx" else ("9.0", arch)
        (d / f"k_{arch}.ptx").write_text(KERNEL_PTX.format(isa=isa, arch=target))
        if arch != "87ptx":
            subprocess.run([str(ptxas()), f"--gpu-name=sm_{arch}", str(d / f"k_{arch}.ptx"), "-o",
                            str(d / f"k_{arch}.cubin")], check=True, timeout=120)
    images = [f"--image3=kind=elf,sm={a},file={d / f'k_{a}.cubin'}" for a in SASS]
    images += [f"--image3=kind=ptx,sm={sm},file={d / f'k_{src}.ptx'}"
               for sm, src in (("90", "87ptx"), ("100f", "100f"), ("100a", "100a"))]
    subprocess.run([str(fatbinary()), "--64", f"--create={d / 'all.fatbin'}", *images], check=True, timeout=120)
    subprocess.run([str(fatbinary()), "--64", "--compress-mode=speed", "--compress-all", f"--create={d / 'lz4.fatbin'}",
                    f"--image3=kind=elf,sm=90a,file={d / 'k_90a.cubin'}"], check=True, timeout=120)
    subprocess.run([str(fatbinary()), "--64", "--compress=false", f"--create={d / 'plain.fatbin'}",
                    f"--image3=kind=elf,sm=100a,file={d / 'k_100a.cubin'}",
                    f"--image3=kind=elf,sm=90,file={d / 'k_90.cubin'}"], check=True, timeout=120)
    return d


def host_library(fatbins: list[Path], name: str) -> Path:
    """A shared object built by gcc whose .nv_fatbin section holds these fat binaries, 8-aligned, in order."""
    d = built()
    src = d / f"{name}.c"
    parts = []
    for i, fb in enumerate(fatbins):
        data = fb.read_bytes()
        parts.append(f"__attribute__((section(\".nv_fatbin\"), aligned(8), used)) const unsigned char fb{i}[] = "
                     f"{{{','.join(str(b) for b in data)}}};")
    src.write_text("\n".join(parts) + "\nint k26_marker(void) { return 1; }\n")
    out = d / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True, timeout=120)
    return out
