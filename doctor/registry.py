"""The check interface and the registries of checks, fact collectors and fixers.

One small interface, kubeadm-style: a check is an id, a title, the facts it reads, and one
function ``run(ctx) -> Result``. Built-in checks register with ``@check`` in modules of the
``checks`` package; a site adds its own through the entry-point group ``k26_doctor.checks``
(an entry point names a module, whose import registers checks with the same decorator, or a
``Check`` object, or a callable returning an iterable of them).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from doctor.context import Context
    from doctor.result import Result

ENTRY_POINT_GROUP = "k26_doctor.checks"
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Check:
    """One check. ``run`` must only read facts through ``ctx`` and must not change anything."""

    id: str
    title: str
    run: Callable[[Context], Result]
    needs: tuple[str, ...] = ()  # fact names (see doctor.facts)
    tags: tuple[str, ...] = ()
    deep: bool = False  # only with --deep
    depends: tuple[str, ...] = ()  # check ids; if one fails, this one is skipped
    timeout: float | None = None  # seconds; None: --timeout or DEFAULT_TIMEOUT_S
    fixer: str | None = None  # fixer id (doctor.registry.FIXERS)
    explain: str = ""  # what it looks at, why it matters, how to fix by hand
    source: str = "builtin"  # "builtin" or the plugin distribution's entry point

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "tags": list(self.tags),
            "deep": self.deep,
            "needs": list(self.needs),
            "depends": list(self.depends),
            "timeout_s": self.timeout,
            "fixer": self.fixer,
            "source": self.source,
        }


@dataclass(frozen=True)
class Collector:
    """Gathers one named fact (JSON-serialisable) from the live host.

    ``isolate=True`` runs it in a child process of the doctor's interpreter that is killed at its
    deadline: use it for anything that calls into a driver or C library that can hang (NVML).
    A collector must not raise for expected conditions (no driver, missing file): it returns
    what it saw, e.g. ``{"available": False, "error": "..."}``, and checks judge.
    """

    name: str
    func: Callable[..., Any]
    timeout: float = 20.0
    isolate: bool = False
    description: str = ""


@dataclass(frozen=True)
class Fixer:
    """Plans (and through its actions applies) the repair of one failing check.

    ``plan(ctx, result)`` returns a list of ``fixes.actions.Action``: every change it would make,
    shown before anything is done. An empty list means nothing can be done automatically.
    """

    id: str
    title: str
    plan: Callable[..., list[Any]]
    needs_root: bool = False


CHECKS: dict[str, Check] = {}
COLLECTORS: dict[str, Collector] = {}
FIXERS: dict[str, Fixer] = {}
_PLUGIN_ERRORS: list[str] = []
LOAD_ERRORS: dict[str, str] = {}  # built-in module -> why it failed to import
_loaded = False
_current_source = "builtin"


class RegistryError(Exception):
    """A duplicate or malformed registration (a programming error, reported clearly)."""


def check(
    id: str,
    title: str,
    *,
    needs: Iterable[str] = (),
    tags: Iterable[str] = (),
    deep: bool = False,
    depends: Iterable[str] = (),
    timeout: float | None = None,
    fixer: str | None = None,
) -> Callable[[Callable[[Context], Result]], Callable[[Context], Result]]:
    """Register ``func`` as a check. Its docstring becomes ``k26-doctor explain ID``."""

    def deco(func: Callable[[Context], Result]) -> Callable[[Context], Result]:
        register(
            Check(
                id=id,
                title=title,
                run=func,
                needs=tuple(needs),
                tags=tuple(tags) or (id.split(".")[0],),
                deep=deep,
                depends=tuple(depends),
                timeout=timeout,
                fixer=fixer,
                explain=textwrap.dedent(inspect.getdoc(func) or "").strip(),
                source=_current_source,
            )
        )
        return func

    return deco


def register(chk: Check) -> None:
    if not chk.id or chk.id != chk.id.lower() or " " in chk.id:
        raise RegistryError(f"check id {chk.id!r} must be lowercase and dotted")
    existing = CHECKS.get(chk.id)
    if existing is not None and existing.run is not chk.run:
        raise RegistryError(f"check {chk.id!r} registered twice ({existing.source}, {chk.source})")
    CHECKS[chk.id] = chk


def collector(
    name: str, *, timeout: float = 20.0, isolate: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a fact collector. ``func(opts: doctor.facts.CollectOptions) -> JSON value``."""

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        if name in COLLECTORS and COLLECTORS[name].func is not func:
            raise RegistryError(f"fact {name!r} has two collectors")
        COLLECTORS[name] = Collector(name, func, timeout, isolate, inspect.getdoc(func) or "")
        return func

    return deco


def fixer(
    id: str, title: str, *, needs_root: bool = False
) -> Callable[[Callable[..., list[Any]]], Callable[..., list[Any]]]:
    """Register a fixer: ``plan(ctx, result) -> list[fixes.actions.Action]``."""

    def deco(func: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
        if id in FIXERS and FIXERS[id].plan is not func:
            raise RegistryError(f"fixer {id!r} registered twice")
        FIXERS[id] = Fixer(id, title, func, needs_root)
        return func

    return deco


def load(plugins: bool = True) -> dict[str, Check]:
    """Import every module of ``checks`` and ``fixes`` (which registers them), then plugins."""
    global _loaded
    if _loaded:
        return CHECKS
    for pkg_name in ("checks", "fixes"):
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_"):
                try:
                    importlib.import_module(f"{pkg_name}.{info.name}")
                except Exception as exc:  # a broken module must fail the gate, not crash the doctor
                    LOAD_ERRORS[f"{pkg_name}.{info.name}"] = f"{type(exc).__name__}: {exc}"
    if plugins:
        _load_plugins()
    _loaded = True
    return CHECKS


def plugin_errors() -> list[str]:
    """Plugins that failed to load; the CLI reports them instead of crashing."""
    return list(_PLUGIN_ERRORS)


def _load_plugins() -> None:
    global _current_source
    from importlib.metadata import entry_points

    try:
        eps = entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # pragma: no cover - Python < 3.10 API
        eps = entry_points().get(ENTRY_POINT_GROUP, [])  # type: ignore[attr-defined]
    for ep in eps:
        _current_source = f"plugin:{ep.name}"
        try:
            obj = ep.load()
            if isinstance(obj, Check):
                register(_with_source(obj, _current_source))
            elif callable(obj) and not inspect.ismodule(obj):
                for chk in obj() or ():
                    register(_with_source(chk, _current_source))
        except Exception as exc:  # a broken plugin must not take the doctor down
            _PLUGIN_ERRORS.append(f"{ep.name} ({ep.value}): {type(exc).__name__}: {exc}")
        finally:
            _current_source = "builtin"


def _with_source(chk: Check, source: str) -> Check:
    if chk.source != "builtin":
        return chk
    from dataclasses import replace

    return replace(chk, source=source)


def all_checks() -> list[Check]:
    return sorted(load().values(), key=lambda c: c.id)
