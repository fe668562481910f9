"""A hashing worker process: the sha256 of whole files named on stdin, one answer line out per file.

Why a process and not a thread: a worker hashes its file through a memory map of the page cache (no
copy into a buffer at all) in windows, and shares nothing with the others; a thread must ``read()`` a
copy first (a memory map in the doctor's own process would let a file truncated under it kill the
doctor with SIGBUS). The copy cost one core of a loaded 2-core VM a quarter of its rate (0.80 against
1.04 GiB/s), which pays back the worker's start-up only on a large share per worker:
``doctor.model.hashing`` hashes small inputs in threads and starts workers for large ones.

Stdlib only and no ``doctor`` import: ``doctor.model.hashing`` starts it as ``python -I -S
sha256_worker.py``. It imports only what it uses: no ``json`` (its ``re``), no ``typing``, ``_signal``
rather than ``signal`` (its ``enum``); those were two thirds of its start-up imports (``-X importtime``:
about 60 ms against 20 ms on a loaded 2-core VM). So the protocol is plain lines:
  stdin:  a path, its bytes (``os.fsencode``) in hex; end of input ends the worker.
  stdout: ``p N`` progress (N more bytes hashed), then for that path ``ok HEX N`` (the digest, bytes
          hashed), ``err errno N`` (open, fstat or read failed), ``err mode M`` (not a regular file:
          its ``st_mode``) or ``err bad request``. The parent words an error as its own read loop does
          (``doctor.core.fileio``), so a file's verdict reads the same whichever way it was hashed.
A file truncated while it is mapped raises SIGBUS and kills this worker; the parent sees the worker
gone and hashes that file itself with ``read()``. Core dumps are off so that nothing is written.
The worker exits when its parent is gone (checked between windows).
"""

import _signal  # not ``signal``: its enum import would double this worker's start-up
import hashlib
import mmap
import os
import stat
import sys

WINDOW = 64 * 1024 * 1024  # bytes mapped at a time (a multiple of the page size)
SLICE = 1024 * 1024  # bytes per hash update
REPORT = 16 * 1024 * 1024  # a progress line every this many bytes (the parent's prefetch follows them)
READ_BLOCK = 256 * 1024  # the read() path: small enough to stay in a core's L2 cache


def _mapped(fd: int, size: int, h, report) -> None:
    off = 0
    while off < size:
        length = min(WINDOW, size - off)
        with mmap.mmap(fd, length, offset=off, access=mmap.ACCESS_READ) as mm:
            if hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mm)
            try:
                for i in range(0, length, REPORT):
                    for j in range(i, min(i + REPORT, length), SLICE):
                        h.update(view[j:j + SLICE])  # REPORT is a multiple of SLICE: a slice ends at i + REPORT
                    report(min(REPORT, length - i))
            finally:
                view.release()
        off += length


def _read(fd: int, h, report) -> int:
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


class Orphaned(Exception):
    """The doctor that asked is gone: nobody reads the answer (the worker ends)."""


def hash_path(path: str, report, parent: int) -> str:
    """``ok HEX N`` for one file, or ``err errno N`` / ``err mode M``; ``report(n)`` after every window."""
    def tick(n: int) -> None:
        report(n)
        if os.getppid() != parent:
            raise Orphaned

    try:  # O_NONBLOCK + fstat, as doctor.core.fileio.open_regular (this worker imports nothing of the doctor)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return f"err errno {exc.errno or 0}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"err mode {st.st_mode}"
        os.set_blocking(fd, True)
        size = st.st_size
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        h = hashlib.sha256()
        try:
            _mapped(fd, size, h, tick)
            return f"ok {h.hexdigest()} {size}"
        except (OSError, ValueError):  # a file that cannot be mapped (some FUSE/special files): read it
            h = hashlib.sha256()
            os.lseek(fd, 0, os.SEEK_SET)
            total = _read(fd, h, tick)
            return f"ok {h.hexdigest()} {total}"
    except OSError as exc:
        return f"err errno {exc.errno or 0}"
    finally:
        os.close(fd)


def main() -> int:
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)  # Ctrl-C ends the worker quietly; the parent reports
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    parent = os.getppid()
    out = sys.stdout

    def emit(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    for line in sys.stdin:
        try:
            path = os.fsdecode(bytes.fromhex(line.strip()))
        except ValueError:
            emit("err bad request")
            continue
        if not path:
            emit("err bad request")
            continue
        try:
            emit(hash_path(path, lambda n: emit(f"p {n}"), parent))
        except Orphaned:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
