"""A judgement of the stack area's library, before it becomes a check's Result: status, one line, the fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    status: str  # "pass" | "warn" | "fail" | "skip"
    summary: str
    fix: str = ""
    commands: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    cause: str | None = None  # a skip explained by another check's failure (Result.cause)
    unjudged: bool = False  # a skip for want of facts (Result.unjudged)
