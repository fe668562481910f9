"""Where a GPU's memory went, read from PyTorch's own out-of-memory message.

An out-of-memory error is blamed on the memory window (model.fit) by default. But the message carries the GPU's
total capacity, what was free, and what the failing process itself held (its allocator's reservation; since torch
2.2 also its whole use, non-PyTorch memory included). Whatever is neither free nor this process's is held by other
processes: a GPU another program occupies (gpu.idle), which no window setting fixes. The figures are the log's own
causal evidence, so the blame needs no guess about the host.

Two layouts, both on one line:
- torch >= 2.2: "GPU 0 has a total capacity of 23.53 GiB of which 20.38 MiB is free. Including non-PyTorch memory,
  this process has 1.81 GiB memory in use. ... Of the allocated memory 1.34 GiB is allocated by PyTorch, and
  94.59 MiB is reserved by PyTorch but unallocated."
- older: "(GPU 0; 10.76 GiB total capacity; 996.23 MiB already allocated; 8.81 MiB free; 1010.00 MiB reserved in
  total by PyTorch)", before torch 1.5 "...; 30.96 MiB cached)" in place of the reservation.
Inside a container NVML may not map the process's id and report "this process has 0 bytes": the allocator's
figures then stand for what the process holds.
"""

from __future__ import annotations

import re

_SIZE = r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB|TiB)"
_SCALE = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_NEW_TOTAL = re.compile(r"total capacity of " + _SIZE + r" of which " + _SIZE + r" is free")
_NEW_PROCESS = re.compile(r"this process has " + _SIZE + r" memory in use")
_NEW_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_NEW_UNALLOCATED = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")
_OLD = re.compile(r"\(GPU \d+; " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; " + _SIZE +
                  r" free;(?: " + _SIZE + r" reserved in total by PyTorch| " + _SIZE + r" cached)?")
# A CUDA context, cuBLAS/NCCL workspaces and the libraries' modules are memory no allocator figure counts: less than
# this outside the process's own figures is not another process.
CONTEXT_SLACK = 1 << 30


def _bytes(number: str | None, unit: str | None) -> int:
    return int(float(number) * _SCALE[unit]) if number is not None and unit is not None else 0


def memory_elsewhere(line: str) -> tuple[int, int] | None:
    """(total, held by other processes) in bytes, read from an out-of-memory message; None when the line does not
    carry the figures (a bare "CUDA error: out of memory", a message cut short)."""
    if m := _NEW_TOTAL.search(line):
        total, free = _bytes(*m.group(1, 2)), _bytes(*m.group(3, 4))
        process = _NEW_PROCESS.search(line)
        allocated = _NEW_ALLOCATED.search(line)
        if process is None and allocated is None:
            return None
        unallocated = _NEW_UNALLOCATED.search(line)
        own = max(_bytes(*process.group(1, 2)) if process else 0,
                  (_bytes(*allocated.group(1, 2)) if allocated else 0) +
                  (_bytes(*unallocated.group(1, 2)) if unallocated else 0))
        if own == 0:  # "this process has 0 bytes" (NVML without the pid) and no allocator figure: nothing known
            return None
        return total, max(0, total - free - own)
    if m := _OLD.search(line):
        total, allocated, free = _bytes(*m.group(1, 2)), _bytes(*m.group(3, 4)), _bytes(*m.group(5, 6))
        own = _bytes(*m.group(7, 8)) if m.group(7) else allocated + _bytes(*m.group(9, 10))
        return total, max(0, total - free - own)
    return None


def held_elsewhere(line: str, share: float) -> bool:
    """Whether the out-of-memory message on ``line`` shows at least ``share`` of the GPU (and more than a context's
    worth) held outside the failing process."""
    figures = memory_elsewhere(line)
    if figures is None:
        return False
    total, elsewhere = figures
    return total > 0 and elsewhere >= share * total and elsewhere > CONTEXT_SLACK
