"""A hashing worker process: the sha256 of whole files named on stdin, one JSON line out per file.

Why a process and not a thread: a thread pool shares one GIL, which it takes back between every read
and every hash call, and reads into one large buffer per thread that falls out of the CPU caches; on
a 16-core host that left 16 hashlib threads at 0.80x of ``xargs -P16 sha256sum``. A worker process
hashes its file through a memory map of the page cache (no copy into a buffer at all) in windows,
and shares nothing with the others.

Stdlib only and no ``doctor`` import: ``doctor.model.hashing`` starts it as
``python -I -S sha256_worker.py``. Protocol, one JSON value per line:
  stdin:  a path (a JSON string); end of input ends the worker.
  stdout: ``{"p": n}`` progress (n more bytes hashed), then ``{"sha256": hex, "bytes": n}`` or
          ``{"error": why}`` for that path.
A file truncated while it is mapped raises SIGBUS and kills this worker; the parent sees the worker
gone and hashes that file itself with ``read()``. Core dumps are off so that nothing is written.
The worker exits when its parent is gone (checked between windows).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import signal
import stat
import sys
from typing import Any

WINDOW = 64 * 1024 * 1024  # bytes mapped at a time (a multiple of the page size)
SLICE = 1024 * 1024  # bytes per hash update
READ_BLOCK = 256 * 1024  # the read() path: small enough to stay in a core's L2 cache


def _mapped(fd: int, size: int, h: Any, report) -> None:
    off = 0
    while off < size:
        length = min(WINDOW, size - off)
        with mmap.mmap(fd, length, offset=off, access=mmap.ACCESS_READ) as mm:
            if hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mm)
            try:
                for i in range(0, length, SLICE):
                    h.update(view[i:i + SLICE])
            finally:
                view.release()
        off += length
        report(length)


def _read(fd: int, h: Any, report) -> int:
    buf = bytearray(READ_BLOCK)
    view = memoryview(buf)
    total = pending = 0
    while True:
        n = os.readv(fd, [buf])
        if not n:
            break
        h.update(view[:n])
        total += n
        pending += n
        if pending >= WINDOW:
            report(pending)
            pending = 0
    if pending:
        report(pending)
    return total


def hash_path(path: str, report, parent: int) -> dict:
    """``{"sha256", "bytes"}`` of one file, or ``{"error"}``; ``report(n)`` after every window."""
    def tick(n: int) -> None:
        report(n)
        if os.getppid() != parent:  # orphaned: nobody reads the answer
            sys.exit(0)

    try:  # O_NONBLOCK + fstat, as doctor.core.fileio.open_regular (this worker imports nothing of the doctor)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return {"error": f"cannot read: {exc.strerror or exc}"}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return {"error": "cannot read: not a regular file"}
        os.set_blocking(fd, True)
        size = st.st_size
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        h = hashlib.sha256()
        try:
            _mapped(fd, size, h, tick)
            return {"sha256": h.hexdigest(), "bytes": size}
        except (OSError, ValueError):  # a file that cannot be mapped (some FUSE/special files): read it
            h = hashlib.sha256()
            os.lseek(fd, 0, os.SEEK_SET)
            total = _read(fd, h, tick)
            return {"sha256": h.hexdigest(), "bytes": total}
    except OSError as exc:
        return {"error": f"cannot read: {exc.strerror or exc}"}
    finally:
        os.close(fd)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends the worker quietly; the parent reports
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    parent = os.getppid()
    out = sys.stdout

    def emit(doc: dict) -> None:
        out.write(json.dumps(doc) + "\n")
        out.flush()

    for line in sys.stdin:
        try:
            path = json.loads(line)
        except ValueError:
            emit({"error": "bad request"})
            continue
        if not isinstance(path, str):
            emit({"error": "bad request"})
            continue
        emit(hash_path(path, lambda n: emit({"p": n}), parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
