"""What every command shares: the selection flags (derived from ``doctor.core.settings``), the exit-code
guard, flags -> settings, and writing a report. Imported by ``doctor.cli`` and the area commands alike,
so no command module imports the CLI module."""

from __future__ import annotations

import functools
import io
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from doctor.core.exitcodes import EXIT_NO_REPORT, EXIT_OK, EXIT_SIGPIPE, EXIT_USAGE

REPORT_OPTIONS = {
    "fmt": lambda: click.option("--format", "fmt", type=click.Choice(["text", "json", "junit", "openmetrics"]),
                                default="text",
                                show_default=True),
    "output": lambda: click.option("--output", type=click.Path(dir_okay=False), default=None,
                                   help="Write the report here."),
    "problems": lambda: click.option("-q", "--problems", "problems", is_flag=True, default=False,
                                     help="Only what is not a pass, one line per root cause."),
}
# Where the report flags sit among the setting flags in --help (after --deep, as CONTRACT.md lists them).
REPORT_AFTER = "deep"


class Number(click.ParamType):
    """A number on the command line, read by the doctor's one reading of numbers
    (``doctor.core.settings.number``): an integer (``integer``) or a finite number in ``[low, high]`` (``low``
    excluded with ``above``). ``nan``, ``inf``, ``1e300``, a negative value or a 400-digit count is a usage error
    (exit 2) naming the option and its range. Every numeric option of every command is one
    (``tests/test_hostile_round_two.py`` walks them)."""

    name = "number"

    def __init__(self, low: float, high: float, *, integer: bool = False, above: bool = False,
                 unit: str = "") -> None:
        self.low, self.high, self.integer, self.above, self.unit = low, high, integer, above, unit

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:  # (ctx: click >= 8.2)
        return "SECONDS" if self.unit == "seconds" else "INTEGER" if self.integer else "NUMBER"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from doctor.core.settings import ConfigError, number

        try:
            return number(value, "the value", low=self.low, high=self.high, integer=self.integer, above=self.above,
                          unit=self.unit)
        except ConfigError as exc:
            self.fail(str(exc).replace("the value ", "", 1), param, ctx)

    def __repr__(self) -> str:
        return f"Number({self.low:g}, {self.high:g})"


class Seconds(Number):
    """A duration: seconds, finite, > 0 (or >= ``minimum``; ``zero``: >= 0), at most ``maximum`` (a week:
    ``doctor.core.settings.MAX_SECONDS``)."""

    def __init__(self, minimum: float | None = None, *, zero: bool = False, maximum: float | None = None) -> None:
        from doctor.core.settings import MAX_SECONDS

        super().__init__(minimum if minimum is not None else 0, maximum if maximum is not None else MAX_SECONDS,
                         above=minimum is None and not zero, unit="seconds")


def setting_option(f: Any) -> Callable[..., Any]:
    """The click option of one ``Settings`` field, from its ``setting()`` metadata."""
    from doctor.core.settings import MAX_COUNT, key_of

    meta, dest = f.metadata, key_of(f)
    names = meta["flag"].split("/")
    kind = meta["kind"]
    if kind == "list":
        return click.option(*names, dest, multiple=True, help=meta["help"])
    if kind in ("bool", "not"):
        return click.option(*names, dest, is_flag=True, default=None, help=meta["help"])
    if kind == "count":
        return click.option(*names, dest, count=True, help=meta["help"])
    high = meta.get("high")
    typ = {"posint": lambda: Number(1, high or MAX_COUNT, integer=True), "posfloat": lambda: Seconds(maximum=high),
           "seconds": lambda: Seconds(zero=True, maximum=high)}.get(kind, lambda: None)()
    if dest in ("config", "from_snapshot"):
        typ = click.Path(dir_okay=False)
    return click.option(*names, dest, type=typ, default=None, help=meta["help"])


def settings_options(*only: str, report: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Flags for every setting that has one (or only those whose key is in ``only``), collected into
    ``flags`` for the command. Derived from ``doctor.core.settings.Settings``: a new setting is one field."""
    from doctor.core.settings import key_of, setting_fields

    chosen = [f for f in setting_fields() if f.metadata["flag"] and (not only or key_of(f) in only)]
    options: list[tuple[str, Callable[..., Any]]] = []
    for f in chosen:
        options.append((key_of(f), setting_option(f)))
        if report and key_of(f) == REPORT_AFTER:
            options += [(k, make()) for k, make in REPORT_OPTIONS.items()]

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        keys = [k for k, _ in options]

        @functools.wraps(func)
        def wrapper(**kwargs: Any) -> Any:
            flags = {k: kwargs.pop(k) for k in keys if k in kwargs}
            return func(flags=flags, **kwargs)

        for _key, opt in reversed(options):
            wrapper = opt(wrapper)
        return wrapper

    return deco


def selection_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The flags shared by check, fix, snapshot, launch (CONTRACT.md): every setting's flag plus the report's."""
    return settings_options()(func)


class Stop(Exception):
    """A command ends here with ``code``, having said why: raised by a helper deep in a command, turned into the
    command's return value by ``guarded`` (and by ``doctor.cli.main`` for commands without it)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def guarded(func: Callable[..., Any]) -> Callable[..., int]:
    """The command's exit code per the contract, returned (``doctor.cli.main`` is the one place that exits):
    what it returns (nothing: 0); ConfigError -> 2; a closed pipe -> 141; any unexpected crash -> 3 with one
    line (the traceback with -v)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        from doctor.core.settings import ConfigError

        try:
            code = func(*args, **kwargs)
            return EXIT_OK if code is None else int(code)
        except Stop as stop:
            return stop.code
        except ConfigError as exc:
            click.echo(f"k26-doctor: {exc}", err=True)
            return EXIT_USAGE
        except BrokenPipeError:  # the reader went away (`| head -1`): not a crash, nothing left to say
            quiet_stdout()
            return EXIT_SIGPIPE
        except (click.exceptions.Exit, click.ClickException, click.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:
            click.echo(f"k26-doctor: internal error, no report: {type(exc).__name__}: {exc}", err=True)
            if "-v" in sys.argv or "--verbose" in sys.argv:
                traceback.print_exc()
            return EXIT_NO_REPORT

    return wrapper


def settings_from(flags: dict[str, Any]) -> Any:
    """Flags -> settings; the report's destination is checked first, so a report that cannot be written
    is an invalid invocation (exit 2) before any check runs, not a crash after all of them."""
    from doctor.app import settings_from_flags

    if flags.get("output"):
        read = (("--config", "config"), ("--from-snapshot", "from_snapshot"))
        plan_outputs([("--output", flags["output"])], inputs=[(f, flags.get(k)) for f, k in read])
    return settings_from_flags({k: v for k, v in flags.items() if k not in REPORT_OPTIONS})


def _identity(path: str) -> tuple[str, tuple[int, int] | None]:
    """Where ``path`` leads: its resolved path (every link followed, ``..`` folded) and, when it exists, its
    (st_dev, st_ino): a hardlink has another path and the same inode."""
    import os

    try:
        st = os.stat(path)
        inode: tuple[int, int] | None = (st.st_dev, st.st_ino)
    except (OSError, ValueError):
        inode = None
    return os.path.realpath(os.path.abspath(path)), inode


def plan_outputs(outputs: list[tuple[str, str | None]], inputs: list[tuple[str, str | None]] | None = None) -> None:
    """Every file one command will write (``(flag, path)``), judged together before any is written: no two are
    the same file (the same path however spelt, a symlink to it, a hardlink: compared by resolved path and by
    (st_dev, st_ino)), none is a file the command reads (``inputs``: its config), and each can be written
    (``check_output_path``). ``ConfigError`` (exit 2) naming both flags otherwise: ``systemd-unit --secrets-file F
    --output F`` would write the key and then the unit over it; ``--timer --output X.service`` with an unwritable
    ``X.timer`` would leave a service without its timer."""
    from doctor.core.settings import ConfigError

    seen: list[tuple[str, str, str, tuple[int, int] | None, bool]] = []
    for flag, path in [(f, p) for f, p in inputs or [] if p] + [(f, p) for f, p in outputs if p]:
        real, inode = _identity(path)
        writes = (flag, path) in outputs
        for other_flag, other_path, other_real, other_inode, other_writes in seen:
            if not writes and not other_writes:
                continue
            if real == other_real or (inode is not None and inode == other_inode):
                how = "" if real == other_real else " (hardlinks of one inode)"
                what = "one would overwrite the other" if other_writes else f"the command reads {other_flag}"
                raise ConfigError(f"{other_flag} {other_path} and {flag} {path} are the same file{how}: {what}; "
                                  "give another file (nothing was written)")
        seen.append((flag, path, real, inode, writes))
    for flag, path in outputs:
        if path:
            check_output_path(path, flag)


def check_output_path(path: str, flag: str = "--output") -> None:
    """``ConfigError`` (exit 2, before any work) unless ``path`` can be written: not a directory, a symlink or
    anything but a regular file (``/dev/full``, a FIFO), in an existing writable directory with room
    (``doctor.core.fileio.output_problem``)."""
    from doctor.core.fileio import output_problem
    from doctor.core.settings import ConfigError

    problem = output_problem(path)
    if problem:
        raise ConfigError(f"{flag} {path}: {problem}" if problem.startswith("the ") else f"{flag} {path} {problem}")


def write_requested(path: str, text: str, what: str = "the report") -> None:
    """Write a file a command was asked to write (``--output``): checked again, redacted, terminal-safe (a
    control character from a file name or a server is escaped: a text report that is ``cat``-ed, a JUnit file
    that stays XML, a JSON file whose strings read back the same), atomic (a failure leaves what was there); an
    I/O failure (a full disk) is ``ConfigError``: exit 2, naming the file."""
    from doctor.core.fileio import describe_error, write_output
    from doctor.core.printable import terminal_safe
    from doctor.core.settings import ConfigError
    from doctor.facts.redaction import redact_text

    check_output_path(path)
    try:
        write_output(path, terminal_safe(redact_text(text)).encode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot write {what} to {path}: {describe_error(exc)}") from None


def quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so that the interpreter's final flush does not
    raise again (the Python documentation's recipe for SIGPIPE)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def textfile_of(flags: dict[str, Any]) -> str | None:
    """The node_exporter textfile of this run: ``--output`` with ``--format openmetrics``."""
    return flags.get("output") if flags.get("fmt") == "openmetrics" else None


def begin_report(settings: Any, flags: dict[str, Any]) -> None:
    """Before the checks: a textfile (``--format openmetrics --output F``) gets this run's start time, its last
    verdict kept, so that a run that never finishes shows (``doctor.service.textfile``)."""
    import time

    path = textfile_of(flags)
    if not path:
        return
    from doctor.app import selected_checks
    from doctor.core.settings import ConfigError

    selected_checks(settings)  # an invalid selection (exit 2) leaves the last verdict as it was
    from doctor.report.openmetrics import run_labels
    from doctor.service.textfile import mark_started, textfile_note

    note = textfile_note(path)
    if note:
        click.echo(f"k26-doctor: note: {note}", err=True)
    try:
        mark_started(path, time.time(), run_labels(settings))
    except OSError as exc:
        raise ConfigError(f"--output {path}: cannot write: {exc.strerror or exc}") from None


def emit(report: Any, flags: dict[str, Any]) -> None:
    """Write the report where the flags say. A reader that closes the pipe early (``| head``) does not
    change the verdict: the exit code still says it. A textfile for node_exporter is replaced whole (the
    atomic writer): its collector must never read half a file."""
    from doctor.app import render

    fmt, output = flags.get("fmt") or "text", flags.get("output")
    verbose, problems = flags.get("verbose") or 0, bool(flags.get("problems"))
    try:
        if textfile_of(flags):
            from doctor.core.fileio import describe_error
            from doctor.core.settings import ConfigError
            from doctor.facts.redaction import redact_text
            from doctor.report.openmetrics import to_openmetrics
            from doctor.service.textfile import write_report

            try:
                write_report(output, redact_text(to_openmetrics(report)))
            except OSError as exc:
                raise ConfigError(f"--output {output}: cannot write: {describe_error(exc)}") from None
            render(report, "text", verbose, sys.stdout, problems=problems)
        elif output:
            buf = io.StringIO()
            render(report, fmt, verbose, buf, color=False, problems=problems)
            write_requested(output, buf.getvalue())
            if fmt != "text":
                render(report, "text", verbose, sys.stdout, problems=problems)
        else:
            render(report, fmt, verbose, sys.stdout, problems=problems)
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()


