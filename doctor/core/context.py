"""What a check sees: the resolved settings and the facts it declared, and why a fact can fail to be had.

The runner gives every check its own view of the run (``Context.view``): ``ctx.fact(name)`` answers only for the
facts the check declares (``@check(needs=...)``; a fixer reads its check's facts and its own ``needs``), so the
declarations are the contract between collectors and checks and the registry can validate them when it loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from doctor.core.result import Result
from doctor.core.settings import ConfigError, Settings

# The server's argv as ``launch`` would build it from the settings (placeholders where a path is not configured),
# and why the settings cannot build it (None when they can): ``doctor.service.launcher.planned_args``.
PlannedArgs = tuple[tuple[str, ...], ConfigError | None]


class FactUnavailable(Exception):
    """A fact could not be had. ``status`` is what a check that needs it becomes.

    ``skip`` when the fact is simply not there to judge (not in a snapshot); ``error`` when its
    collector crashed or ran past its deadline (the gate fails closed).
    """

    def __init__(self, name: str, reason: str, status: str = "error") -> None:
        super().__init__(f"fact {name!r}: {reason}")
        self.name = name
        self.reason = reason
        self.status = status


class MalformedFact(FactUnavailable):
    """A fact whose value does not have its collector's declared shape: the check that reads it fails,
    naming the fact and where the value is wrong (``doctor.facts.shape``)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(name, reason, status="fail")


class UndeclaredFact(Exception):
    """A check (or fixer) read a fact it does not declare in ``needs=``: a bug in that check, reported as its
    ``error`` (the declaration is what collectors, snapshots and the registry rely on)."""


class FactSource(Protocol):
    """Where a run's facts come from (``doctor.facts.store.FactStore``: collected live or replayed)."""

    options: Any

    def get(self, name: str) -> Any: ...

    def collected(self) -> set[str]: ...


@dataclass
class Context:
    settings: Settings
    facts: FactSource
    # how the run plans the server's argv from its settings (doctor.app.planned_server: the launcher's
    # planned_args), given by whoever builds the run, so that no check imports the launcher; ``server_args`` asks
    # it once per run (it is the ``server_args`` provider of ``knowledge``), and every check judging the server's
    # command (flags, exposure, tokenizer, drafter, fit, multicast, the DDTREE gate) judges that one argv
    planner: Callable[[Settings], PlannedArgs]
    results: dict[str, Result] = field(default_factory=dict)  # finished checks, by id (shared by every view)
    selected: frozenset[str] = frozenset()  # the ids of this run's checks (set by the runner)
    needs: frozenset[str] | None = None  # the facts this view may read; None: the run's own context
    # what judgements need beyond facts and settings, read from the product's own data or packages (the DDTree
    # set's manifest and its release's flag table): providers given by whoever builds the run (doctor.app), each
    # called once per run on first use (``know``), so that no judgement reads a file
    knowledge: dict[str, Callable[[Settings], Any]] = field(default_factory=dict)
    known: dict[str, tuple[bool, Any]] = field(default_factory=dict)  # name -> (ok, value or the exception)

    def __post_init__(self) -> None:
        self.knowledge.setdefault("server_args", self.planner)  # (a view shares the run's dicts: no change there)

    def view(self, needs: tuple[str, ...] | frozenset[str]) -> Context:
        """The context of one check (or fixer): the same run, reading only the facts in ``needs``."""
        return replace(self, needs=frozenset(needs))

    def fact(self, name: str) -> Any:
        """A declared fact's value; raises ``FactUnavailable`` (the runner turns it into a result), and
        ``UndeclaredFact`` for a fact this view does not declare."""
        if self.needs is not None and name not in self.needs:
            raise UndeclaredFact(f"reads the fact {name!r} without declaring it (needs={tuple(sorted(self.needs))})")
        return self.facts.get(name)

    def optional(self, name: str) -> Any:
        """A declared fact, or None when it cannot be had (an older snapshot without it, a collector that failed);
        a malformed value still fails the check, as everywhere."""
        try:
            return self.fact(name)
        except MalformedFact:
            raise
        except FactUnavailable:
            return None

    @property
    def server_args(self) -> tuple[list[str], ConfigError | None]:
        """The server's planned argv (a list of its own for each reader: a judgement that edits it edits no other
        check's) and why the settings cannot build it, or None."""
        args, problem = self.know("server_args")  # (two checks asking at once both compute it: the same value)
        return list(args), problem

    def know(self, name: str) -> Any:
        """The provider ``name``'s answer for this run's settings, computed once (what it raised, raised again)."""
        if name not in self.known:
            if name not in self.knowledge:
                raise LookupError(f"no provider of {name!r} in this run's context (doctor.app.KNOWLEDGE)")
            try:
                self.known[name] = (True, self.knowledge[name](self.settings))
            except Exception as exc:  # a NotJudged of the provider: every reader gets the same
                self.known[name] = (False, exc)
        ok, value = self.known[name]
        if not ok:
            raise value
        return value

    @property
    def deep(self) -> bool:
        return self.settings.deep
