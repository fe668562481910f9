"""The supported-stack data (``doctor/data/compat.toml``) and small version helpers.

The tables change with every NVIDIA, PyTorch and SGLang release, so they live in a data file; this
module only reads them and answers questions (the driver a CUDA release needs, the Triton a torch
pins, the kernels an SGLang release pins).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "compat.toml"


def load(path: str | None = None) -> dict[str, Any]:
    """The compatibility tables (cached; ``path`` only for tests)."""
    return load_toml(path or DATA_FILE)


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``"580.65.06"`` -> ``(580, 65, 6)``; ``"13.0"`` -> ``(13, 0)``; junk -> None."""
    if not isinstance(text, str):
        return None
    m = re.match(r"^\s*(\d+(?:\.\d+)*)", text)
    if not m:
        return None
    return tuple(int(p) for p in m.group(1).split("."))


def cuda_from_nvml(value: Any) -> str | None:
    """NVML's ``nvmlSystemGetCudaDriverVersion`` integer (13000) -> ``"13.0"``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def min_driver(cuda: str) -> str | None:
    """The minimum Linux driver for a CUDA release ``"13.0"`` (GA), or None if not in the table."""
    return load().get("cuda", {}).get("min_driver", {}).get(_major_minor(cuda))


def minor_compat_min_driver(cuda: str) -> str | None:
    """The minimum driver for minor-version compatibility within ``cuda``'s major family."""
    t = version_tuple(cuda)
    if not t:
        return None
    return load().get("cuda", {}).get("minor_compat_min_driver", {}).get(str(t[0]))


def triton_for_torch(torch_version: str) -> str | None:
    """The Triton a torch release pins: a version (``"2.11.0+cu130"`` -> ``"3.6.0"``) or a specifier
    (``"2.14.1"`` -> ``"~=3.8.0"``)."""
    return load().get("torch", {}).get("triton", {}).get(base_version(torch_version))


def sglang_pins(sglang_version: str) -> dict[str, str]:
    """The kernel packages a known SGLang release pins, ``{"sglang_kernel": "0.4.10", "flashinfer": "0.7.2"}``,
    else {} (its torch pin: ``sglang_torch``)."""
    pins = load().get("sglang", {}).get(sglang_version, {}) or {}
    return {k: v for k, v in pins.items() if k != "torch"}


def sglang_torch(sglang_version: str) -> str | None:
    """The torch a known SGLang release pins (``"0.5.23"`` -> ``"2.14.1"``): its kernels are built for it."""
    return (load().get("sglang", {}).get(sglang_version, {}) or {}).get("torch")


def distribution_names() -> dict[str, list[str]]:
    """Component -> the distribution names it may be installed under."""
    return {k: list(v) for k, v in load().get("distributions", {}).items()}


def ptxas_min_cuda(arch: str) -> str | None:
    """The first CUDA release whose ptxas knows ``arch`` (e.g. ``sm_103a`` -> ``"12.9"``)."""
    return load().get("ptxas", {}).get("min_cuda", {}).get(arch)


def arch_info(cc: str) -> dict[str, str]:
    """``{"min_cuda": "12.9", "name": "Blackwell Ultra (B300, GB300)"}`` for ``"10.3"``, else {}."""
    return dict(load().get("arch", {}).get(cc, {}) or {})


def base_version(version: str) -> str:
    """Drop a local label: ``"2.11.0+cu130"`` -> ``"2.11.0"``."""
    return version.split("+", 1)[0].strip()


def _major_minor(cuda: str) -> str:
    t = version_tuple(cuda) or ()
    return f"{t[0]}.{t[1]}" if len(t) >= 2 else cuda
