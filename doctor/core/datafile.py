"""Knowledge as data: the TOML tables under ``doctor/data/`` (and a test's own copy), read once per process.

Every area keeps its tables as data; this is the one reader, so the Python 3.10 fallback (``tomli``) and the
caching live in one place.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - py310
    import tomli as tomllib

DATA_DIR = Path(__file__).resolve().parents[1] / "data"


@functools.lru_cache(maxsize=32)
def load_toml(path: str | Path) -> dict[str, Any]:
    """The parsed table at ``path`` (cached: callers must not modify it)."""
    with open(path, "rb") as fh:
        return tomllib.load(fh)
