"""sha256 digests in the two spellings the patch engine meets: hex (manifests) and RECORD's.

A wheel's ``dist-info/RECORD`` writes ``sha256=<urlsafe base64, no padding>``; manifests write
plain hex, which people can compare with ``sha256sum``. Both denote the same digest.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from pathlib import Path

from doctor.core.fileio import open_regular

HEX_RE = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex digest of a file's bytes; raises ``OSError`` (FileNotFoundError when absent)."""
    h = hashlib.sha256()
    with open_regular(path) as fh:  # a FIFO or a device is refused, never waited on
        while True:
            block = fh.read(CHUNK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def record_to_hex(value: str) -> str | None:
    """``sha256=<b64>`` (RECORD) -> hex; None for an empty or non-sha256 entry."""
    algo, _, digest = value.partition("=")
    if algo != "sha256" or not digest:
        return None
    try:
        raw = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def hex_to_record(hexdigest: str) -> str:
    """hex -> ``sha256=<b64>`` as a RECORD line spells it."""
    return "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(hexdigest)).rstrip(b"=").decode("ascii")


def normalize_digest(value: object) -> str | None:
    """A manifest hash in either spelling -> lowercase hex; ``ValueError`` when it is neither."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"hash must be a string or null, got {type(value).__name__}")
    text = value.strip()
    if text.startswith("sha256="):
        out = record_to_hex(text)
        if out is None:
            raise ValueError(f"not a sha256 digest: {value!r}")
        return out
    low = text.lower()
    if not HEX_RE.match(low):
        raise ValueError(f"not a 64-digit sha256 hex digest: {value!r}")
    return low
