"""The patch-set manifest: what a set patches, in which SGLang versions, with which hashes.

A patch set is a directory ``sglang_patches/<name>/`` (package data) or ``<patches_dir>/<name>/``
(a site's own sets: config ``[doctor] patches_dir`` or ``--patches-dir``) holding unified diffs and
``manifest.json``::

    {"name": "ddtree-0.5.23",
     "description": "DDTree tree verification for SGLang 0.5.23",
     "sglang": "==0.5.23",                      # a packaging specifier for the installed version
     "patches": [
       {"id": "cuda-graph-tree",
        "description": "what it changes and why",
        "diff": "0001-cuda-graph-tree.patch",     # unified diff, relative to the set directory
        "files": [
          {"path": "sglang/srt/.../x.py",        # relative to site-packages
           "before": "<sha256 hex>",             # as RECORD has it; null: the patch creates the file
           "after": "<sha256 hex>"}]}],         # null: the patch deletes the file
     "validated": [{"tp_size": 1, ..., "date": "...", "run": "..."}]}  # optional: see below

Patches apply in list order. A file may be touched by several patches: then each later patch's
``before`` is the earlier one's ``after`` (a chain), and the file's pristine hash is the first
``before``. Hashes may also be written as RECORD spells them (``sha256=<urlsafe b64>``). The
manifest is generated, never typed: ``k26-doctor patches make-manifest`` (doctor.sglang.patching.generate).

``validated`` (optional, kept by the generator as written): the configurations the patched SGLang was validated in,
one object each, as the patched code's own table lists them (ddtree-0.5.23: ``ddtree_worker.VALIDATED``, which its
start-up gate matches; ``doctor.sglang.ddtree`` judges a profile against it before a start).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from doctor.core.fileio import read_capped
from doctor.sglang.patching.hashing import normalize_digest

if TYPE_CHECKING:  # packaging is imported where it is used: `k26-doctor list` and --help never need it
    from packaging.specifiers import SpecifierSet

MANIFEST_NAME = "manifest.json"
PACKAGE_SETS_DIR = Path(__file__).resolve().parents[3] / "sglang_patches"
MAX_MANIFEST_BYTES = 4 << 20
MAX_DIFF_BYTES = 64 << 20


class ManifestError(Exception):
    """The manifest (or the set) is unusable; the message names the file and the problem."""


@dataclass(frozen=True)
class FileChange:
    path: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class Patch:
    id: str
    description: str
    diff: str
    files: tuple[FileChange, ...]


@dataclass
class PatchSet:
    name: str
    description: str
    sglang: str
    patches: list[Patch]
    directory: Path | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    validated: tuple[dict[str, Any], ...] = ()  # the configurations the set was validated in (module docstring)

    @property
    def specifier(self) -> SpecifierSet:
        from packaging.specifiers import SpecifierSet

        return SpecifierSet(self.sglang)

    def supports(self, version: str) -> bool:
        """Whether the installed SGLang version is one this set was made for (pre-releases too)."""
        from packaging.version import InvalidVersion, Version

        try:
            return self.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False

    def chains(self) -> dict[str, list[tuple[int, FileChange]]]:
        """Per file, in patch order: (patch index, change). Insertion order: first appearance."""
        out: dict[str, list[tuple[int, FileChange]]] = {}
        for i, patch in enumerate(self.patches):
            for change in patch.files:
                out.setdefault(change.path, []).append((i, change))
        return out

    def diff_path(self, patch: Patch) -> Path:
        if self.directory is None:
            raise ManifestError(f"patch set {self.name!r} has no directory to read {patch.diff} from")
        return self.directory / patch.diff

    def read_diff(self, patch: Patch) -> bytes:
        path = self.diff_path(patch)
        try:
            return read_capped(path, MAX_DIFF_BYTES, "a source patch")
        except OSError as exc:
            raise ManifestError(f"cannot read diff {path} of patch {patch.id!r}: {exc.strerror or exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "sglang": self.sglang,
            "patches": [
                {"id": p.id, "description": p.description, "diff": p.diff,
                 "files": [{"path": f.path, "before": f.before, "after": f.after} for f in p.files]}
                for p in self.patches
            ],
        }


def _safe_relpath(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ManifestError(f"{what} must be a non-empty relative path")
    if "\\" in value or "\x00" in value:
        raise ManifestError(f"{what} {value!r} must use '/' and no NUL")
    p = PurePosixPath(value)
    if p.is_absolute() or any(part in ("..", "") for part in value.split("/")) or str(p) != value:
        raise ManifestError(f"{what} {value!r} must be a normalised path inside its root (no '..', no leading '/')")
    return value


def _sglang_spec(spec: Any, origin: str) -> str:
    """The manifest's 'sglang' version specifier, checked that it parses: kept apart from ``from_dict`` so the
    manifest's own checks read in their order."""
    if not isinstance(spec, str) or not spec.strip():
        raise ManifestError(f"{origin}: 'sglang' must be a version specifier such as '==0.5.23'")
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        raise ManifestError(f"{origin}: 'sglang' {spec!r} is not a valid version specifier") from None
    return spec


def from_dict(data: Any, directory: Path | None = None, origin: str = "manifest") -> PatchSet:
    """Validate a manifest document; every problem becomes a ``ManifestError`` naming ``origin``."""
    if not isinstance(data, dict):
        raise ManifestError(f"{origin}: the top level must be a JSON object")
    name = data.get("name")
    if not isinstance(name, str) or not name or "/" in name:
        raise ManifestError(f"{origin}: 'name' must be a non-empty string without '/'")
    spec = _sglang_spec(data.get("sglang"), origin)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ManifestError(f"{origin}: 'description' must be a string")
    raw_patches = data.get("patches")
    if not isinstance(raw_patches, list) or not raw_patches:
        raise ManifestError(f"{origin}: 'patches' must be a non-empty list")
    seen_ids: set[str] = set()
    last_after: dict[str, str | None] = {}
    patches = [_patch(rp, origin, n, seen_ids, last_after) for n, rp in enumerate(raw_patches)]
    validated = data.get("validated", [])
    if not isinstance(validated, list) or not all(isinstance(v, dict) for v in validated):
        raise ManifestError(f"{origin}: 'validated' must be a list of objects (one validated configuration each)")
    return PatchSet(name, description, spec.strip(), patches, directory, raw=data,
                    validated=tuple(dict(v) for v in validated))


def _patch(rp: Any, origin: str, n: int, seen_ids: set[str], last_after: dict[str, str | None]) -> Patch:
    """One entry of 'patches', checked. ``seen_ids`` (ids so far) and ``last_after`` (each file's hash after the
    patches so far) carry what the set's earlier patches leave, and are updated: a later patch of a file must
    start from the hash the earlier one leaves."""
    where = f"{origin}: patches[{n}]"
    if not isinstance(rp, dict):
        raise ManifestError(f"{where} must be an object")
    pid = rp.get("id")
    if not isinstance(pid, str) or not pid or any(c.isspace() for c in pid):
        raise ManifestError(f"{where}: 'id' must be a non-empty string without spaces")
    if pid in seen_ids:
        raise ManifestError(f"{where}: duplicate patch id {pid!r}")
    seen_ids.add(pid)
    where = f"{origin}: patch {pid!r}"
    pdesc = rp.get("description", "")
    if not isinstance(pdesc, str):
        raise ManifestError(f"{where}: 'description' must be a string")
    diff = _safe_relpath(rp.get("diff"), f"{where}: 'diff'")
    raw_files = rp.get("files")
    if not isinstance(raw_files, list) or not raw_files:
        raise ManifestError(f"{where}: 'files' must be a non-empty list")
    paths_here: set[str] = set()
    files = tuple(_file_change(rf, where, paths_here, last_after) for rf in raw_files)
    return Patch(pid, pdesc, diff, files)


def _file_change(rf: Any, where: str, paths_here: set[str], last_after: dict[str, str | None]) -> FileChange:
    """One entry of a patch's 'files', checked: listed once in its patch, both hashes given and different, and
    its 'before' the 'after' of the set's earlier patch of that file (``last_after``, updated here)."""
    if not isinstance(rf, dict):
        raise ManifestError(f"{where}: each entry of 'files' must be an object")
    path = _safe_relpath(rf.get("path"), f"{where}: file path")
    if path in paths_here:
        raise ManifestError(f"{where}: {path} listed twice")
    paths_here.add(path)
    if "before" not in rf or "after" not in rf:
        raise ManifestError(f"{where}: {path} needs 'before' and 'after' (null for absent)")
    try:
        before, after = normalize_digest(rf["before"]), normalize_digest(rf["after"])
    except ValueError as exc:
        raise ManifestError(f"{where}: {path}: {exc}") from None
    if before == after:
        raise ManifestError(f"{where}: {path}: 'before' and 'after' are the same: the patch changes nothing")
    if path in last_after and last_after[path] != before:
        raise ManifestError(f"{where}: {path}: 'before' is not the 'after' of the earlier patch that "
                            "touches this file (patches apply in order)")
    last_after[path] = after
    return FileChange(path, before, after)


def stage_hashes(chain: list[tuple[int, FileChange]]) -> list[str | None]:
    """A file's sha256 at each stage of its chain (one of ``PatchSet.chains()``): index 0 before the first
    patch, index k after the k-th (None: the file is absent there). Status finds a file's stage in it, and
    each plan the hash its result must have: one list, so they agree."""
    return [chain[0][1].before] + [c.after for _, c in chain]


def load(directory: str | os.PathLike[str]) -> PatchSet:
    """Read and validate ``<directory>/manifest.json`` (and that every diff it names exists)."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    try:
        blob = read_capped(path, MAX_MANIFEST_BYTES, "a manifest")
    except FileNotFoundError:
        raise ManifestError(f"{path} does not exist") from None
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path} is not valid JSON: {exc}") from None
    pset = from_dict(data, directory, origin=str(path))
    for patch in pset.patches:
        if not pset.diff_path(patch).is_file():
            raise ManifestError(f"{path}: patch {patch.id!r} names {patch.diff}, which is not in {directory}")
    return pset


def search_dirs(patches_dir: str | None) -> list[Path]:
    """Where sets are looked up by name: the site directory first (it may override), then the package."""
    dirs = [Path(os.path.expanduser(patches_dir))] if patches_dir else []
    dirs.append(PACKAGE_SETS_DIR)
    return dirs


def locate(name: str, patches_dir: str | None = None) -> Path:
    """The directory of set ``name``: a path to a set directory, or a name under ``search_dirs``."""
    if not name:
        raise ManifestError("no patch set named")
    if "/" in name or name.startswith("."):
        path = Path(os.path.expanduser(name))
        if (path / MANIFEST_NAME).is_file():
            return path
        raise ManifestError(f"{path} is not a patch-set directory (no {MANIFEST_NAME})")
    dirs = search_dirs(patches_dir)
    for base in dirs:
        if (base / name / MANIFEST_NAME).is_file():
            return base / name
    known = sorted({p.parent.name for base in dirs for p in base.glob(f"*/{MANIFEST_NAME}")})
    raise ManifestError(f"patch set {name!r} not found in {', '.join(str(d) for d in dirs)}"
                        + (f"; available: {', '.join(known)}" if known else "; no patch sets there"))


def resolve(name: str, patches_dir: str | None = None) -> PatchSet:
    """Locate and load a set; its manifest's name must match the directory it was asked by."""
    directory = locate(name, patches_dir)
    pset = load(directory)
    if "/" not in name and pset.name != name:
        raise ManifestError(f"{directory / MANIFEST_NAME} names itself {pset.name!r}, not {name!r}")
    return pset
