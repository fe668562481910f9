"""The doctor as a library: flags -> settings -> checks -> report. The CLI is a thin shell over this."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import IO, Any

from doctor import __version__
from doctor.core import deadline, runner
from doctor.core.causes import mark_unexplained
from doctor.core.context import Context, PlannedArgs
from doctor.core.decision import Decision, decide, not_judged
from doctor.core.fixing import not_plannable, plan_for, wants_fix
from doctor.core.registry import Check, Registry, load
from doctor.core.result import Notice, Remediation, Result, Status
from doctor.core.runner import RunOutcome, select
from doctor.core.settings import ConfigError, Settings, profile_names, resolve
from doctor.facts.snapshot import load_snapshot
from doctor.facts.store import CollectOptions, FactStore


def settings_from_flags(flags: dict[str, Any]) -> Settings:
    """Resolve flags (None = not given) against config and profile; raises ``ConfigError``.

    With ``--from-snapshot`` the recorded paths and interpreter stand in for flags not given, so
    a replay judges the host as it was recorded.
    """
    snap = None
    given_python = bool(flags.get("python"))
    if flags.get("from_snapshot"):
        from doctor.facts.snapshot import SnapshotError

        try:
            snap = load_snapshot(flags["from_snapshot"])
        except SnapshotError as exc:
            raise ConfigError(str(exc)) from None
        recorded = snap.get("options") or {}
        flags = dict(flags)
        for key in ("model_path", "draft_model_path", "python", "tp"):
            if not flags.get(key) and recorded.get(key):
                flags[key] = recorded[key]
        rec_profile = (recorded.get("profile") or {}).get("name") if isinstance(recorded.get("profile"), dict) else None
        if not flags.get("profile") and rec_profile in profile_names():
            flags["profile"] = rec_profile
    settings = resolve(flags)
    settings.snapshot = snap
    if snap is not None and not given_python:  # as recorded (a recording that does not say: as given)
        settings.python_given = bool((snap.get("options") or {}).get("python_given", True))
    return settings


def collect_options(settings: Settings) -> Any:
    return CollectOptions.from_settings(settings)


def registry_for(settings: Settings) -> Registry:
    """The validated registry of this run: built-in modules plus the plugins not disabled."""
    return load(disabled=settings.disable_plugins)


def make_context(settings: Settings, registry: Registry | None = None) -> Context:
    reg = registry or registry_for(settings)
    return Context(settings, FactStore(collect_options(settings), snapshot=settings.snapshot,
                                       collectors=reg.collectors), planned_server, knowledge=dict(KNOWLEDGE))


def ddtree_gate_knowledge(settings: Settings) -> Any:
    """The profile's DDTree patch set and its SGLang release's option strings (``Context.know``)."""
    from doctor.sglang.ddtree import gate_knowledge

    return gate_knowledge(settings)


KNOWLEDGE = {"ddtree_gate": ddtree_gate_knowledge}


def planned_server(settings: Settings) -> PlannedArgs:
    """The server's argv as ``launch`` builds it (placeholders for paths not configured) and why the settings
    cannot build it: computed once per run for the checks that judge it (``Context.server_args``)."""
    from doctor.service.launcher import planned_args

    args, problem = planned_args(settings)
    return tuple(args), problem


@dataclass
class Report:
    settings: Settings
    outcome: RunOutcome
    notes: list[str] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)  # said once at the top (an area's notice hook)
    context: Context | None = field(default=None, repr=False)
    registry: Registry | None = field(default=None, repr=False)
    fixable_ids: list[str] | None = field(default=None, repr=False)  # known already (``fix`` planned them)
    started_at: float | None = None  # wall clock (time.time()) when the run began and ended: the OpenMetrics
    finished_at: float | None = None  # report's timestamps (a verdict that stops advancing is stale)

    def fixable(self) -> list[str]:
        """The failing (or warning) checks whose fixer would change something now: the footer offers
        only these (a fixer with nothing to do is not a fix). Planning reads; it changes nothing."""
        if self.fixable_ids is None:
            out = []
            for res in self.results:
                if not wants_fix(res):
                    continue
                if not_plannable(res):  # past the run's deadline, or the check never finished: no plan waited on
                    continue
                if self.context is None or self.registry is None or plan_for(self.registry, self.context,
                                                                               res).actions:
                    out.append(res.id)
            self.fixable_ids = out
        return self.fixable_ids

    @property
    def results(self) -> list[Result]:
        return self.outcome.results

    def decision(self) -> Decision:
        """Status, exit code and launch gate of this run: ``doctor.core.decision.decide``'s table."""
        return decide(self.results, interrupted=self.outcome.interrupted, strict=self.settings.strict)

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in (Status.PASS, Status.WARN, Status.FAIL, Status.SKIP, Status.ERROR)}
        for r in self.results:
            counts[r.status.value] += 1
        return counts

    @property
    def unjudged(self) -> list[Result]:
        """Checks skipped for want of facts (not because a dependency failed): never a pass for the gate. The
        decision's own list (``doctor.core.decision.not_judged``), so the report names what the gate refuses for."""
        return not_judged(self.results)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (CONTRACT.md); ``doctor/report/report.schema.json`` describes it. It tells the story
        the text tells (``doctor.report.story``): the root causes in order, each dependent's root, the next step."""
        from doctor.report.story import story

        st = story(self)
        results = []
        for res in self.results:
            out = res.to_dict()
            if res.id in st.root_of:
                out["root"] = st.root_of[res.id]
            results.append(out)
        return {
            "schema_version": 1,
            "summary": {
                "status": self.decision().status.value,
                "counts": self.counts(),
                "duration_s": round(self.outcome.duration_s, 4),
                "interrupted": self.outcome.interrupted,
                "unjudged": [r.id for r in self.unjudged],
                "roots": list(st.order),
                "next_step": st.next_step,
            },
            "results": results,
            "doctor": {
                "version": __version__,
                "profile": self.settings.profile_name,
                "tp": self.settings.tp,
                "python": self.settings.python,
                "hostname": socket.gethostname(),
                "from_snapshot": self.settings.from_snapshot,
                "deep": self.settings.deep,
                "strict": self.settings.strict,
                "notes": self.notes,
                "notices": [n.to_dict() for n in self.notices],
            },
        }


def selected_checks(settings: Settings, registry: Registry | None = None) -> list[Check]:
    """The checks of this run. A selection that names nothing registered, or that runs no check at all,
    is an invalid invocation (``ConfigError``): nothing checked is never a pass."""
    reg = registry or registry_for(settings)
    validate_selection(settings, reg)
    chosen = select(reg.sorted_checks(), settings.only, settings.skip + serving_skips_of(settings, reg), settings.deep)
    if not chosen:
        deep = [c.id for c in reg.sorted_checks() if c.deep and runner.matches(c.id, settings.only or ["*"])
                and not runner.matches(c.id, settings.skip)]
        hint = f"; {', '.join(deep)} run only with --deep" if deep and not settings.deep else ""
        raise ConfigError("the selection runs no check (--only " + " ".join(settings.only or ["*"])
                          + (" --skip " + " ".join(settings.skip) if settings.skip else "") + f"){hint}")
    return chosen


def serving_skips_of(settings: Settings, registry: Registry) -> list[str]:
    """With ``--while-serving`` (or ``--node-pod``): the registered checks that do not apply where this run is
    (their ``applies=``; doctor/service/fleet.py)."""
    from doctor.service.fleet import place_of, serving_skips

    place = place_of(settings)
    return [] if place == "start" else serving_skips(registry.checks.values(), place)


def validate_selection(settings: Settings, registry: Registry) -> None:
    """Every ``--only``/``--skip``/``--ignore`` pattern (flags and ``[doctor]`` lists) matches a registered
    check; else ``ConfigError`` with the closest ids (a typo must not turn into a run that checks nothing)."""
    ids = list(registry.checks)
    for what, patterns in (("--only", settings.only), ("--skip", settings.skip), ("--ignore", settings.ignore)):
        for pat in patterns:
            if any(runner.matches(i, [pat]) for i in ids):
                continue
            raise ConfigError(f"{what} {pat!r} matches no registered check{_suggest(pat, registry)}")


def _suggest(pattern: str, registry: Registry) -> str:
    import difflib

    ids = sorted(registry.checks)
    areas = sorted({i.split(".")[0] for i in ids})
    close = difflib.get_close_matches(pattern.rstrip("*").rstrip("."), ids + areas, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `k26-doctor list`"
    if registry.plugin_failures:
        hint += f" (plugin(s) that failed to load: {', '.join(sorted(registry.plugin_failures))})"
    return hint


def plugin_id(name: str) -> str:
    """The result id under which a plugin that failed to load is reported: ``doctor.plugin.<name>``."""
    return "doctor.plugin." + ("".join(c if c.isalnum() else "_" for c in name.lower()) or "unnamed")


def run(settings: Settings, on_result: Callable[[Result], None] | None = None,
        checks: list[Check] | None = None, registry: Registry | None = None,
        progress: Callable[[str], None] | None = None) -> tuple[Report, Context]:
    started_at = time.time()
    # A live --deep run hashes shards: the hashing workers' fork server starts now, before the checks are loaded
    # and selected, so that its pool is up when the first shard is hashed (doctor/model/hashing.py says why).
    # Not stat'ed here: a model path on a stuck mount must not hang the run before its deadline is armed (a
    # server for a path that turns out not to exist costs one idle process until the run ends).
    if settings.deep and not settings.from_snapshot and (settings.model_path or settings.draft_model_path):
        from doctor.model.hashing import workers_for_run

        with workers_for_run():
            return _run(settings, started_at, on_result, checks, registry, progress)
    return _run(settings, started_at, on_result, checks, registry, progress)


def _run(settings: Settings, started_at: float, on_result: Callable[[Result], None] | None,
         checks: list[Check] | None, registry: Registry | None,
         progress: Callable[[str], None] | None) -> tuple[Report, Context]:
    reg = registry or registry_for(settings)
    chosen = selected_checks(settings, reg) if checks is None else checks
    if any(c.deep for c in chosen) and not settings.deep:  # a deep check named by --only runs as with --deep
        settings = replace(settings, deep=True)
    ctx = make_context(settings, reg)
    deadline.start(settings.timeout, f"the run's deadline (--timeout {settings.timeout:g}s)" if settings.timeout
                   else "")
    for before in reg.hooks_of("before_checks"):  # e.g. the GPU area's bounded wait for the NVSwitch fabric
        before.func(ctx, chosen, progress or _say_stderr)
    outcome = runner.run_all(chosen, ctx, on_result=on_result)
    for module, why in sorted(reg.load_errors.items()):  # fail closed: checks of that module are missing
        res = Result.errored(f"built-in module {module} failed to import: {why}")
        res.id, res.title = f"doctor.load.{module.replace('.', '_')}", f"Load {module}"
        res.failure = "deployment"  # the doctor's own installation: block the launch, never drain the node
        outcome.results.append(res)
    for name, (why, tb) in sorted(reg.plugin_failures.items()):  # site policy that did not load: fail closed
        res = Result.errored(f"site plugin {name!r} failed to load ({why}); its checks did not run",
                             plugin=name)
        res.remediation = Remediation(
            "Its checks are site policy: the run fails closed. The import error is shown with -v. Fix the "
            f"plugin's installation, or turn it off knowingly: [doctor] disable_plugins = [\"{name}\"] in the "
            f"config, or K26_DOCTOR_DISABLE_PLUGINS={name} in the environment.")
        res.id, res.title, res.traceback = plugin_id(name), f"Load site plugin {name}", tb
        res.failure = "deployment"
        outcome.results.append(res)
    notices = [n for h in reg.hooks_of("notice") if (n := h.func(ctx, outcome.results)) is not None]
    from doctor.service.startplan import start_plan_notice  # the service's start, not an area's: said by the app

    if (plan_notice := start_plan_notice(ctx)) is not None:
        notices.append(plan_notice)
    mark_unexplained(outcome.results, notices)
    notes: list[str] = list(reg.warnings)  # e.g. a site plugin's check that does not declare failure=
    if deadline.expired() and not outcome.interrupted:  # (Ctrl-C: the report's last line says it)
        notes.append(f"{deadline.ended()}: what had not finished is an error, and no fix was planned")
    if settings.from_snapshot:
        notes.append(f"judged from snapshot {settings.from_snapshot}, not the live host")
    if settings.while_serving or settings.node_pod:
        from doctor.service.fleet import place_of, serving_note

        notes.append(serving_note(serving_skips_of(settings, reg), place_of(settings)))
    return Report(settings, outcome, notes, notices, ctx, reg, started_at=started_at, finished_at=time.time()), ctx


def _say_stderr(msg: str) -> None:
    sys.stderr.write(f"k26-doctor: {msg}\n")
    sys.stderr.flush()


def redacted(report: Report) -> Report:
    """The report with every result's summary, details, remediation, exhibit and traceback redacted
    (``doctor.facts.redaction``): what every renderer renders, so no format shows a secret a check read
    (``[server] args = ["--api-key", "X"]`` in details, a token in a traceback)."""
    from doctor.facts.redaction import redact, redact_text

    def clean(res: Result) -> Result:
        rem = res.remediation
        return replace(res, summary=redact_text(res.summary), details=redact(res.details),
                       remediation=None if rem is None else Remediation(redact_text(rem.text),
                                                                        [redact_text(c) for c in rem.commands]),
                       exhibit=redact_text(res.exhibit) if res.exhibit else res.exhibit,
                       traceback=redact_text(res.traceback) if res.traceback else res.traceback)

    return replace(report, outcome=replace(report.outcome, results=[clean(r) for r in report.results]),
                   notes=[redact_text(n) for n in report.notes])


def render(report: Report, fmt: str, verbose: int = 0, stream: IO[str] | None = None,
           color: bool | None = None, problems: bool = False, each: bool = False) -> None:
    """Write the report in ``text``, ``json``, ``junit`` or ``openmetrics`` to ``stream`` (stdout by default),
    redacted."""
    stream = stream or sys.stdout
    if fmt in ("text", "json", "junit"):  # their next step names a fix plan when the first cause has one
        report.fixable()  # planned on the results as they are, before they are redacted for showing
    report = redacted(report)
    if fmt == "json":
        from doctor.report.json_report import dumps
        from doctor.report.text import utf8_capable

        stream.write(dumps(report, ascii_only=not utf8_capable(stream)) + "\n")
    elif fmt == "junit":
        from doctor.report.junit import to_junit

        stream.write(to_junit(report))
    elif fmt == "openmetrics":
        from doctor.report.openmetrics import to_openmetrics

        stream.write(to_openmetrics(report))
    elif fmt == "text":
        from doctor.report.text import render_text

        stream.write(render_text(report, verbose=verbose, color=color, stream=stream, problems=problems, each=each))
    else:  # pragma: no cover - click validates choices
        raise ConfigError(f"unknown format {fmt!r}")
