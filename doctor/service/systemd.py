"""The systemd unit of the service: checked before every start, ready only when SGLang answers.

* ``ExecStartPre=`` runs ``k26-doctor check --import-sglang`` (fast tier: no ``--deep``, but SGLang is
  imported for real, as ``launch``'s own gate does) with the same config and
  profile, so a host that cannot serve never starts the server; it first waits (``--wait-fabric``,
  the profile's ``[gpu] fabric_wait_s``) for the NVSwitch fabric, which registers minutes after boot.
* ``ExecStart=`` runs ``k26-doctor launch --no-check --wait``: no second check run (the flag check
  against SGLang's sources stays: it is cheap and judges the exact argv), the server as a child,
  ``READY=1`` to systemd (``Type=notify``) once ``/health`` answers 200, signals forwarded.
* ``TimeoutStartSec=`` covers the checks, the fabric wait, reading the weights (~595 GB) and CUDA graph capture.
* ``Restart=on-failure`` with ``RestartPreventExitStatus=2 3``: 2 is an invalid configuration
  (the doctor's) or an argparse rejection (SGLang's), 3 a doctor that could not run; restarting
  cannot fix either. systemd tests that list against the main process only, so a failing
  ``ExecStartPre`` (exit 1: a check failed) is bounded by ``StartLimitBurst=`` instead.
* A sandbox that a GPU server survives: a dedicated ``User=`` (``--user``, ``[server] user``, default
  ``sglang``), ``NoNewPrivileges=``, no capabilities, ``ProtectSystem=strict`` with the caches, state and
  logs it writes (Triton, Hugging Face, FlashInfer's JIT cache under ``CacheDirectory=``; the state
  directory; ``LogsDirectory=``; the site's own ``TRITON_CACHE_DIR``/``HF_HOME``/... and
  ``[server] read_write_paths``) as the only writable paths, ``PrivateTmp=``, the kernel and control
  groups read-only, and ``DevicePolicy=closed`` with ``DeviceAllow=char-nvidia* rw`` (every NVIDIA
  device group: /dev/nvidia*, nvidia-uvm, nvidia-caps, nvswitch). ``/dev/shm`` stays shared (NCCL),
  and ``MemoryDenyWriteExecute=`` is not set: Triton, CUDA and torch JIT code at run time.
* ``PATH`` starts with the service interpreter's ``bin``: FlashInfer's JIT runs the ``ninja`` that pip installs
  there, which systemd's default PATH lacks; ``SGLANG_CACHE_DIR`` (where SGLang points FlashInfer's cache)
  is under ``CacheDirectory=``. ``sglang.install`` judges both in ``ExecStartPre``.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from doctor import __version__
from doctor.core.fileio import read_text
from doctor.core.settings import ConfigError, Settings
from doctor.host.access import Account, account, describe, first_denied
from doctor.python.interpreter import needed_paths

WEIGHTS_BYTES_DEFAULT = 595e9 + 6.5e9  # Kimi K2.6 INT4 (~595 GB) + the DFlash drafter (~6.5 GB)
MIN_READ_BYTES_PER_S = 1.0e9  # cold page cache, one NVMe namespace, TP8 ranks reading concurrently
GRAPH_CAPTURE_S = 600  # CUDA graph capture + warm-up for every batch size, DDTree verify graphs
SMOKE_S = 120  # ExecStartPost: k26-doctor smoke's deadline
CHECKS_S = 180  # ExecStartPre: the fast check tier with its per-check deadlines
DEFAULT_UNIT = "sglang-k26-ddtree.service"
DEFAULT_USER = "sglang"
DEFAULT_STATE_DIR = "/var/lib/k26-doctor"
SERVICE_DIR_NAME = "sglang-k26"  # CacheDirectory=, StateDirectory= and LogsDirectory= of the server
CACHE_VARS = ("TRITON_CACHE_DIR", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "FLASHINFER_WORKSPACE_BASE",
              "SGLANG_CACHE_DIR",
              "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "SGLANG_LOG_DIR", "TMPDIR", "HOME")


def weights_bytes(settings: Settings) -> tuple[float, str]:
    """Bytes to read at start: the shards on disk when readable, else the K2.6 figure."""
    total = 0.0
    seen = False
    for path in (settings.model_path, settings.draft_model_path):
        if not path:
            continue
        try:
            for f in Path(path).glob("*.safetensors"):
                total += f.stat().st_size
                seen = True
        except OSError:
            continue
    if seen and total > 1e9:
        return total, "measured from the shards on disk"
    return WEIGHTS_BYTES_DEFAULT, "Kimi K2.6 + drafter, nominal"


def start_timeout(settings: Settings, override: float | None = None) -> tuple[int, str]:
    """``TimeoutStartSec`` in seconds and how it was sized."""
    if override:
        return int(override), "given on the command line"
    size, how = weights_bytes(settings)
    load = size / MIN_READ_BYTES_PER_S
    fabric = fabric_wait(settings)
    computed = CHECKS_S + fabric + load + GRAPH_CAPTURE_S
    profile = settings.server.start_timeout_s
    chosen = max(computed, float(profile or 0))
    why = (f"checks {CHECKS_S}s" + (f" + fabric wait {fabric:g}s" if fabric else "")
           + f" + weights {size / 1e9:.0f} GB ({how}) at >= {MIN_READ_BYTES_PER_S / 1e9:g} GB/s "
           f"= {load:.0f}s + CUDA graphs/warm-up {GRAPH_CAPTURE_S}s = {computed:.0f}s"
           + (f"; profile start_timeout_s {profile}" if profile else ""))
    return int(math.ceil(chosen / 60.0) * 60), why


def fabric_wait(settings: Settings) -> float:
    """Seconds ExecStartPre waits for NVSwitch fabric registration: --wait-fabric, else [gpu] fabric_wait_s."""
    value = settings.wait_fabric if settings.wait_fabric is not None else settings.fabric_wait_s
    return float(value or 0)


def doctor_command() -> list[str]:
    """How systemd should call this doctor: the console script if installed, else ``python -m doctor``."""
    script = shutil.which("k26-doctor")
    if script:
        return [str(Path(script).resolve()) if not Path(script).is_absolute() else script]
    return [sys.executable, "-m", "doctor"]


class EnvRef(str):
    """An argument systemd fills in from the unit's environment (``${NAME}``, one argument): a secret the unit
    reads from its ``EnvironmentFile=`` instead of holding it."""


class UnitValueError(ConfigError):
    """A value that cannot go into a unit file (exit 2)."""


CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def unit_value(value: str, what: str, *, secret: bool = False) -> str:
    """``value`` when it can stand in a unit line: a newline (or any control character) would end the line and
    let the rest be read as directives of its own (``--model-path $'/m\nExecStartPre=/bin/evil'``). A
    ``secret`` one is refused without being quoted (a message is no place for a key, however mangled)."""
    if CONTROL.search(value):
        shown = f"(its {len(value)} characters not shown)" if secret else repr(value)
        raise UnitValueError(f"{what} {shown} holds a newline or another control character: it cannot be "
                             "written into a unit file (it would inject lines); fix the value")
    return value


def _quote(argv: list[str]) -> str:
    """systemd command-line quoting: shell-like; ``%`` and ``$`` must be doubled/escaped; an ``EnvRef``
    becomes ``${NAME}``. A value with a control character is refused (``unit_value``)."""
    out = []
    for arg in argv:
        if isinstance(arg, EnvRef):
            out.append("${" + str(arg) + "}")
            continue
        arg = unit_value(arg, "the command-line argument").replace("%", "%%").replace("$", "$$")
        out.append(shlex.quote(arg) if arg and not any(c in arg for c in "'") else '"' + arg.replace("\\", "\\\\")
                   .replace('"', '\\"') + '"')
    return " ".join(out)


def exec_line(argv: list[str]) -> str:
    """An ``Exec*=`` command line for ``argv``, quoted and escaped as systemd reads it."""
    return _quote(argv)


def absolute(path: str) -> str:
    """systemd runs commands from ``/``: a relative path given here must become the one it meant here."""
    return os.path.abspath(os.path.expanduser(path))


def selection_args(settings: Settings, config: str | None) -> list[str]:
    """The flags that make ExecStartPre and ExecStart see the same host, profile and model (paths absolute)."""
    args: list[str] = []
    if config:
        args += ["--config", absolute(config)]
    profile = settings.profile_name
    args += ["--profile", absolute(profile) if profile.endswith(".toml") else profile]
    if settings.python_given:
        python = settings.python
        args += ["--python", absolute(python) if os.sep in python else python]
    if not config:  # without a config file the paths must travel as flags
        if settings.model_path:
            args += ["--model-path", absolute(settings.model_path)]
        if settings.draft_model_path:
            args += ["--draft-model-path", absolute(settings.draft_model_path)]
        if settings.tp != int(settings.parallel.tp or settings.tp):
            args += ["--tp", str(settings.tp)]
        if settings.patches_dir:
            args += ["--patches-dir", absolute(settings.patches_dir)]
        if settings.state_dir and settings.state_dir != DEFAULT_STATE_DIR:
            args += ["--state-dir", absolute(settings.state_dir)]
    return args


def service_env_values(settings: Settings) -> dict[str, str]:
    """The cache/log variables the site sets: the profile's [server.env] and its environment file."""
    from doctor.host.facts import parse_env_file

    env = {str(k): str(v) for k, v in (settings.server.env or {}).items()
           if isinstance(v, (str, int, float))}
    env_file = settings.server.env_file
    if env_file:
        try:
            env.update(parse_env_file(read_text(os.path.expanduser(str(env_file)), 1 << 20, "an environment file",
                                                errors="replace")))
        except OSError:
            pass
    return env


def writable_paths(settings: Settings) -> list[str]:
    """Where the service writes besides the directories systemd creates for it: the state directory, the
    caches and logs the site points elsewhere, and ``[server] read_write_paths``."""
    paths: list[str] = []
    if settings.state_dir and settings.state_dir != DEFAULT_STATE_DIR:
        paths.append(absolute(settings.state_dir))
    env = service_env_values(settings)
    for var in CACHE_VARS:
        value = env.get(var)
        if value and os.path.isabs(os.path.expanduser(value)) and var not in ("TMPDIR",):
            paths.append(absolute(value))
    extra = settings.server.read_write_paths or []
    paths += [absolute(p) for p in extra if isinstance(p, str) and p]
    return list(dict.fromkeys(paths))


# The kernel, clock, host name and control groups out of reach, no set-uid, realtime or new namespaces: the
# server's unit and the periodic checks' (doctor/service/timer.py) alike.
KERNEL_PROTECTION = (
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "RestrictSUIDSGID=yes",
    "RestrictRealtime=yes",
    "RestrictNamespaces=yes",
    "LockPersonality=yes",
)


def hardening_lines(settings: Settings, user: str) -> list[str]:
    """The sandbox (see the module docstring); each line keeps the GPU server working."""
    rw = writable_paths(settings)
    state = "k26-doctor" if settings.state_dir in (None, DEFAULT_STATE_DIR) else ""
    lines = [
        "# Sandbox. The server runs as an unprivileged user on a read-only system; only its caches, state and",
        "# logs are writable. Create the user once: useradd --system --home-dir /var/lib/sglang-k26 "
        f"--shell /usr/sbin/nologin {user}",
        f"User={user}",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "PrivateTmp=yes",
        f"StateDirectory={SERVICE_DIR_NAME}" + (f" {state}" if state else ""),
        f"CacheDirectory={SERVICE_DIR_NAME}",
        f"LogsDirectory={SERVICE_DIR_NAME}",
    ]
    if rw:
        lines.append("# Caches, logs and state the site keeps elsewhere ('-': not an error if absent).")
        lines.append("ReadWritePaths=" + " ".join(_quote(["-" + p]) for p in rw))
    lines += [
        "# HOME and the JIT caches (Triton, FlashInfer, Hugging Face) under the service's own directories;",
        "# the EnvironmentFile below overrides them.",
        f"Environment=HOME=%S/{SERVICE_DIR_NAME}",
        f"Environment=TRITON_CACHE_DIR=%C/{SERVICE_DIR_NAME}/triton",
        f"Environment=XDG_CACHE_HOME=%C/{SERVICE_DIR_NAME}",
        f"Environment=HF_HOME=%C/{SERVICE_DIR_NAME}/huggingface",
        f"Environment=SGLANG_CACHE_DIR=%C/{SERVICE_DIR_NAME}/sglang",
        f"Environment=SGLANG_LOG_DIR=%L/{SERVICE_DIR_NAME}",
        "# CUDA needs every NVIDIA device node (/dev/nvidia*, nvidia-uvm, nvidia-caps, nvswitch); /dev/shm (NCCL)",
        "# is a filesystem and stays shared. Triton and CUDA JIT code at run time: MemoryDenyWriteExecute is off.",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia* rw",
        *KERNEL_PROTECTION,
        "SystemCallArchitectures=native",
        "# Only groups no GPU server calls (NUMA binding, affinity, chown, ptrace-like calls stay allowed);",
        "# a denied call fails with EPERM instead of killing the process.",
        "SystemCallFilter=~@clock @cpu-emulation @module @mount @obsolete @raw-io @reboot @swap",
        "SystemCallErrorNumber=EPERM",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "PrivateMounts=yes",
        "RemoveIPC=yes",
        "KeyringMode=private",
        "UMask=0027",
        "# Not set, on purpose: PrivateDevices (hides the GPUs), MemoryDenyWriteExecute (Triton/CUDA JIT),",
        "# ProtectProc=invisible (ExecStartPre's gpu.idle must see other users' GPU processes), ProcSubset=pid",
        "# (psutil reads /proc/meminfo), PrivateNetwork (it serves HTTP).",
    ]
    return lines


def _interpreter_paths(settings: Settings, doctor: list[str]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(what, path, need) for the doctor's and the service's interpreters with everything they load, and why an
    interpreter's loads are unknown: a venv links into its base Python, which may sit where the user cannot
    go (a pyenv Python under ``/root``), so the links are followed, not only the venv's own path judged."""
    wanted: list[tuple[str, str, str]] = []
    reasons: list[str] = []
    pythons = dict.fromkeys(p for p in (settings.python, _script_interpreter(doctor[0]) if doctor else None) if p)
    for python in pythons:
        if os.sep not in python:
            continue
        needed, why = needed_paths(python)
        label = "the service's interpreter" if python == settings.python else "the doctor's interpreter"
        wanted.extend((f"{label}: {what}" if what != "the interpreter" else label, path, need)
                      for what, path, need in needed)
        if why:
            reasons.append(f"{python} did not say what it loads ({why}): only its path was judged")
    return wanted, reasons


_Blocked = dict[str, tuple[dict[str, Any], dict[str, str]]]  # denied path -> (the denial, {what: path})


def _blocked_paths(wanted: list[tuple[str, str, str]], who: Account) -> _Blocked:
    """Denied path -> (the denial, {what: the path asked for}): many wanted paths (a venv's files) fail on one
    directory, and the note names that directory once instead of once per file."""
    blocked: dict[str, tuple[dict[str, Any], dict[str, str]]] = {}
    for what, path, need in wanted:
        if not path or os.sep not in path:
            continue
        denied = first_denied(path, who, need)
        if denied is not None:
            entry = blocked.setdefault(denied["path"], (denied, {}))
            entry[1].setdefault(what.split(": ")[0], path)
    return blocked


def _denial_note(user: str, where: str, denied: dict[str, Any], whats: dict[str, str]) -> str:
    """One blocked directory or file, what it stops the service from using, and the two ways out."""
    is_dir = bool((denied["access"] or {}).get("is_dir"))
    verb = ("enter" if is_dir else "execute") if denied["need"] == "x" else "read"
    names = "; ".join(f"{what} {path}" + ("" if path == where or path.startswith(where + os.sep) else
                                           f" (it resolves into {where})") for what, path in whats.items())
    return (f"{user} cannot {verb} {where} ({describe(denied['access'] or {})}), so the service cannot use "
            f"{names}: install them where {user} can read them, or run as another --user")


def reachability_notes(settings: Settings, doctor: list[str], user: str) -> list[str]:
    """What the service's user will not be able to reach, judged for that user from mode bits, owners and its
    groups (``doctor.host.access.first_denied``): the doctor and the interpreter it runs under, the service's
    interpreter with everything it needs to start (symlinks resolved: a venv made from a pyenv Python under
    ``/root``, mode 0700, links into it), the config, the model directories."""
    if user == "root":
        return []
    who = account(user)
    wanted: list[tuple[str, str, str]] = []
    if doctor and os.sep in doctor[0]:
        wanted.append(("the doctor", doctor[0], "x"))
    interpreters, reasons = _interpreter_paths(settings, doctor)
    wanted += interpreters
    wanted += [("the config", str(settings.config_path or ""), "r"),
               ("the model", str(settings.model_path or ""), "rx"),
               ("the draft model", str(settings.draft_model_path or ""), "rx")]
    notes = [_denial_note(user, where, denied, whats)
             for where, (denied, whats) in _blocked_paths(wanted, who).items()]
    if notes and not who.exists:
        notes.append(f"{user} does not exist yet (useradd --system --shell /usr/sbin/nologin {user}): judged as a "
                     "user who owns none of these and is in none of their groups")
    return notes + reasons


def _script_interpreter(script: str) -> str | None:
    """The interpreter a console script runs (its shebang), e.g. the doctor's own venv."""
    from doctor.python.facts import read_shebang

    return read_shebang(Path(script)) if os.path.isfile(script) else None


SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def service_user(settings: Settings, user: str | None) -> str:
    """``--user``, else ``[server] user``, else ``sglang``: never root by default."""
    return user or str(settings.server.user or DEFAULT_USER)


SECRET_VAR_PREFIX = "K26_SERVER_"


def split_secrets(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Server arguments with the value of every secret flag (``--api-key X``, ``--api-key=X``, an abbreviation)
    replaced by an ``EnvRef`` to a variable of the unit's secrets file, and those variables' values."""
    from doctor.facts.redaction import is_secret_flag

    out: list[str] = []
    secrets: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if is_secret_flag(name) and (eq or i + 1 < len(args)):
            var = SECRET_VAR_PREFIX + re.sub(r"[^A-Z0-9]", "_", name[2:].upper())
            secrets[var] = value if eq else args[i + 1]
            out += [name, EnvRef(var)]
            i += 1 if eq else 2
            continue
        out.append(arg)
        i += 1
    return out, secrets


def secrets_file_text(secrets: dict[str, str]) -> str:
    """The unit's secrets file (``EnvironmentFile=`` syntax, values quoted literally)."""
    lines = ["# Secrets of the server's command line, read by the unit (EnvironmentFile=). Keep it mode 0600."]
    for var, value in secrets.items():
        unit_value(value, f"the value of {var}", secret=True)
        if "'" not in value:
            lines.append(f"{var}='{value}'")
        else:
            escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
            lines.append(f'{var}="{escaped}"')
    return "\n".join(lines) + "\n"


def unit_inputs(settings: Settings, config: str | None, doctor: list[str], user: str | None,
                extra: list[str]) -> list[tuple[str, str]]:
    """Every value of the settings, flags and config that goes into the unit, with what it is."""
    values: list[tuple[str, Any]] = [
        ("--model-path", settings.model_path), ("--draft-model-path", settings.draft_model_path),
        ("--python", settings.python), ("--config", config), ("--profile", settings.profile_name),
        ("--user", user), ("[server] user", settings.server.user), ("--state-dir", settings.state_dir),
        ("--patches-dir", settings.patches_dir), ("[server] unit", settings.server.unit),
        ("[server] env_file", settings.server.env_file), ("[model] repo", settings.model.repo),
    ]
    values += [("[server] read_write_paths", p) for p in settings.server.read_write_paths or []]
    values += [("--doctor", d) for d in doctor] + [("a server argument", a) for a in extra]
    return [(what, str(v)) for what, v in values if v is not None and not isinstance(v, EnvRef)]


def render_unit(settings: Settings, *, config: str | None, doctor: list[str] | None = None,
                user: str | None = None, timeout_override: float | None = None,
                extra: list[str] | None = None, diagnose_on_failure: bool = True, harden: bool = True,
                smoke: bool = False, secrets_file: str | None = None) -> str:
    """The unit file text; ``smoke``: an ``ExecStartPost`` running ``k26-doctor smoke`` once the server is ready;
    ``harden``: the sandbox (``hardening_lines``); ``secrets_file``: the ``EnvironmentFile=`` holding the values
    ``extra`` refers to (``split_secrets``). A value with a newline or another control character anywhere is
    refused (``UnitValueError``, exit 2): it would inject directives."""
    doctor = doctor or doctor_command()
    for what, value in unit_inputs(settings, config, doctor, user, list(extra or [])):
        unit_value(value, what)
    sel = selection_args(settings, config)
    timeout, why = start_timeout(settings, timeout_override)
    unit = str(settings.server.unit if settings.server.unit is not None else DEFAULT_UNIT)
    env_file = settings.server.env_file
    # --import-sglang: the fast tier finds SGLang's files; before a start, `import sglang` is worth its seconds.
    pre = [*doctor, "check", *sel, "--import-sglang", "--format", "text"]
    if fabric_wait(settings):  # after boot the fabric takes minutes to register: wait, bounded, then judge
        pre += ["--wait-fabric", f"{fabric_wait(settings):g}"]
    # The doctor gives up (and stops the server, exit 1) just before systemd would kill it: a clear
    # message in the journal instead of a bare "start operation timed out".
    wait = max(60, int(timeout - CHECKS_S - fabric_wait(settings) - (SMOKE_S if smoke else 0)))
    start = [*doctor, "launch", *sel, "--no-check", "--wait", "--wait-timeout", str(wait)]
    if extra:
        start += ["--", *extra]
    lines = [
        f"# {unit}: generated by k26-doctor {__version__} (profile {settings.profile_name}).",
        "# Regenerate rather than edit: k26-doctor systemd-unit " + " ".join(shlex.quote(a) for a in sel),
        "[Unit]",
        f"Description=SGLang server for {settings.model.repo if settings.model.repo is not None else 'Kimi K2.6'} "
        f"({settings.profile_name}, TP{settings.tp}), gated by k26-doctor",
        "After=network-online.target nvidia-persistenced.service nvidia-fabricmanager.service",
        "Wants=network-online.target",
        "# A failing ExecStartPre (a check failed: exit 1) is not covered by RestartPreventExitStatus;",
        "# at most 3 starts per hour, then the unit stays failed until `systemctl reset-failed`.",
        "StartLimitIntervalSec=3600",
        "StartLimitBurst=3",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
    ]
    if harden:
        lines += hardening_lines(settings, service_user(settings, user))
    elif user:
        lines.append(f"User={user}")
    if env_file:
        lines.append("# The site's pins (CUDA_VISIBLE_DEVICES, NCCL_*...): kept over the profile's [server.env].")
        lines.append(f"EnvironmentFile=-{env_file}")
    if secrets_file:
        lines.append("# Secrets of the server's command line (--api-key...): in this file (mode 0600), not in the")
        lines.append("# unit, which every user can read (systemctl cat).")
        lines.append(f"EnvironmentFile={secrets_file}")
    if config:
        lines.append(f"Environment={_quote(['K26_DOCTOR_CONFIG=' + config])}")
    from doctor.host.facts import interpreter_bin_dir

    bin_dir = interpreter_bin_dir(settings.python)
    if bin_dir:
        lines.append("# The service interpreter's bin first on PATH: FlashInfer's JIT runs the `ninja` pip put there,")
        lines.append("# and systemd's default PATH does not have it (EnvironmentFile overrides this).")
        lines.append(f"Environment={_quote(['PATH=' + bin_dir + ':' + SYSTEMD_DEFAULT_PATH])}")
    lines += [
        "Environment=PYTHONUNBUFFERED=1",
        f"ExecStartPre={_quote(pre)}",
        f"ExecStart={_quote(start)}",
    ]
    if smoke:
        post = [*doctor, "smoke", *(["--config", config] if config else []), "--profile", settings.profile_name,
                "--timeout", str(SMOKE_S)]
        lines.append("# After READY=1: real requests; an error, a timeout or a drafter that does not match the target")
        lines.append("# (accept length ~1) fails the start.")
        lines.append(f"ExecStartPost={_quote(post)}")
    if diagnose_on_failure:
        lines.append("# After a failed start, map the journal to the check that would have caught it.")
        lines.append(f"ExecStopPost=-{_quote([*doctor, 'diagnose', '--journal', '%n', '--on-service-failure'])}"
                     .replace("%%n", "%n"))
    lines += [
        f"# {why}",
        f"TimeoutStartSec={timeout}",
        "TimeoutStopSec=120",
        "KillMode=control-group",
        "Restart=on-failure",
        "RestartSec=30",
        "RestartPreventExitStatus=2 3",
        "LimitNOFILE=1048576",
        "LimitMEMLOCK=infinity",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)
