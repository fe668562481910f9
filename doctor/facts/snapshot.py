"""Snapshot files: every fact of a host (redacted), replayable with ``check --from-snapshot FILE``."""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from typing import TYPE_CHECKING, Any

from doctor import __version__
from doctor.core.datafile import MAX_NESTING, too_deep
from doctor.core.fileio import read_text
from doctor.facts.redaction import redact

if TYPE_CHECKING:  # pragma: no cover
    from doctor.facts.store import FactStore

SNAPSHOT_KIND = "k26-doctor-snapshot"
SNAPSHOT_SCHEMA_VERSION = 1


def build_snapshot(store: FactStore, note: str = "", names: list[str] | None = None) -> dict[str, Any]:
    """Every fact (or ``names``), with the run's options, redacted."""
    facts = store.collect_all(names)
    opts = store.options.to_dict()
    opts.pop("env", None)  # the environment is recorded (redacted) as the fact "env"
    return redact({
        "kind": SNAPSHOT_KIND,
        "schema_version": SNAPSHOT_SCHEMA_VERSION,
        "doctor_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "synthetic": False,
        "note": note,
        "options": opts,
        "collect_s": {k: round(v, 4) for k, v in store.durations().items()},
        "facts": facts,
    })


class SnapshotError(Exception):
    """The snapshot file cannot be used (invocation error: exit 2)."""


MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A snapshot file, read by the safe reader (a FIFO, a device or a directory is refused at once) and
    bounded in size and nesting; ``SnapshotError`` (exit 2) for anything that is not a usable snapshot."""
    try:
        data = json.loads(read_text(path, MAX_SNAPSHOT_BYTES, "a snapshot"))
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"snapshot {path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise SnapshotError(f"snapshot {path} cannot be used: nested too deeply (more than {MAX_NESTING} "
                            "levels)") from None
    if too_deep(data):
        raise SnapshotError(f"snapshot {path} cannot be used: nested more than {MAX_NESTING} levels deep "
                            "(no recorded fact is)")
    if not isinstance(data, dict) or data.get("kind") != SNAPSHOT_KIND or not isinstance(data.get("facts"), dict):
        raise SnapshotError(f"{path} is not a k26-doctor snapshot (kind {SNAPSHOT_KIND!r} with 'facts')")
    if data.get("schema_version") != SNAPSHOT_SCHEMA_VERSION:
        raise SnapshotError(f"snapshot schema_version {data.get('schema_version')!r} is not supported "
                            f"(this doctor reads {SNAPSHOT_SCHEMA_VERSION})")
    return data
