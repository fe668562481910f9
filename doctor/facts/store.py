"""The facts of one run: collected live on first use (a lock per fact, under the collector's deadline)
or replayed from a snapshot; ``CollectOptions`` is what collectors may look at. A fact that cannot be had
raises ``doctor.core.context.FactUnavailable`` (``MalformedFact`` for a value of the wrong shape)."""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any

from doctor.core import deadline
from doctor.core.context import FactUnavailable, MalformedFact
from doctor.core.registry import Collector
from doctor.core.settings import Settings
from doctor.facts.isolation import collect_isolated

# What collectors may look at is the run's settings marked ``collect=True`` (``Settings.collected()``: one type for
# the run and its collectors, so the two cannot drift), ``env`` among them: the environment the doctor runs in
# (``doctor.host.facts.service_env`` adds what the service will get).
CollectOptions = Settings


class FactStore:
    """Facts of one run: collected live on first use, or replayed from a snapshot."""

    def __init__(self, options: CollectOptions, snapshot: dict[str, Any] | None = None,
                 collectors: dict[str, Collector] | None = None) -> None:
        self.options = options
        self.snapshot = snapshot
        self._collectors = collectors
        self._values: dict[str, Any] = {}
        self._errors: dict[str, FactUnavailable] = {}
        self._durations: dict[str, float] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._shaped: dict[str, MalformedFact | None] = {}  # shape verdict per fact, once
        self._active: dict[int, list[str]] = {}  # thread ident -> the facts it is collecting (innermost last)
        if snapshot is not None:
            for name, value in (snapshot.get("facts") or {}).items():
                if isinstance(value, dict) and "__error__" in value:
                    self._errors[name] = FactUnavailable(name, f"recorded as failed: {value['__error__']}")
                else:
                    self._values[name] = value

    @property
    def collectors(self) -> dict[str, Collector]:
        """The collectors this store runs: given, or the built-in registry's."""
        if self._collectors is None:
            from doctor.core.registry import load

            self._collectors = load(plugins=False).collectors
        return self._collectors

    @property
    def replaying(self) -> bool:
        return self.snapshot is not None

    def get(self, name: str) -> Any:
        """The fact's value; raises ``FactUnavailable`` if it cannot be had, ``MalformedFact`` if its value
        does not have the shape its collector declares."""
        value = self._get(name)
        if name not in self._shaped:
            coll = self.collectors.get(name)
            if coll is not None and coll.shape is not None:
                from doctor.facts.shape import problem

                bad = problem(value, coll.shape)
                self._shaped[name] = MalformedFact(name, bad) if bad else None
            else:
                self._shaped[name] = None
        if self._shaped[name] is not None:
            raise self._shaped[name]
        return value

    def _get(self, name: str) -> Any:
        if name in self._values:
            return self._values[name]
        if name in self._errors:
            raise self._errors[name]
        if self.snapshot is not None:
            raise FactUnavailable(name, "not recorded in the snapshot", status="skip")
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        wait = deadline.remaining()
        active = self._active.setdefault(threading.get_ident(), [])
        active.append(name)  # waited for or collected: what a check past its deadline is stuck on
        try:
            if not lock.acquire(timeout=-1 if wait is None else wait):  # another check is still collecting it
                raise FactUnavailable(name, f"still being collected by another check when {deadline.ended()}")
        except BaseException:
            active.pop()
            raise
        try:
            if name in self._values:
                return self._values[name]
            if name in self._errors:
                raise self._errors[name]
            coll = self.collectors.get(name)
            if coll is None:
                raise FactUnavailable(name, "no collector registered for it")
            start = time.monotonic()
            try:
                value = collect_isolated(coll, self.options) if coll.isolate else coll.func(self.options)
            except FactUnavailable as exc:
                self._errors[name] = exc
                raise
            except Exception as exc:
                err = FactUnavailable(name, f"collector crashed: {type(exc).__name__}: {exc}")
                err.__cause__ = exc
                self._errors[name] = err
                raise err from exc
            finally:
                self._durations[name] = time.monotonic() - start
            self._values[name] = value
            return value
        finally:
            active.pop()
            lock.release()

    def collecting(self, thread_ident: int | None) -> list[str]:
        """The facts the thread ``thread_ident`` is collecting now (what a check past its deadline waits on)."""
        return list(self._active.get(thread_ident or 0, []))

    def collected(self) -> set[str]:
        """Names of the facts that have a value in this store (collected, replayed or seeded)."""
        return set(self._values)

    def seed(self, name: str, value: Any) -> None:
        """Provide a fact's value up front (a recorded reading mixed with live collection, e.g. in tests)."""
        self._errors.pop(name, None)
        self._shaped.pop(name, None)
        self._values[name] = value

    def collect_all(self, names: list[str] | None = None) -> dict[str, Any]:
        """Collect every fact (for ``snapshot``); failures are recorded, never raised."""
        out: dict[str, Any] = {}
        names = names if names is not None else sorted(self.collectors)
        threads = [threading.Thread(target=self._quiet_get, args=(n,), daemon=True) for n in names]
        for t in threads:
            t.start()
        longest = max((self.collectors[n].timeout for n in names if n in self.collectors), default=5)
        end = time.monotonic() + deadline.clip(longest + 5)
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        for n in names:
            if n in self._values:
                out[n] = self._values[n]
            elif n in self._errors:
                out[n] = {"__error__": self._errors[n].reason}
            else:
                out[n] = {"__error__": "collector did not finish before the deadline"}
        return out

    def _quiet_get(self, name: str) -> None:
        try:
            self.get(name)
        except FactUnavailable:
            pass
        except Exception:  # pragma: no cover - defensive
            self._errors[name] = FactUnavailable(name, traceback.format_exc(limit=1))

    def durations(self) -> dict[str, float]:
        return dict(self._durations)
