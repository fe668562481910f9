#!/usr/bin/env python3
"""Build the DDTree validation payload: what a GPU host without network needs to run a patched SGLang
0.5.23 server, from the package registries, as one compressed site directory.

The GPU image this targets has Python 3.12, torch 2.11.0+cu130, triton 3.6.0, transformers 5.17 and the
scientific stack, but no network. The payload adds:

* SGLang 0.5.23 (cp312 wheel), pristine, slimmed of what a text-only server never imports
  (``DROP_SGLANG``, recorded in the payload's manifest). The DDTree patch set is applied on the GPU
  host by the product itself (``k26-doctor patches apply --python python3`` with the payload on
  ``PYTHONPATH``), so every revision of the set runs from the repository without rebuilding this;
* ``sglang-kernel`` 0.4.5 trimmed to its sm90 library (0.4.10's sm90 library needs 8 libtorch symbols
  torch 2.11 lacks; 0.4.5's resolve). Its 1.1 GB ``flash_ops`` and the other per-arch/extra
  libraries are dropped (the server's Triton attention path never loads them);
* the light runtime dependencies of the server path that the image lacks (``WHEELS``).

This test stack (torch 2.11 + sglang-kernel 0.4.5 + SGLang 0.5.23) is NOT SGLang 0.5.23's production
stack (which pins torch 2.14.1 and sglang-kernel 0.4.10): results obtained with it say so.

Usage: ``python bench/ddtree/payload.py --out .payload`` (needs a Python 3.12 interpreter: ``--python312``,
default ``python3.12`` on PATH or pyenv's). On the GPU host: ``bash bench/ddtree/unpack.sh`` (or
``mkdir -p /tmp/site && cat .payload/site.tar.xz.* | tar -xJ -C /tmp/site``) and ``PYTHONPATH=/tmp/site``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SGLANG = "sglang==0.5.23"
SGL_KERNEL = "sglang-kernel==0.4.5"
PATCH_SET = "ddtree-0.5.23"

# The server path's imports that the GPU image lacks (found by importing sglang.launch_server, the
# scheduler, the tokenizer/detokenizer managers, the model runner, the llama/qwen3/deepseek_v2/dflash
# models, the Triton attention backend and the DFlash/DDTree workers), pinned where SGLang pins them.
WHEELS = [
    "orjson", "pybase64", "msgspec", "pyzmq", "setproctitle", "starlette", "fastapi", "uvicorn",
    "python-multipart", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
    "apache-tvm-ffi==0.1.11", "compressed-tensors==0.18.0", "openai==2.8.0", "distro", "jiter", "sniffio",
    "partial-json-parser", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py",
    "xgrammar==0.2.7", "soundfile==0.13.1", "cffi", "pycparser", "gguf", "dill", "loguru", "opentelemetry-api",
    "ipython", "ipython-pygments-lexers", "jedi", "parso", "traitlets", "decorator", "matplotlib-inline",
    "prompt-toolkit", "wcwidth", "pexpect", "ptyprocess", "stack-data", "executing", "asttokens", "pure-eval",
    "interegular", "blobfile", "pycryptodomex", "llguidance", "openai-harmony==0.0.4", "watchfiles",
    "zstandard", "uvloop", "python-dotenv", "httptools", "websockets",
]
# SGLang's Llama/Qwen MLPs import the CuTe DSL (``cutlass``) on every CUDA start (DualGemm's mode
# selection; the kernel itself is SM100-only). Its compiler library alone is 92 MB compressed, so it
# travels as a second archive group, carried by a second call while the host is warm.
CUTLASS = ["nvidia-cutlass-dsl==4.8.0", "nvidia-cutlass-dsl-libs-base==4.8.0", "nvidia-cutlass-dsl-libs-cu13==4.8.0"]
# FlashInfer on CUDA: DFLASH/DDTREE verify renormalises with it, and once it is importable SGLang JIT-compiles
# other FlashInfer modules too (norm, ...), which need its CUDA sources, CUTLASS and CCCL headers: the whole
# wheel travels, as its own archive group (a trimmed copy failed on the host: "norm.cu ... missing").
FLASHINFER = "flashinfer-python==0.7.2"
PLATFORMS = ["manylinux_2_39_x86_64", "manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]

# Dropped from the patched SGLang tree, with the reason (recorded in the payload manifest).
DROP_SGLANG = {
    "sglang/multimodal_gen": "diffusion/video generation: a separate server, never imported by launch_server",
    "sglang/test": "SGLang's test kits",
    "sglang/srt/rust_extensions/_server.cpython-312-x86_64-linux-gnu.so":
        "the Rust HTTP server, only with SGLANG_RUST_SERVER=1",
    "sglang/srt/rust_extensions/_bench.cpython-312-x86_64-linux-gnu.so": "the Rust benchmark client",
    "sglang/srt/rust_extensions/_grpc.cpython-312-x86_64-linux-gnu.so": "the gRPC front end (--grpc-mode)",
    "sglang/srt/rust_extensions/_multimodal.cpython-312-x86_64-linux-gnu.so": "image/video preprocessing",
}
# Dropped from the dependencies' trees, with the reason: a call carries at most 64 MiB (site + flashinfer + the
# repository), and these are never imported by a text-only server.
DROP_DEPS = {
    "jedi": "IPython's completion engine: IPython imports it only when a completion is asked for (32 MB of stubs)",
    "zstandard/_cffi.cpython-312-x86_64-linux-gnu.so": "zstandard's CFFI backend: its C backend is the default",
}
# Kept from sglang-kernel 0.4.5: its Python modules and the sm90 common ops (H200 is sm_90).
KEEP_KERNEL_LIBS = {"sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so"}


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(str(a) for a in argv), flush=True)
    return subprocess.run([str(a) for a in argv], check=True, **kw)


def download(specs: list[str], dest: Path) -> list[Path]:
    """cp312 manylinux (or pure-Python) wheels, no dependencies: exactly what is named."""
    dest.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
            "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none"]
    for p in PLATFORMS:
        args += ["--platform", p]
    sh([*args, "--platform", "any", "-d", dest, *specs])
    return sorted(dest.glob("*.whl"))


def find_python312(given: str | None) -> str:
    for cand in [given, shutil.which("python3.12"),
                 *sorted(str(p) for p in (Path.home() / ".pyenv" / "versions").glob("3.12.*/bin/python3"))]:
        if not cand:
            continue
        probe = subprocess.run([cand, "-c", "import sys;print(sys.version_info[:2] == (3, 12))"],
                               capture_output=True, text=True)
        if probe.stdout.strip() == "True":  # a pyenv shim may exist without answering
            return cand
    sys.exit("payload: a Python 3.12 interpreter is needed (--python312)")


def patched_sglang(wheel: Path, py312: str, work: Path) -> Path:
    """A venv holding the wheel, patched by ``k26-doctor patches apply`` (a dry run of what the GPU host
    does: the set must apply to this wheel); returns the venv's site-packages."""
    venv = work / "venv312"
    sh([py312, "-m", "venv", "--without-pip", venv])
    vpy = venv / "bin" / "python"
    site = Path(subprocess.run([vpy, "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    sh([sys.executable, "-m", "doctor", "patches", "apply", "--python", vpy, "--set", PATCH_SET,
        "--state-dir", work / "state", "--yes"], cwd=REPO, env=env)
    status = subprocess.run([sys.executable, "-m", "doctor", "patches", "status", "--python", str(vpy), "--set",
                             PATCH_SET, "--state-dir", str(work / "state")], cwd=REPO, env=env,
                            capture_output=True, text=True)
    print(status.stdout[-2000:])
    if status.returncode != 0:
        sys.exit(f"payload: the patch set is not fully applied:\n{status.stdout}\n{status.stderr}")
    return site


def stage(site: Path, wheels: list[Path], kernel: Path, out: Path) -> dict:
    stage_dir = out / "site"
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    dropped = {}
    for name in ("sglang",):
        shutil.copytree(site / name, stage_dir / name, ignore=shutil.ignore_patterns("__pycache__"))
    for info in site.glob("sglang-*.dist-info"):
        shutil.copytree(info, stage_dir / info.name)
    for rel, why in DROP_SGLANG.items():
        p = stage_dir / rel
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        else:
            continue
        dropped[rel] = why
    with zipfile.ZipFile(kernel) as zf:
        for n in zf.namelist():
            if (n.startswith("sgl_kernel/") and (n.endswith(".py") or n in KEEP_KERNEL_LIBS)) or ".dist-info/" in n:
                zf.extract(n, stage_dir)
            elif n.endswith(".so"):
                dropped[n] = "sglang-kernel library the Triton-attention H200 path never loads"
    for whl in wheels:
        with zipfile.ZipFile(whl) as zf:
            for n in zf.namelist():
                if any(n == d or n.startswith(d + "/") for d in DROP_DEPS):
                    continue
                parts = n.split("/")
                if ".data" in parts[0] and len(parts) > 2 and parts[1] in ("purelib", "platlib"):
                    target = stage_dir / "/".join(parts[2:])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(zf.read(n))
                elif ".data" not in parts[0]:
                    zf.extract(n, stage_dir)
    dropped.update(DROP_DEPS)
    return dropped


def unpack_wheels(wheels: list[Path], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for whl in wheels:
        with zipfile.ZipFile(whl) as zf:
            zf.extractall(dest)


def pack(src: Path, out: Path, group: str, part_mib: int = 60) -> list[Path]:
    """``src`` as ``<group>.tar.xz.NN`` parts of at most ``part_mib`` MiB (one call carries 64 MiB)."""
    tar = out / f"{group}.tar.xz"
    with tar.open("wb") as fh:  # xz -T0: every core; tarfile's xz is single-threaded
        tarp = subprocess.Popen(["tar", "-C", str(src), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", "-6", "-c"], stdin=tarp.stdout, stdout=fh, check=True)
        if tarp.wait() != 0:
            sys.exit("payload: tar failed")
    for old in out.glob(f"{group}.tar.xz.*"):
        old.unlink()
    parts, data, size = [], tar.read_bytes(), part_mib << 20
    for i in range(0, len(data), size):
        p = out / f"{group}.tar.xz.{i // size:02d}"
        p.write_bytes(data[i:i + size])
        parts.append(p)
    tar.unlink()
    return parts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / ".payload"))
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "k26-doctor-payload"))
    ap.add_argument("--python312")
    args = ap.parse_args()
    out, cache = Path(args.out), Path(args.cache)
    out.mkdir(parents=True, exist_ok=True)
    sg = download([SGLANG], cache / "sglang")
    kern = download([SGL_KERNEL], cache / "kernel")
    deps = download(WHEELS, cache / "deps")
    cutlass = download(CUTLASS, cache / "cutlass")
    flashinfer = download([FLASHINFER], cache / "flashinfer")
    py312 = find_python312(args.python312)
    with tempfile.TemporaryDirectory(prefix="k26-payload-") as tmp:
        patched_sglang(sg[0], py312, Path(tmp))
        pristine = Path(tmp) / "pristine"
        with zipfile.ZipFile(sg[0]) as zf:
            zf.extractall(pristine)
        dropped = stage(pristine, deps, kern[0], out)
    parts = pack(out / "site", out, "site")
    shutil.rmtree(out / "site")
    unpack_wheels(cutlass, out / "cutlass")
    parts += pack(out / "cutlass", out, "cutlass")
    shutil.rmtree(out / "cutlass")
    unpack_wheels(flashinfer, out / "flashinfer")
    parts += pack(out / "flashinfer", out, "flashinfer")
    shutil.rmtree(out / "flashinfer")
    manifest = {
        "what": "DDTree validation payload: SGLang 0.5.23 (pristine; apply " + PATCH_SET + " on the host), "
                "sglang-kernel 0.4.5 (sm90), "
                "server dependencies the GPU image lacks. NOT the production stack (torch 2.11, kernel 0.4.5).",
        "sglang": sg[0].name, "sglang_kernel": kern[0].name, "wheels": sorted(w.name for w in deps),
        "cutlass": sorted(w.name for w in cutlass), "flashinfer": flashinfer[0].name,
        "dropped": dropped,
        "parts": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in parts},
        "bytes": sum(p.stat().st_size for p in parts),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"payload: {len(parts)} part(s), {manifest['bytes'] / 2**20:.1f} MiB in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
