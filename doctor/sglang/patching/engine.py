"""Apply and revert a patch set as one transaction over many files, and recover an interrupted one.

A run (``Engine.apply``/``Engine.revert``) goes:

1. plan: read every target file, compute its new bytes in memory (strict diffs, ``udiff``) and check
   them against the manifest's hashes; a drifted or missing file, a version the set is not for, or a
   diff that does not apply stops the run here, before anything is written;
2. under the lock, check nothing changed since the plan, store the old and the new bytes of every
   file in the state directory's object store (fsynced), then write the journal;
3. write each file through tmp + fsync + rename, and delete its stale ``__pycache__`` entries;
4. read every file back and check its hash; then move the journal to history (the commit point).

Any failure in 3-4 rolls every file back to its old bytes at once. If the process dies instead
(SIGKILL, power loss) the journal stays, and the next ``apply``/``revert`` first rolls the
interrupted run back (every file's old bytes are in the object store) and then does its own work.
Each file is at any moment either as it was or as planned: never in between.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.core import fileio
from doctor.sglang.patching import manifest as mf
from doctor.sglang.patching import udiff
from doctor.sglang.patching.hashing import sha256_bytes
from doctor.sglang.patching.record import Installed
from doctor.sglang.patching.state import JOURNAL_KIND, JOURNAL_SCHEMA, StateStore, now_stamp
from doctor.sglang.patching.status import DRIFTED, MISSING, NOT_A_FILE, Evaluation, evaluate, observe


class EngineError(Exception):
    """The run did not happen or was rolled back; the message says what state the files are in."""


MAX_TARGET_BYTES = 64 << 20  # a source file SGLang ships (its largest is ~1 MB)
PLAN_FAILURES = (udiff.HunkMismatch, EngineError, OSError)  # what reading and patching a file in memory raise


def refusal(path: str, exc: Exception) -> str:
    """A plan's refusal for a file it could not read or patch in memory: a hunk or engine error says its own
    words (they name the file); an OSError is "cannot read", with the system's reason."""
    if isinstance(exc, OSError):
        return f"{path}: cannot read: {exc.strerror or exc}"
    return str(exc)


def not_a_file(fs: Any, version: str | None) -> str:
    """The refusal for a target that is not a file (a FIFO, a device, a directory): named as what it is; no
    ``--force`` is offered, since none would make it a file."""
    return (f"{fs.path} {fs.note.split(': remove it')[0]}: remove it, then reinstall sglang "
            f"(pip install --force-reinstall --no-deps sglang=={version})")


@dataclass
class Change:
    """One file's planned change, computed in memory before anything is written."""

    path: str
    old: bytes | None  # current bytes (None: absent)
    new: bytes | None  # planned bytes (None: delete)
    expected: str | None  # the manifest's hash the new bytes must have
    verified: bool  # new bytes hash to ``expected`` (False only for --force over a drifted file)
    why: str
    stat: os.stat_result | None = None
    patch_ids: list[str] = field(default_factory=list)

    @property
    def old_sha(self) -> str | None:
        return None if self.old is None else sha256_bytes(self.old)

    @property
    def new_sha(self) -> str | None:
        return None if self.new is None else sha256_bytes(self.new)

    def diff_lines(self) -> list[str]:
        text = udiff.make_diff(self.path, self.old, self.new).decode("utf-8", "replace")
        return text.splitlines()

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "old_sha256": self.old_sha, "new_sha256": self.new_sha,
                "verified": self.verified, "why": self.why, "patches": list(self.patch_ids)}


@dataclass
class Transaction:
    op: str  # "apply" | "revert"
    set_name: str
    evaluation: Evaluation
    changes: list[Change] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # any: nothing may be written
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refusals

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "set": self.set_name, "ok": self.ok, "changes": [c.to_dict() for c in self.changes],
                "refusals": list(self.refusals), "notes": list(self.notes)}


@dataclass
class Outcome:
    op: str
    changed: list[str] = field(default_factory=list)
    removed_bytecode: list[str] = field(default_factory=list)
    backups: dict[str, str] = field(default_factory=dict)  # path -> object file with its old bytes
    history: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Engine:
    """One patch set against one installed SGLang, with its state directory."""

    def __init__(self, pset: mf.PatchSet, installed: Installed, *, state_dir: str | None = None,
                 package_root: Path | None = None, hook: fileio.Hook | None = None) -> None:
        self.pset = pset
        self.installed = installed
        self.state_dir = state_dir
        self.root = Path(package_root or installed.site_packages)
        self.hook = hook
        self._sections: dict[str, list[udiff.FilePatch]] = {}

    # -- reading ------------------------------------------------------------------------------
    def observe(self) -> dict[str, Any]:
        return observe(self.pset, self.installed, self.state_dir, self.root)

    def status(self) -> Evaluation:
        return evaluate(self.observe())

    def sections(self, patch: mf.Patch) -> list[udiff.FilePatch]:
        if patch.id not in self._sections:
            try:
                self._sections[patch.id] = udiff.parse(self.pset.read_diff(patch))
            except udiff.PatchFormatError as exc:
                raise EngineError(f"patch {patch.id} ({patch.diff}): {exc}") from None
        return self._sections[patch.id]

    def section(self, patch: mf.Patch, path: str) -> udiff.FilePatch:
        sec = udiff.match_section(self.sections(patch), path)
        if sec is None:
            raise EngineError(f"patch {patch.id} ({patch.diff}) has no section for {path}")
        return sec

    def check_diffs(self) -> list[str]:
        """Every diff parses and touches exactly the files its manifest entry lists."""
        problems = []
        for patch in self.pset.patches:
            try:
                secs = self.sections(patch)
            except EngineError as exc:
                problems.append(str(exc))
                continue
            listed = {c.path for c in patch.files}
            for sec in secs:
                if not any(udiff.match_section([sec], p) for p in listed):
                    problems.append(f"patch {patch.id} ({patch.diff}) changes {sec.path}, which its manifest "
                                    "entry does not list")
            for path in listed:
                if udiff.match_section(secs, path) is None:
                    problems.append(f"patch {patch.id} lists {path}, but {patch.diff} has no section for it")
        return problems

    def _read(self, path: str) -> tuple[bytes | None, os.stat_result | None]:
        target = self.root / path
        try:
            with fileio.open_regular(target) as fh:  # a FIFO or a device is refused, never waited on
                st = os.fstat(fh.fileno())
                return fh.read(MAX_TARGET_BYTES + 1), st
        except FileNotFoundError:
            if os.path.islink(target):
                raise
            return None, None

    def _stored(self, digest: str | None) -> bytes | None:
        for store in StateStore.existing(self.state_dir, self.installed.site_packages):
            data = store.get_object(digest)
            if data is not None:
                return data
        return None

    def _run_chain(self, data: bytes | None, steps: list[tuple[int, mf.FileChange]], path: str,
                   reverse: bool = False, allow_offset: bool = False) -> bytes | None:
        for i, _change in steps:
            sec = self.section(self.pset.patches[i], path)
            data = udiff.apply(data, sec.reversed() if reverse else sec, allow_offset=allow_offset)
        return data

    # -- planning -----------------------------------------------------------------------------
    def _refuse_unsettled(self, ev: Any, plan: Transaction) -> None:
        """Refuse a plan while the tree is not in a state to change: the status's problems (the patch set's own
        are said elsewhere), an interrupted run to recover, a diff that does not check; shared by both plans so
        their refusals stay the same."""
        plan.refusals.extend(p for p in ev.problems if not p.startswith("patch set "))
        if ev.journal and plan.op == "apply":
            plan.refusals.append(f"an interrupted run ({ev.journal.get('op')}, {ev.journal.get('started')}) must be "
                                 f"recovered first: {ev.journal.get('path')}")
        elif ev.journal:
            plan.refusals.append(f"an interrupted run must be recovered first: {ev.journal.get('path')}")
        plan.refusals.extend(self.check_diffs())

    def plan_apply(self, *, force: bool = False, only: Iterable[str] | None = None) -> Transaction:
        ev = self.status()
        plan = Transaction("apply", self.pset.name, ev)
        wanted = self._selection(only, plan)
        if not ev.version_ok:
            plan.refusals.append(f"installed sglang {ev.version or '?'} is not one patch set {self.pset.name} is "
                                 f"for ({self.pset.sglang})")
        self._refuse_unsettled(ev, plan)
        if plan.refusals:
            return plan
        for fs, chain, positions, sel in self._selected_chains(ev, wanted):
            goal = max(sel) + 1
            stage = fs.stage
            if stage is not None and stage >= goal:
                continue
            start = stage or 0
            missing_prereq = [self.pset.patches[positions[k]].id for k in range(start, goal)
                              if positions[k] not in wanted]
            if missing_prereq:
                plan.refusals.append(f"{fs.path}: selected patches build on {', '.join(missing_prereq)}; select it too")
                continue
            if fs.state == NOT_A_FILE:  # no --force writes over (or through) what is not a file
                plan.refusals.append(not_a_file(fs, self.installed.version))
                continue
            hashes = mf.stage_hashes(chain)
            try:
                old, st = self._read(fs.path)
                if fs.state in (DRIFTED, MISSING):
                    change = self._forced_apply(fs, old, st, chain[:goal], hashes[goal], force, plan)
                    if change is not None:
                        plan.changes.append(change)
                    continue
                new = self._run_chain(old, chain[start:goal], fs.path)
            except PLAN_FAILURES as exc:
                plan.refusals.append(refusal(fs.path, exc))
                continue
            if (None if new is None else sha256_bytes(new)) != hashes[goal]:
                plan.refusals.append(f"{fs.path}: the patched bytes do not hash to the manifest's 'after' "
                                     f"({hashes[goal]}); the manifest and the diff disagree")
                continue
            ids = [self.pset.patches[positions[k]].id for k in range(start, goal)]
            plan.changes.append(Change(fs.path, old, new, hashes[goal], True, f"apply {', '.join(ids)}", st, ids))
        self._preflight(plan)
        return plan

    def _forced_apply(self, fs: Any, old: bytes | None, st: os.stat_result | None,
                      steps: list[tuple[int, mf.FileChange]], goal_hash: str | None, force: bool,
                      plan: Transaction) -> Change | None:
        if not force:
            if fs.state == MISSING:
                plan.refusals.append(f"{fs.path} is missing; reinstall sglang "
                                     f"(pip install --force-reinstall --no-deps sglang=={self.installed.version})")
            else:
                plan.refusals.append(f"{fs.path} has drifted (sha256 {fs.sha256}): neither the original nor the "
                                     "patched file; --force overrides (the current file is backed up)")
            return None
        step_ids = [self.pset.patches[i].id for i, _ in steps]
        original = self._stored(fs.pristine)
        if original is not None or fs.pristine is None:
            new = self._run_chain(original, steps, fs.path)
            if (None if new is None else sha256_bytes(new)) == goal_hash:
                plan.notes.append(f"{fs.path}: {fs.state}; rebuilt from the stored original {fs.pristine}")
                return Change(fs.path, old, new, goal_hash, True,
                              f"--force over {fs.state}: rebuilt from the original", st, step_ids)
        if old is None:
            plan.refusals.append(f"{fs.path} is missing and no original is stored; reinstall sglang "
                                 f"(pip install --force-reinstall --no-deps sglang=={self.installed.version})")
            return None
        new = self._run_chain(old, steps, fs.path, allow_offset=True)
        plan.notes.append(f"{fs.path}: drifted; diff applied to the edited file with --force: the result will "
                          "not match the manifest, and status will still say drifted")
        return Change(fs.path, old, new, goal_hash, False, "--force over drift (unverified)", st, step_ids)

    def plan_revert(self, *, force: bool = False, only: Iterable[str] | None = None) -> Transaction:
        ev = self.status()
        plan = Transaction("revert", self.pset.name, ev)
        wanted = self._selection(only, plan)
        self._refuse_unsettled(ev, plan)
        if plan.refusals:
            return plan
        for fs, chain, positions, sel in self._selected_chains(ev, wanted):
            goal = min(sel)
            pristine_want = fs.record if (fs.in_record and fs.record) else fs.pristine
            if fs.state == NOT_A_FILE:
                plan.refusals.append(not_a_file(fs, self.installed.version))
                continue
            if fs.state in (DRIFTED, MISSING):
                change = self._restore_original(fs, goal, force, plan)
                if change is not None:
                    plan.changes.append(change)
                continue
            stage = fs.stage or 0
            if stage <= goal:
                continue
            keep = [self.pset.patches[positions[k]].id for k in range(goal, stage) if positions[k] not in wanted]
            if keep:
                plan.refusals.append(f"{fs.path}: {', '.join(keep)} build(s) on the selected patches; revert it too")
                continue
            try:
                old, st = self._read(fs.path)
                new = self._run_chain(old, list(reversed(chain[goal:stage])), fs.path, reverse=True)
            except PLAN_FAILURES as exc:
                plan.refusals.append(refusal(fs.path, exc))
                continue
            hashes = mf.stage_hashes(chain)
            got = None if new is None else sha256_bytes(new)
            if got != hashes[goal] or (goal == 0 and got is not None and got != pristine_want):
                plan.refusals.append(f"{fs.path}: reverting does not give back the original bytes "
                                     f"(got {got}, RECORD/manifest say {hashes[goal]})")
                continue
            ids = [self.pset.patches[positions[k]].id for k in reversed(range(goal, stage))]
            plan.changes.append(Change(fs.path, old, new, hashes[goal], True, f"revert {', '.join(ids)}", st, ids))
        self._preflight(plan)
        return plan

    def _restore_original(self, fs: Any, goal: int, force: bool, plan: Transaction) -> Change | None:
        chain = self.pset.chains()[fs.path]
        if fs.state == DRIFTED and not force:
            plan.refusals.append(f"{fs.path} has drifted (sha256 {fs.sha256}); --force puts the original back "
                                 "(the edited file is backed up)")
            return None
        base = self._stored(fs.pristine)
        if base is None and fs.pristine is not None:
            plan.refusals.append(f"{fs.path} is {fs.state} and no original is stored: reinstall sglang "
                                 f"(pip install --force-reinstall --no-deps sglang=={self.installed.version})")
            return None
        try:
            new = self._run_chain(base, chain[:goal], fs.path)
            old, st = self._read(fs.path)
        except PLAN_FAILURES as exc:
            plan.refusals.append(refusal(fs.path, exc))
            return None
        want = mf.stage_hashes(chain)
        if (None if new is None else sha256_bytes(new)) != want[goal]:
            plan.refusals.append(f"{fs.path}: the stored original does not rebuild to {want[goal]}")
            return None
        if old == new:
            return None
        ids = [self.pset.patches[i].id for i, _ in chain[goal:]]
        return Change(fs.path, old, new, want[goal], True, f"{fs.state}: restore the stored original", st, ids)

    def _selected_chains(self, ev: Evaluation,
                         wanted: set[int]) -> Iterator[tuple[Any, list[Any], list[int], list[int]]]:
        """Each file a selected patch touches: its status, its chain of (patch index, file entry), the
        chain's patch indices, and the positions in the chain that are selected."""
        chains = self.pset.chains()
        for fs in ev.files:
            chain = chains[fs.path]
            positions = [i for i, _ in chain]
            sel = [k for k, i in enumerate(positions) if i in wanted]
            if sel:
                yield fs, chain, positions, sel

    def _selection(self, only: Iterable[str] | None, plan: Transaction) -> set[int]:
        ids = [p.id for p in self.pset.patches]
        if only is None:
            return set(range(len(ids)))
        chosen = set()
        for pid in only:
            if pid not in ids:
                plan.refusals.append(f"no patch {pid!r} in set {self.pset.name} (patches: {', '.join(ids)})")
            else:
                chosen.add(ids.index(pid))
        return chosen

    def _preflight(self, plan: Transaction) -> None:
        """Refuse before writing: a directory that cannot be written (as this user), a symlinked file, a file
        whose directory leads out of the package root through a symbolic link."""
        for change in plan.changes:
            if (self.root / change.path).is_symlink():
                plan.refusals.append(f"{change.path} is a symbolic link; the engine does not write through links "
                                     "(replace it with the file, or patch its target's checkout)")
                continue
            escape = escapes(self.root, change.path)
            if escape:
                plan.refusals.append(f"{change.path}: {escape}; the engine writes only inside {self.root}")
                continue
            parent = (self.root / change.path).parent
            while not parent.exists() and parent != parent.parent:
                parent = parent.parent
            if not os.access(parent, os.W_OK):
                try:
                    owner = f" (owner uid {parent.stat().st_uid})"
                except OSError:
                    owner = ""
                plan.refusals.append(f"{change.path}: cannot write in {parent}{owner}; run as the venv's owner "
                                     "or root")

    # -- doing --------------------------------------------------------------------------------
    def execute(self, plan: Transaction) -> Outcome:
        """Carry out a plan as one transaction (see the module docstring)."""
        if not plan.ok:
            raise EngineError("the plan was refused: " + "; ".join(plan.refusals))
        out = Outcome(plan.op)
        if not plan.changes:
            return out
        store = StateStore.open(self.state_dir, self.installed.site_packages)
        with store.lock(plan.op):
            if store.read_journal() is not None:
                raise EngineError(f"an interrupted run must be recovered first ({store.journal_path})")
            self._check_unchanged(plan.changes)
            for c in plan.changes:
                for data in (c.old, c.new):
                    if data is not None:
                        store.put_object(data)
                if c.old is not None:
                    out.backups[c.path] = str(store.object_path(c.old_sha or ""))
            made_dirs = self._missing_dirs(plan.changes)
            doc = self._journal(plan, made_dirs)
            store.write_journal(doc)
            try:
                self._write_and_verify(plan.changes, made_dirs, out, store)
            except BaseException as exc:
                self._undo(plan, doc, store, exc)
                raise  # not an Exception (an interrupt, an exit): rolled back, and it goes on as it came
            out.history = str(store.close_journal(doc, "done"))
            out.changed = [c.path for c in plan.changes]
        return out

    def _check_unchanged(self, changes: list[Change]) -> None:
        """Every file still reads as the plan found it; else nothing is written (the plan is stale)."""
        for c in changes:
            try:
                cur, _ = self._read(c.path)
            except OSError as exc:
                raise EngineError(f"{c.path}: cannot read ({exc.strerror or exc}); nothing was written") from None
            if cur != c.old:
                raise EngineError(f"{c.path} changed since the plan was made; nothing was written, plan again")

    def _journal(self, plan: Transaction, made_dirs: list[Path]) -> dict[str, Any]:
        """The journal of a run, written before the first file is: what a roll-back (now or after a crash)
        needs to put every file and directory back."""
        return {"kind": JOURNAL_KIND, "schema_version": JOURNAL_SCHEMA,
                "op": plan.op, "set": plan.set_name, "site_packages": str(self.installed.site_packages),
                "package_root": str(self.root), "pid": os.getpid(), "started": now_stamp(),
                "made_dirs": [str(d) for d in made_dirs],
                "files": [{"path": c.path, "old": c.old_sha, "new": c.new_sha,
                           "mode": (c.stat.st_mode & 0o7777) if c.stat else None} for c in plan.changes]}

    def _write_and_verify(self, changes: list[Change], made_dirs: list[Path], out: Outcome, store: StateStore
                          ) -> None:
        """Make the missing directories, write (or remove) every file, then read every one back."""
        self._event("journal-written", store.journal_path)
        for d in made_dirs:
            d.mkdir(exist_ok=True)
        for c in changes:
            target = self.root / c.path
            if c.new is None:
                fileio.remove(target, hook=self.hook)
            else:
                fileio.atomic_write(target, c.new, like=c.stat, hook=self.hook)
            out.removed_bytecode.extend(fileio.remove_stale_bytecode(target))
            if c.new is None:
                self._prune_empty_dirs(target.parent)
        for c in changes:
            cur, _ = self._read(c.path)
            if cur != c.new:
                raise EngineError(f"{c.path} does not read back as written")
        self._event("verified", store.journal_path)

    def _undo(self, plan: Transaction, doc: dict[str, Any], store: StateStore, exc: BaseException) -> None:
        """A run that failed part-way is rolled back. Raises ``EngineError`` saying so (and what could not be
        put back, the journal then kept for the next run to finish); returns only for an exception that is not
        an ``Exception`` (an interrupt), which the caller raises again."""
        problems = self._roll_back(doc, store)
        if problems:
            raise EngineError(f"{plan.op} failed ({_why(exc)}) and could not be rolled back completely: "
                              f"{'; '.join(problems)}. Every file is either as it was or as planned; the "
                              f"journal {store.journal_path} stays, and the next apply or revert finishes "
                              "the roll-back") from exc
        store.close_journal(doc, f"rolled back: {_why(exc)}")
        if isinstance(exc, Exception):
            raise EngineError(f"{plan.op} failed ({_why(exc)}); every file was rolled back, "
                              "nothing changed") from exc

    def apply(self, *, force: bool = False, only: Iterable[str] | None = None) -> Outcome:
        """Recover, plan and execute in one call (refusals raise ``EngineError``)."""
        return self._recover_plan_execute(self.plan_apply, force, only)

    def revert(self, *, force: bool = False, only: Iterable[str] | None = None) -> Outcome:
        """The same for a revert."""
        return self._recover_plan_execute(self.plan_revert, force, only)

    def _recover_plan_execute(self, planner: Any, force: bool, only: Iterable[str] | None) -> Outcome:
        self.recover()
        plan = planner(force=force, only=only)
        if not plan.ok:
            raise EngineError("; ".join(plan.refusals))
        return self.execute(plan)

    def recover(self) -> str | None:
        """Roll back a run that was interrupted (its journal is still there); None if there was none."""
        messages = []
        for store in StateStore.existing(self.state_dir, self.installed.site_packages):
            if not store.journal_path.exists():
                continue
            with store.lock("recover"):
                doc = store.read_journal()
                if doc is None:
                    continue
                if doc.get("site_packages") != str(self.installed.site_packages):
                    raise EngineError(f"{store.journal_path} is for {doc.get('site_packages')}, "
                                      f"not {self.installed.site_packages}")
                problems = self._roll_back(doc, store)
                if problems:
                    raise EngineError("cannot recover the interrupted run: " + "; ".join(problems)
                                      + f". Journal kept: {store.journal_path}")
                store.close_journal(doc, f"recovered (rolled back) by pid {os.getpid()}")
                messages.append(f"rolled back the interrupted {doc.get('op')} of {doc.get('started')} "
                                f"({len(doc['files'])} file(s)) recorded in {store.journal_path}")
        return "; ".join(messages) or None

    def _roll_back(self, doc: dict[str, Any], store: StateStore) -> list[str]:
        """Put every file of a journal back to its old bytes; returns what could not be.

        A journal is data in a directory others may write: its ``package_root`` must be this environment's
        (the package root or inside its site-packages) and every file must stay inside it, else nothing of
        it is touched."""
        root = Path(str(doc.get("package_root") or self.root))
        if not (same_or_inside(root, self.root) or same_or_inside(root, self.installed.site_packages)):
            return [f"the journal names package_root {root}, outside this environment's site-packages "
                    f"({self.installed.site_packages}): nothing of it was touched; inspect {store.journal_path} "
                    "and remove it by hand"]
        files = doc.get("files")
        problems = [p for entry in reversed(files if isinstance(files, list) else [])
                    if (p := self._roll_back_file(entry, root, store))]
        if not problems:
            _remove_made_dirs(doc.get("made_dirs"), root)
        return problems

    def _roll_back_file(self, entry: Any, root: Path, store: StateStore) -> str | None:
        """One journal entry put back: left as it is when it already reads as it was, refused when it reads
        neither as it was nor as planned (someone else changed it meanwhile). Returns the problem, if any."""
        path = str(entry.get("path", "")) if isinstance(entry, dict) else ""
        if not path or path.startswith("/") or ".." in path.split("/") or escapes(root, path):
            return f"journal entry {entry!r} is not a file inside {root}"
        target = root / path
        for tmp in fileio.leftover_tmp_files(target):
            try:
                tmp.unlink()
            except OSError:
                pass
        try:
            cur = fileio.read_or_none(target)
        except OSError as exc:
            return f"{path}: cannot read: {exc.strerror or exc}"
        cur_sha = None if cur is None else sha256_bytes(cur)
        old, new = entry.get("old"), entry.get("new")
        if cur_sha == old:
            return None
        if cur_sha != new:
            return (f"{path} is neither as it was ({old}) nor as planned ({new}): changed by someone else "
                    "meanwhile; left alone")
        try:
            return self._restore(target, path, old, store)
        except OSError as exc:
            return f"{path}: cannot restore: {exc.strerror or exc}"

    def _restore(self, target: Path, path: str, old: str | None, store: StateStore) -> str | None:
        """The file's old bytes written back from their backup (or the file removed, when it was absent);
        returns the problem when the backup is gone. ``OSError`` is the caller's to name."""
        if old is None:
            fileio.remove(target, hook=self.hook)
        else:
            data = store.get_object(old)
            if data is None:
                return f"{path}: its backup {store.object_path(old)} is missing or corrupt"
            like = None
            try:
                like = os.stat(target)
            except FileNotFoundError:
                target.parent.mkdir(parents=True, exist_ok=True)  # a revert may have pruned it
            fileio.atomic_write(target, data, like=like, hook=self.hook)
        fileio.remove_stale_bytecode(target)
        return None

    def _prune_empty_dirs(self, directory: Path) -> None:
        """After deleting a file: remove directories left empty that the wheel does not have (RECORD)."""
        record_dirs = self._record_dirs()
        while directory != self.root and self.root in directory.parents:
            rel = str(directory.relative_to(self.root))
            if rel in record_dirs:
                return
            cache = directory / "__pycache__"
            try:
                if cache.is_dir() and not any(cache.iterdir()):
                    cache.rmdir()
                directory.rmdir()
            except OSError:  # not empty (or not ours to remove): stop
                return
            directory = directory.parent

    def _record_dirs(self) -> set[str]:
        if not hasattr(self, "_dirs_cache"):
            dirs: set[str] = set()
            for path in self.installed.hashes:
                parts = path.split("/")[:-1]
                for k in range(1, len(parts) + 1):
                    dirs.add("/".join(parts[:k]))
            self._dirs_cache = dirs
        return self._dirs_cache

    def _missing_dirs(self, changes: list[Change]) -> list[Path]:
        made: list[Path] = []
        for c in changes:
            parent = (self.root / c.path).parent
            chain = []
            while not parent.exists() and parent != self.root:
                chain.append(parent)
                parent = parent.parent
            for d in reversed(chain):
                if d not in made:
                    made.append(d)
        return made

    def _event(self, event: str, path: Path) -> None:
        if self.hook is not None:
            self.hook(event, str(path))


def _remove_made_dirs(made_dirs: Any, root: Path) -> None:
    """After a whole roll-back: the directories the run made, removed when empty, deepest first (a journal's
    entry outside ``root`` is never touched)."""
    for d in reversed(made_dirs or []):
        if not isinstance(d, str) or not same_or_inside(Path(d), root):
            continue
        try:
            os.rmdir(d)
        except OSError:
            pass


def same_or_inside(path: Path, root: Path) -> bool:
    """Whether ``path`` is ``root`` or below it, symbolic links resolved on both sides."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip("/") + "/")


def escapes(root: Path, rel: str) -> str | None:
    """Why writing ``root/rel`` would land outside ``root`` (a directory on the way that is a symbolic link
    to elsewhere), or None. The file itself is judged apart (a symlinked file is refused as such)."""
    parent = (Path(root) / rel).parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if same_or_inside(parent, root):
        return None
    return (f"its directory {parent} leads to {os.path.realpath(parent)} through a symbolic link, outside "
            f"{os.path.realpath(root)}")


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, EngineError) else str(exc)
