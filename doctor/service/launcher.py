"""The SGLang server command and environment of a profile, and the exec that starts it.

One place builds the command, so that ``launch``, ``launch --dry-run``, the ``sglang.flags`` check
and the systemd unit all agree on what will run::

    <python> -m sglang.launch_server --model-path M --tp-size N --trust-remote-code
        --speculative-algorithm DDTREE --speculative-draft-model-path D --speculative-ddtree-budget B
        --attention-backend triton --mem-fraction-static F [--context-length C] [--max-running-requests R]
        [--cuda-graph-max-bs-decode B] --host H --port P
        <profile [server] args> <anything after -- on the command line>

A flag given later (profile ``args``, then the command line) replaces the same flag built from the
profile keys, instead of passing it twice. The environment is the doctor's own with the profile's
``[server.env]`` filling in what the site leaves unset, then the site's ``server.env_file`` over it,
as systemd composes a unit's environment; a variable the site pins is never replaced. A DDTREE profile's
server also gets ``SGLANG_DDTREE_SITE_RECORD``: the directory of this host's site validation records
(``k26-doctor validate``), where the patched server looks for the record that opens its gate.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any

from doctor.core.fileio import read_text
from doctor.core.settings import ConfigError, Settings
from doctor.facts.redaction import redact_pair

SERVER_MODULE = "sglang.launch_server"
MODEL_PLACEHOLDER = "<model-path>"
DRAFT_PLACEHOLDER = "<draft-model-path>"


@dataclass
class LaunchPlan:
    """What ``launch`` will exec: ``argv`` (no shell) and the full environment."""

    argv: list[str]
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)  # e.g. a profile env value the site overrides
    replaced: list[str] = field(default_factory=list)  # built flags replaced by later ones

    @property
    def server_args(self) -> list[str]:
        """The arguments SGLang's parser sees (after ``-m sglang.launch_server``)."""
        return self.argv[3:]


def _option_name(arg: str) -> str | None:
    if arg.startswith("--"):
        return arg.split("=", 1)[0]
    return None


def _groups(args: list[str]) -> list[list[str]]:
    """Split an argv into [option, values...] groups (a leading non-option forms its own group)."""
    out: list[list[str]] = []
    for arg in args:
        if _option_name(arg) is not None or not out:
            out.append([arg])
        else:
            out[-1].append(arg)
    return out


def _canonical(name: str, table: dict[str, dict[str, Any]] | None) -> str:
    """The flag's destination when the SGLang flag table is known (aliases collapse), else its name."""
    if table and name in table:
        return "dest:" + str(table[name].get("dest", name))
    return name


def merge_args(base: list[str], later: list[str], table: dict[str, dict[str, Any]] | None = None
               ) -> tuple[list[str], list[str]]:
    """``base`` + ``later``, dropping from ``base`` every flag that ``later`` sets again."""
    later_names = {_canonical(n, table) for n in (_option_name(a) for a in later) if n}
    kept: list[str] = []
    replaced: list[str] = []
    for group in _groups(base):
        name = _option_name(group[0])
        if name and _canonical(name, table) in later_names:
            replaced.append(name)
            continue
        kept.extend(group)
    return kept + list(later), replaced


def _number(value: Any, key: str, kind: type, low: float | None = None, high: float | None = None) -> Any:
    """``value`` (the profile's ``key``) as a number of ``kind`` within ``[low, high]``; None stays None."""
    if value is None:
        return None
    try:
        num = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a number, got {value!r}") from None
    if isinstance(value, bool) or (kind is int and isinstance(value, float) and value != int(value)):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if (low is not None and num < low) or (high is not None and num > high):
        raise ConfigError(f"{key} = {value!r} is out of range [{low}, {high}]")
    return num


def _string_list(value: Any, key: str) -> list[str]:
    value = value or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key} must be a list of strings (one argv element each), got {value!r}")
    return list(value)


def planned_args(settings: Settings) -> tuple[list[str], ConfigError | None]:
    """The server's arguments as the checks read them (placeholders where a path is not configured), or ``[]``
    and why the settings cannot build them: the checks that read the command judge the same one."""
    try:
        return build_server_args(settings, placeholders=True)[0], None
    except ConfigError as exc:
        return [], exc


def _model_args(settings: Settings, placeholders: bool) -> list[str]:
    """The model and how it is split: path, TP, PP and DP beyond 1, remote code (Kimi's config needs it)."""
    model = settings.model_path
    if not model:
        if not placeholders:
            raise ConfigError("no model path: give --model-path or set [model] path in the config")
        model = MODEL_PLACEHOLDER
    args = ["--model-path", model, "--tp-size", str(settings.tp)]
    pp = _number(settings.parallel.pp, "parallel.pp", int, 1)
    dp = _number(settings.parallel.dp, "parallel.dp", int, 1)
    if pp and pp > 1:
        args += ["--pp-size", str(pp)]
    if dp and dp > 1:
        args += ["--dp-size", str(dp)]
    if settings.model.trust_remote_code is not False:  # a bool or left out (validate_profile): on unless false
        args.append("--trust-remote-code")
    return args


def _speculative_args(settings: Settings, placeholders: bool) -> list[str]:
    """The speculative algorithm with its draft model (and DDTree's budget), or nothing without one."""
    algorithm = settings.server.speculative_algorithm
    if not algorithm:
        return []
    if not isinstance(algorithm, str):
        raise ConfigError(f"server.speculative_algorithm must be a string, got {algorithm!r}")
    draft = settings.draft_model_path
    if not draft:
        if not placeholders:
            raise ConfigError(f"speculative algorithm {algorithm} needs a draft model: give "
                              "--draft-model-path or set [drafter] path in the config")
        draft = DRAFT_PLACEHOLDER
    args = ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", draft]
    budget = _number(settings.server.ddtree_budget, "server.ddtree_budget", int, 1)
    if algorithm.upper() == "DDTREE" and budget is not None:
        args += ["--speculative-ddtree-budget", str(budget)]
    return args


def _serving_args(settings: Settings) -> list[str]:
    """Memory, sizes and where it listens: the attention backend, the static memory fraction, context length,
    running requests, CUDA graph batch size, host, port and the API key a server beyond loopback asks for."""
    args: list[str] = []
    backend = settings.server.attention_backend
    if backend:
        args += ["--attention-backend", str(backend)]
    mem = _number(settings.server.mem_fraction_static, "server.mem_fraction_static", float, 0.0, 1.0)
    if mem is not None:
        args += ["--mem-fraction-static", f"{mem:g}"]
    for flag, value in (("--context-length", settings.context_length),
                        ("--max-running-requests", settings.max_running_requests),
                        ("--cuda-graph-max-bs-decode", settings.cuda_graph_max_bs)):
        if value is not None:
            args += [flag, str(value)]
    host = settings.server.host
    port = _number(settings.server.port, "server.port", int, 1, 65535) or 30000
    args += ["--host", str(host), "--port", str(port)]
    api_key = settings.server.api_key
    if api_key:  # host.exposure: a server beyond loopback asks for it
        if not isinstance(api_key, str):
            raise ConfigError("server.api_key must be a string")
        args += ["--api-key", api_key]
    return args


def build_server_args(settings: Settings, extra: list[str] | tuple[str, ...] = (), *,
                      table: dict[str, dict[str, Any]] | None = None,
                      placeholders: bool = False) -> tuple[list[str], list[str]]:
    """The server's arguments from settings; returns ``(args, replaced flag names)``.

    ``placeholders``: put ``<model-path>`` where a path is not configured (for the flag check),
    instead of raising ``ConfigError``.
    """
    args = _model_args(settings, placeholders) + _speculative_args(settings, placeholders) + _serving_args(settings)
    later = _string_list(settings.server.args, "server.args") + list(extra)
    return merge_args(args, later, table)


def resolve_python(python: str) -> str:
    """An absolute interpreter path (exec needs one); a bare name is looked up on PATH."""
    if os.sep in python:
        return python
    found = shutil.which(python)
    if not found:
        raise ConfigError(f"interpreter {python!r} not found on PATH; give --python /path/to/venv/bin/python")
    return found


def build_env(settings: Settings, environ: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The server's environment and notes on profile values that the site's pins override.

    As systemd builds it, and as the ``env`` fact (``host.env``) judges it: the process environment,
    the profile's ``[server.env]`` for what that leaves unset, then the profile's ``server.env_file``
    (the unit's EnvironmentFile) over both. Safety variables a site sets (CUDA_VISIBLE_DEVICES,
    NCCL_*) are never replaced by the profile. The interpreter's directory goes first on PATH, as the venv's
    ``activate`` would put it (FlashInfer's JIT runs the ``ninja`` pip installed there).
    """
    from doctor.host.facts import parse_env_file, with_interpreter_bin

    env = dict(os.environ if environ is None else environ)
    notes: list[str] = []
    profile_env = settings.server.env or {}
    if not isinstance(profile_env, dict):
        raise ConfigError("[server.env] must be a table of NAME = \"value\"")
    wanted: dict[str, str] = {}
    for key, value in profile_env.items():
        if isinstance(value, (dict, list)):
            raise ConfigError(f"[server.env] {key} must be a string, number or boolean")
        text = ("1" if value else "0") if isinstance(value, bool) else str(value)
        wanted[str(key)] = text
        if key in env and env[key] != text:
            notes.append(f"{key}={redact_pair(key, env[key])} pinned by the site is kept (profile wants "
                         f"{redact_pair(key, text)})")
            continue
        env[str(key)] = text
    env_file = settings.server.env_file
    if env_file:
        try:
            file_vars = parse_env_file(read_text(os.path.expanduser(str(env_file)), 1 << 20, "an environment file",
                                                 errors="replace"))
        except OSError:
            file_vars = {}  # absent or unreadable: host.env reports it
        for key, value in file_vars.items():
            if key in wanted and wanted[key] != value and env.get(key) == wanted[key]:
                notes.append(f"{key}={redact_pair(key, value)} pinned by {env_file} is kept (profile wants "
                             f"{redact_pair(key, wanted[key])})")
            env[key] = value
    if str(settings.server.speculative_algorithm or "").upper() == "DDTREE":
        from doctor.sglang.validation.record import RECORD_ENV, records_dir

        # the patched server opens DDTREE's gate on a site validation record of this host (launch narrows this to
        # the record the sglang.ddtree check matched); a site's own value is kept
        env.setdefault(RECORD_ENV, str(records_dir(settings.state_dir)))
    return with_interpreter_bin(env, settings.python), notes


def build_plan(settings: Settings, extra: list[str] | tuple[str, ...] = (), *,
               environ: dict[str, str] | None = None,
               table: dict[str, dict[str, Any]] | None = None) -> LaunchPlan:
    """The full plan: interpreter, arguments and environment. Raises ``ConfigError``."""
    args, replaced = build_server_args(settings, extra, table=table)
    env, notes = build_env(settings, environ)
    argv = [resolve_python(settings.python), "-m", SERVER_MODULE, *args]
    notes += [f"{name} from the profile is replaced by the one given later" for name in replaced]
    return LaunchPlan(argv, env, notes, replaced)


def exec_plan(plan: LaunchPlan) -> None:  # pragma: no cover - replaces the process (tested via subprocess)
    """Replace this process with the server (no shell). Returns only by raising ``OSError``."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(plan.argv[0], plan.argv, plan.env)
