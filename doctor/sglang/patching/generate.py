"""Generate (or regenerate) a set's ``manifest.json`` from its diffs and a pristine SGLang install.

Hashes are never typed by hand: ``before`` is read from the pristine file (and must equal RECORD's
hash, else the install is not pristine and nothing is written); ``after`` is what the strict
applier makes of it. Patches apply in order in memory, so chains (several patches on one file)
get their intermediate hashes right. An existing manifest keeps its ids, descriptions and order;
without one, every ``*.patch``/``*.diff`` of the directory becomes a patch, sorted by file name.

    k26-doctor patches make-manifest sglang_patches/ddtree-0.5.23 --python /opt/venv/bin/python
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from doctor.core.fileio import atomic_write, read_capped, read_or_none, read_text
from doctor.sglang.patching import manifest as mf
from doctor.sglang.patching import udiff
from doctor.sglang.patching.hashing import sha256_bytes
from doctor.sglang.patching.record import Installed


class GenerateError(Exception):
    """The manifest cannot be generated; nothing was written."""


def _existing(set_dir: Path) -> dict[str, Any] | None:
    path = set_dir / mf.MANIFEST_NAME
    if not path.exists():
        return None
    try:
        data = json.loads(read_text(path, mf.MAX_MANIFEST_BYTES, "a manifest"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GenerateError(f"{path} exists but cannot be read as JSON ({exc}); move it away to start afresh") from None
    if not isinstance(data, dict) or not isinstance(data.get("patches"), list):
        raise GenerateError(f"{path} is not a manifest; move it away to start afresh")
    return data


def _site_path(section: udiff.FilePatch, root: Path, known: dict[str, bytes | None]) -> str:
    """The site-packages-relative path a diff section is about: the longest suffix that exists."""
    parts = udiff.strip_prefix(section.path).split("/")
    for k in range(len(parts)):
        cand = "/".join(parts[k:])
        if cand in known or (root / cand).is_file():
            return cand
    if section.creates:
        for k in range(len(parts) - 1):
            cand = "/".join(parts[k:])
            if (root / parts[k]).is_dir():
                return cand
    raise GenerateError(f"{section.path}: no such file under {root} (is this the right install?)")


def generate(set_dir: str | Path, installed: Installed, *, name: str | None = None, sglang: str | None = None,
             description: str | None = None, package_root: Path | None = None, write: bool = True) -> mf.PatchSet:
    """Build the manifest for ``set_dir`` against a pristine ``installed``; write it unless ``write=False``."""
    set_dir = Path(set_dir)
    root = Path(package_root or installed.site_packages)
    old = _existing(set_dir) or {}
    state: dict[str, bytes | None] = {}  # every file's content as the patches so far leave it
    patches_out = [_patch_entry(set_dir, entry, root, installed, state) for entry in _entries(set_dir, old)]
    doc = {
        "name": name or old.get("name") or set_dir.name,
        "description": description if description is not None else old.get("description", ""),
        "sglang": sglang or old.get("sglang") or f"=={installed.version}",
        "patches": patches_out,
    }
    # What a set records besides its hashes (e.g. ddtree-0.5.23's "validated" configurations) is not
    # generated: it is kept as the existing manifest has it.
    doc.update({k: v for k, v in old.items() if k not in doc})
    try:
        pset = mf.from_dict(doc, set_dir, origin=str(set_dir / mf.MANIFEST_NAME))
    except mf.ManifestError as exc:
        raise GenerateError(str(exc)) from None
    if not pset.supports(installed.version):
        raise GenerateError(f"'sglang' {pset.sglang} does not include the install it was generated from "
                            f"({installed.version})")
    if write:
        atomic_write(set_dir / mf.MANIFEST_NAME, (json.dumps(doc, indent=2) + "\n").encode())
    return pset


def _entries(set_dir: Path, old: dict[str, Any]) -> list[dict[str, Any]]:
    """The patches to hash, in order: the existing manifest's (ids, descriptions and order kept), else every
    ``*.patch``/``*.diff`` of the directory, sorted by file name."""
    if old.get("patches"):
        return [dict(p) for p in old["patches"] if isinstance(p, dict)]
    diffs = sorted(p for p in set_dir.iterdir() if p.suffix in (".patch", ".diff") and p.is_file())
    if not diffs:
        raise GenerateError(f"no *.patch or *.diff files in {set_dir}")
    return [{"id": p.stem, "description": "", "diff": p.name} for p in diffs]


def _sections(set_dir: Path, entry: dict[str, Any]) -> tuple[str, list[udiff.FilePatch]]:
    """(diff file name, its file sections) of one manifest entry; a missing, unreadable or malformed diff is a
    ``GenerateError``."""
    diff_name = entry.get("diff")
    if not isinstance(diff_name, str):
        raise GenerateError(f"patch {entry.get('id')!r} has no 'diff'")
    try:
        return diff_name, udiff.parse(read_capped(set_dir / diff_name, mf.MAX_DIFF_BYTES, "a source patch"))
    except OSError as exc:
        raise GenerateError(f"cannot read {set_dir / diff_name}: {exc.strerror or exc}") from None
    except udiff.PatchFormatError as exc:
        raise GenerateError(f"{diff_name}: {exc}") from None


def _pristine(path: str, root: Path, installed: Installed) -> bytes | None:
    """The installed file's content (None: absent, a file the patch creates), refused unless RECORD vouches for
    it: a file that differs from RECORD means the install is not pristine, and one RECORD does not list cannot
    be verified."""
    data = read_or_none(root / path)
    listed_in_record, rec = installed.record_hash(path)
    if data is not None and listed_in_record and rec and sha256_bytes(data) != rec:
        raise GenerateError(f"{path} differs from RECORD: this install is not pristine; generate "
                            "against a fresh `pip install --no-deps sglang==X`")
    if data is not None and not listed_in_record:
        raise GenerateError(f"{path} is not in {installed.dist_info.name}/RECORD: its original cannot "
                            "be verified")
    return data


def _patch_entry(set_dir: Path, entry: dict[str, Any], root: Path, installed: Installed,
                 state: dict[str, bytes | None]) -> dict[str, Any]:
    """One patch's manifest entry: each file it changes with its hash before and after, applied in memory on
    ``state`` (what the earlier patches made of the file), so that chains get their intermediate hashes."""
    diff_name, sections = _sections(set_dir, entry)
    listed = [f.get("path") for f in entry.get("files") or [] if isinstance(f, dict)]
    files_out = []
    for sec in sections:
        path = next((p for p in listed if isinstance(p, str) and udiff.match_section([sec], p)), None)
        path = path or _site_path(sec, root, state)
        if path not in state:
            state[path] = _pristine(path, root, installed)
        before = state[path]
        try:
            after = udiff.apply(before, sec)
        except udiff.HunkMismatch as exc:
            raise GenerateError(f"{diff_name}: {exc}") from None
        state[path] = after
        files_out.append({"path": path, "before": None if before is None else sha256_bytes(before),
                          "after": None if after is None else sha256_bytes(after)})
    return {"id": entry.get("id"), "description": entry.get("description", ""), "diff": diff_name,
            "files": files_out}
