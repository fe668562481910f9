"""``k26-doctor validate``: prove DDTree on this host, with the profile's model, drafter, TP and stack, and
write the site validation record that opens the DDTREE gate (``doctor.sglang.validation``).

Exit codes: 0 pass (or lossless but not faster than DFLASH: recorded, ``launch`` warns naming DFLASH), 1 fail
or undecided (the JSON ``outcome`` tells them apart), 2 invalid invocation.
"""

from __future__ import annotations

import copy
import datetime
import json
import shlex
import signal
import sys
import time
from typing import Any

import click

from doctor.commands.options import Number, Seconds, guarded, settings_from, settings_options, write_requested
from doctor.core.exitcodes import EXIT_FAILED, EXIT_OK

NOT_FASTER = "lossless-not-faster"


def _say(msg: str) -> None:
    from doctor.facts.redaction import redact_text

    click.echo(f"k26-doctor validate: {redact_text(msg)}", err=True)


def _budgets(text: str | None, settings: Any) -> list[int]:
    from doctor.core.settings import ConfigError

    if text:
        try:
            values = [int(x) for x in text.replace(" ", "").split(",") if x]
        except ValueError:
            raise ConfigError(f"--budgets {text!r}: a comma-separated list of integers, e.g. 16,32,64") from None
        if not values or any(v < 1 or v > 4096 for v in values):
            raise ConfigError(f"--budgets {text!r}: each budget from 1 to 4096")
        return list(dict.fromkeys(values))
    budget = settings.server.ddtree_budget
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise ConfigError("the profile sets no [server] ddtree_budget: give --budgets 16,32,64")
    return [budget]


def _facts(settings: Any) -> Any:
    """The run of the gate's check only: its facts are what the record's configuration is read from."""
    from doctor.app import run

    gate = copy.deepcopy(settings)
    gate.only, gate.skip, gate.ignore = ["sglang.ddtree"], [], []
    _report, ctx = run(gate)

    def read(name: str) -> Any:
        try:
            return ctx.facts.get(name)
        except Exception:  # FactUnavailable, a malformed fact: the key it feeds is then unread
            return None

    return read


def configurations(settings: Any, budgets: list[int], extra: list[str], read: Any
                   ) -> tuple[dict[int, dict[str, Any]], dict[str, str]]:
    """The configuration each budget's record would pin, read from the facts as ``sglang.ddtree`` reads it."""
    from doctor.service.launcher import build_server_args
    from doctor.service.validation.servers import Role, role_settings
    from doctor.sglang.ddtree import patch_set, release_options
    from doctor.sglang.validation.siteconfig import site_configuration

    options = release_options(patch_set(settings))
    port = int(settings.server.port or 30000)
    out: dict[int, dict[str, Any]] = {}
    unread: dict[str, str] = {}
    for budget in budgets:
        args = build_server_args(role_settings(settings, Role(f"ddtree-{budget}", "DDTREE", budget), port), extra)[0]
        values, missing = site_configuration(read, (args, None), options, settings)
        out[budget] = values
        unread.update(missing)
    return out, unread


def _lines(result: dict[str, Any]) -> list[str]:
    lines = []
    for budget, v in result["budgets"].items():
        worth = v["worth"]["phases"]
        figures = ", ".join(f"{k}: {w.get('tok_per_s')} tok/s ({w.get('tok_per_s_vs_dflash')}x DFLASH, "
                            f"{w.get('tok_per_s_vs_base')}x base), accept {w.get('accept_len')} "
                            f"({w.get('accept_vs_dflash')}x DFLASH)" for k, w in worth.items())
        lines.append(f"budget {budget}: {v['outcome'].upper()}")
        lines.append(f"  greedy: {v['greedy']['outcome']}: {v['greedy']['why']}")
        lines.append(f"  sampled: {v['sampled']['outcome']}: {v['sampled']['why']}")
        lines.append(f"  refusals: {v['refusals']['outcome']}: {v['refusals']['why']}")
        lines.append(f"  worth: {figures or 'not measured'}")
        lines += [f"  why: {w}" for w in v["why"]]
        if v.get("record"):
            lines.append(f"  record: {v['record']}")
        if v.get("record_error"):
            lines.append(f"  record NOT written: {v['record_error']}")
    if result.get("best_budget") is not None:
        lines.append(f"best budget at {result['concurrency']}: {result['best_budget']}")
    t = result.get("timing")
    if t:
        own = t["overhead_s"] / t["wall_s"] if t["wall_s"] else 0.0
        lines.append(f"timing: {t['wall_s']:.0f} s in all: server starts {t['starts_s']:.0f} s, requests "
                     f"{t['requests_s']:.0f} s, stops {t['stops_s']:.0f} s, the validation's own work "
                     f"{t['overhead_s']:.0f} s ({own:.1%})")
    lines.append(f"outcome: {result['outcome']}")
    return lines


def write_records(settings: Any, result: dict[str, Any], configs: dict[int, dict[str, Any]], host: dict[str, Any],
                  command: str) -> None:
    """A record for each budget that passed (or was lossless but not faster); nothing for the others."""
    from doctor import __version__
    from doctor.core.fileio import describe_error
    from doctor.sglang.validation.record import KIND, SCHEMA_VERSION, write_record

    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for budget, v in result["budgets"].items():
        if v["outcome"] not in ("pass", NOT_FASTER):
            continue
        figures = {k: v[k] for k in ("greedy", "sampled", "refusals", "worth")}
        record = {"kind": KIND, "schema_version": SCHEMA_VERSION, "key": "", "outcome": v["outcome"],
                  "configuration": configs[int(budget)], "host": host, "figures": figures, "date": date,
                  "command": command, "doctor_version": __version__}
        try:
            v["record"] = str(write_record(settings.state_dir, record))
        except (OSError, ValueError) as exc:
            v["record_error"] = describe_error(exc) if isinstance(exc, OSError) else str(exc)
            v["outcome"] = "undecided" if v["outcome"] == "pass" else v["outcome"]
            result["outcome"] = "undecided" if result["outcome"] in ("pass", NOT_FASTER) else result["outcome"]


class _Terminated(BaseException):
    pass


SETTINGS = ("config", "profile", "model_path", "draft_model_path", "python", "tp", "timeout", "verbose", "patches_dir",
            "state_dir", "context_length", "max_running_requests", "cuda_graph_max_bs")
"""The selection flags of ``check``/``launch`` that mean something here (the server is the profile's)."""


def _ddtree_settings(flags: dict[str, Any]) -> Any:
    """The profile's settings, refused (ConfigError) unless they run DDTREE on this host: validate starts real
    servers, so a snapshot or another algorithm has nothing it could prove."""
    from doctor.core.settings import ConfigError

    settings = settings_from(flags)
    if settings.from_snapshot:
        raise ConfigError("validate runs servers on this host: it cannot judge a snapshot")
    algo = str(settings.server.speculative_algorithm or "").upper()
    if algo != "DDTREE":
        raise ConfigError(f"the profile launches {algo or 'no speculative algorithm'}, not DDTREE: nothing to "
                          "validate (set [server] speculative_algorithm = \"DDTREE\")")
    return settings


def _check_prompt_kind(settings: Any, extra: list[str], prompt_set: dict[str, Any]) -> None:
    """Refuse text prompts for a server without a tokenizer (ConfigError): it could not read them."""
    from doctor.core.settings import ConfigError
    from doctor.service.launcher import build_server_args

    args = build_server_args(settings, extra)[0]
    if "--skip-tokenizer-init" in args and prompt_set["kind"] == "text":
        raise ConfigError("the server runs with --skip-tokenizer-init: give --prompts FILE of token ids "
                          "(bench/ddtree/make_trained.py --prompts makes one for the trained pair)")


def _measure(v: Any) -> tuple[bool, str | None]:
    """Run the measurements with SIGTERM/SIGHUP turned into a clean stop: (interrupted, why it stopped early).
    Interrupted: every server is down and the state kept, said here; the handlers are restored either way."""
    from doctor.service.validation.run import Stopped

    def terminate(signum: int, _frame: Any) -> None:
        raise _Terminated(signum)

    old = {s: signal.signal(s, terminate) for s in (signal.SIGTERM, signal.SIGHUP)}
    stopped = None
    try:
        v.opts.resume = False  # the state was loaded above
        v.measure()
    except Stopped as exc:
        stopped = str(exc)
    except (KeyboardInterrupt, _Terminated):
        _say(f"interrupted: every server stopped; the measurements so far are kept in {v.state_path} "
             "(run the same command again to resume)")
        return True, None
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return False, stopped


def _mark_stopped(result: dict[str, Any], stopped: str, state_path: Any) -> None:
    """A run stopped early decides nothing: the outcome and every budget not already failed become undecided."""
    _say(f"{stopped}: stopped cleanly, state kept in {state_path}")
    result["outcome"] = "undecided"
    result["stopped"] = stopped
    for b in result["budgets"].values():
        if b["outcome"] != "fail":
            b["outcome"] = "undecided"
            b["why"] = [*b["why"], stopped]


def _emit(result: dict[str, Any], flags: dict[str, Any]) -> None:
    """Print the outcome as text or JSON, and write it to --output too when asked."""
    lines = _lines(result)  # after the timing: it is one of them
    fmt = flags.get("fmt") or "text"
    text = json.dumps(result, indent=1) + "\n" if fmt == "json" else "\n".join(lines) + "\n"
    if flags.get("output"):
        write_requested(flags["output"], text, "the validation")
    click.echo(text, nl=False)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@settings_options(*SETTINGS, report=False)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="The outcome and figures as text, or as JSON (\"outcome\": pass, lossless-not-faster, fail, "
                   "undecided).")
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="Write the outcome here too.")
@click.option("--budgets", default=None, metavar="B[,B...]",
              help="DDTree budgets to validate, e.g. 16,32,64 (default: the profile's [server] ddtree_budget); "
                   "the best one for --concurrency is reported.")
@click.option("--concurrency", type=Number(1, 1024, integer=True), default=None,
              help="The service's concurrency: worth is judged at c1 and at this (default: the profile's "
                   "[server] max_running_requests, at most 64, else 32).")
@click.option("--time-budget", "time_budget", type=Seconds(1), default=None,
              help="Stop cleanly after SECONDS (servers stopped, state kept): the outcome is then undecided.")
@click.option("--parallel", is_flag=True, help="Start the servers side by side (a model that fits several times "
              "on the GPUs); by default one at a time.")
@click.option("--resume/--restart", default=True, show_default=True,
              help="Reuse the measurements of servers an interrupted validation of this same configuration finished.")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help="A JSON prompt file: text, or token ids for a --skip-tokenizer-init server "
                   "(default: the shipped text prompts).")
@click.option("--port", "port_base", type=Number(1024, 65000, integer=True), default=30100, show_default=True,
              help="The first server's port (the others the next ones).")
@click.option("--samples", type=Number(100, 1000000, integer=True), default=2000, show_default=True,
              help="Samples of one context on each side of the sampled test.")
@click.option("--start-timeout", type=Seconds(1), default=None,
              help="Seconds a server may take to become healthy (default: the profile's start_timeout_s, else 1800).")
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
@guarded
def validate(flags: dict[str, Any], fmt: str, output: str | None, budgets: str | None, concurrency: int | None,
             time_budget: float | None,
             parallel: bool, resume: bool, prompts_file: str | None, port_base: int, samples: int,
             start_timeout: float | None, server_args: tuple[str, ...]) -> int:
    """Prove DDTree on this host and write the record that opens its gate.

    Starts the profile's server exactly as `launch` would, as the base server (no speculation), as DFLASH and as
    DDTREE at each budget, one at a time; compares DDTREE with the base (greedy token identity over c1/c8/c32
    with every divergence probed as a near-tie, the sampled distribution against the base with a control that
    proves the test's power, requests it cannot serve exactly refused) and measures accept length and tokens/s
    against DFLASH and the base. A pass writes the site validation record under the state directory; `check` and
    `launch` then open the DDTREE gate on an exact match, and the patched server checks it again.

    Exit 0: pass (or lossless but not faster than DFLASH: recorded, and `launch` warns naming DFLASH);
    1: fail or undecided (--format json: "outcome"); 2: invalid invocation.
    Extra server flags go after `--`, as with `launch`.
    """
    from doctor.service.validation.run import Options, Validation, expected_duration_s, run_key
    from doctor.sglang.validation import prompts
    from doctor.sglang.validation.record import host_identity
    from doctor.sglang.validation.siteconfig import gpu_uuids

    began = time.monotonic()
    flags = {**flags, "fmt": fmt, "output": output}
    settings = _ddtree_settings(flags)
    chosen = _budgets(budgets, settings)
    conc = concurrency or min(64, int(settings.max_running_requests or 32))
    prompt_set = prompts.load(prompts_file)
    extra = list(server_args)
    _check_prompt_kind(settings, extra, prompt_set)
    timeout = start_timeout or float(settings.server.start_timeout_s or 1800)
    opts = Options(budgets=chosen, concurrency=conc, time_budget_s=time_budget, parallel=parallel, resume=resume,
                   port_base=port_base, start_timeout_s=timeout, samples=samples, extra_args=extra)
    _say("reading this host's configuration (the sglang.ddtree check's facts)")
    read = _facts(settings)
    configs, unread = configurations(settings, chosen, extra, read)
    if unread:
        _say("cannot validate: the configuration a record would pin is not known: " +
             "; ".join(f"{k} ({why})" for k, why in unread.items()))
        return EXIT_FAILED
    host = host_identity(gpu_uuids(read("nvml")))
    key = run_key(settings, opts, prompt_set, configs)
    v = Validation(settings, opts, prompt_set, key, _say, log_stream=sys.stderr)
    v.load_state()
    todo = v.pending()
    est = expected_duration_s(settings, todo, opts)
    _say(f"{len(todo)} server start(s) ({', '.join(r.name for r in todo) or 'none: all measured'}), "
         f"{'side by side' if parallel else 'one at a time'}: expected about {est / 60:.0f} min"
         + (f" (time budget {time_budget:.0f} s)" if time_budget else ""))
    interrupted, stopped = _measure(v)
    if interrupted:
        return EXIT_FAILED
    result = v.judge()
    if stopped:
        _mark_stopped(result, stopped, v.state_path)
    else:
        from doctor.facts.redaction import redact_argv

        write_records(settings, result, configs, host, shlex.join(redact_argv(["k26-doctor", *sys.argv[1:]])))
    wall = time.monotonic() - began  # the whole command: the facts read first included
    result["timing"] = {"wall_s": round(wall, 2), **{k: round(t, 2) for k, t in v.timing.items()},
                        "overhead_s": round(wall - sum(v.timing.values()), 2)}
    result["state"] = str(v.state_path)
    _emit(result, flags)
    return EXIT_OK if result["outcome"] in ("pass", NOT_FASTER) else EXIT_FAILED
