"""Where an installed SGLang stands against a patch set: per file, per patch, overall.

Two halves, so that ``sglang.patches`` can judge a recorded snapshot: ``observe`` reads the host
(hashes of the target files, RECORD, the journal) into a JSON document; ``evaluate`` is a pure
function of that document. File states:

- ``pristine``: matches the manifest's ``before`` (the RECORD hash), or absent for a file the set creates
- ``applied``:  matches the post-image (the last ``after`` of its chain; absent if the set deletes it)
- ``partial``:  matches an intermediate ``after`` (an earlier patch of a chain applied, not a later one)
- ``drifted``:  exists with other bytes: edited by hand, another build, or a patch made for another version
- ``missing``:  a file the set patches is not there
- ``not a file``: something else stands where the file should be (a FIFO, a device, a directory, a symlink loop):
  named as what it is; no ``--force`` patches or restores it (the engine refuses it): remove it and reinstall
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.core.fileio import NotRegularFile
from doctor.sglang.patching import manifest as mf
from doctor.sglang.patching.hashing import sha256_file
from doctor.sglang.patching.record import Installed
from doctor.sglang.patching.state import StateError, StateStore, lock_holder

PRISTINE, APPLIED, PARTIAL, DRIFTED, MISSING = "pristine", "applied", "partial", "drifted", "missing"
NOT_A_FILE = "not a file"


def observe(pset: mf.PatchSet, installed: Installed, state_dir: str | None = None,
            package_root: Path | None = None) -> dict[str, Any]:
    """Hash every file the set touches and read RECORD and the journal: the fact ``sglang_patches``."""
    root = Path(package_root or installed.site_packages)
    files: dict[str, Any] = {}
    for path in pset.chains():
        listed, record = installed.record_hash(path)
        entry: dict[str, Any] = {"sha256": None, "exists": False, "in_record": listed, "record": record}
        try:
            entry["sha256"] = sha256_file(root / path)
            entry["exists"] = True
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            entry["exists"] = True
            entry["error"] = "is a directory"
            entry["not_a_file"] = True
        except OSError as exc:
            if isinstance(exc, NotRegularFile) or exc.errno == errno.ELOOP:
                entry["not_a_file"] = True
            entry["exists"] = (root / path).exists()
            entry["error"] = exc.strerror or str(exc)
        files[path] = entry
    journal: dict[str, Any] | None = None
    journal_error = None
    last_run: dict[str, Any] | None = None
    for store in StateStore.existing(state_dir, installed.site_packages):
        try:
            doc = store.read_journal()
            last = store.last_history()
        except StateError as exc:
            journal_error = str(exc)
            continue
        if last is not None and (last_run is None or str(last.get("finished")) > str(last_run.get("finished"))):
            last_run = {k: last.get(k) for k in ("op", "set", "outcome", "started", "finished")}
        if doc is not None:
            journal = {"path": str(store.journal_path), "op": doc.get("op"), "set": doc.get("set"),
                       "started": doc.get("started"), "pid": doc.get("pid"), "files": len(doc.get("files", [])),
                       "running": lock_holder(store)}
            break
    return {
        "site_packages": str(installed.site_packages),
        "package_root": str(root),
        "sglang": {"name": installed.name, "version": installed.version, "dist_info": str(installed.dist_info)},
        "set": {"name": pset.name, "directory": str(pset.directory) if pset.directory else None,
                "manifest": pset.to_dict()},
        "files": files,
        "journal": journal,
        "journal_error": journal_error,
        "last_run": last_run,
    }


@dataclass
class FileStatus:
    path: str
    state: str
    sha256: str | None
    pristine: str | None  # first 'before'
    target: str | None  # last 'after'
    stage: int | None  # how many patches of its chain are applied (None: drifted/missing)
    chain: list[str]  # patch ids touching it, in order
    record: str | None = None
    in_record: bool = False
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PatchStatus:
    id: str
    description: str
    state: str
    files: list[str]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Evaluation:
    """The verdict on one set: ``overall`` is applied/pristine/partial/drifted/missing, or why none applies."""

    overall: str
    set_name: str = ""
    spec: str = ""
    version: str | None = None
    version_ok: bool = False
    files: list[FileStatus] = field(default_factory=list)
    patches: list[PatchStatus] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    journal: dict[str, Any] | None = None
    last_run: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.overall == APPLIED and self.version_ok and self.journal is None and not self.problems

    def count(self, state: str) -> int:
        return sum(1 for f in self.files if f.state == state)

    def to_dict(self) -> dict[str, Any]:
        return {"overall": self.overall, "ok": self.ok, "set": self.set_name, "sglang_spec": self.spec,
                "sglang_version": self.version, "version_ok": self.version_ok,
                "files": [f.to_dict() for f in self.files], "patches": [p.to_dict() for p in self.patches],
                "problems": list(self.problems), "journal": self.journal, "last_run": self.last_run}


def file_stage(chain: list[tuple[int, mf.FileChange]], digest: str | None, exists: bool) -> tuple[str, int | None]:
    """(state, stage) of one file from its hash: stage k = the first k patches of its chain applied."""
    hashes = mf.stage_hashes(chain)
    current = digest if exists else None
    # the last matching stage wins: a chain never repeats a hash (before != after per step)
    matches = [k for k, h in enumerate(hashes) if h == current]
    if matches:
        k = matches[-1]
        n = len(chain)
        return (PRISTINE if k == 0 else APPLIED if k == n else PARTIAL), k
    return (MISSING if not exists else DRIFTED), None


def _patch_statuses(pset: Any, chains: dict[str, Any], files: list[FileStatus]) -> list[PatchStatus]:
    """Each patch's state from its files' (applied where every file's stage is past it): kept apart from
    ``evaluate`` so the judging of files and of patches read on their own."""
    by_path = {f.path: f for f in files}
    out = []
    for i, patch in enumerate(pset.patches):
        states = []
        for change in patch.files:
            fs = by_path[change.path]
            if fs.state in (NOT_A_FILE, DRIFTED, MISSING):
                states.append(fs.state)
                continue
            pos = [j for j, _ in chains[change.path]].index(i)
            states.append(APPLIED if (fs.stage or 0) > pos else PRISTINE)
        out.append(PatchStatus(patch.id, patch.description, _combine(states), [c.path for c in patch.files]))
    return out


def evaluate(obs: dict[str, Any]) -> Evaluation:
    """Judge an observation (see ``observe``); a malformed document (a hand-edited snapshot) gives
    ``overall == "invalid"`` with the reason, never an exception."""
    if not isinstance(obs, dict) or not isinstance(obs.get("set") or {}, dict):
        return Evaluation("invalid", problems=["the sglang_patches fact is not an object with a 'set'"])
    try:
        pset = mf.from_dict((obs.get("set") or {}).get("manifest"), origin="recorded manifest")
    except mf.ManifestError as exc:
        return Evaluation("invalid", problems=[str(exc)])
    ev = _set_level(pset, obs)
    seen = _object(obs, "files") or {}
    chains = pset.chains()
    for path, chain in chains.items():
        status, problem = _file_status(pset, path, chain, _object(seen, path) or {})
        ev.files.append(status)
        if problem:
            ev.problems.append(f"{path}: {problem}")
    ev.patches.extend(_patch_statuses(pset, chains, ev.files))
    ev.overall = _combine([f.state for f in ev.files])
    return ev


def _set_level(pset: mf.PatchSet, obs: dict[str, Any]) -> Evaluation:
    """The evaluation before any file is judged: the installed version against the set's, the journal of an
    unfinished run, the last run, and the problems these alone show."""
    version = (_object(obs, "sglang") or {}).get("version")
    ev = Evaluation("pristine", pset.name, pset.sglang, version, bool(version) and pset.supports(str(version)))
    ev.journal = _object(obs, "journal")
    ev.last_run = _object(obs, "last_run")
    if obs.get("journal_error"):
        ev.problems.append(str(obs["journal_error"]))
    if not ev.version_ok:
        ev.problems.append(f"patch set {pset.name} is for sglang {pset.sglang}; installed: {version or 'unknown'}")
    return ev


def _object(doc: dict[str, Any], key: str) -> dict[str, Any] | None:
    """``doc[key]`` when it is an object; ``None`` otherwise: a hand-edited snapshot may hold anything there."""
    value = doc.get(key)
    return value if isinstance(value, dict) else None


def _file_status(pset: mf.PatchSet, path: str, chain: list[tuple[int, mf.FileChange]], entry: dict[str, Any]
                 ) -> tuple[FileStatus, str | None]:
    """One file's status from its observed entry, and the problem it shows about the set itself (``None``
    when there is none): a set made for another build or version is a problem even where the file reads
    pristine."""
    digest, exists = entry.get("sha256"), bool(entry.get("exists"))
    state, stage, note = _observed_state(chain, entry)
    record, in_record = entry.get("record"), bool(entry.get("in_record"))
    first = chain[0][1].before
    note, problem = _record_note(first, state, digest, record, in_record, note)
    status = FileStatus(path, state, digest if exists else None, first, chain[-1][1].after, stage,
                        [pset.patches[i].id for i, _ in chain], record, in_record, note)
    return status, problem


def _observed_state(chain: list[tuple[int, mf.FileChange]], entry: dict[str, Any]) -> tuple[str, int | None, str]:
    """(state, stage, note) of one file: from its hash, unless something other than a file stands there or it
    could not be read (then the hash says nothing)."""
    exists = bool(entry.get("exists"))
    state, stage = file_stage(chain, entry.get("sha256"), exists)
    if entry.get("not_a_file"):  # whatever its hash would match: absent for a file the set creates, too
        return NOT_A_FILE, stage, f"{entry.get('error') or 'not a regular file'}: remove it and reinstall sglang"
    if entry.get("error") and state in (MISSING, DRIFTED):
        return (DRIFTED if exists else MISSING), stage, f"unreadable: {entry['error']}"
    return state, stage, ""


def _record_note(first: str | None, state: str, digest: str | None, record: str | None, in_record: bool,
                 note: str) -> tuple[str, str | None]:
    """The file's note once RECORD (the wheel's own hashes) is read beside the manifest, and the problem it
    names when RECORD shows the set was made for another build or version."""
    if first is None and in_record:
        note = "the set creates this file, but the installed wheel already has it (made for another version?)"
        return note, note
    if first is not None and in_record and record and record != first:
        note = "RECORD's hash differs from the manifest's 'before': this set was made for another build"
        return note, note
    if state == DRIFTED and digest == record and record:
        return "matches RECORD (pristine for this install), but not the set's original", None
    if state == DRIFTED:
        return note or "neither the original nor the patched bytes: edited by hand or another version", None
    return note, None


def _combine(states: list[str]) -> str:
    for bad in (NOT_A_FILE, DRIFTED, MISSING):
        if bad in states:
            return bad
    if states and all(s == APPLIED for s in states):
        return APPLIED
    if all(s == PRISTINE for s in states):
        return PRISTINE
    return PARTIAL
