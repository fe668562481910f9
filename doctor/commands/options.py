"""What every command shares: the selection flags (derived from ``doctor.core.settings``), the exit-code
guard, flags -> settings, and writing a report. Imported by ``doctor.cli`` and the area commands alike,
so no command module imports the CLI module."""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from doctor.core.exitcodes import EXIT_NO_REPORT, EXIT_USAGE


def selection_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The flags shared by check, fix, launch (CONTRACT.md), collected into ``flags`` for the command."""
    options = [
        click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
                     help="TOML config (default $K26_DOCTOR_CONFIG, else /etc/k26-doctor/config.toml)."),
        click.option("--profile", default=None, help="Deployment profile (default b300-tp8-ddtree)."),
        click.option("--model-path", default=None, help="Target model directory."),
        click.option("--draft-model-path", default=None, help="Draft (DFlash) model directory."),
        click.option("--python", "python", default=None, help="The service's interpreter (default: this one)."),
        click.option("--tp", type=int, default=None, help="Tensor-parallel size (default: the profile's)."),
        click.option("--only", multiple=True, help="Only checks matching this glob (repeatable)."),
        click.option("--skip", multiple=True, help="Skip checks matching this glob (repeatable)."),
        click.option("--ignore", multiple=True, help="Report a failure of this check as warn (repeatable)."),
        click.option("--deep", is_flag=True, default=None, help="Add the slow checks (hashing, bandwidth)."),
        click.option("--format", "fmt", type=click.Choice(["text", "json", "junit"]), default="text",
                     show_default=True),
        click.option("--output", type=click.Path(dir_okay=False), default=None, help="Write the report here."),
        click.option("--strict", is_flag=True, default=None, help="Warnings fail too."),
        click.option("--timeout", type=float, default=None, help="Deadline per check, seconds."),
        click.option("-v", "--verbose", count=True, help="Details and tracebacks."),
        click.option("--from-snapshot", type=click.Path(dir_okay=False), default=None,
                     help="Judge a recorded snapshot instead of this host."),
        click.option("--patches-dir", default=None, help="A site directory of patch sets."),
        click.option("--state-dir", default=None, help="Where backups, journals and locks live."),
        click.option("--no-verify-cache", is_flag=True, default=None,
                     help="--deep: hash every file again, ignoring the verification cache."),
    ]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        keys = ["config", "profile", "model_path", "draft_model_path", "python", "tp", "only", "skip", "ignore",
                "deep", "fmt", "output", "strict", "timeout", "verbose", "from_snapshot", "patches_dir",
                "state_dir", "no_verify_cache"]
        flags = {k: kwargs.pop(k) for k in keys if k in kwargs}
        return func(flags=flags, **kwargs)

    for opt in reversed(options):
        wrapper = opt(wrapper)
    return wrapper


def guarded(func: Callable[..., Any]) -> Callable[..., Any]:
    """Exit codes per the contract: ConfigError -> 2; any unexpected crash -> 3 with one line."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from doctor.core.settings import ConfigError

        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            click.echo(f"k26-doctor: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:
            click.echo(f"k26-doctor: internal error, no report: {type(exc).__name__}: {exc}", err=True)
            if "-v" in sys.argv or "--verbose" in sys.argv:
                traceback.print_exc()
            sys.exit(EXIT_NO_REPORT)

    return wrapper


def settings_from(flags: dict[str, Any]) -> Any:
    from doctor.app import settings_from_flags

    return settings_from_flags({k: v for k, v in flags.items() if k not in ("fmt", "output")})


def emit(report: Any, flags: dict[str, Any]) -> None:
    from doctor.app import render

    fmt, output = flags.get("fmt") or "text", flags.get("output")
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            render(report, fmt, flags.get("verbose") or 0, fh, color=False)
        if fmt != "text":
            render(report, "text", flags.get("verbose") or 0, sys.stdout)
    else:
        render(report, fmt, flags.get("verbose") or 0, sys.stdout)


