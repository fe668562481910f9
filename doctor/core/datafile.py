"""Knowledge as data: the TOML tables under ``doctor/data/`` (and a test's own copy), read once per process;
and the one TOML reader for every other file the doctor reads (config, profiles, signature files).

Every TOML file goes through ``read_toml``, so the Python 3.10 fallback (``tomli``) and the wording of a
file that cannot be used (which file, and where tomllib stopped: line and column) live in one place. Each
caller turns ``DataFileError`` into its own error (``ConfigError``: exit 2; ``SignatureError``); a packaged
table that fails is a damaged install, and the CLI's guard reports it in one line naming the file.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from doctor.core.fileio import read_capped

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - py310
    import tomli as tomllib

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
MAX_TOML_BYTES = 16 * 1024 * 1024  # a config, profile or signatures file; far larger is not one
MAX_NESTING = 64  # tables and arrays within each other: no file the doctor reads needs more


class DataFileError(Exception):
    """A TOML file that cannot be used: missing or unreadable, not UTF-8, or not valid TOML.

    The message names the file and, for a parse error, tomllib's line and column; ``path`` and ``reason``
    are kept apart for a caller that words it its own way.
    """

    def __init__(self, message: str, path: Path, reason: str) -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


def _utf8_error(data: bytes, exc: UnicodeDecodeError) -> str:
    """Where the first byte that is not UTF-8 stands, as an editor counts it (line, byte column)."""
    line = data.count(b"\n", 0, exc.start) + 1
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    return f"byte 0x{data[exc.start]:02x} is not UTF-8 (at line {line}, column {column})"


def read_toml(path: str | Path, what: str = "data file") -> dict[str, Any]:
    """The parsed TOML at ``path``, read afresh; ``DataFileError`` naming ``what`` and the file otherwise.

    ``what`` says what the file is to the user ("config file", "signatures file"): the message is
    ``cannot read <what> <path>: <why>`` or ``<what> <path> is not valid TOML: <tomllib's message>``.
    """
    path = Path(path)
    try:
        data = read_capped(path, MAX_TOML_BYTES, f"a {what}")
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise DataFileError(f"cannot read {what} {path}: {reason}", path, reason) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        reason = _utf8_error(data, exc)
        raise DataFileError(f"{what} {path} is not valid TOML: {reason}", path, reason) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reason = str(exc)
        raise DataFileError(f"{what} {path} is not valid TOML: {reason}", path, reason) from None
    except RecursionError:
        reason = f"arrays or tables nested too deeply (more than {MAX_NESTING} levels)"
        raise DataFileError(f"{what} {path} cannot be used: {reason}", path, reason) from None
    if too_deep(doc):
        reason = f"arrays or tables nested more than {MAX_NESTING} levels deep"
        raise DataFileError(f"{what} {path} cannot be used: {reason}", path, reason)
    return doc


def too_deep(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether dicts and lists nest more than ``limit`` levels in ``value`` (walked without recursion, so a
    hostile file cannot make a reader of it, or any recursive walk after it, overflow the stack)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return False


@functools.lru_cache(maxsize=32)
def load_toml(path: str | Path) -> dict[str, Any]:
    """The parsed table at ``path`` (cached: callers must not modify it); ``DataFileError`` as ``read_toml``."""
    return read_toml(path)
