"""File writes the patch engine can be interrupted in without leaving a half-written file.

Each write goes to a temporary file next to the target, is fsynced, then renamed over the target
and the directory fsynced: a reader (or a crash) sees the old bytes or the new ones, never a mix.
``hook(event, path)`` is called at each step so tests can inject a failure (``OSError(ENOSPC)``,
a killed process) exactly there; in normal runs it is ``None``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from doctor.fileio import fsync_dir

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


def write_atomic(target: Path, data: bytes, *, like: os.stat_result | None = None, hook: Hook | None = None) -> None:
    """Replace ``target`` with ``data`` through tmp + fsync + rename (+ directory fsync).

    ``like``: the stat of the file being replaced; its mode (and, as root, owner) are kept, so a
    venv owned by a service user stays owned by it. A new file gets 0644 and its directory's owner.
    """
    target = Path(target)
    _call(hook, "write", target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TMP_SUFFIX, dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        mode = (like.st_mode & 0o7777) if like is not None else 0o644
        os.chmod(tmp, mode)
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
