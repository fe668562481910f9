"""What a check says, in one vocabulary for every area.

An area function judges facts and returns ``Findings``: each ``Finding`` is one thing found, with a severity, a
stable ``code`` (fixers match on it, tests name it), one line for people and, when something can be done, its
``fix``. A check maps its facts to area functions and turns what they found into its ``Result``
(``Result.of``); an area function that cannot judge raises ``NotJudged``, which the runner turns into the
check's ``skip`` or ``error`` (never a pass). kubeadm's preflight ``Check() (warnings, errors)`` and flutter
doctor's ``ValidationMessage``, with the codes fixers need.

Kept free of any I/O so that checks stay pure functions from facts to a ``Result``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """A check's verdict. ``error`` means the check itself crashed, timed out or could not judge and fails
    closed; the gate fails on it as on ``fail``."""

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


@dataclass
class Remediation:
    """How to fix it: prose for people and the exact commands, brew-doctor style."""

    text: str = ""
    commands: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "commands": list(self.commands)}

    @classmethod
    def of(cls, value: Remediation | str | None) -> Remediation | None:
        """A remediation from prose alone (or None, or one already made)."""
        if value is None or isinstance(value, Remediation):
            return value
        return cls(text=value)

    @classmethod
    def merged(cls, fixes: Iterable[Remediation | None]) -> Remediation | None:
        """Several fixes as one: the texts in order, each once, then the commands in order, each once."""
        texts: list[str] = []
        commands: list[str] = []
        seen = 0
        for fix in fixes:
            if fix is None:
                continue
            seen += 1
            if fix.text and fix.text not in texts:
                texts.append(fix.text)
            commands += [c for c in fix.commands if c not in commands]
        return cls(" ".join(texts), commands) if seen else None


class Severity(str, enum.Enum):
    """How much a finding weighs: ``fail`` fails the check, ``warn`` warns, ``info`` is said (a pass line)."""

    FAIL = "fail"
    WARN = "warn"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One thing an area function found. ``code`` is stable and dotted (``gpu.idle.processes``): fixers decide
    on it, never on the wording; ``message`` is one line; ``fix`` what to do about it, if anything."""

    severity: Severity
    code: str
    message: str
    fix: Remediation | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"severity": self.severity.value, "code": self.code, "message": self.message,
                "fix": self.fix.to_dict() if self.fix else None}


class Findings(list[Finding]):
    """What an area function returns: its findings in the order found, and what the check's ``Result`` carries
    with them: ``details`` (what was read, JSON), ``cause`` (the check whose failure explains this one) and
    ``exhibit`` (a block shown with a failure, such as the NVLink matrix)."""

    def __init__(self, items: Iterable[Finding] = (), **details: Any) -> None:
        super().__init__(items)
        self.details: dict[str, Any] = details
        self.cause: str | None = None
        self.exhibit: str | None = None
        self.lead: str | None = None  # set by ``fold``
        self.fold_fix: Remediation | None = None

    def fold(self, lead: str = "", fix: Remediation | str | None = None) -> Findings:
        """Say many findings in one line: ``lead``, the first one's message and how many more (``(+N more)``),
        with ``fix`` as the one remediation for them all (else their fixes, merged). Each finding stays in the
        result with its own code, for the fixers; ``Result.of`` is the one place the line is made."""
        self.lead, self.fold_fix = lead, Remediation.of(fix)
        return self

    def add(self, severity: Severity, code: str, message: str, fix: Remediation | str | None = None) -> Findings:
        self.append(Finding(severity, code, message, Remediation.of(fix)))
        return self

    def fail(self, code: str, message: str, fix: Remediation | str | None = None) -> Findings:
        return self.add(Severity.FAIL, code, message, fix)

    def warn(self, code: str, message: str, fix: Remediation | str | None = None) -> Findings:
        return self.add(Severity.WARN, code, message, fix)

    def info(self, code: str, message: str) -> Findings:
        return self.add(Severity.INFO, code, message)

    def of(self, severity: Severity) -> list[Finding]:
        return [f for f in self if f.severity is severity]

    @property
    def failing(self) -> bool:
        return any(f.severity is Severity.FAIL for f in self)


class NotJudged(Exception):
    """Raised by an area function that cannot judge; the check's result says why, and it is never a pass.

    ``missing``: for want of facts (not recorded, unreadable, nothing to compare with): ``skip``, not judged
    (``launch`` refuses it, ``--strict`` fails on it). ``blocked``: another check judges the cause: ``skip``
    with ``cause`` (the report says "same cause as ..."). ``inapplicable``: nothing here to judge: ``skip``.
    ``failing``: the facts say the reading failed: ``error`` (fails closed)."""

    def __init__(self, status: Status, summary: str, fix: Remediation | str | None = None, *,
                 by: str | None = None, unjudged: bool = False, exhibit: str | None = None, **details: Any) -> None:
        super().__init__(summary)
        self.status, self.summary, self.fix = status, summary, Remediation.of(fix)
        self.by, self.unjudged, self.exhibit, self.details = by, unjudged, exhibit, details

    @classmethod
    def missing(cls, summary: str, fix: Remediation | str | None = None, **details: Any) -> NotJudged:
        return cls(Status.SKIP, summary, fix, unjudged=True, **details)

    @classmethod
    def blocked(cls, summary: str, by: str, **details: Any) -> NotJudged:
        return cls(Status.SKIP, summary, by=by, **details)

    @classmethod
    def inapplicable(cls, summary: str, exhibit: str | None = None, **details: Any) -> NotJudged:
        return cls(Status.SKIP, summary, exhibit=exhibit, **details)

    @classmethod
    def failing(cls, summary: str, fix: Remediation | str | None = None, **details: Any) -> NotJudged:
        return cls(Status.ERROR, summary, fix, **details)

    def result(self) -> Result:
        res = Result(self.status, self.summary, self.details, self.fix)
        res.cause, res.unjudged, res.exhibit = self.by, self.unjudged, self.exhibit
        return res


@dataclass
class Result:
    """The outcome of one check.

    Checks build it from what their area functions found (``Result.of``); the runner fills in ``id``,
    ``title``, ``fixer``, ``duration_s`` and, for an ignored failure, ``ignored`` with the original status.
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
    findings: list[Finding] = field(default_factory=list)
    # What a failure means for the node, as the check declares it (doctor.core.registry.FAILURES): "node" (drain,
    # taint, page) or "deployment" (block the launch, warn, never drain). A result no check stamped counts as "node".
    failure: str = "node"

    @classmethod
    def of(cls, found: Findings) -> Result:
        """The check's result from its findings, by one table:

        ============================  =======  =========================================  ======================
        findings                      status   summary                                    remediation
        ============================  =======  =========================================  ======================
        a ``fail``                    fail     the fail messages, in order, ``"; "``      their fixes, merged
        a ``warn``, no ``fail``       warn     the info and warn messages, in order       the warn fixes, merged
        only ``info``                 pass     the info messages, in order                none
        none                          error    "judged nothing" (never a pass)            none
        ============================  =======  =========================================  ======================

        Folded (``Findings.fold``): the summary is the lead, the first of those messages and ``(+N more)``; the
        remediation the fold's, when it gives one.
        """
        fails, warns = found.of(Severity.FAIL), found.of(Severity.WARN)
        if fails:
            status, said, fixes = Status.FAIL, fails, fails
        elif warns:
            status, said, fixes = Status.WARN, [f for f in found if f.severity is not Severity.FAIL], warns
        elif found:
            status, said, fixes = Status.PASS, list(found), []
        else:
            return cls(Status.ERROR, "the check judged nothing (no finding): a bug in the check", found.details)
        summary = "; ".join(f.message for f in said)
        fix = Remediation.merged(f.fix for f in fixes)
        if found.lead is not None:
            summary = found.lead + said[0].message + (f" (+{len(said) - 1} more)" if len(said) > 1 else "")
            fix = found.fold_fix or fix
        res = cls(status, summary, found.details, fix, findings=list(found))
        res.cause, res.exhibit = found.cause, found.exhibit
        return res

    @classmethod
    def judging(cls, judge: Callable[[], Findings]) -> Result:
        """The result of an area function called outside a run of checks (the launcher's flag gate): its
        findings, or what it says when it cannot judge, as the runner would make them."""
        try:
            return cls.of(judge())
        except NotJudged as exc:
            return exc.result()

    # -- a result in one step: for the doctor's own results (the runner, plugins that failed to load) and for site
    #    plugins' small checks; the built-in checks build theirs from findings (tests/test_architecture.py) --------
    @classmethod
    def passed(cls, summary: str, **details: Any) -> Result:
        return cls(Status.PASS, summary, details)

    @classmethod
    def warned(cls, summary: str, remediation: Remediation | str | None = None, **details: Any) -> Result:
        return cls(Status.WARN, summary, details, Remediation.of(remediation))

    @classmethod
    def failed(cls, summary: str, remediation: Remediation | str | None = None, **details: Any) -> Result:
        return cls(Status.FAIL, summary, details, Remediation.of(remediation))

    @classmethod
    def not_judged(cls, summary: str, remediation: Remediation | str | None = None, **details: Any) -> Result:
        """``skip`` for want of facts (not recorded, not readable, nothing to compare with): the check
        could have judged but did not. ``launch`` refuses it and ``--strict`` fails on it."""
        return NotJudged.missing(summary, remediation, **details).result()

    @classmethod
    def skipped(cls, summary: str, **details: Any) -> Result:
        return cls(Status.SKIP, summary, details)

    @classmethod
    def errored(cls, summary: str, **details: Any) -> Result:
        return cls(Status.ERROR, summary, details)

    @classmethod
    def blocked(cls, summary: str, by: str, **details: Any) -> Result:
        """``skip`` because another check (``by``) failed and judges the cause: listed under it."""
        return NotJudged.blocked(summary, by, **details).result()

    def has(self, *codes: str) -> bool:
        """Whether any finding has one of ``codes`` (a code ending in ``.`` matches every code under it)."""
        return any(f.code == c or (c.endswith(".") and f.code.startswith(c)) for f in self.findings for c in codes)

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
            "failure": self.failure,
            "affects": self.failure,  # CONTRACT.md's name for it; the same value
        }
        if self.findings:
            out["findings"] = [f.to_dict() for f in self.findings]
        if self.ignored is not None:
            out["ignored"] = self.ignored.value
        if self.traceback:
            out["traceback"] = self.traceback
        if self.cause:
            out["cause"] = self.cause
        if self.unjudged:
            out["unjudged"] = True
        return out


@dataclass
class Notice:
    """Something said once at the top of a report, which results may name as their cause (``Result.cause``):
    an area's hook finds it after the run (``doctor.core.registry.notice``)."""

    id: str
    summary: str
    remediation: Remediation
    dependents: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "summary": self.summary, "remediation": self.remediation.to_dict(),
                "dependents": list(self.dependents)}
