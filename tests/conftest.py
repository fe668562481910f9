"""Shared test helpers: GPU detection for ``@pytest.mark.gpu``, a runner for the CLI as users run it."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def nvidia_gpu_count() -> int:
    """GPUs NVML sees (0 without driver/library); probed in a child with a deadline so a bad driver can't hang."""
    code = ("import pynvml\ntry:\n pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())\n"
            "except Exception:\n print(0)\n")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
        return int((out.stdout.strip() or "0").splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if nvidia_gpu_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with NVML")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def doctor_env(**extra: str) -> dict[str, str]:
    """An environment for running the doctor as a subprocess from this checkout, deterministic."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + extra.pop("PYTHONPATH") if "PYTHONPATH" in extra else "")
    env.pop("K26_DOCTOR_CONFIG", None)
    env["NO_COLOR"] = "1"
    env.update(extra)
    return env


def run_doctor(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
               input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m doctor ARGS`` as a user would run it (a child process, real exit code)."""
    return subprocess.run([sys.executable, "-m", "doctor", *args], capture_output=True, text=True,
                          env=env or doctor_env(), timeout=timeout, input=input,
                          stdin=None if input is not None else subprocess.DEVNULL)


@pytest.fixture
def doctor() -> object:
    return run_doctor
