"""The one crash-safe writer of the doctor (fixers, the patch engine, caches, manifests).

A file is written through a temporary file in the same directory, fsynced, renamed over the target,
and the directory fsynced: after a crash (or a reader) sees the old bytes or the new ones, never a
mix. The mode (and, as root, the owner) of the file replaced are kept, so a venv owned by a service
user stays owned by it. ``hook(event, path)`` is called at each step so tests can inject a failure
(``OSError(ENOSPC)``, a killed process) exactly there; in normal runs it is ``None``.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

Hook = Callable[[str, str], None]
TMP_SUFFIX = ".k26tmp"


def _call(hook: Hook | None, event: str, path: Path) -> None:
    if hook is not None:
        hook(event, str(path))


def read_or_none(path: Path) -> bytes | None:
    """A file's bytes, or None when it does not exist (other errors raise)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def read_capped(path: Path, limit: int, kind: str) -> bytes:
    """A file's bytes when it holds at most ``limit`` of them; at most ``limit + 1`` are ever read.

    For files the doctor parses whole (a patch set's manifest and diffs, a RECORD): one named like them
    but huge (or endless, a FIFO or /dev/zero) is refused, not read into memory. Every failure is an
    ``OSError`` (too large: EFBIG, ``strerror`` "larger than N MiB: not <kind>"), so a caller words all
    of them with one ``except OSError``.
    """
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB: not {kind}", str(path))
    return data


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
    if like is None:
        try:
            like = os.stat(target)
        except OSError:
            like = None
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
