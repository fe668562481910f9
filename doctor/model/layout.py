"""Where a model's files are and what interrupted downloads left behind.

Three layouts are normal: a plain directory; ``hf download --local-dir DIR`` (metadata under
``DIR/.cache/huggingface/download/<file>.metadata``: commit, etag, timestamp; partial files as
``<file>.incomplete`` there); the Hugging Face cache (``models--org--name/snapshots/<rev>/<file>``
is a symlink to ``../../blobs/<sha256 or git sha1>``, partial blobs as ``blobs/<x>.incomplete``).
aria2 leaves ``<file>.aria2`` control files next to unfinished files.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doctor.core.fileio import describe_error, open_regular

LEFTOVER_SUFFIXES = (".aria2", ".incomplete", ".part", ".partial")
HF_LOCAL_META_DIR = os.path.join(".cache", "huggingface", "download")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_SCAN_ENTRIES = 20000


@dataclass
class FileState:
    """What is at ``<model_dir>/<name>``: a file, a symlink (resolved or dangling), or nothing."""

    name: str
    path: str
    exists: bool
    is_symlink: bool = False
    link_target: str | None = None
    dangling: bool = False
    size: int | None = None
    error: str | None = None
    blob_sha256: str | None = None  # HF cache: the blob's name when it is a sha256
    allocated: int | None = None  # bytes the filesystem allocated (st_blocks x 512): holes are not

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, False)} | {"name": self.name,
                                                                                       "exists": self.exists}


def file_state(model_dir: str, name: str) -> FileState:
    """Stat ``name`` under ``model_dir`` without following it outside what a loader would open."""
    path = os.path.join(model_dir, name)
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        return FileState(name, path, exists=False)
    except OSError as exc:  # a loop in a directory of the path: it is there, and cannot be reached
        return FileState(name, path, exists=True, error=describe_error(exc))
    fs = FileState(name, path, exists=True)
    if stat.S_ISLNK(lst.st_mode):
        fs.is_symlink = True
        try:
            fs.link_target = os.readlink(path)
        except OSError:
            fs.link_target = None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            fs.dangling = True
            return fs
        except OSError as exc:  # a symlink loop is said to be one, never "missing"
            fs.error = describe_error(exc)
            return fs
        base = os.path.basename(os.path.realpath(path))
        if SHA256_RE.match(base):
            fs.blob_sha256 = base
    else:
        st = lst
    fs.size = st.st_size
    fs.allocated = getattr(st, "st_blocks", 0) * 512 if hasattr(st, "st_blocks") else None
    return fs


def hf_cache_root(model_dir: str) -> str | None:
    """``.../models--org--name`` when ``model_dir`` is a snapshot of the Hugging Face cache."""
    p = Path(os.path.abspath(model_dir))
    if p.parent.name == "snapshots" and p.parent.parent.name.startswith("models--"):
        return str(p.parent.parent)
    return None


def read_hf_local_metadata(model_dir: str, name: str) -> dict[str, Any] | None:
    """huggingface_hub's record of a file fetched with ``--local-dir``: commit, etag (sha256 for LFS), time."""
    path = os.path.join(model_dir, HF_LOCAL_META_DIR, name + ".metadata")
    try:
        with open_regular(path) as fh:
            lines = fh.read(4096).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    if len(lines) < 3:
        return {"path": path, "invalid": True}
    etag = lines[1].strip().strip('"')
    try:
        ts = float(lines[2].strip())
    except ValueError:
        ts = None
    return {"path": path, "commit": lines[0].strip(), "etag": etag, "timestamp": ts,
            "sha256": etag if SHA256_RE.match(etag) else None}


def _scan(dirpath: str, limit: int) -> list[os.DirEntry[str]]:
    out: list[os.DirEntry[str]] = []
    try:
        with os.scandir(dirpath) as it:
            for entry in it:
                out.append(entry)
                if len(out) >= limit:
                    break
    except OSError:
        return []
    return out


def find_leftovers(model_dir: str, names: list[str]) -> list[dict[str, Any]]:
    """Control and partial files of interrupted downloads, for the model's files.

    Looks at the model directory (and the sub-directories that indexed names live in),
    ``.cache/huggingface/download/`` below it, and ``blobs/`` of a Hugging Face cache.
    """
    found: list[dict[str, Any]] = []
    dirs = {""} | {os.path.dirname(n) for n in names if os.path.dirname(n)}
    for sub in sorted(dirs):
        for entry in _scan(os.path.join(model_dir, sub), MAX_SCAN_ENTRIES):
            if entry.name.endswith(LEFTOVER_SUFFIXES):
                rel = os.path.join(sub, entry.name) if sub else entry.name
                found.append(_leftover(rel, entry.path, entry.name))
    meta_dir = os.path.join(model_dir, HF_LOCAL_META_DIR)
    if os.path.isdir(meta_dir):
        count = 0
        for root, _dirs, files in os.walk(meta_dir):
            for fname in files:
                count += 1
                if count > MAX_SCAN_ENTRIES:
                    break
                if fname.endswith(".incomplete"):
                    full = os.path.join(root, fname)
                    found.append(_leftover(os.path.relpath(full, model_dir), full, fname))
    known = set(names)
    for item in found:
        if item["kind"] == "incomplete" and item["for"] not in known:
            item["for"] = None  # huggingface_hub names these <hash>.<etag>.incomplete
    cache = hf_cache_root(model_dir)
    if cache:
        for entry in _scan(os.path.join(cache, "blobs"), MAX_SCAN_ENTRIES):
            if entry.name.endswith(".incomplete"):
                found.append(_leftover(os.path.join("blobs", entry.name), entry.path, entry.name))
    return found


def _leftover(rel: str, full: str, fname: str) -> dict[str, Any]:
    kind = "aria2" if fname.endswith(".aria2") else fname.rsplit(".", 1)[-1]
    target = None
    if kind == "aria2":
        target = rel[: -len(".aria2")]
    elif kind == "incomplete" and HF_LOCAL_META_DIR in rel:
        target = os.path.relpath(rel[: -len(".incomplete")], HF_LOCAL_META_DIR)
        if target.startswith(".."):
            target = None
    elif kind in ("part", "partial"):
        target = rel.rsplit(".", 1)[0]
    try:
        size = os.lstat(full).st_size
    except OSError:
        size = None
    return {"path": rel, "kind": kind, "for": target, "size": size}


MAX_LISTED_DOWNLOADS = 20  # more files than this: a command naming them all is no command to paste
_DIGITS = re.compile(r"[0-9]+")


def download_globs(files: list[str]) -> list[str]:
    """Shell-free ``--include`` patterns covering ``files``: each name with its runs of digits as ``*``
    (``model-00007-of-000064.safetensors`` -> ``model-*-of-*.safetensors``), fewest first."""
    return sorted(dict.fromkeys(_DIGITS.sub("*", f) for f in files))


def redownload_argv(repo: str, model_dir: str, files: list[str]) -> tuple[list[str], str]:
    """``hf download`` of ``files`` into ``model_dir`` and what it does: the files by name (forced: a damaged
    file that is present must be replaced) while they are few; beyond ``MAX_LISTED_DOWNLOADS`` the patterns
    they share (``--include``), which fetch every missing file of those names and skip those already complete
    (10,000 broken shards: one short command, not 330,000 characters; the exact list is the result's
    details, and ``k26-doctor fix`` plans exactly those files)."""
    if len(files) <= MAX_LISTED_DOWNLOADS:
        return ["hf", "download", repo, *files, "--local-dir", model_dir, "--force-download"], ""
    globs = download_globs(files)
    if len(globs) > MAX_LISTED_DOWNLOADS:
        globs = sorted({"*" + os.path.splitext(g)[1] if os.path.splitext(g)[1] else "*" for g in globs})
    argv = ["hf", "download", repo]
    for g in globs:
        argv += ["--include", g]
    note = (f"{len(files)} files (listed in the result's details): `k26-doctor fix` plans exactly those; the "
            "command fetches what is missing by pattern (add --force-download to replace damaged files that are "
            "present: it fetches every file of the pattern again)")
    return [*argv, "--local-dir", model_dir], note
