"""The engine's state directory: content-addressed backups, the journal of a run, a lock, history.

Layout under ``<state_dir>/patches/`` (``state_dir``: ``[doctor] state_dir``, ``--state-dir``,
default ``/var/lib/k26-doctor``; ``~/.local/state/k26-doctor`` when that is not writable)::

    objects/<sha256>                  every file content the engine replaced or wrote (fsynced)
    targets/<key>/target.json         which site-packages directory <key> stands for
    targets/<key>/lock                held (flock) by the run that changes that site-packages
    targets/<key>/journal.json        present only while a run is changing files
    targets/<key>/history/<time>.json one record per finished (or rolled back) run

Backups are addressed by hash so that a pristine original is found again by the manifest's
``before`` hash, whenever it was saved, and verified when read back.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from doctor.core.fileio import atomic_write, fsync_dir, read_capped, read_text
from doctor.sglang.patching.hashing import HEX_RE, sha256_bytes

DEFAULT_STATE_DIR = "/var/lib/k26-doctor"
JOURNAL = "journal.json"
JOURNAL_KIND = "k26-doctor-patch-journal"
JOURNAL_SCHEMA = 1
MAX_JOURNAL_BYTES = 16 << 20
MAX_OBJECT_BYTES = 64 << 20  # a backed-up source file; SGLang's largest is ~1 MB


class StateError(Exception):
    """No usable state directory, a held lock, or an unreadable journal."""


def fallback_root() -> Path:
    return Path.home() / ".local/state/k26-doctor"


def candidate_roots(state_dir: str | None) -> list[Path]:
    roots = [Path(os.path.expanduser(state_dir or DEFAULT_STATE_DIR))]
    if fallback_root() not in roots:
        roots.append(fallback_root())
    return roots


def target_key(site_packages: Path) -> str:
    return hashlib.sha256(str(Path(site_packages).resolve()).encode()).hexdigest()[:16]


def now_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


class StateStore:
    """The state of one site-packages directory under one state root."""

    def __init__(self, root: Path, site_packages: Path) -> None:
        self.root = Path(root)
        self.site_packages = Path(site_packages)
        self.base = self.root / "patches"
        self.objects = self.base / "objects"
        self.target = self.base / "targets" / target_key(site_packages)
        self.journal_path = self.target / JOURNAL
        self.history = self.target / "history"

    @classmethod
    def open(cls, state_dir: str | None, site_packages: Path) -> StateStore:
        """The first writable root (creating its directories), as ``doctor.core.actions.new_backup_dir`` does."""
        errors = []
        for root in candidate_roots(state_dir):
            if root.exists() and not root.is_dir():  # a file where the state directory should be: said, not skipped
                raise StateError(f"the state directory {root} is not a directory: give --state-dir a directory")
            store = cls(root, site_packages)
            try:
                for d in (store.objects, store.history):
                    d.mkdir(parents=True, exist_ok=True)
                probe = store.target / f".probe.{os.getpid()}"
                probe.write_bytes(b"")
                probe.unlink()
                info = store.target / "target.json"
                if not info.exists():
                    atomic_write(info, json.dumps({"site_packages": str(site_packages)}).encode())
                return store
            except OSError as exc:
                errors.append(f"{root}: {exc.strerror or exc}")
        raise StateError("no writable state directory: " + "; ".join(errors))

    @classmethod
    def existing(cls, state_dir: str | None, site_packages: Path) -> list[StateStore]:
        """Stores that already exist for this site-packages (read-only lookup, creates nothing)."""
        return [s for s in (cls(r, site_packages) for r in candidate_roots(state_dir)) if s.target.is_dir()]

    # -- objects ------------------------------------------------------------------------------
    def put_object(self, data: bytes) -> str:
        """Store bytes under their sha256 (fsynced); an existing copy is reused only if it verifies."""
        digest = sha256_bytes(data)
        if self.get_object(digest) is None:
            atomic_write(self.objects / digest, data)
        return digest

    def get_object(self, digest: str | None) -> bytes | None:
        """The stored bytes with this hash, verified; None when absent or corrupt."""
        if not digest or not HEX_RE.match(digest):
            return None
        try:
            data = read_capped(self.objects / digest, MAX_OBJECT_BYTES, "a stored file")
        except OSError:
            return None
        return data if sha256_bytes(data) == digest else None

    def object_path(self, digest: str) -> Path:
        return self.objects / digest

    # -- journal ------------------------------------------------------------------------------
    def write_journal(self, doc: dict[str, Any]) -> None:
        atomic_write(self.journal_path, json.dumps(doc, indent=1, sort_keys=True).encode())

    def read_journal(self) -> dict[str, Any] | None:
        return read_journal_file(self.journal_path)

    def close_journal(self, doc: dict[str, Any], outcome: str) -> Path:
        """Record the run in history, then remove the journal (the commit point of a run)."""
        doc = dict(doc, outcome=outcome, finished=now_stamp())
        dest = self.history / f"{now_stamp()}-{doc.get('op', 'run')}.json"
        atomic_write(dest, json.dumps(doc, indent=1, sort_keys=True).encode())
        try:
            os.unlink(self.journal_path)
        except FileNotFoundError:
            pass
        fsync_dir(self.target)
        return dest

    def last_history(self) -> dict[str, Any] | None:
        """The latest finished run's record (names sort by time)."""
        try:
            names = sorted(self.history.glob("*.json"))
        except OSError:
            return None
        return read_journal_file(names[-1]) if names else None

    # -- lock ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, what: str) -> Iterator[None]:
        """Exclusive, non-blocking: a second run fails at once, naming the holder."""
        path = self.target / "lock"
        fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                raise StateError(f"another k26-doctor patches run holds {path} ({holder}); "
                                 "wait for it to finish") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} {what} since {now_stamp()}\n".encode(), 0)
            try:
                yield
            finally:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def lock_holder(store: StateStore) -> str | None:
    """Who holds the store's lock right now (read-only probe, takes nothing); None when free."""
    path = store.target / "lock"
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def read_journal_file(path: Path) -> dict[str, Any] | None:
    try:
        text = read_text(path, MAX_JOURNAL_BYTES, "a journal")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise StateError(f"{path} is not valid JSON ({exc}); it was written atomically, so something "
                         "else damaged it: inspect it and remove it by hand") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        raise StateError(f"{path} is not a k26-doctor patch journal")
    if doc.get("schema_version", JOURNAL_SCHEMA) != JOURNAL_SCHEMA:
        raise StateError(f"{path} has journal schema {doc.get('schema_version')!r}, this doctor writes "
                         f"{JOURNAL_SCHEMA}: finish or roll it back with the doctor that wrote it")
    return doc
