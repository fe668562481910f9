"""Other Python interpreters on this machine for the tests that run probes under them (found, never assumed).

Looks in pyenv's versions (``$PYENV_ROOT``, else ``~/.pyenv``) and on ``PATH`` (``python3.X``).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def pyenv_versions() -> Path:
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"


def find_python(version: str) -> Path | None:
    """An interpreter of ``version`` ("3.10" or "3.10.13"): pyenv's first match, else ``python3.X`` on PATH."""
    root = pyenv_versions()
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.name == version or d.name.startswith(version + "."):
                exe = d / "bin" / "python"
                if exe.exists():
                    return exe
    minor = ".".join(version.split(".")[:2])
    found = shutil.which(f"python{minor}")
    return Path(found) if found else None


@functools.lru_cache(maxsize=1)
def bare_python() -> Path:
    """A venv of the running interpreter without its site-packages, made once per test session.

    For probes that must see an interpreter without torch, transformers or SGLang's dependencies: the test
    interpreter has them under CI (.ci/run installs them for the DDTree tests)."""
    d = Path(tempfile.mkdtemp(prefix="k26-bare-venv-"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True, timeout=300)
    return d / "bin" / "python"


# The installed distributions whose files a probe reads as sources (the GPU harness takes an installed SGLang's
# kernels), which a patch changes in place without changing their version: their files' sizes and times count too.
SOURCES_READ = ("sglang",)
IDENTITY = ("import hashlib, importlib.metadata as m, json, os, sys\n"
            "def files(d):\n"
            "    h = hashlib.sha256()\n"
            "    for f in sorted(map(str, d.files or ())):\n"
            "        try: st = os.stat(d.locate_file(f))\n"
            "        except OSError: continue\n"
            "        h.update(f'{f} {st.st_size} {st.st_mtime_ns} '.encode())\n"
            "    return h.hexdigest()\n"
            "dists = list(m.distributions())\n"
            "print(json.dumps({'executable': os.path.realpath(sys.executable), 'version': sys.version, "
            "'path': sys.path[1:], 'distributions': sorted({(d.metadata['Name'] or '', d.version) for d in dists}), "
            "'files': sorted(((d.metadata['Name'] or '').lower(), files(d)) for d in dists "
            "if (d.metadata['Name'] or '').lower() in sys.argv[1:])}))")
# The environment a probe's result may depend on (compilers, devices, the loader, the libraries' own switches,
# the tests' own).
RESULT_ENV = ("TRITON_", "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_", "SGLANG_", "OMP_", "MKL_", "HF_", "TRANSFORMERS_",
              "PYTHON", "LD_", "K26_")


@functools.cache
def identity(python: str) -> dict:
    """What a probe run under ``python`` sees of it: its real path, version, module search path, every
    distribution it can import with its version (an install, upgrade or removal changes it), and the state of the
    files of those of SOURCES_READ (a patch applied in place changes it)."""
    res = subprocess.run([python, "-c", IDENTITY, *SOURCES_READ], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        return {"python": python, "error": res.stderr[-500:]}
    return json.loads(res.stdout)


def probe_env(**extra: str) -> dict[str, str]:
    """The environment for a probe whose result ``sglang_wheels.computed_once`` keeps: the session's as it started
    (``conftest.SESSION_ENV``), with ``extra``."""
    from conftest import SESSION_ENV

    return dict(SESSION_ENV, **extra)


def run_identity(python: str, env: dict[str, str]) -> dict:
    """Everything besides its own inputs that a probe's result depends on, for ``sglang_wheels.computed_once``:
    the interpreter (``identity``), the environment variables of RESULT_ENV and the GPUs NVML sees."""
    from conftest import nvidia_gpu_count

    return {"python": identity(python), "gpus": nvidia_gpu_count(),
            "env": {k: v for k, v in sorted(env.items()) if k.startswith(RESULT_ENV)}}
