"""The node_exporter textfile the doctor keeps (``check --format openmetrics --output FILE.prom``).

The textfile collector reads every ``*.prom`` file of its directory at each scrape; a file caught half-written
is a scrape error and a gap in every series. So the file is only ever replaced whole, by the one atomic writer
(a temporary ``.NAME.*.k26tmp`` in the same directory, which the collector ignores, renamed over it).

Twice per run: before the checks, the last run's series stay as they were with the start time of this run
(``started_marker``); after them, the whole report. A run killed in between (a hung host, systemd's
``TimeoutStartSec``) leaves a start later than the last finish, which the alert "run never finished" reads.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from doctor.core.fileio import atomic_write, read_capped
from doctor.report.openmetrics import started_marker

PREVIOUS_LIMIT = 4 << 20  # our own file: a few KiB per check; anything larger is not ours
MODE = 0o644  # node_exporter runs as its own user and must read it


def check_target(path: str | Path) -> None:
    """``OSError`` unless ``path`` is absent, a regular file or a link (which the rename replaces, never writes
    through): a FIFO or a device there would hang the read of the last verdict or take the report."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise OSError(errno.EINVAL, "not a regular file", str(path))


def read_previous(path: str | Path) -> str | None:
    """The file as the last run left it, or None (absent, a link, unreadable, too large, not text)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        return read_capped(Path(path), PREVIOUS_LIMIT, "a k26-doctor textfile").decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def mark_started(path: str | Path, started_at: float, labels: dict[str, str]) -> None:
    """Before the checks: the last run's series kept, this run's start time set."""
    check_target(path)
    text = started_marker(read_previous(path), started_at, labels)
    atomic_write(path, text.encode("utf-8"), MODE)


def write_report(path: str | Path, text: str) -> None:
    """After the checks: the whole rendered report replaces the file."""
    check_target(path)
    atomic_write(path, text.encode("utf-8"), MODE)


def textfile_note(path: str | Path) -> str | None:
    """Why node_exporter will not read ``path``, or None: its textfile collector reads only ``*.prom``."""
    if not os.fspath(path).endswith(".prom"):
        return f"{path}: node_exporter's textfile collector reads only files ending in .prom"
    return None

