"""``k26-doctor launch``, ``systemd-unit``, ``wait-ready`` and ``diagnose``: the service's life cycle.

``launch`` is the gate: the checks run first, then the exact server argv is checked against the
flags the installed SGLang accepts (read from its sources); only then does the doctor replace itself
with the server (``exec``, no shell), or with ``--wait`` start it as a child, wait for ``/health``,
tell systemd ``READY=1`` and supervise it.
"""

from __future__ import annotations

import io
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from doctor.commands.options import (
    Number,
    Seconds,
    guarded,
    plan_outputs,
    selection_options,
    settings_from,
    textfile_of,
    write_requested,
)
from doctor.core.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

DEFAULT_WAIT_S = 1800.0
PID_MAX = 1 << 22  # the kernel's largest pid_max


def _say(msg: str) -> None:
    from doctor.facts.redaction import redact_text

    click.echo(f"k26-doctor: {redact_text(msg)}", err=True)


def _run_gate(settings: Any, flags: dict[str, Any]) -> tuple[int | None, Any, Any]:
    """Run the selected checks; report to stderr (or --output); (None when nothing failed, else the refused
    start's exit code: the decision's, so an interrupted gate is 130, and 143 under SIGTERM, never a failure's 1;
    the run's context; the sglang.ddtree result or None)."""
    from doctor.app import render, run

    report, ctx = run(settings)
    fmt = flags.get("fmt") or "text"
    if textfile_of(flags):  # node_exporter's textfile: replaced whole, never half-written
        from doctor.core.fileio import describe_error
        from doctor.core.settings import ConfigError
        from doctor.facts.redaction import redact_text
        from doctor.report.openmetrics import to_openmetrics
        from doctor.service.textfile import write_report

        try:
            write_report(flags["output"], redact_text(to_openmetrics(report)))
        except OSError as exc:
            raise ConfigError(f"--output {flags['output']}: cannot write: {describe_error(exc)}") from None
    elif flags.get("output"):
        buf = io.StringIO()
        render(report, fmt, flags.get("verbose") or 0, buf, color=False)
        write_requested(flags["output"], buf.getvalue())
    render(report, "text" if fmt in ("junit", "openmetrics") else fmt, flags.get("verbose") or 0, sys.stderr,
           problems=bool(flags.get("problems")))
    decision = report.decision()
    why = decision.refusal  # a failure, or a check of the profile not judged for want of facts
    if why is not None:
        if decision.exit_code == EXIT_INTERRUPTED:  # Ctrl-C or SIGTERM: no verdict to fix, the same exit as check
            _say(f"not launching: {why}.")
            return EXIT_INTERRUPTED, ctx, None
        _say(f"not launching: {why}. Fix them (`k26-doctor fix`) or --ignore ID to accept a known failure.")
        return EXIT_FAILED, ctx, None
    return None, ctx, next((r for r in report.results if r.id == "sglang.ddtree"), None)


def site_record_env(plan: Any, result: Any) -> None:
    """The server gets the site validation record the sglang.ddtree check matched (its path), and a record that
    says DDTREE was not faster than DFLASH here is said once more."""
    from doctor.sglang.validation.record import RECORD_ENV

    if result is None:  # --no-check: the server looks through the records' directory (launcher.build_env)
        return
    details = getattr(result, "details", None) or {}
    if details.get("record"):
        plan.env[RECORD_ENV] = str(details["record"])
        _say(f"DDTREE opens on the site validation record {details['record']}")
    if result is not None and result.has("sglang.ddtree.not_faster"):
        _say("warning: DDTREE was lossless but NOT faster than DFLASH on this host (its record says so): DFLASH "
             "is the faster choice (server.speculative_algorithm = \"DFLASH\")")


def _recorded_flags(ctx: Any, plan: Any) -> dict[str, Any] | None:
    """The ``sglang_flags`` fact the check run already collected for this very interpreter, if any."""
    if ctx is None or plan.argv[0] != ctx.settings.python or dict(plan.env) != ctx.facts.options.env:
        return None
    try:
        fact = ctx.facts.get("sglang_flags") if "sglang_flags" in ctx.facts.collected() else None
    except Exception:  # FactUnavailable: read it again below, with the service's environment
        return None
    return fact if isinstance(fact, dict) else None


def _flag_gate(plan: Any, settings: Any, ctx: Any = None) -> bool:
    """The real server argv judged by ``doctor.sglang.flags.judge_flags`` (the one flag judgement);
    the flag table is the one the check run read when it ran, else read now. True if accepted."""
    from doctor.core.result import Result, Status
    from doctor.sglang.flags import flags_fact, judge_flags

    fact = _recorded_flags(ctx, plan) or flags_fact(plan.argv[0], plan.env)
    result = Result.judging(lambda: judge_flags(fact, plan.server_args))
    for p in result.details.get("problems", []):
        _say(f"{p['severity']}: {p['message']}")
    if result.status is Status.PASS or result.status is Status.WARN:
        return True
    errors = sum(1 for p in result.details.get("problems", []) if p["severity"] == "error")
    _say(f"not launching: {result.summary}" if not errors else
         f"not launching: the installed SGLang {result.details.get('sglang_version')} rejects {errors} flag(s)")
    if result.remediation and result.remediation.text:
        _say(result.remediation.text)
        for cmd in result.remediation.commands:
            _say(f"  $ {cmd}")
    return False


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@selection_options
@click.option("--dry-run", is_flag=True, help="Print the server command (one argv element per line) and exit; "
              "no checks, but exit 1 if the installed SGLang would reject a flag.")
@click.option("--no-check", is_flag=True, help="Do not run the checks (the unit's ExecStartPre already did).")
@click.option("--no-flag-check", is_flag=True, help="Do not check the flags against SGLang's sources.")
@click.option("--wait", is_flag=True, help="Start the server as a child, wait until /health answers 200 "
              "(READY=1 to systemd), then supervise it.")
@click.option("--wait-timeout", type=Seconds(1), default=DEFAULT_WAIT_S, show_default=True,
              help="Seconds to wait for readiness with --wait.")
@click.option("--wait-interval", type=Seconds(0.01), default=2.0, show_default=True,
              help="Seconds between polls.")
@click.option("--no-prewarm", is_flag=True, help="Do not compile FlashInfer's JIT modules ahead, in parallel with the "
              "checks (a failed prewarm never stops a start).")
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
@guarded
def launch(flags: dict[str, Any], dry_run: bool, no_check: bool, no_flag_check: bool, wait: bool,
           wait_timeout: float, wait_interval: float, no_prewarm: bool, server_args: tuple[str, ...]) -> int:
    """Start the SGLang server of the profile, only if no check fails.

    Extra server flags go after `--`: `k26-doctor launch -- --log-level debug`.
    """
    from doctor.service.launcher import build_plan, exec_plan

    settings = settings_from(flags)
    if settings.wait_fabric is None:  # the gate waits for fabric registration as the profile says
        settings.wait_fabric = settings.fabric_wait_s
    # The gate imports SGLang for real (sglang.install): a start that fails at the import costs the weights' load.
    settings.import_sglang = True
    if settings.from_snapshot:
        _say("cannot launch from a snapshot (it judges another host)")
        return EXIT_USAGE
    plan = build_plan(settings, list(server_args))
    if dry_run:
        for note in plan.notes:
            _say(note)
        from doctor.facts.redaction import redact_argv

        shown = redact_argv(plan.argv)
        if shown != plan.argv:
            _say("secret values (--api-key, URL credentials) are shown as <redacted>")
        sys.stdout.write("\n".join(shown) + "\n")
        sys.stdout.flush()
        if not no_flag_check and not _flag_gate(plan, settings):
            return EXIT_FAILED
        return EXIT_OK
    ctx = gate = None
    from doctor.service.startwatch import StartWatch  # the start plan: prewarm, plan shown, start recorded

    watch = StartWatch(settings, _say, prewarm=not no_prewarm, deadline_s=wait_timeout if wait else None)
    watch.before_gate(plan)
    if not no_check:
        refused, ctx, gate = _run_gate(settings, flags)
        if refused is not None:
            watch.abandon()  # the prewarm stops with the refused start
            return refused
    watch.before_start(ctx, plan)  # how the prewarm went (or that it goes on beside the server); the plan
    if not no_check:
        from doctor.core import deadline

        deadline.clear()  # --timeout bounded the gate's checks; the flag check and the server have their own
    if not no_flag_check and not _flag_gate(plan, settings, ctx):
        watch.abandon()
        return EXIT_FAILED
    site_record_env(plan, gate)
    for note in plan.notes:
        _say(note)
    from doctor.facts.redaction import redact_argv

    _say("exec: " + shlex.join(redact_argv(plan.argv)))
    if not wait:
        try:
            exec_plan(plan)
        except OSError as exc:
            _say(f"cannot start {plan.argv[0]}: {exc.strerror or exc}")
            return EXIT_FAILED
    return _supervise(plan, settings, wait_timeout, wait_interval, watch)


def _supervise(plan: Any, settings: Any, timeout: float, interval: float, watch: Any = None) -> int:
    """Run the server as a child: wait for readiness, notify systemd, forward signals, return its status."""
    from doctor.service.readiness import health_url, sd_notify, wait_ready

    started: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: Any) -> None:
        if started and started[0].poll() is None:
            started[0].send_signal(signum)

    # The handlers go in before the server starts: a signal the doctor handles is the default again in the program
    # it execs, so the server hears the SIGINT and SIGTERM forwarded to it even where the doctor was started with
    # them ignored or blocked (`nohup ... &`, a CI runner), which it would otherwise inherit.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, forward)
    # Ctrl-C on a terminal already reaches the server (same foreground process group): don't double it.
    signal.signal(signal.SIGINT, forward if not sys.stdin.isatty() else lambda *_: None)
    try:
        child = subprocess.Popen(plan.argv, env=plan.env, **(watch.popen_args() if watch else {}))
    except OSError as exc:
        _say(f"cannot start {plan.argv[0]}: {exc.strerror or exc}")
        return EXIT_FAILED
    started.append(child)
    if watch:
        watch.tee(child)  # its output passes through unchanged; the start's lines are kept for the record
    url = health_url(str(settings.server.host), int(settings.server.port))
    sd_notify(f"MAINPID={os.getpid()}\nSTATUS=starting SGLang (pid {child.pid}), waiting for {url}")
    outcome = wait_ready(url, timeout, interval_s=interval, exited=child.poll, progress=sys.stderr,
                         notify=lambda status: sd_notify(f"STATUS={status}"))
    if not outcome.ready:
        if outcome.exit_code is not None:
            _say(f"{outcome.reason}; `k26-doctor diagnose LOGFILE` (or --journal UNIT) names the cause")
            return _status(outcome.exit_code)
        _say(f"{outcome.reason}; stopping the server")
        _stop(child)
        return EXIT_FAILED
    _say(f"server ready: {outcome.reason}")
    if watch:
        watch.after_ready(outcome.elapsed_s)  # actual against predicted, printed and kept in <state_dir>/start/
    sd_notify(f"READY=1\nSTATUS=serving on {url}")
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries; defensive
            continue
    return _status(code)


def _status(code: int) -> int:
    """The server's exit status as ours. Killed by a signal: die by the same signal (so systemd sees a
    clean stop after SIGTERM, and a shell sees what happened); failing that, 128 + N."""
    if code >= 0:
        return code
    sig = -code
    try:
        signal.signal(sig, signal.SIG_DFL)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), sig)
        time.sleep(1)
    except (OSError, ValueError):
        pass
    return 128 + sig


def _stop(child: subprocess.Popen[Any], grace: float = 30.0) -> None:
    child.terminate()
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


@click.command("systemd-unit", context_settings={"help_option_names": ["-h", "--help"]})
@selection_options
@click.option("--user", default=None, help="User= of the service (default: [server] user, else sglang; never root "
              "unless asked).")
@click.option("--no-hardening", is_flag=True, help="Leave out the sandbox (User=, ProtectSystem=, DevicePolicy=...).")
@click.option("--start-timeout", type=Seconds(1), default=None, help="TimeoutStartSec in seconds (default: sized).")
@click.option("--doctor", "doctor_path", default=None,
              help="Command that runs k26-doctor in the unit, e.g. '/opt/k26/bin/k26-doctor' (default: this one).")
@click.option("--no-diagnose", is_flag=True, help="No ExecStopPost diagnosis of a failed start.")
@click.option("--smoke", is_flag=True, help="ExecStartPost: `k26-doctor smoke` once the server is ready.")
@click.option("--secrets-file", default=None, type=click.Path(dir_okay=False),
              help="Where a secret of the server arguments (the value of --api-key) is written (mode 0600) for "
                   "the unit's EnvironmentFile=; the unit itself never holds it.")
@click.option("--timer", is_flag=True, help="Instead: a oneshot service and timer that run the checks periodically "
              "(not the server) and refresh node_exporter's textfile; --output NAME.service writes NAME.timer beside.")
@click.option("--interval", type=Seconds(10), default=None,
              help="--timer: seconds between runs (default 300).")
@click.option("--textfile", default=None, help="--timer: the node_exporter textfile, *.prom "
              "(default /var/lib/prometheus/node-exporter/k26-doctor.prom).")
@click.option("--idle-node", is_flag=True, help="--timer: the node runs no server; keep the checks that judge a host "
              "before a start (gpu.idle, host.port, ...), which --while-serving leaves out.")
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
@guarded
def systemd_unit(flags: dict[str, Any], user: str | None, no_hardening: bool, start_timeout: float | None,
                 doctor_path: str | None, no_diagnose: bool, smoke: bool, secrets_file: str | None, timer: bool,
                 interval: float | None, textfile: str | None, idle_node: bool, server_args: tuple[str, ...]) -> int:
    """Print a systemd unit: ExecStartPre runs `k26-doctor check`, ExecStart launches the server.

    Install: `k26-doctor systemd-unit --config /etc/k26-doctor/config.toml > /etc/systemd/system/UNIT`.
    With --timer: `k26-doctor systemd-unit --timer --output /etc/systemd/system/k26-doctor-check.service`.
    """
    from doctor.core.settings import ConfigError
    from doctor.service.launcher import build_plan
    from doctor.service.systemd import (
        absolute,
        doctor_command,
        reachability_notes,
        render_unit,
        secrets_file_text,
        service_user,
        split_secrets,
    )

    settings = settings_from(flags)
    if timer:
        from doctor.commands.fleet import timer_units

        timer_units(settings, flags, user=user, doctor_path=doctor_path, interval=interval, textfile=textfile,
                    idle_node=idle_node, server_args=server_args)
        return
    build_plan(settings, list(server_args))  # the same validation launch will do: fail now, not at boot
    config = settings.config_path
    if config:
        config = str(Path(config).resolve())
    doctor = shlex.split(doctor_path) if doctor_path else None
    if doctor and os.sep in doctor[0]:  # systemd runs it from /: a relative path must mean what it meant here
        doctor[0] = absolute(doctor[0])
    extra, secrets = split_secrets(list(server_args))
    if secrets and not secrets_file:
        raise ConfigError(f"the server arguments carry a secret ({', '.join(_flag_names(extra))}): a unit file is "
                          "readable by every user (systemctl cat), so it is not written there. Give --secrets-file "
                          "PATH (written mode 0600, read by EnvironmentFile=), or put the key in the config "
                          "([server] api_key, a file of mode 0640)")
    if secrets_file:
        secrets_file = absolute(secrets_file)
    plan_outputs([("--secrets-file", secrets_file), ("--output", flags.get("output"))],
                 inputs=[("--config", config)])
    text = render_unit(settings, config=config, doctor=doctor, user=user, timeout_override=start_timeout,
                       extra=extra, diagnose_on_failure=not no_diagnose, harden=not no_hardening,
                       smoke=smoke, secrets_file=secrets_file if secrets else None)
    if secrets and secrets_file:
        write_secrets(secrets_file, secrets_file_text(secrets))
        _say(f"the value(s) of {', '.join(f'`{n}`' for n in _flag_names(extra))} went to {secrets_file} (mode "
             "0600, EnvironmentFile= of the unit), not into the unit")
    if not no_hardening:
        for note in reachability_notes(settings, doctor or doctor_command(), service_user(settings, user)):
            _say(f"note: {note}")
    if flags.get("output"):
        write_requested(flags["output"], text, "the unit")
        _say(f"unit written to {flags['output']}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _flag_names(args: list[str]) -> list[str]:
    from doctor.service.systemd import EnvRef

    return [args[i - 1] for i, a in enumerate(args) if isinstance(a, EnvRef) and i > 0]


def write_secrets(path: str, text: str) -> None:
    """The unit's secrets file: mode 0600 from its first byte on (the atomic writer's temporary file is 0600),
    never through a symlink; a failure is exit 2."""
    from doctor.core.fileio import atomic_write, describe_error
    from doctor.core.settings import ConfigError

    try:
        atomic_write(path, text.encode("utf-8"), 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot write the secrets file {path}: {describe_error(exc)}") from None


@click.command("wait-ready", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", default=None, help="Health URL (default: http://HOST:PORT/health of the profile).")
@click.option("--config", "config", default=None, type=click.Path(dir_okay=False))
@click.option("--profile", default=None)
@click.option("--timeout", type=Seconds(), default=DEFAULT_WAIT_S, show_default=True, help="Seconds.")
@click.option("--interval", type=Seconds(0.01), default=2.0, show_default=True, help="Seconds between polls.")
@click.option("--pid", type=Number(1, PID_MAX, integer=True), default=None,
              help="Stop waiting when this process (the server) exits.")
@click.option("-q", "--quiet", is_flag=True, help="No progress output.")
@guarded
def wait_ready(url: str | None, config: str | None, profile: str | None, timeout: float, interval: float,
               pid: int | None, quiet: bool) -> int:
    """Wait until the server answers ready: refused while loading, 503 while warming up, then 200.

    Exit 0 when ready, 1 on timeout or when --pid exits first.
    """
    from doctor.core.settings import ConfigError
    from doctor.service.http import shown_url
    from doctor.service.readiness import alive, health_url, url_problem
    from doctor.service.readiness import wait_ready as wait

    if url is None:
        settings = settings_from({"config": config, "profile": profile})
        url = health_url(str(settings.server.host), int(settings.server.port))
    why = url_problem(url)
    if why:
        raise ConfigError(f"--url {shown_url(url)!r} {why}")
    if pid is not None and not alive(pid):
        raise ConfigError(f"--pid {pid}: no such process (give the server's process id)")
    outcome = wait(url, timeout, interval_s=interval, pid=pid, progress=None if quiet else sys.stderr)
    if not quiet:
        _say(outcome.reason)
    return EXIT_OK if outcome.ready else EXIT_FAILED


def _journal_lines(unit: str, invocation: str | None, on_service_failure: bool) -> tuple[list[str], str] | int:
    """The journal's lines of UNIT and their source's name, or EXIT_USAGE once said why: kept apart from
    diagnose so that reading the input stays one step beside matching it."""
    from doctor.core.proc import run
    from doctor.service.diagnose import journal_argv

    if on_service_failure and not invocation:
        invocation = os.environ.get("INVOCATION_ID")
    res = run(journal_argv(unit, invocation), 60)
    if not res.ok:
        _say(f"cannot read the journal of {unit}: {res.why()}")
        return EXIT_USAGE
    lines, source = res.stdout.splitlines(), f"journal of {unit}"
    if not any(line.strip() and line.strip() != "-- No entries --" for line in lines):
        which = f" (invocation {invocation})" if invocation else " since boot"
        _say(f"the journal had no lines for {unit}{which}: check the unit name (systemctl list-units "
             f"{shlex.quote(unit)}) or pass the log file instead")
        return EXIT_USAGE
    return lines, source


def _file_lines(logfile: str | None) -> tuple[list[str], str] | int:
    """The log file's lines (``-``: stdin) and its name, or EXIT_USAGE once said why it cannot be read."""
    from doctor.service.diagnose import read_log

    assert logfile is not None
    try:
        return read_log(logfile), logfile
    except OSError as exc:
        _say(f"cannot read {logfile}: {exc.strerror or exc}")
        return EXIT_USAGE


def _show_diagnosis(matches: list, source: str, lines: list[str], fmt: str) -> None:
    """Print the matches as JSON (the contract's keys) or as text: one place for both renderings."""
    import json

    from doctor.service.diagnose import names_a_cause, render_text, telling_lines

    if fmt == "json":
        shown = [] if names_a_cause(matches) else telling_lines(lines)
        click.echo(json.dumps({"source": source, "lines": len(lines),
                               "findings": [m.to_dict() for m in matches],  # the contract's key
                               "telling_lines": [{"line": n, "text": text} for n, text in shown]}, indent=2))
    else:
        click.echo(render_text(matches, source, lines))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("logfile", required=False)
@click.option("--journal", "unit", default=None, help="Read the systemd journal of this unit instead of a file.")
@click.option("--invocation", default=None, help="Only this start of the unit (its InvocationID).")
@click.option("--on-service-failure", is_flag=True,
              help="For ExecStopPost: do nothing unless $SERVICE_RESULT says the start failed.")
@click.option("--signatures", multiple=True, type=click.Path(dir_okay=False), help="More signatures (TOML).")
@click.option("--python", "python", default=None,
              help="The service's interpreter, for fixes that name its packages (Python.h); default: what the log "
                   "names.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--timeout", "match_timeout", type=Seconds(), default=60.0, show_default=True,
              help="Seconds the matching may take with --signatures (matched in a child process killed then).")
@guarded
def diagnose(logfile: str | None, unit: str | None, invocation: str | None, on_service_failure: bool,
             signatures: tuple[str, ...], python: str | None, fmt: str, match_timeout: float) -> int:
    """Map a failed start's log (FILE, `-` for stdin, or --journal UNIT) to the checks that catch it.

    Exit 0 when a known signature was found, 1 when none was, 2 on bad input: an unreadable file or
    signatures, or a journal that cannot be read or has no lines for the unit (most often a misspelt
    unit name). The likely root cause comes first; messages that only follow a failure (NCCL teardown,
    "Received sigquit") never outrank a cause.
    """
    from doctor.service.diagnose import (
        SignatureError,
        diagnose_lines,
        host_values,
        load_signatures,
        match_bounded,
        with_host_values,
    )

    if on_service_failure and os.environ.get("SERVICE_RESULT", "success") == "success":
        return EXIT_OK
    if bool(logfile) == bool(unit):
        raise click.UsageError("give a log FILE or --journal UNIT (one of them)")
    try:
        sigs = load_signatures([Path(s) for s in signatures])
    except SignatureError as exc:
        _say(str(exc))
        return EXIT_USAGE
    got = (_journal_lines(unit, invocation, on_service_failure) if unit
           else _file_lines(logfile))
    if isinstance(got, int):
        return got
    lines, source = got
    try:  # a site's patterns are matched in a killable child under a deadline; the built-in ones here
        matches = (match_bounded(lines, [Path(s) for s in signatures], match_timeout) if signatures
                   else diagnose_lines(lines, sigs))
    except SignatureError as exc:
        _say(str(exc))
        return EXIT_USAGE
    with_host_values(matches, lambda clean: host_values(clean, python), lines)
    _show_diagnosis(matches, source, lines, fmt)
    return EXIT_OK if matches else EXIT_FAILED
