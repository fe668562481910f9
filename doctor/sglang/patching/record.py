"""The installed wheel's own account of its files: ``<dist>.dist-info/RECORD`` and METADATA.

RECORD holds the sha256 of every file the installer wrote, so a pristine source file is recognised
exactly, by hash, without importing SGLang (which would pull in torch). Editable installs have no
sources in RECORD: their files are then ``unknown`` to RECORD and judged by the manifest alone.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from doctor.core.fileio import read_capped, read_text
from doctor.sglang.patching.hashing import record_to_hex

MAX_RECORD_BYTES = 64 << 20
MAX_METADATA_BYTES = 16 << 20


class RecordError(Exception):
    """The dist-info is missing or unreadable; the message says which file and why."""


def canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Installed:
    """One installed distribution: where it is, its version, and RECORD's hashes by path."""

    name: str
    version: str
    dist_info: Path
    site_packages: Path
    hashes: dict[str, str] = field(default_factory=dict)  # path -> RECORD's hash field as written ("" if none)

    def record_hash(self, path: str) -> tuple[bool, str | None]:
        """(listed in RECORD, its hex digest or None). Decoded on demand: a RECORD has thousands of rows."""
        if path in self.hashes:
            raw = self.hashes[path]
            return True, record_to_hex(raw) if raw else None
        return False, None


def parse_record(text: str) -> dict[str, str]:
    """RECORD's CSV (path, hash, size) -> {path: hash field as written, e.g. ``sha256=<b64>``, or ""}."""
    out: dict[str, str] = {}
    for row in csv.reader(io.StringIO(text)):
        if row and row[0]:
            out[row[0]] = row[1] if len(row) > 1 else ""
    return out


def read_metadata(dist_info: Path) -> tuple[str, str]:
    """(Name, Version) from METADATA; ``RecordError`` if absent or without them."""
    meta = dist_info / "METADATA"
    try:
        text = read_text(meta, MAX_METADATA_BYTES, "a METADATA file", errors="replace")
    except OSError as exc:
        raise RecordError(f"cannot read {meta}: {exc.strerror or exc}") from None
    headers = HeaderParser().parsestr(text.split("\n\n", 1)[0] + "\n\n")
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        raise RecordError(f"{meta} has no Name/Version header")
    return str(name).strip(), str(version).strip()


def find_dist_infos(site_packages: Path, dist: str = "sglang") -> list[Path]:
    """Every ``<dist>-<version>.dist-info`` directory of ``dist`` in one site-packages directory."""
    want = canonical_name(dist)
    found = []
    try:
        entries = sorted(site_packages.iterdir())
    except OSError:
        return []
    for entry in entries:
        if entry.name.endswith(".dist-info") and canonical_name(entry.name[:-10].split("-")[0]) == want:
            found.append(entry)
    return found


def load_installed(dist_info: Path, site_packages: Path | None = None) -> Installed:
    """Read METADATA and RECORD of one dist-info directory."""
    dist_info = Path(dist_info)
    name, version = read_metadata(dist_info)
    record = dist_info / "RECORD"
    try:
        blob = read_capped(record, MAX_RECORD_BYTES, "a RECORD")
    except OSError as exc:
        raise RecordError(f"cannot read {record}: {exc.strerror or exc}") from None
    try:
        hashes = parse_record(blob.decode("utf-8"))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise RecordError(f"{record} is not a valid RECORD: {exc}") from None
    return Installed(name, version, dist_info, Path(site_packages or dist_info.parent), hashes)


def installed_in(site_packages: str | Path, dist: str = "sglang") -> Installed:
    """The one installation of ``dist`` in ``site_packages``; two dist-infos is an error (a broken upgrade)."""
    sp = Path(site_packages)
    found = find_dist_infos(sp, dist)
    if not found:
        raise RecordError(f"no {dist} *.dist-info in {sp}")
    if len(found) > 1:
        raise RecordError(f"{len(found)} {dist} dist-info directories in {sp} ({', '.join(p.name for p in found)}): "
                          "a half-finished upgrade; reinstall it")
    return load_installed(found[0], sp)
