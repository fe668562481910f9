"""The flag tables of SGLang's releases: for every server flag of every release from 0.4.0 on, the runs of releases
that accept it (``doctor/data/sglang_flag_history.json``, made by ``scripts/make_flag_history.py``).

A table of the installed stack, read by two areas: ``doctor.sglang.flag_history`` explains a flag SGLang rejects,
and ``doctor.gpu.multicast`` asks whether the installed release accepts a multicast flag. It lives here, below
both, so that neither area climbs into the other (``tests/test_architecture.py``: areas import only lower layers).
Nothing here imports SGLang.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doctor.core.fileio import read_text

if TYPE_CHECKING:  # packaging is imported where it is used: `k26-doctor list` and --help never need it
    from packaging.version import Version

HISTORY_FILE = Path(__file__).resolve().parents[1] / "data" / "sglang_flag_history.json"


def _version(text: str | None) -> Version | None:
    from packaging.version import InvalidVersion, Version

    if not text:
        return None
    try:
        return Version(str(text))
    except InvalidVersion:
        return None


@dataclass(frozen=True)
class FlagHistory:
    """Every release read (oldest first) and, per flag, the runs of releases that accept it."""

    releases: tuple[str, ...]
    flags: Mapping[str, dict[str, Any]]
    unreadable: Mapping[str, str] = field(default_factory=dict)
    forks: Mapping[str, dict[str, Any]] = field(default_factory=dict)

    def runs(self, flag: str) -> list[tuple[int, int]]:
        entry = self.flags.get(flag) or {}
        return [(int(a), int(b)) for a, b in entry.get("in", [])]

    def known(self, flag: str) -> bool:
        return flag in self.flags

    def position(self, version: str | None) -> float | None:
        """Where ``version`` falls among the releases: its index, or a half index between two;
        ``None`` when it is not a version."""
        from packaging.version import Version

        parsed = _version(version)
        if parsed is None:
            return None
        release = Version(parsed.base_version) if parsed.is_devrelease or parsed.local else parsed
        for i, rel in enumerate(self.releases):
            rv = Version(rel)
            if rv == release:
                return float(i)
            if rv > release:
                return i - 0.5
        return len(self.releases) - 0.5

    def options_at(self, release: str) -> dict[str, str]:
        """Every option string ``release`` accepts, with its argparse ``dest`` ({} for a release not read)."""
        if release not in self.releases:
            return {}
        i = self.releases.index(release)
        return {flag: str((self.flags.get(flag) or {}).get("dest") or "") for flag in self.flags
                if any(a <= i <= b for a, b in self.runs(flag))}

    def fork_of(self, flag: str) -> str | None:
        """The fork (package name) whose recorded release alone has ``flag``."""
        for package, info in self.forks.items():
            if flag in (info.get("flags") or ()):
                return package
        return None


@functools.lru_cache(maxsize=4)
def load_history(path: Path = HISTORY_FILE) -> FlagHistory:
    data = json.loads(read_text(path, 64 << 20, "a flag history"))
    return FlagHistory(tuple(data.get("releases") or ()), dict(data.get("flags") or {}),
                       dict(data.get("unreadable") or {}), dict(data.get("forks") or {}))
