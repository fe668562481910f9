"""What a check says: a status, one line, details and a remediation.

Kept free of any I/O so that checks stay pure functions from facts to a ``Result``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """Verdicts, ordered by severity (see ``SEVERITY``).

    ``error`` means the check itself crashed or timed out; the gate fails closed on it.
    """

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value

    @property
    def failed(self) -> bool:
        """``fail`` and ``error`` both stop a launch."""
        return self in (Status.FAIL, Status.ERROR)


SEVERITY = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.FAIL: 3, Status.ERROR: 4}


@dataclass
class Remediation:
    """How to fix it: prose for people and the exact commands, brew-doctor style."""

    text: str = ""
    commands: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "commands": list(self.commands)}


@dataclass
class Result:
    """The outcome of one check.

    Checks build it with the constructors below (``Result.passed(...)`` etc.). The runner fills in
    ``id``, ``title``, ``fixer``, ``duration_s`` and, for an ignored failure, ``ignored`` with the
    original status.
    """

    status: Status
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    remediation: Remediation | None = None
    id: str = ""
    title: str = ""
    fixer: str | None = None
    duration_s: float = 0.0
    ignored: Status | None = None
    traceback: str | None = None
    # Why a ``skip`` is not a verdict of its own:
    cause: str | None = None  # the check (or notice) whose failure explains this result; shown under it
    unjudged: bool = False  # skipped for want of facts: never a pass for launch, a failure under --strict
    exhibit: str | None = None  # a block shown with a failure (e.g. the NVLink matrix), not only under -v

    # -- constructors used by checks -------------------------------------------------------
    @classmethod
    def passed(cls, summary: str, **details: Any) -> Result:
        return cls(Status.PASS, summary, details)

    @classmethod
    def warned(cls, summary: str, remediation: Remediation | str | None = None, **details: Any) -> Result:
        return cls(Status.WARN, summary, details, _remedy(remediation))

    @classmethod
    def failed(cls, summary: str, remediation: Remediation | str | None = None, **details: Any) -> Result:
        return cls(Status.FAIL, summary, details, _remedy(remediation))

    @classmethod
    def skipped(cls, summary: str, **details: Any) -> Result:
        return cls(Status.SKIP, summary, details)

    @classmethod
    def errored(cls, summary: str, **details: Any) -> Result:
        return cls(Status.ERROR, summary, details)

    @classmethod
    def blocked(cls, summary: str, by: str, **details: Any) -> Result:
        """``skip`` because another check (``by``) failed and judges the cause: listed under it."""
        res = cls(Status.SKIP, summary, details)
        res.cause = by
        return res

    @classmethod
    def not_judged(cls, summary: str, remediation: Remediation | str | None = None, **details: Any) -> Result:
        """``skip`` for want of facts (not recorded, not readable, nothing to compare with): the check
        could have judged but did not. ``launch`` refuses it and ``--strict`` fails on it."""
        res = cls(Status.SKIP, summary, details, _remedy(remediation))
        res.unjudged = True
        return res

    def to_dict(self) -> dict[str, Any]:
        """The JSON report's result object (CONTRACT.md); extra keys only ever added."""
        out: dict[str, Any] = {
            "id": self.id,
            "status": self.status.value,
            "title": self.title,
            "summary": self.summary,
            "details": self.details,
            "remediation": self.remediation.to_dict() if self.remediation else None,
            "fixer": self.fixer,
            "duration_s": round(self.duration_s, 4),
        }
        if self.ignored is not None:
            out["ignored"] = self.ignored.value
        if self.traceback:
            out["traceback"] = self.traceback
        if self.cause:
            out["cause"] = self.cause
        if self.unjudged:
            out["unjudged"] = True
        return out


def _remedy(value: Remediation | str | None) -> Remediation | None:
    if value is None or isinstance(value, Remediation):
        return value
    return Remediation(text=value)


def worst(statuses: list[Status]) -> Status:
    """The overall verdict: ``fail`` if anything failed or errored, else ``warn`` if any warned."""
    if any(s.failed for s in statuses):
        return Status.FAIL
    if any(s is Status.WARN for s in statuses):
        return Status.WARN
    return Status.PASS
