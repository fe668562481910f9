"""The systemd unit of the service: checked before every start, ready only when SGLang answers.

* ``ExecStartPre=`` runs ``k26-doctor check`` (fast tier: no ``--deep``) with the same config and
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
"""

from __future__ import annotations

import math
import shlex
import shutil
import sys
from pathlib import Path

from doctor import __version__
from doctor.core.settings import Settings

WEIGHTS_BYTES_DEFAULT = 595e9 + 6.5e9  # Kimi K2.6 INT4 (~595 GB) + the DFlash drafter (~6.5 GB)
MIN_READ_BYTES_PER_S = 1.0e9  # cold page cache, one NVMe namespace, TP8 ranks reading concurrently
GRAPH_CAPTURE_S = 600  # CUDA graph capture + warm-up for every batch size, DDTree verify graphs
SMOKE_S = 120  # ExecStartPost: k26-doctor smoke's deadline
CHECKS_S = 180  # ExecStartPre: the fast check tier with its per-check deadlines
DEFAULT_UNIT = "sglang-k26-ddtree.service"


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
    profile = settings.get("server.start_timeout_s")
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


def _quote(argv: list[str]) -> str:
    """systemd command-line quoting: shell-like; ``%`` and ``$`` must be doubled/escaped."""
    out = []
    for arg in argv:
        arg = arg.replace("%", "%%").replace("$", "$$")
        out.append(shlex.quote(arg) if arg and not any(c in arg for c in "'") else '"' + arg.replace("\\", "\\\\")
                   .replace('"', '\\"') + '"')
    return " ".join(out)


def selection_args(settings: Settings, config: str | None) -> list[str]:
    """The flags that make ExecStartPre and ExecStart see the same host, profile and model."""
    args: list[str] = []
    if config:
        args += ["--config", config]
    args += ["--profile", settings.profile_name]
    if settings.python_given:
        args += ["--python", settings.python]
    if not config:  # without a config file the paths must travel as flags
        if settings.model_path:
            args += ["--model-path", settings.model_path]
        if settings.draft_model_path:
            args += ["--draft-model-path", settings.draft_model_path]
        if settings.tp != int(settings.get("parallel.tp", settings.tp) or settings.tp):
            args += ["--tp", str(settings.tp)]
    return args


def render_unit(settings: Settings, *, config: str | None, doctor: list[str] | None = None,
                user: str | None = None, timeout_override: float | None = None,
                extra: list[str] | None = None, diagnose_on_failure: bool = True, smoke: bool = False) -> str:
    """The unit file text; ``smoke``: an ``ExecStartPost`` running ``k26-doctor smoke`` once the server is ready."""
    doctor = doctor or doctor_command()
    sel = selection_args(settings, config)
    timeout, why = start_timeout(settings, timeout_override)
    unit = str(settings.get("server.unit", DEFAULT_UNIT))
    env_file = settings.get("server.env_file")
    pre = [*doctor, "check", *sel, "--format", "text"]
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
        f"Description=SGLang server for {settings.get('model.repo', 'Kimi K2.6')} "
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
    if user:
        lines.append(f"User={user}")
    if env_file:
        lines.append("# The site's pins (CUDA_VISIBLE_DEVICES, NCCL_*...): kept over the profile's [server.env].")
        lines.append(f"EnvironmentFile=-{env_file}")
    if config:
        lines.append(f"Environment={_quote(['K26_DOCTOR_CONFIG=' + config])}")
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
