"""How much of the weights is in the page cache now, and how much memory the host has for it (the start plan).

A start reads every byte of the shards: at disk speed when the page cache is cold (554 GiB of K2.6 at ~1.4 GiB/s is
minutes), at memory speed when they are resident (``check --deep`` has just read them all). ``mincore(2)`` on a
shared read-only map says which pages are resident without reading (or faulting in) any of them: no data moves,
nothing is evicted. Where ``mincore`` cannot be called (no libc through ctypes), the fact says so and the plan
falls back on /proc/meminfo's page cache size as an upper bound.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
from pathlib import Path
from typing import Any

from doctor.core.fileio import open_regular, read_text

PROT_READ, MAP_SHARED = 1, 1
WINDOW = 1 << 30  # map and ask one GiB at a time: a bounded vector, whatever the shard's size
MAX_FILES = 4096
MEMINFO_KEYS = ("MemTotal", "MemAvailable", "Cached", "Buffers")
LOW_BIT = bytes(b & 1 for b in range(256))  # mincore's residency bit; the others are reserved


class Residency:
    """``mincore(2)`` through ctypes; ``method`` None when it cannot be called here."""

    def __init__(self) -> None:
        self.method: str | None = None
        self._libc: Any = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
            self._libc, self.method = libc, "mincore(2)"
        except (OSError, AttributeError):
            pass

    def resident(self, path: str) -> tuple[int, int]:
        """(file size, bytes resident). Raises ``OSError`` (a FIFO or device is refused by ``open_regular``)."""
        page = os.sysconf("SC_PAGE_SIZE")
        with open_regular(path, buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            if self._libc is None:
                raise OSError("mincore(2) is not available")
            total = 0
            for off in range(0, size, WINDOW):
                length = min(WINDOW, size - off)
                addr = self._libc.mmap(None, length, PROT_READ, MAP_SHARED, fh.fileno(), off)
                if addr in (None, ctypes.c_void_p(-1).value):
                    raise OSError(ctypes.get_errno(), "mmap failed")
                try:
                    vec = (ctypes.c_ubyte * ((length + page - 1) // page))()
                    if self._libc.mincore(ctypes.c_void_p(addr), length, vec) != 0:
                        raise OSError(ctypes.get_errno(), "mincore failed")
                    total += bytes(vec).translate(LOW_BIT).count(1) * page
                finally:
                    self._libc.munmap(ctypes.c_void_p(addr), length)
            return size, min(total, size)


def shards(path: str) -> list[str]:
    """The ``*.safetensors`` of a model directory (the files a start reads), sorted; at most ``MAX_FILES``."""
    try:
        return sorted(str(p) for p in Path(path).glob("*.safetensors"))[:MAX_FILES]
    except OSError:
        return []


def model_residency(path: str | None, res: Residency) -> dict[str, Any]:
    """``{"path", "files", "bytes", "resident_bytes", "method", "error"}`` for one model directory."""
    out: dict[str, Any] = {"path": path, "files": 0, "bytes": 0, "resident_bytes": None, "method": res.method}
    if not path:
        out["error"] = "not configured"
        return out
    files = shards(path)
    resident: int | None = 0 if res.method else None
    for f in files:
        try:
            size, here = res.resident(f)
        except OSError as exc:
            try:
                size = os.stat(f).st_size
            except OSError:
                size = 0
            out.setdefault("error", f"{os.path.basename(f)}: {exc.strerror or exc}")
            here = None
        out["files"] += 1
        out["bytes"] += size
        resident = None if resident is None or here is None else resident + here
    out["resident_bytes"] = resident
    return out


def layers(path: str | None) -> int | None:
    """``num_hidden_layers`` of the directory's config.json (the capture cost grows with it), None if unknown."""
    if not path:
        return None
    try:
        data = json.loads(read_text(os.path.join(path, "config.json"), 4 << 20, "a model config"))
    except (OSError, ValueError, RecursionError):
        return None
    cfg = data.get("text_config") if isinstance(data, dict) and isinstance(data.get("text_config"), dict) else data
    value = cfg.get("num_hidden_layers") if isinstance(cfg, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 100_000 else None


def meminfo() -> dict[str, int]:
    """/proc/meminfo's totals in bytes (``MemTotal``, ``MemAvailable``, ``Cached``, ``Buffers``); {} if unread."""
    try:
        text = read_text("/proc/meminfo", 1 << 20, "the kernel's memory table", errors="replace")
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in MEMINFO_KEYS and parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out
