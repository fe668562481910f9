"""The ``k26-doctor`` command line (click). Thin: the work is in ``doctor.app`` and the checks.

Startup stays cheap (``--help``/``list`` run on every ExecStartPre): subcommands of other areas
load lazily, and nothing heavy is imported at module level.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import click

from doctor import __version__
from doctor.commands.options import (
    Stop,
    begin_report,
    emit,
    guarded,
    quiet_stdout,
    selection_options,
    settings_from,
    write_requested,
)
from doctor.core import interrupt
from doctor.core.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_SIGPIPE, EXIT_TERMINATED, EXIT_USAGE

LAZY_COMMANDS = {
    "fix": "doctor.commands.fix:fix",
    "launch": "doctor.commands.launch:launch",
    "systemd-unit": "doctor.commands.launch:systemd_unit",
    "diagnose": "doctor.commands.launch:diagnose",
    "wait-ready": "doctor.commands.launch:wait_ready",
    "patches": "doctor.commands.patches:patches",
    "manifest": "doctor.commands.model:manifest",
    "env": "doctor.commands.env:env",
    "smoke": "doctor.commands.smoke:smoke",
    "validate": "doctor.commands.validate:validate",
    "slurm-health": "doctor.commands.fleet:slurm_health",
    "kube-node": "doctor.commands.fleet:kube_node",
}
# What `k26-doctor --help` lists for each lazy command: its docstring's first sentence, here so that the help
# imports none of them (the launcher, the patch engine, the hashing: 0.2 s of a start that only prints). The
# commands' own help is what `k26-doctor COMMAND --help` prints; tests/test_startup.py keeps the two equal.
LAZY_HELP = {
    "fix": "Show (and with --apply, make) the changes that fix failing checks, then check again.",
    "launch": "Start the SGLang server of the profile, only if no check fails.",
    "systemd-unit": "Print a systemd unit: ExecStartPre runs `k26-doctor check`, ExecStart launches the server.",
    "diagnose": "Map a failed start's log (FILE, `-` for stdin, or --journal UNIT) to the checks that catch it.",
    "wait-ready": "Wait until the server answers ready: refused while loading, 503 while warming up, then 200.",
    "patches": "The profile's SGLang patch set ([patches] set) in the --python environment.",
    "manifest": "sha256 manifest of a model directory (k26-doctor.manifest.json), used by `check --deep`.",
    "env": "A short, paste-ready, redacted summary: driver, CUDA, GPUs and topology, torch/triton/SGLang/kernel "
           "versions, the environment that matters, and the profile's verdict (the default checks run once).",
    "smoke": "Send a few requests to the running server (OpenAI API and /generate), read back SGLang's speculative "
             "accept length, report errors and latencies.",
    "slurm-health": "Slurm node health check / prolog: drain the node with the failing root cause, resume it when "
                    "the checks pass.",
    "validate": "Prove DDTree on this host and write the record that opens its gate.",
    "kube-node": "The node's verdict for Kubernetes: node-problem-detector's plugin protocol, and with --mark the "
                 "Node's condition, taint and label written through the API.",
}


class LazyGroup(click.Group):
    """Loads area subcommands on use; an area whose module is absent is simply not offered."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        names.update(n for n, target in LAZY_COMMANDS.items() if _module_exists(target.split(":")[0]))
        return sorted(names)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in LAZY_COMMANDS:
            return cmd
        module, attr = LAZY_COMMANDS[name].split(":")
        if not _module_exists(module):
            return None
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's list of commands, a lazy command's line from ``LAZY_HELP`` (the command is not imported)."""
        commands: list[tuple[str, str | click.Command]] = []
        for name in self.list_commands(ctx):
            if name in LAZY_HELP and name not in self.commands:
                commands.append((name, LAZY_HELP[name]))
                continue
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                commands.append((name, cmd))
        if not commands:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in commands)
        rows = [(name, click.utils.make_default_short_help(cmd, limit) if isinstance(cmd, str)
                 else cmd.get_short_help_str(limit)) for name, cmd in commands]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _module_exists(module: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="k26-doctor")
def cli() -> None:
    """Preflight diagnostics and repair for Kimi K2.6 on SGLang + DDTree, TP8 over NVLink.

    \b
    k26-doctor check                 run the checks (exit 0 ok, 1 failed, 2 usage, 3 no report)
    k26-doctor fix [--apply]         plan (and apply) the fixes of failing checks
    k26-doctor launch [--dry-run]    start the server only when every check passes
    """


@cli.command()
@selection_options
@guarded
def check(flags: dict[str, Any]) -> int:
    """Run the selected checks and print a report. Changes nothing."""
    from doctor.app import run

    settings = settings_from(flags)
    begin_report(settings, flags)
    report, _ = run(settings)
    emit(report, flags)
    return report.decision().exit_code


@cli.command("list")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@guarded
def list_cmd(fmt: str) -> int:
    """Every registered check: id, title, tags, deep, fixer."""
    from doctor.core.registry import load

    registry = load(collectors=False)
    checks = registry.sorted_checks()
    for err in registry.plugin_errors:  # stderr, so JSON on stdout stays parseable
        click.echo(f"plugin failed to load: {err}", err=True)
    for warning in registry.warnings:
        click.echo(f"warning: {warning}", err=True)
    if fmt == "json":
        click.echo(json.dumps([c.to_dict() for c in checks], indent=2))
        return EXIT_OK
    width = max((len(c.id) for c in checks), default=8)
    for c in checks:
        extra = []
        if c.deep:
            extra.append("deep")
        if c.failure == "deployment":
            extra.append("deployment")
        if c.fixer:
            extra.append(f"fixer {c.fixer}")
        if c.source != "builtin":
            extra.append(c.source)
        click.echo(f"{c.id.ljust(width)}  {c.title}" + (f"  [{', '.join(extra)}]" if extra else ""))
    return EXIT_OK


@cli.command()
@click.argument("check_id")
@guarded
def explain(check_id: str) -> int:
    """What a check looks at, why it matters, how to fix it by hand."""
    from doctor.core.registry import FAILURES, load

    registry = load(collectors=False)
    chk = registry.checks.get(check_id)
    if chk is None:
        import difflib

        close = difflib.get_close_matches(check_id, list(registry.checks), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `k26-doctor list`"
        click.echo(f"k26-doctor: no check {check_id!r}{hint}", err=True)
        return EXIT_USAGE
    click.echo(f"{chk.id} — {chk.title}")
    click.echo(f"tags: {', '.join(chk.tags)}   deep: {'yes' if chk.deep else 'no'}   "
               f"timeout: {chk.timeout or 'default'}   needs: {', '.join(chk.needs) or '-'}   "
               f"depends on: {', '.join(chk.depends) or '-'}")
    click.echo(f"a failure means: {chk.failure} ({FAILURES.get(chk.failure or '', '')})   "
               f"applies: {', '.join(chk.applies)}")
    if chk.fixer:
        fx = registry.fixers.get(chk.fixer)
        click.echo(f"fixer: {chk.fixer}" + (f" — {fx.title}" if fx else " (not registered)"))
    click.echo("")
    click.echo(plain(chk.explain) or "(no explanation written)")
    return EXIT_OK


def plain(doc: str | None) -> str:
    """A docstring as a person reads it: reStructuredText's inline literals (````x````) as `x`."""
    import re

    return re.sub(r"``(.+?)``", r"`\1`", doc or "", flags=re.S)


@cli.command()
@selection_options
@click.option("--note", default="", help="A note stored in the snapshot.")
@click.option("--fact", "facts", multiple=True, help="Only these facts (repeatable).")
@guarded
def snapshot(flags: dict[str, Any], note: str, facts: tuple[str, ...]) -> int:
    """JSON of every fact the checks read (GPUs, links, versions, paths), secrets redacted."""
    from doctor.app import collect_options, registry_for
    from doctor.facts.snapshot import build_snapshot
    from doctor.facts.store import FactStore

    settings = settings_from(flags)
    if settings.timeout:  # --timeout bounds the whole recording, every probe included
        from doctor.core import deadline

        deadline.start(settings.timeout, f"the run's deadline (--timeout {settings.timeout:g}s)")
    collectors = registry_for(settings).collectors
    store = FactStore(collect_options(settings), collectors=collectors)
    unknown = [f for f in facts if f not in collectors]
    if unknown:
        known = ", ".join(sorted(collectors))
        raise click.BadParameter(f"unknown fact(s): {', '.join(unknown)}; known: {known}")
    snap = build_snapshot(store, note=note, names=list(facts) or None)
    text = json.dumps(snap, indent=1, default=str, ensure_ascii=False) + "\n"
    if flags.get("output"):
        write_requested(flags["output"], text, "the snapshot")
        click.echo(f"snapshot written to {flags['output']} ({len(snap['facts'])} facts)", err=True)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def tolerate_terminal() -> None:
    """A terminal or pipe that cannot encode UTF-8 (``PYTHONIOENCODING=ascii``, a C locale): replace what it
    cannot show instead of dying with UnicodeEncodeError before the verdict (the reports pick ASCII glyphs)."""
    for stream in (sys.stdout, sys.stderr):
        enc = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if enc and not enc.startswith("utf") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # pragma: no cover - a stream that cannot be reconfigured
                pass


def run_cli(argv: list[str] | None = None) -> int:
    """The command line as a function: the exit code of the command ``argv`` (default ``sys.argv[1:]``) ran.
    Every command returns its code; click's own errors (usage, ``--help``) keep click's codes."""
    tolerate_terminal()
    from doctor.facts.redaction import guard_std_streams

    guard_std_streams()  # one redaction for every message and report any command prints
    interrupt.install()  # SIGTERM (systemd's stop, a fleet's timeout) ends a run as Ctrl-C does
    code = _run_command(argv)
    if code == EXIT_INTERRUPTED and interrupt.terminated():
        return EXIT_TERMINATED
    return code


def _run_command(argv: list[str] | None) -> int:
    """``cli.main`` with every way it ends turned into an exit code."""
    try:
        code = cli.main(args=argv, prog_name="k26-doctor", standalone_mode=False)
    except Stop as stop:
        return stop.code
    except click.ClickException as exc:  # a usage error: click says why
        exc.show()
        return exc.exit_code
    except (click.Abort, EOFError, KeyboardInterrupt) as exc:  # click turns Ctrl-C into Abort
        if isinstance(exc, KeyboardInterrupt) or isinstance(exc.__cause__, KeyboardInterrupt):
            click.echo(f"interrupted ({interrupt.cause()})", err=True)  # (a run of checks reports what finished itself)
            return EXIT_INTERRUPTED
        click.echo("\nAborted!", err=True)  # a prompt answered with Ctrl-D
        return EXIT_FAILED
    except BrokenPipeError:  # the reader went away (`k26-doctor list | head -1`): nothing left to say
        quiet_stdout()
        return EXIT_SIGPIPE
    finally:  # a probe of a check abandoned at its deadline, or interrupted: never left running
        if "doctor.core.proc" in sys.modules:  # (what never started a child has none to end: --help, list)
            sys.modules["doctor.core.proc"].kill_all()
    return code if isinstance(code, int) else EXIT_OK


def main() -> None:
    """The one place the doctor exits (the console script and ``python -m doctor``)."""
    sys.exit(run_cli())


if __name__ == "__main__":  # pragma: no cover
    main()
