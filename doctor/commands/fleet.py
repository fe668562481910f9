"""The doctor on the engines a fleet already runs: ``slurm-health`` (Slurm's HealthCheckProgram and prolog),
``systemd-unit --timer`` (periodic checks for Prometheus' node_exporter) and ``kube-node`` (Kubernetes:
node-problem-detector's plugin protocol, and the node's condition, taint and label through the API). Prometheus
itself is ``check --format openmetrics``; the manifests are under ``deploy/``."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from doctor.commands.options import (
    Seconds,
    begin_report,
    emit,
    guarded,
    plan_outputs,
    selection_options,
    settings_from,
    write_requested,
)
from doctor.core.exitcodes import EXIT_FAILED


def _say(msg: str) -> None:
    from doctor.facts.redaction import redact_text

    click.echo(f"k26-doctor: {redact_text(msg)}", err=True)


def timer_units(settings: Any, flags: dict[str, Any], *, user: str | None, doctor_path: str | None,
                interval: float | None, textfile: str | None, idle_node: bool, server_args: tuple[str, ...]) -> None:
    """``systemd-unit --timer``: the oneshot service and its timer, printed or written (``--output NAME.service``:
    NAME.service and NAME.timer, each replaced whole)."""
    from doctor.core.settings import ConfigError
    from doctor.service.systemd import absolute, unit_value
    from doctor.service.textfile import textfile_note
    from doctor.service.timer import TimerOptions, render_check_service, render_check_timer

    if server_args:
        raise ConfigError("--timer runs the checks, not the server: it takes no server arguments")
    opts = TimerOptions.defaults()
    output = flags.get("output")
    if output:
        if not output.endswith(".service"):
            raise ConfigError(f"--output {output}: with --timer, name the service file (NAME.service); "
                              "NAME.timer is written beside it")
        opts.unit = Path(output).name[: -len(".service")]
    if textfile:
        opts.textfile = absolute(textfile)
    note = textfile_note(opts.textfile)
    if note:
        raise ConfigError(f"--textfile {note}")
    if interval:
        opts.interval_s = interval
    opts.user, opts.idle_node = (unit_value(user, "--user") if user else user), idle_node
    unit_value(opts.textfile, "--textfile")
    config = str(Path(settings.config_path).resolve()) if settings.config_path else None
    doctor = shlex.split(doctor_path) if doctor_path else None
    if doctor and os.sep in doctor[0]:
        doctor[0] = absolute(doctor[0])
    selection = [arg for key, flag in (("only", "--only"), ("skip", "--skip"), ("ignore", "--ignore"))
                 for pattern in (flags.get(key) or ()) for arg in (flag, pattern)]
    service = render_check_service(settings, opts, config=config, doctor=doctor, selection=selection)
    timer = render_check_timer(settings, opts)
    if not output:
        sys.stdout.write(f"# ---- {opts.unit}.service ----\n{service}\n# ---- {opts.unit}.timer ----\n{timer}")
        return
    timer_path = output[: -len(".service")] + ".timer"
    plan_outputs([("--output", output), ("the timer beside it", timer_path)])  # both writable, or neither written
    write_requested(output, service, "the service unit")  # never through a link, onto a device, half-written
    write_requested(timer_path, timer, "the timer unit")
    _say(f"units written: {output}, {timer_path}; enable with: systemctl daemon-reload && "
         f"systemctl enable --now {opts.unit}.timer")


@click.command("slurm-health", context_settings={"help_option_names": ["-h", "--help"]})
@selection_options
@click.option("--node", default=None, help="The node as slurm.conf names it (default: $SLURMD_NODENAME, else the "
              "short host name).")
@click.option("--scontrol", "scontrol_path", default=None, type=click.Path(dir_okay=False),
              help="scontrol to use (default: on PATH, else /usr/bin/scontrol).")
@click.option("--scontrol-timeout", type=Seconds(0.1, maximum=3600), default=None,
              help="Seconds each scontrol call may take (default 20; slurmd kills a health check after 60).")
@click.option("--dry-run", is_flag=True, help="Say what would be done to the node; change nothing.")
@click.option("--drain-unjudged", is_flag=True, help="Also drain for checks that could not be judged for want of "
              "facts (the reason says 'not judged'); by default they are listed and drain nothing.")
@click.option("--serving", type=click.Choice(["auto", "yes", "no"]), default="auto", show_default=True,
              help="Leave out the checks that judge a host before a start (--while-serving): auto does on a node "
              "with jobs, except in a prolog.")
@guarded
def slurm_health(flags: dict[str, Any], node: str | None, scontrol_path: str | None, scontrol_timeout: float | None,
                 dry_run: bool, drain_unjudged: bool, serving: str) -> int:
    """Slurm node health check / prolog: drain the node with the failing root cause, resume it when the checks pass.

    \b
    slurm.conf:  HealthCheckProgram=/usr/local/sbin/k26-doctor-slurm-health
                 Prolog=/usr/local/sbin/k26-doctor-slurm-health
    Exit 0 healthy (a drain of ours resumed), 1 failing (drained) or scontrol failed, 2 invalid invocation or
    unknown node, 3 the doctor could not run, 130 interrupted before every check finished (the node left as it
    is: an interrupted check is no verdict on it).
    """
    from doctor.app import run
    from doctor.core.settings import ConfigError
    from doctor.service import slurm

    settings = settings_from(flags)
    if settings.from_snapshot:
        raise ConfigError("slurm-health judges the live node; --from-snapshot is for check")
    env = dict(os.environ)
    path = slurm.find_scontrol(scontrol_path, env)
    if path is None:
        raise ConfigError("scontrol not found (PATH, /usr/bin, /usr/local/bin); give --scontrol PATH")
    tool = slurm.Scontrol(path, scontrol_timeout or float(slurm.slurm_table()["scontrol_timeout_s"]), env)
    name = slurm.node_name(node, env)
    try:
        state = tool.show_node(name)
    except slurm.UnknownNode as exc:
        raise ConfigError(str(exc)) from None
    except slurm.SlurmError as exc:
        _say(f"cannot read the node from Slurm: {exc}")
        return EXIT_FAILED
    if slurm.serving(serving, state, env):
        settings = replace(settings, while_serving=True)
    begin_report(settings, flags)
    report, _ = run(settings)
    if flags.get("output") or (flags.get("fmt") or "text") != "text":
        emit(report, flags)
    else:
        emit(report, {**flags, "problems": True})
    action = slurm.node_action(report, state, drain_unjudged=drain_unjudged)
    for line in action.lines:
        click.echo(("(dry run) " if dry_run and action.action != "keep" else "") + line)
    if dry_run or action.action == "keep":
        return action.exit_code
    try:
        slurm.carry_out(tool, state, action)
    except slurm.SlurmError as exc:
        _say(f"could not {action.action} {name}: {exc}")
        return EXIT_FAILED
    return action.exit_code


@click.command("kube-node", context_settings={"help_option_names": ["-h", "--help"]})
@selection_options
@click.option("--mark", is_flag=True, help="Write the verdict on this Node through the API: its condition, and for "
              "a failure of the node a taint and a label, removed once its checks pass (in-cluster credentials).")
@click.option("--node", default=None, help="The Node's name (default: $NODE_NAME, set from spec.nodeName).")
@click.option("--taint-effect", type=click.Choice(["NoExecute", "NoSchedule", "PreferNoSchedule"]), default=None,
              help="The taint's effect (default: doctor/data/fleet.toml's, NoExecute: the server's pod moves).")
@click.option("--kube-api", default=None, envvar="K26_DOCTOR_KUBE_API",
              help="The API server's URL (default: the pod's cluster).")
@click.option("--kube-token-file", default=None, type=click.Path(dir_okay=False), envvar="K26_DOCTOR_KUBE_TOKEN_FILE",
              help="The bearer token's file (default: the pod's service account's).")
@click.option("--kube-ca-file", default=None, type=click.Path(dir_okay=False), envvar="K26_DOCTOR_KUBE_CA_FILE",
              help="The API server's CA (default: the pod's service account's ca.crt).")
@guarded
def kube_node(flags: dict[str, Any], mark: bool, node: str | None, taint_effect: str | None, kube_api: str | None,
              kube_token_file: str | None, kube_ca_file: str | None) -> int:
    """The node's verdict for Kubernetes: node-problem-detector's plugin protocol, and with --mark the Node's
    condition, taint and label written through the API.

    \b
    stdout: one line, the root cause first, at most 80 characters (NPD's condition message)
    Exit 0 the node has no failure of its own (the deployment's configuration may fail: said, never marked),
    1 a check whose failure means the node is broken failed (or the API refused --mark), 2 not judged
    (NPD: Unknown) or an invalid invocation, 3 the doctor could not run, 130 interrupted before every check
    finished (NPD: Unknown; nothing written on the node).
    Only a check declared failure="node" marks the node; the text report goes to stderr, and
    --format openmetrics --output FILE writes the textfile of the same run.
    """
    import contextlib

    from doctor.app import run
    from doctor.service import kube

    settings = settings_from(flags)
    if mark and settings.from_snapshot:
        from doctor.core.settings import ConfigError

        raise ConfigError("--mark writes the live node's verdict; --from-snapshot is for judging a recording")
    begin_report(settings, flags)
    report, _ = run(settings)
    if flags.get("output"):
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the protocol's one line
            emit(report, flags)
    verdict = kube.node_mark(report)
    code, line = kube.plugin_line(verdict)
    if mark and verdict.state != kube.INTERRUPTED:  # an interrupted run is no verdict: the node is left as it is
        name = node or os.environ.get("NODE_NAME") or ""
        try:
            api = kube.KubeApi.in_cluster(kube_api, kube_token_file, kube_ca_file)
            for said in kube.mark(api, name, verdict, taint_effect):
                _say(said)
        except kube.KubeError as exc:
            _say(f"could not mark the node {name!r}: {exc}")
            code = EXIT_FAILED if code == 0 else code
    click.echo(line)
    return code
