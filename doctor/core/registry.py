"""The check interface and the registry of checks, fact collectors and fixers.

One small interface, kubeadm-style: a check is an id, a title, the facts it reads, and one
function ``run(ctx) -> Result``. Authors mark functions with ``@check``, ``@collector`` and
``@fixer``; the decorators only attach a declaration to the function (pluggy's hookimpl markers).
A ``Registry`` object collects the declarations of the modules it loads:

* built-in: every module of ``checks`` and ``fixes``, and each area's ``doctor/<area>/facts.py``;
* plugins: the entry-point group ``k26_doctor.checks`` (an entry point names a module whose marked
  functions are taken, or a ``Check`` object, or a callable returning an iterable of them).

Loading validates, as pluggy validates hook implementations at registration: a check, collector,
fixer or hook whose function does not take the arguments it will be called with is refused when it is
added; every ``fixer=`` names a registered fixer, every ``depends=`` a registered check, every ``needs=``
(of a check or a fixer) a registered collector. A built-in inconsistency raises ``RegistryError`` naming
the module; a plugin that does not resolve is rejected as a whole and reported by name: the doctor keeps
running, and a run of checks fails closed on it (site policy that did not load is not a pass). Plugins
are disabled by name with ``[doctor] disable_plugins = [...]`` or ``K26_DOCTOR_DISABLE_PLUGINS=a,b``.

Hooks let an area take part in a run without the core knowing the area: ``@hook("before_checks")``
runs before the checks (the GPU area waits for the NVSwitch fabric there), ``@hook("notice")`` after
them (the stack area says once, at the top, that the doctor judged its own interpreter).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import pkgutil
import textwrap
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from doctor.core.context import Context
    from doctor.core.result import Result
    from doctor.core.settings import Settings

ENTRY_POINT_GROUP = "k26_doctor.checks"
# What a check's failure means (``@check(failure=...)``): what a fleet does with a node where it fails.
FAILURES = {
    "node": "the node's hardware or host is broken (a GPU, a link, the driver, a disk, the node's copy of the "
            "weights): Slurm drains it, Kubernetes taints it, the alert pages",
    "deployment": "the deployment's configuration is wrong (a profile, a flag, a pinned version, the image's "
                  "software): the launch is blocked and the alert warns; the node is never drained for it",
}
# A site plugin's check that does not say: fail closed, as a broken node (load warns; docs: DEVELOPING.md).
DEFAULT_FAILURE = "node"
# Where a check applies (``@check(applies=...)``); a periodic run leaves out a check that does not apply where it
# runs (doctor/service/fleet.py; the reasons are doctor/data/fleet.toml's).
PLACES = {
    "start": "before the server starts (ExecStartPre, the init container, the Slurm prolog, by hand)",
    "serving": "beside the running server on its host (the systemd timer, Slurm's health check on a node with "
               "jobs): --while-serving",
    "node-pod": "in a pod of its own beside the server's pod (the Kubernetes DaemonSet): --node-pod",
}
DISABLE_ENV = "K26_DOCTOR_DISABLE_PLUGINS"
DEFAULT_TIMEOUT_S = 30.0
MARK = "__k26_doctor__"  # the attribute a decorator leaves on the function: its declarations
BUILTIN = "builtin"


@dataclass(frozen=True)
class Applicability:
    """Whether a check applies to the profile, declared on the check (``@check(applies_if=...)``) rather than
    found inside its judgement: ``predicate(settings)`` is True where the check applies; ``reason(settings)`` is
    the result's summary where it does not (a ``skip``, "not applicable", as ``NotJudged.inapplicable`` says it).

    Settings only, no facts: the runner asks before the check runs, so a check that does not apply reads none of
    its facts, and a fact no other selected check reads is never collected (the multicast probe of a TP 1 profile,
    the fabric software of a host the profile gives no NVSwitch). Whether it applies given what the host shows
    (one GPU found, no fabric reported) stays in the judgement: that needs the facts."""

    predicate: Callable[[Settings], bool]
    reason: Callable[[Settings], str]

    def refusal(self, settings: Settings) -> str | None:
        """The reason the check does not apply to ``settings``, or None where it does."""
        return None if self.predicate(settings) else str(self.reason(settings))


@dataclass(frozen=True)
class Check:
    """One check. ``run`` must only read facts through ``ctx`` and must not change anything."""

    id: str
    title: str
    run: Callable[[Context], Result]
    needs: tuple[str, ...] = ()  # fact names (collectors)
    tags: tuple[str, ...] = ()
    deep: bool = False  # only with --deep
    depends: tuple[str, ...] = ()  # check ids; if one fails, this one is skipped
    timeout: float | None = None  # seconds; None: --timeout or DEFAULT_TIMEOUT_S
    fixer: str | None = None  # fixer id
    explain: str = ""  # what it looks at, why it matters, how to fix by hand
    source: str = BUILTIN  # "builtin" or "plugin:<entry point name>"
    module: str = ""  # the module that declared it (named by load errors)
    failure: str | None = None  # FAILURES; None: not declared (a built-in check is refused, a plugin's defaulted)
    applies: tuple[str, ...] = tuple(PLACES)  # PLACES where it judges what it means to judge
    applies_if: Applicability | None = None  # the profiles it applies to; None: every profile

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
            "failure": self.failure or DEFAULT_FAILURE,
            "applies": list(self.applies),
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
    source: str = BUILTIN
    module: str = ""
    shape: Any = None  # the value's declared shape (doctor.facts.shape); None: not checked


@dataclass(frozen=True)
class Fixer:
    """Plans (and through its actions applies) the repair of one failing check.

    ``plan(ctx, result)`` returns a ``doctor.core.actions.Plan`` (actions and notes): every change
    it would make, shown before anything is done. No actions means nothing can be done automatically.
    """

    id: str
    title: str
    plan: Callable[..., Any]
    needs_root: bool = False
    source: str = BUILTIN
    module: str = ""
    needs: tuple[str, ...] = ()  # facts it reads beyond those of the check it fixes


HOOK_KINDS = {
    # kind: (the arguments it is called with, what it is for)
    "before_checks": (("ctx", "checks", "say"), "runs before the checks of a live run, e.g. a bounded wait"),
    "notice": (("ctx", "results"), "after the checks: a Notice said once at the top, or None"),
}


@dataclass(frozen=True)
class Hook:
    """An area's part in a run (``HOOK_KINDS``). ``before_checks(ctx, checks, say)``: ``checks`` are the run's,
    ``say(line)`` prints progress; ``notice(ctx, results) -> Notice | None``."""

    kind: str
    func: Callable[..., Any]
    source: str = BUILTIN
    module: str = ""

    @property
    def id(self) -> str:
        return f"{self.module}.{getattr(self.func, '__name__', '?')}"


Item = Check | Collector | Fixer | Hook
# How each kind is called: the positional arguments its function must accept (validated when it is added).
CALLED_WITH = {Check: ("ctx",), Collector: ("opts",), Fixer: ("ctx", "result")}


class RegistryError(Exception):
    """A duplicate, malformed or unresolved registration; the message names the module or plugin."""


def signature_problem(func: Callable[..., Any], args: tuple[str, ...]) -> str | None:
    """Why ``func`` cannot be called with ``len(args)`` positional arguments, or None."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None  # a builtin or C function: nothing to read
    try:
        sig.bind(*args)
    except TypeError as exc:
        return f"{getattr(func, '__name__', func)}{sig} cannot be called as ({', '.join(args)}): {exc}"
    return None


def _mark(func: Callable[..., Any], item: Item) -> None:
    marks = func.__dict__.setdefault(MARK, [])
    marks.append(item)


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
    failure: str | None = None,
    applies: Iterable[str] = tuple(PLACES),
    applies_if: Applicability | None = None,
) -> Callable[[Callable[[Context], Result]], Callable[[Context], Result]]:
    """Declare ``func`` a check. Its docstring becomes ``k26-doctor explain ID``.

    ``failure`` (required of built-in checks): what its failure means for the node, ``"node"`` (hardware or host:
    drain, taint, page) or ``"deployment"`` (configuration: block the launch, warn, never drain); ``FAILURES``.
    ``applies``: the ``PLACES`` where it judges what it means to (default: everywhere); a periodic run elsewhere
    leaves it out. ``applies_if``: the profiles it applies to (``Applicability``, settings only); the runner
    reports it "not applicable" with the declared reason, without running it, on any other."""

    def deco(func: Callable[[Context], Result]) -> Callable[[Context], Result]:
        _mark(func, Check(id=id, title=title, run=func, needs=tuple(needs), tags=tuple(tags) or (id.split(".")[0],),
                          deep=deep, depends=tuple(depends), timeout=timeout, fixer=fixer,
                          explain=textwrap.dedent(inspect.getdoc(func) or "").strip(), module=func.__module__,
                          failure=failure, applies=tuple(applies), applies_if=applies_if))
        return func

    return deco


def collector(
    name: str, *, timeout: float = 20.0, isolate: bool = False, shape: Any = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a fact collector. ``func(opts: doctor.facts.store.CollectOptions) -> JSON value``.

    ``shape`` (``doctor.facts.shape``): what checks may rely on; a value without it is a ``MalformedFact``.
    """

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        _mark(func, Collector(name, func, timeout, isolate, inspect.getdoc(func) or "", module=func.__module__,
                              shape=shape))
        return func

    return deco


def fixer(
    id: str, title: str, *, needs_root: bool = False, needs: Iterable[str] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a fixer: ``plan(ctx, result) -> doctor.core.actions.Plan``. It reads the facts of the check it
    fixes and those it names in ``needs``; it decides on ``result.findings`` (their codes), never on wording."""

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        _mark(func, Fixer(id, title, func, needs_root, module=func.__module__, needs=tuple(needs)))
        return func

    return deco


def hook(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare an area's hook of ``kind`` (``HOOK_KINDS``)."""

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        _mark(func, Hook(kind, func, module=func.__module__))
        return func

    return deco


def declarations(module: ModuleType) -> list[Item]:
    """The checks, collectors and fixers a module's functions were marked with, in source order."""
    out: list[Item] = []
    for obj in vars(module).values():
        if callable(obj) and getattr(obj, "__module__", None) == module.__name__:
            out.extend(getattr(obj, MARK, ()))
    return out


AREA_MODULES = ("facts", "hooks")  # what the registry loads of each area package: its collectors, its hooks


def area_fact_modules() -> list[str]:
    """``doctor.<area>.facts`` and ``doctor.<area>.hooks`` of every area package (the built-in collectors and
    hooks)."""
    import doctor

    names = []
    for info in pkgutil.iter_modules(doctor.__path__):
        for part in AREA_MODULES:
            if info.ispkg and importlib.util.find_spec(f"doctor.{info.name}.{part}") is not None:
                names.append(f"doctor.{info.name}.{part}")
    return sorted(names)


def builtin_modules(collectors: bool = True) -> list[str]:
    """Every built-in module that declares something: checks, fixes (and the areas' facts)."""
    names = []
    for pkg_name in ("checks", "fixes"):
        pkg = importlib.import_module(pkg_name)
        names += [f"{pkg_name}.{i.name}" for i in pkgutil.iter_modules(pkg.__path__) if not i.name.startswith("_")]
    return names + (area_fact_modules() if collectors else [])


def disabled_from_env(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    raw = (os.environ if environ is None else environ).get(DISABLE_ENV, "")
    return tuple(n.strip() for n in raw.split(",") if n.strip())


@dataclass
class Registry:
    """The checks, collectors and fixers of one doctor run (build one per test; never global)."""

    checks: dict[str, Check] = field(default_factory=dict)
    collectors: dict[str, Collector] = field(default_factory=dict)
    fixers: dict[str, Fixer] = field(default_factory=dict)
    hooks: dict[str, Hook] = field(default_factory=dict)  # by Hook.id
    load_errors: dict[str, str] = field(default_factory=dict)  # built-in module -> why it failed to import
    plugin_errors: list[str] = field(default_factory=list)  # "name (value): why" of rejected plugins
    plugin_failures: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (why, traceback)
    disabled: tuple[str, ...] = ()  # plugin names not loaded
    warnings: list[str] = field(default_factory=list)  # what loaded but is not as it should be (said by `list`)

    # -- adding ------------------------------------------------------------------------------------

    def add(self, item: Item, source: str = BUILTIN) -> None:
        """Add one declaration; a duplicate, a malformed id or a function that cannot be called as its kind is
        called raises ``RegistryError``."""
        if item.source != source and item.source == BUILTIN:
            item = replace(item, source=source)
        where = item.module or item.source
        self._check_callable(item, where)
        if isinstance(item, Hook):
            self.hooks[item.id] = item
        elif isinstance(item, Check):
            if not item.id or item.id != item.id.lower() or " " in item.id:
                raise RegistryError(f"{where}: check id {item.id!r} must be lowercase and dotted")
            item = self._declared(item, where, source)
            old = self.checks.get(item.id)
            if old is not None and old.run is not item.run:
                raise RegistryError(f"check {item.id!r} registered twice ({old.module or old.source}, {where})")
            self.checks[item.id] = item
        elif isinstance(item, Collector):
            old_c = self.collectors.get(item.name)
            if old_c is not None and old_c.func is not item.func:
                raise RegistryError(f"fact {item.name!r} has two collectors ({old_c.module}, {where})")
            self.collectors[item.name] = item
        elif isinstance(item, Fixer):
            old_f = self.fixers.get(item.id)
            if old_f is not None and old_f.plan is not item.plan:
                raise RegistryError(f"fixer {item.id!r} registered twice ({old_f.module}, {where})")
            self.fixers[item.id] = item
        else:
            raise RegistryError(f"{where}: {item!r} is not a Check, Collector, Fixer or Hook")

    def _declared(self, item: Check, where: str, source: str) -> Check:
        """``failure=`` and ``applies=`` validated: an unknown value is refused; a built-in check of ``checks/``
        must say what its failure means, another check that does not is given ``DEFAULT_FAILURE`` and a
        warning."""
        if item.failure is not None and item.failure not in FAILURES:
            raise RegistryError(f"{where}: check {item.id!r}: failure={item.failure!r} is not one of "
                                f"{', '.join(FAILURES)}")
        bad = [p for p in item.applies if p not in PLACES]
        if bad or not item.applies:
            raise RegistryError(f"{where}: check {item.id!r}: applies={list(item.applies)!r}: each must be one of "
                                f"{', '.join(PLACES)}, and at least one")
        self._check_applicability(item, where)
        if item.failure is not None:
            return item
        if source == BUILTIN and item.module.split(".")[0] == "checks":
            raise RegistryError(f"{where}: check {item.id!r} does not declare failure= (one of "
                                f"{', '.join(FAILURES)}): what its failure means for the node")
        if source != BUILTIN:
            self.warnings.append(f"{source}: check {item.id!r} does not declare failure=; counted as "
                                 f"{DEFAULT_FAILURE!r} (a failure drains, taints and pages)")
        return replace(item, failure=DEFAULT_FAILURE)

    @staticmethod
    def _check_applicability(item: Check, where: str) -> None:
        """``applies_if=``, as pluggy checks a hook implementation: an ``Applicability`` whose predicate and reason
        can each be called with the settings, else refused when it is added."""
        decl = item.applies_if
        if decl is None:
            return
        if not isinstance(decl, Applicability):
            raise RegistryError(f"{where}: check {item.id!r}: applies_if={decl!r} is not an Applicability"
                                "(predicate, reason) of the settings")
        for part in ("predicate", "reason"):
            func = getattr(decl, part)
            if not callable(func):
                raise RegistryError(f"{where}: check {item.id!r}: applies_if {part} {func!r} is not callable")
            bad = signature_problem(func, ("settings",))
            if bad:
                raise RegistryError(f"{where}: check {item.id!r}: applies_if {part}: {bad}")

    @staticmethod
    def _check_callable(item: Any, where: str) -> None:
        if isinstance(item, Hook):
            if item.kind not in HOOK_KINDS:
                raise RegistryError(f"{where}: hook kind {item.kind!r} is not one of {', '.join(HOOK_KINDS)}")
            args = HOOK_KINDS[item.kind][0]
            func = item.func
        elif type(item) in CALLED_WITH:
            args = CALLED_WITH[type(item)]
            func = {Check: "run", Collector: "func", Fixer: "plan"}[type(item)]
            func = getattr(item, func)
        else:
            return
        if not callable(func):
            raise RegistryError(f"{where}: {type(item).__name__.lower()} {getattr(item, 'id', '')!r} is not callable")
        bad = signature_problem(func, args)
        if bad:
            name = getattr(item, "id", None) or getattr(item, "name", None)
            raise RegistryError(f"{where}: {type(item).__name__.lower()} {name!r}: {bad}")

    def hooks_of(self, kind: str) -> list[Hook]:
        return [h for h in self.hooks.values() if h.kind == kind]

    def add_module(self, module: ModuleType | str, source: str = BUILTIN) -> list[Item]:
        """Add every declaration of ``module`` (imported by name if needed); returns them."""
        mod = importlib.import_module(module) if isinstance(module, str) else module
        items = declarations(mod)
        for item in items:
            self.add(item, source)
        return items

    # -- validation --------------------------------------------------------------------------------

    def problems(self, items: Iterable[Item] | None = None) -> list[str]:
        """Unresolved references of ``items`` (default: everything), each naming its module."""
        out = []
        todo = list(self.checks.values()) + list(self.fixers.values()) if items is None else list(items)
        for item in todo:
            if isinstance(item, Fixer) and self.collectors:
                out += [f"{item.module or item.source}: fixer {item.id!r} needs fact {need!r}, which no collector "
                        "provides" for need in item.needs if need not in self.collectors]
            if not isinstance(item, Check):
                continue
            where = item.module or item.source
            if item.fixer is not None and item.fixer not in self.fixers:
                out.append(f"{where}: check {item.id!r} names fixer {item.fixer!r}, which is not registered")
            for dep in item.depends:
                if dep not in self.checks:
                    out.append(f"{where}: check {item.id!r} depends on {dep!r}, which is not a registered check")
            if self.collectors:  # a registry loaded without collectors (``list``) cannot resolve needs
                for need in item.needs:
                    if need not in self.collectors:
                        out.append(f"{where}: check {item.id!r} needs fact {need!r}, which no collector provides")
        return out

    def validate(self) -> None:
        """Raise ``RegistryError`` listing every unresolved reference."""
        bad = self.problems()
        if bad:
            raise RegistryError("; ".join(bad))

    # -- loading -----------------------------------------------------------------------------------

    def load_builtin(self, collectors: bool = True) -> None:
        """Built-in modules; one that fails to import is recorded (its checks are missing: fail closed)."""
        for name in builtin_modules(collectors):
            try:
                self.add_module(name)
            except RegistryError:
                raise
            except Exception as exc:  # a broken module must fail the gate, not crash the doctor
                self.load_errors[name] = f"{type(exc).__name__}: {exc}"

    def load_plugins(self, disabled: Iterable[str] = ()) -> None:
        """Entry points of ``k26_doctor.checks``, each validated on its own; a bad one is rejected whole."""
        from importlib.metadata import entry_points

        self.disabled = tuple(dict.fromkeys(list(self.disabled) + list(disabled)))
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in self.disabled:
                continue
            source = f"plugin:{ep.name}"
            trial = Registry(dict(self.checks), dict(self.collectors), dict(self.fixers), dict(self.hooks))
            try:
                obj = ep.load()
                if inspect.ismodule(obj):
                    items = trial.add_module(obj, source)
                elif isinstance(obj, (Check, Collector, Fixer, Hook)):
                    items = [obj]
                elif callable(obj):
                    items = list(obj() or ())
                else:
                    raise RegistryError(f"entry point is {type(obj).__name__}, not a module, Check or callable")
                if not inspect.ismodule(obj):
                    for item in items:
                        trial.add(item, source)
                added = [trial.checks.get(getattr(i, "id", "")) or i for i in items]
                bad = trial.problems(added)
                if bad:
                    raise RegistryError("; ".join(bad))
            except Exception as exc:  # a broken plugin must not take the doctor down (the run fails closed)
                why = f"{type(exc).__name__}: {exc}"
                self.plugin_errors.append(f"{ep.name} ({ep.value}): {why}")
                self.plugin_failures[ep.name] = (f"{ep.value}: {why}", traceback.format_exc())
                continue
            self.checks, self.collectors = trial.checks, trial.collectors
            self.warnings += trial.warnings
            self.fixers, self.hooks = trial.fixers, trial.hooks

    def sorted_checks(self) -> list[Check]:
        return sorted(self.checks.values(), key=lambda c: c.id)

    def fact_needs(self, chk: Check) -> tuple[str, ...]:
        """The facts a check's fixer may read: the check's and the fixer's own."""
        fx = self.fixers.get(chk.fixer or "")
        return tuple(dict.fromkeys(chk.needs + (fx.needs if fx else ())))


@functools.lru_cache(maxsize=8)
def _build_default(plugins: bool, disabled: tuple[str, ...], collectors: bool) -> Registry:
    reg = Registry()
    reg.load_builtin(collectors)
    reg.validate()
    if plugins:
        reg.load_plugins(disabled)
    return reg


def load(plugins: bool = True, disabled: Iterable[str] = (), collectors: bool = True) -> Registry:
    """The built-in registry (plus plugins not disabled), validated; built once per process and arguments."""
    names = tuple(sorted(set(disabled) | set(disabled_from_env()))) if plugins else ()
    return _build_default(plugins, names, collectors)
