"""k26-doctor's sha256 manifest of a model directory: what the deep tier compares against first.

``k26-doctor manifest write DIR`` records, after a download known to be good (or from the digests
the Hub published), every shard's size and sha256 in ``DIR/k26-doctor.manifest.json``::

    {"kind": "k26-doctor-manifest", "version": 1, "algorithm": "sha256", "created": "...",
     "files": {"model-00001-of-000064.safetensors": {"size": 9876543210, "sha256": "ab12..."}}}

It is also readable by people and by ``sha256sum -c`` through ``manifest export``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from doctor.core.fileio import read_capped

MANIFEST_NAME = "k26-doctor.manifest.json"
MANIFEST_KIND = "k26-doctor-manifest"
MANIFEST_VERSION = 1
_SHA = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Manifest:
    path: str
    present: bool = False
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    created: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.present and self.error is None


def read_manifest(path: str) -> Manifest:
    """Parse a manifest; anything malformed is an ``error`` (the caller falls back to other sources)."""
    man = Manifest(path)
    try:
        raw = read_capped(path, 64 * 1024 * 1024, "a manifest")
    except FileNotFoundError:
        if os.path.islink(path):
            man.present = True
            man.error = f"{path} is a dangling symlink"
        return man
    except OSError as exc:
        man.present = True
        man.error = f"cannot read {path}: {exc.strerror or exc}"
        return man
    man.present = True
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        man.error = f"{os.path.basename(path)} is not valid JSON ({type(exc).__name__})"
        return man
    if not isinstance(doc, dict) or doc.get("kind") != MANIFEST_KIND or not isinstance(doc.get("files"), dict):
        man.error = f"{os.path.basename(path)} is not a k26-doctor manifest"
        return man
    if doc.get("version") != MANIFEST_VERSION or doc.get("algorithm", "sha256") != "sha256":
        man.error = f"manifest version {doc.get('version')!r} / algorithm {doc.get('algorithm')!r} not supported"
        return man
    for name, entry in doc["files"].items():
        if (not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str)
                or not _SHA.match(entry["sha256"].lower())):
            man.error = f"manifest entry {name!r} has no valid sha256"
            return man
        size = entry.get("size")
        man.files[name] = {"sha256": entry["sha256"].lower(), "size": size if isinstance(size, int) else None}
    man.created = doc.get("created") if isinstance(doc.get("created"), str) else None
    return man


def manifest_text(files: dict[str, dict[str, Any]], note: str = "") -> str:
    """The manifest file's content for ``files`` (name -> {size, sha256})."""
    doc = {
        "kind": MANIFEST_KIND, "version": MANIFEST_VERSION, "algorithm": "sha256",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "note": note,
        "files": {n: {"size": files[n]["size"], "sha256": files[n]["sha256"]} for n in sorted(files)},
    }
    return json.dumps(doc, indent=1) + "\n"


def sha256sum_line(digest: str, name: str) -> str:
    """One line of ``sha256sum`` output, escaped as coreutils escapes it: a name holding a backslash, a newline or
    a carriage return gets a leading ``\\`` and those characters as ``\\\\``, ``\\n``, ``\\r`` (what
    ``sha256sum -c`` reads back), so a name can never end the line and start a line of its own."""
    if not any(c in name for c in "\\\n\r"):
        return f"{digest}  {name}\n"
    escaped = name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return f"\\{digest}  {escaped}\n"


def sha256sum_text(files: dict[str, dict[str, Any]]) -> str:
    """The same digests in ``sha256sum -c`` format, one line per file whatever its name holds."""
    return "".join(sha256sum_line(files[n]["sha256"], n) for n in sorted(files))
