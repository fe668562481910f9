"""The doctor as a library: flags -> settings -> checks -> report. The CLI is a thin shell over this."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from doctor import __version__
from doctor.core import runner as _runner
from doctor.core.context import Context
from doctor.core.exitcodes import EXIT_FAILED, EXIT_OK
from doctor.core.registry import Check, Registry, load
from doctor.core.result import Result, Status, worst
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
    return settings


def collect_options(settings: Settings) -> Any:
    return CollectOptions.from_settings(settings)


def registry_for(settings: Settings) -> Registry:
    """The validated registry of this run: built-in modules plus the plugins not disabled."""
    return load(disabled=settings.disable_plugins)


def make_context(settings: Settings, registry: Registry | None = None) -> Context:
    reg = registry or registry_for(settings)
    return Context(settings, FactStore(collect_options(settings), snapshot=settings.snapshot,
                                       collectors=reg.collectors))


@dataclass
class Report:
    settings: Settings
    outcome: RunOutcome
    notes: list[str] = field(default_factory=list)

    @property
    def results(self) -> list[Result]:
        return self.outcome.results

    @property
    def status(self) -> Status:
        return worst([r.status for r in self.results])

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in (Status.PASS, Status.WARN, Status.FAIL, Status.SKIP, Status.ERROR)}
        for r in self.results:
            counts[r.status.value] += 1
        return counts

    def exit_code(self, strict: bool | None = None) -> int:
        strict = self.settings.strict if strict is None else strict
        if any(r.status.failed for r in self.results) or self.outcome.interrupted:
            return EXIT_FAILED
        if strict and any(r.status is Status.WARN for r in self.results):
            return EXIT_FAILED
        return EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (CONTRACT.md); ``doctor/report/report.schema.json`` describes it."""
        status = self.status
        if self.settings.strict and status is Status.WARN:
            status = Status.FAIL
        return {
            "schema_version": 1,
            "summary": {
                "status": status.value,
                "counts": self.counts(),
                "duration_s": round(self.outcome.duration_s, 4),
                "interrupted": self.outcome.interrupted,
            },
            "results": [r.to_dict() for r in self.results],
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
            },
        }


def selected_checks(settings: Settings, registry: Registry | None = None) -> list[Check]:
    reg = registry or registry_for(settings)
    return select(reg.sorted_checks(), settings.only, settings.skip, settings.deep)


def run(settings: Settings, on_result: Callable[[Result], None] | None = None,
        checks: list[Check] | None = None, registry: Registry | None = None,
        progress: Callable[[str], None] | None = None) -> tuple[Report, Context]:
    reg = registry or registry_for(settings)
    ctx = make_context(settings, reg)
    chosen = selected_checks(settings, reg) if checks is None else checks
    if settings.wait_fabric and settings.snapshot is None and any("nvml" in c.needs for c in chosen):
        from doctor.gpu.fabric import wait_before_checks  # --wait-fabric / launch: fabric readiness first

        wait_before_checks(ctx, reg.collectors, progress or _say_stderr)
    outcome = _runner.run_checks(chosen, ctx, on_result=on_result)
    for module, why in sorted(reg.load_errors.items()):  # fail closed: checks of that module are missing
        res = Result.errored(f"built-in module {module} failed to import: {why}")
        res.id, res.title = f"doctor.load.{module.replace('.', '_')}", f"Load {module}"
        outcome.results.append(res)
    notes = [f"plugin failed to load: {e}" for e in reg.plugin_errors]
    if settings.from_snapshot:
        notes.append(f"judged from snapshot {settings.from_snapshot}, not the live host")
    return Report(settings, outcome, notes), ctx


def _say_stderr(msg: str) -> None:
    sys.stderr.write(f"k26-doctor: {msg}\n")
    sys.stderr.flush()


def run_checks(settings: Settings) -> Report:
    """Run the selected checks and return the report: what the launcher gates on."""
    return run(settings)[0]


def render(report: Report, fmt: str, verbose: int = 0, stream: IO[str] | None = None,
           color: bool | None = None) -> None:
    """Write the report in ``text``, ``json`` or ``junit`` to ``stream`` (stdout by default)."""
    stream = stream or sys.stdout
    if fmt == "json":
        from doctor.report.json_report import dumps

        stream.write(dumps(report) + "\n")
    elif fmt == "junit":
        from doctor.report.junit import to_junit

        stream.write(to_junit(report))
    elif fmt == "text":
        from doctor.report.text import render_text

        stream.write(render_text(report, verbose=verbose, color=color, stream=stream))
    else:  # pragma: no cover - click validates choices
        raise ConfigError(f"unknown format {fmt!r}")
