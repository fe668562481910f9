"""Crash-safe file writes shared by every writer in the doctor (fixers, the patch engine, caches).

A file is written through a temporary file in the same directory, fsynced, renamed over the target,
and the directory fsynced: after a crash the file is either the old one or the new one, never a mix.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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


def atomic_write(target: Path | str, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``target`` atomically (tmp file, fsync, rename, directory fsync)."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".k26tmp", dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(target.parent)
