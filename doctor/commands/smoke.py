"""``k26-doctor smoke``: requests against the running server, the speculative accept length read back.

Usable as a unit's ``ExecStartPost=`` (after ``launch --wait`` told systemd the server is ready) and as a
periodic probe (a timer): one deadline bounds the whole run, exit codes are ``check``'s.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from doctor.commands.options import Number, Seconds, Stop, guarded, settings_from
from doctor.core.exitcodes import EXIT_USAGE

MAX_ACCEPT_LENGTH = 1024  # tokens accepted per step: at most a draft tree's budget, never more than this

API_KEY_ENV = "K26_DOCTOR_API_KEY"


def _ids(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        ids = tuple(int(x) for x in text.replace(",", " ").split())
    except ValueError:
        raise click.BadParameter(f"--input-ids must be integers, got {text!r}") from None
    if not ids or any(i < 0 for i in ids):
        raise click.BadParameter("--input-ids must be non-negative integers")
    return ids


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", default=None, help="The server (default: http://HOST:PORT of the profile's [server]).")
@click.option("--config", "config", default=None, type=click.Path(dir_okay=False), help="TOML config.")
@click.option("--profile", default=None, help="Deployment profile (host, port, thresholds).")
@click.option("--timeout", type=Seconds(1), default=60.0, show_default=True,
              help="Seconds for the whole smoke (every request shares this deadline).")
@click.option("--requests", "n_requests", type=Number(1, 64, integer=True), default=3, show_default=True,
              help="/generate requests.")
@click.option("--max-tokens", type=Number(2, 4096, integer=True), default=64, show_default=True,
              help="Tokens generated per request (greedy).")
@click.option("--fail-below", type=Number(0, MAX_ACCEPT_LENGTH), default=None,
              help="Fail a speculative server whose accept length is below this (default: profile "
                   "[smoke] fail_accept_length_below, else 1.1).")
@click.option("--warn-below", type=Number(0, MAX_ACCEPT_LENGTH), default=None,
              help="Warn below this accept length (default: profile [smoke] warn_accept_length_below).")
@click.option("--input-ids", default=None, help="Prompt token ids for a --skip-tokenizer-init server "
              "(default 5..20).")
@click.option("--api-key", default=None, help=f"The key the server was started with (default ${API_KEY_ENV}).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--strict", is_flag=True, help="Warnings fail too.")
@guarded
def smoke(url: str | None, config: str | None, profile: str | None, timeout: float, n_requests: int,
          max_tokens: int, fail_below: float | None, warn_below: float | None, input_ids: str | None,
          api_key: str | None, fmt: str, strict: bool) -> int:
    """Send a few requests to the running server (OpenAI API and /generate), read back SGLang's
    speculative accept length, report errors and latencies.

    Exit 0 when nothing failed (warnings too, unless --strict), 1 when a request failed, timed out, or the
    accept length says the drafter does not match the target, 2 on bad usage.
    """
    from doctor.core.settings import ConfigError, number
    from doctor.service.http import shown_url
    from doctor.service.readiness import health_url, url_problem
    from doctor.service.smoke import SmokeOptions, render_text, run_smoke

    settings: Any = None
    if url is None or fail_below is None or warn_below is None:
        settings = settings_from({"config": config, "profile": profile})
    if url is None:
        url = health_url(str(settings.server.host), int(settings.server.port), "/")
    why = url_problem(url)
    if why:  # 'http://[::1', a bad port, no host: an invalid invocation (exit 2), never a crash
        raise ConfigError(f"--url {shown_url(url)!r} {why}")

    def threshold(key: str, default: float | None) -> float | None:
        v = getattr(settings.smoke, key) if settings is not None else None
        if v is None:
            return default
        try:  # a TOML number: a string ("1.5") is the wrong type, not a number to parse
            return float(number(v if isinstance(v, (int, float)) else None, f"[smoke] {key}", low=0,
                                high=MAX_ACCEPT_LENGTH))
        except ConfigError as exc:
            click.echo(f"k26-doctor: {exc}", err=True)
            raise Stop(EXIT_USAGE) from None

    opts = SmokeOptions(url.rstrip("/"), timeout_s=timeout, requests=n_requests, max_tokens=max_tokens,
                        api_key=api_key or os.environ.get(API_KEY_ENV) or None,
                        fail_below=fail_below if fail_below is not None
                        else threshold("fail_accept_length_below", 1.1) or 1.1,
                        warn_below=warn_below if warn_below is not None
                        else threshold("warn_accept_length_below", None))
    ids = _ids(input_ids)
    if ids:
        opts.input_ids = ids
    report = run_smoke(opts)
    if fmt == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(render_text(report), nl=False)
    return report.decision(strict).exit_code
