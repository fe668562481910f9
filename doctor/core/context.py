"""What a check sees: the resolved settings and the facts of this run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from doctor.core.result import Result
from doctor.core.settings import Settings
from doctor.facts.store import FactStore


@dataclass
class Context:
    settings: Settings
    facts: FactStore
    results: dict[str, Result] = field(default_factory=dict)  # finished checks, by id
    selected: frozenset[str] = frozenset()  # the ids of this run's checks (set by the runner)

    def fact(self, name: str) -> Any:
        """A fact's value; raises ``doctor.facts.FactUnavailable`` (the runner turns it into a result)."""
        return self.facts.get(name)

    def expect(self, dotted: str, default: Any = None) -> Any:
        """What the profile (merged with the config) expects, e.g. ``ctx.expect("gpu.min_memory_gib")``."""
        return self.settings.get(dotted, default)

    @property
    def deep(self) -> bool:
        return self.settings.deep
