"""The doctor's one safe reader and its one crash-safe writer.

Reading (``open_regular``, ``read_capped``, ``read_text``): every file the doctor opens by name (an index,
a config, a snapshot, a tokenizer file, remote code, a patch target, a journal, ``/proc`` entries) is
opened with ``O_NONBLOCK`` and judged by ``fstat`` on the open descriptor before a byte is read: a FIFO, a
device, a socket or a directory where a file should be is refused at once with words that say what it is
(``NotRegularFile``), never waited on; a symlink loop is named a loop, a dangling link a dangling link; and
at most ``limit + 1`` bytes are ever read (``EFBIG`` beyond). Every failure is an ``OSError`` whose
``strerror`` is a phrase ("is a FIFO (named pipe), not a regular file"), so callers word them all alike.

Writing (``atomic_write``): a file is written through a temporary file in the same directory, fsynced,
renamed over the target, and the directory fsynced: after a crash (or a reader) sees the old bytes or the
new ones, never a mix. It never replaces what is not a regular file (a symlink, a device such as
``/dev/full``, a FIFO): the rename would destroy it. The mode (and, as root, the owner) of the file replaced
are kept, so a venv owned by a service user stays owned by it. ``hook(event, path)`` is called at each step
so tests can inject a failure (``OSError(ENOSPC)``, a killed process) exactly there; in normal runs it is
``None``. ``write_output`` is what a command asked to write a file (``--output``) uses: the same writer,
after ``check_output_target`` refused a target that is a symlink, not a regular file, or on a full
filesystem (exit 2 before the run).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

Hook = Callable[[str, str], None]
TMP_SUFFIX = ".k26tmp"
DEFAULT_LIMIT = 64 * 1024 * 1024  # read_or_none: nothing the doctor reads whole is larger
KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def _call(hook: Hook | None, event: str, path: Path) -> None:
    if hook is not None:
        hook(event, str(path))


class NotRegularFile(OSError):
    """A path that names something other than a regular file where one is read or written; ``what`` is
    the phrase for it ("a FIFO (named pipe)")."""

    def __init__(self, path: str, what: str, doing: str = "") -> None:
        code = errno.EISDIR if what == "a directory" else errno.EINVAL
        super().__init__(code, f"is {what}, not a regular file" + (f": {doing}" if doing else ""), path)
        self.what = what


def kind_of(mode: int) -> str:
    """What a ``st_mode`` is, in words ("a regular file", "a directory", "a FIFO (named pipe)", ...)."""
    for test, words in KINDS:
        if test(mode):
            return words
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _worded(exc: OSError, path: str) -> OSError:
    """The same error with words a user can act on: a symlink loop is a loop, a dangling link is dangling."""
    if exc.errno == errno.ELOOP:
        return OSError(errno.ELOOP, "is a symlink loop (too many levels of symbolic links)", path)
    if exc.errno == errno.ENXIO:  # open() of a socket
        return NotRegularFile(path, "a socket")
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return FileNotFoundError(errno.ENOENT, f"is a dangling symlink (to {target}, which does not exist)", path)
    return exc


def describe_error(exc: OSError) -> str:
    """One phrase for a failure of the reader (or of ``os.stat``) on a path: "is a FIFO (named pipe), not a
    regular file", "is a symlink loop (...)", "No such file or directory"."""
    path = exc.filename if isinstance(exc.filename, str) else ""
    worded = _worded(exc, path) if path else exc
    return worded.strerror or str(worded)


def _open_nonblocking(name: str) -> tuple[int, int]:
    """A descriptor for reading ``name`` that never blocks in ``open()``, and its ``st_mode`` (failures worded)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise _worded(exc, name) from None
    try:
        return fd, os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise


def open_regular(path: str | os.PathLike[str], buffering: int = -1) -> BinaryIO:
    """``path`` opened for reading (binary), only if it is a regular file: never blocks in ``open()`` on a
    FIFO or a device, whatever it is named (see the module docstring). Raises ``OSError``."""
    name = os.fspath(path)
    fd, mode = _open_nonblocking(name)
    try:
        if not stat.S_ISREG(mode):
            raise NotRegularFile(name, kind_of(mode))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def size_words(limit: int) -> str:
    """A size limit as a message says it, in the largest unit it is a whole number of: "8 MiB", "4 KiB",
    "1000 bytes" (never "0 MiB" for a limit under one)."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if limit >= 1 << shift and limit % (1 << shift) == 0:
            return f"{limit >> shift} {unit}"
    return f"{limit} bytes"


def read_capped(path: str | os.PathLike[str], limit: int, kind: str) -> bytes:
    """A regular file's bytes when it holds at most ``limit`` of them; at most ``limit + 1`` are ever read.

    For every file the doctor parses whole: one named like it but huge is refused, not read into memory,
    and one that is not a regular file (a FIFO, /dev/zero, a directory) is refused before reading. Every
    failure is an ``OSError`` (too large: EFBIG, ``strerror`` "larger than N MiB: not <kind>"), so a caller
    words all of them with one ``except OSError``.
    """
    with open_regular(path) as fh:
        if os.fstat(fh.fileno()).st_size > limit:  # refused before reading (a 2 GB sparse log costs nothing)
            raise OSError(errno.EFBIG, f"larger than {size_words(limit)}: not {kind}", os.fspath(path))
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {size_words(limit)}: not {kind}", os.fspath(path))
    return data


def read_pipe_or_file(path: str | os.PathLike[str], limit: int, kind: str, deadline_s: float) -> bytes:
    """A regular file (as ``read_capped``) or a pipe (``diagnose <(journalctl ...)``, a FIFO), read until its
    writer closes it, ``limit`` bytes or ``deadline_s`` seconds, whichever comes first (``TimeoutError`` at the
    deadline). A pipe with no writer reads as empty at once, never waited on; a device or a directory is
    refused as ``read_capped`` refuses it."""
    import select
    import time

    name = os.fspath(path)
    fd, mode = _open_nonblocking(name)
    try:
        if stat.S_ISREG(mode):
            os.close(fd)
            fd = -1
            return read_capped(name, limit, kind)
        if not stat.S_ISFIFO(mode):
            raise NotRegularFile(name, kind_of(mode))
        end = time.monotonic() + deadline_s
        parts: list[bytes] = []
        size = 0
        while size <= limit:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(errno.ETIMEDOUT, f"the pipe was still open after {deadline_s:g}s", name)
            try:  # a FIFO nobody has opened for writing reads as end of file at once
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:  # a writer, nothing written yet
                select.select([fd], [], [], min(left, 0.5))
                continue
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            size += len(chunk)
        raise OSError(errno.EFBIG, f"more than {size_words(limit)}: not {kind}", name)
    finally:
        if fd >= 0:
            os.close(fd)


def read_text(path: str | os.PathLike[str], limit: int, kind: str, errors: str = "strict") -> str:
    """``read_capped`` decoded as UTF-8 (``errors`` as ``bytes.decode``; strict raises UnicodeDecodeError)."""
    return read_capped(path, limit, kind).decode("utf-8", errors=errors)


def read_or_none(path: str | os.PathLike[str], limit: int = DEFAULT_LIMIT) -> bytes | None:
    """A regular file's bytes, or None when it does not exist (other errors raise, a dangling link included)."""
    try:
        return read_capped(path, limit, "a file the doctor reads")
    except FileNotFoundError:
        if os.path.islink(path):
            raise
        return None


def fsync_dir(path: Path | str) -> None:
    """Make a rename in ``path`` durable (best effort: some filesystems refuse directory fsync)."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(target: Path | str, data: bytes, mode: int | None = None, *, like: os.stat_result | None = None,
                 hook: Hook | None = None) -> None:
    """Replace ``target`` with ``data`` through tmp + fsync + rename (+ directory fsync).

    The new file's mode is ``mode`` if given, else that of ``like`` (the stat of the file being
    replaced), else that of the existing target, else 0644. As root the owner of ``like`` (or the
    existing target, else the directory) is kept.
    """
    target = Path(target)
    try:
        current = os.lstat(target)
    except FileNotFoundError:
        current = None
    if current is not None and not stat.S_ISREG(current.st_mode):
        raise NotRegularFile(str(target), kind_of(current.st_mode), "not replaced (writing would destroy it)")
    if like is None:
        like = current
    _call(hook, "write", target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TMP_SUFFIX, dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else (like.st_mode & 0o7777) if like is not None else 0o644)
        if os.geteuid() == 0:
            owner = like if like is not None else os.stat(target.parent)
            try:
                os.chown(tmp, owner.st_uid, owner.st_gid)
            except OSError:
                pass
        _call(hook, "tmp-written", target)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(target.parent)
    _call(hook, "replaced", target)


def current_umask() -> int:
    """The process's umask, read without changing it (``/proc/self/status``; 022 where that is absent)."""
    try:
        with open_regular("/proc/self/status") as fh:
            for line in fh.read(1 << 16).decode("ascii", "replace").splitlines():
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def output_problem(path: str) -> str | None:
    """Why a file a command was asked to write (``--output``) cannot be written, before any work is done:
    a directory, a symlink (never written through), anything but a regular file (``/dev/full``, a FIFO), a
    missing or unwritable directory, a full filesystem. None when it can be."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return f"cannot be used: {describe_error(exc)}"
    if st is not None and stat.S_ISDIR(st.st_mode):
        return "is a directory; give a file name"
    if st is not None and stat.S_ISLNK(st.st_mode):
        return ("is a symbolic link: the doctor does not write through links it did not create; give the path "
                f"it points to ({os.path.realpath(path)}) if that is meant")
    if st is not None and not stat.S_ISREG(st.st_mode):
        return f"is {kind_of(st.st_mode)}, not a regular file: writing a report there would destroy it"
    if not os.path.isdir(parent):
        return f"the directory {parent} does not exist"
    if st is not None and not os.access(path, os.W_OK):
        return "exists and is not writable by this user"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the directory {parent} is not writable by this user (the file is replaced through a temporary file)"
    try:
        fs = os.statvfs(parent)
    except OSError:
        return None
    free = fs.f_bfree if os.geteuid() == 0 else fs.f_bavail
    if fs.f_blocks and free * fs.f_frsize < 64 * 1024:
        return f"the filesystem of {parent} is full ({free * fs.f_frsize} bytes free)"
    return None


def write_output(path: str, data: bytes) -> None:
    """Write a file a command was asked to write: ``atomic_write`` (a failure leaves what was there), a new
    file with the mode the umask gives, an existing one keeping its own. Raises ``OSError``."""
    atomic_write(path, data, None if os.path.lexists(path) else 0o666 & ~current_umask())


def remove(target: Path, *, hook: Hook | None = None) -> None:
    """Delete a file (the engine has its bytes in the object store first)."""
    _call(hook, "write", target)
    try:
        os.unlink(target)
    except FileNotFoundError:
        pass
    fsync_dir(target.parent)
    _call(hook, "replaced", target)


def remove_stale_bytecode(source: Path) -> list[str]:
    """Delete ``__pycache__/<name>.*.pyc`` of a changed source file, so no stale bytecode runs.

    CPython revalidates timestamp pycs by mtime and size, which a same-size edit within the same
    second defeats, and never revalidates unchecked hash-based pycs; removing them is always safe.
    """
    removed = []
    cache = source.parent / "__pycache__"
    stem = source.stem
    if source.suffix != ".py" or not cache.is_dir():
        return removed
    for pyc in cache.glob(f"{stem}.*.pyc"):
        if pyc.name.split(".")[0] != stem:
            continue
        try:
            pyc.unlink()
            removed.append(str(pyc))
        except FileNotFoundError:
            pass
    return removed


def leftover_tmp_files(target: Path) -> list[Path]:
    """Temporary files of an interrupted write to ``target``."""
    try:
        return sorted(target.parent.glob(f".{target.name}.*{TMP_SUFFIX}"))
    except OSError:
        return []
