"""Host checks: free disk where the service writes, the server port, the service's environment."""

from __future__ import annotations

import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any

from doctor.core.context import Context
from doctor.core.datafile import load_toml
from doctor.core.registry import check
from doctor.core.result import Remediation, Result
from doctor.core.settings import ConfigError
from doctor.host.access import access_fix, describe
from doctor.host.exposure import exposure
from doctor.service.launcher import build_server_args

GIB = 1024**3
ENV_RULES = Path(__file__).resolve().parents[1] / "doctor" / "data" / "env_rules.toml"


@check("host.disk", "Free space where caches, logs and temp files are written", needs=("disk",))
def host_disk(ctx: Context) -> Result:
    """Free space (and writability) where the service writes: the Triton cache (TRITON_CACHE_DIR or
    ~/.triton/cache), TMPDIR, and the profile's [host] paths.

    Why: Triton compiles kernels into its cache at first use and the server writes logs; a full or
    read-only disk shows up minutes into a start as an obscure compile or write error.
    Fix by hand: free space (`du -xsh /path/* | sort -h`), or point TRITON_CACHE_DIR / TMPDIR at a
    roomier filesystem in the service's environment file.
    """
    disk: dict[str, Any] = ctx.fact("disk")
    need = float(ctx.expect("host.min_free_gib", 20)) * GIB
    bad, warn, rows = [], [], {}
    denied: list[dict[str, Any]] = []
    user = None
    seen_fs: set[str] = set()
    for name, e in disk.items():
        if "error" in e:
            bad.append(f"{e.get('path')}: {e['error']}")
            continue
        free = e["free_bytes"]
        rows[name] = f"{e['path']}: {free / GIB:.1f} GiB free" + ("" if e["writable"] else " (not writable)")
        if e.get("read_only_fs") or not e["writable"]:
            access = e.get("access")
            if access and not e.get("read_only_fs"):
                denied.append(dict(access, target=e["path"]))
                user = user or e.get("user")
            bad.append(f"{e['path']} is not writable" + (" (read-only filesystem)" if e.get("read_only_fs") else
                                                         f" ({describe(access)})" if access else ""))
        elif free < need and e["measured_at"] not in seen_fs:
            bad.append(f"{e['path']}: {free / GIB:.1f} GiB free < {need / GIB:g} GiB")
        elif free < 2 * need:
            warn.append(f"{e['path']}: {free / GIB:.1f} GiB free")
        seen_fs.add(e["measured_at"])
    if bad:
        df = shlex.join(["df", "-h", *sorted({str(e["path"]) for e in disk.values()})])
        if denied and len(denied) == len(bad):  # only permissions: a chown/chmod, never "free space"
            return Result.failed("; ".join(bad), access_fix(denied, "write", user), paths=rows,
                                 access=denied)
        rem = Remediation("Free space or point the cache elsewhere (TRITON_CACHE_DIR, TMPDIR) in the service's "
                          "environment file.", [df])
        if denied:
            fix = access_fix(denied, "write", user)
            rem = Remediation(rem.text + " " + fix.text, rem.commands + fix.commands)
        return Result.failed("; ".join(bad), rem, paths=rows, access=denied)
    if warn:
        return Result.warned("low space: " + "; ".join(warn), None, paths=rows, min_free_gib=need / GIB)
    return Result.passed(f"{len(disk)} locations writable, >= {need / GIB:g} GiB free each", paths=rows)


@check("host.port", "The server port is free", needs=("port",))
def host_port(ctx: Context) -> Result:
    """Binds the server's host:port as SGLang will (SO_REUSEADDR) and releases it at once.

    Why: a stale server (or another service) on port 30000 makes SGLang fail with "Address already
    in use" only after minutes of loading weights.
    Fix by hand: stop the owner (`ss -ltnp 'sport = :30000'`), or choose another port in the config.
    """
    p = ctx.fact("port")
    where = f"{p.get('host')}:{p.get('port')}"
    if p.get("free"):
        return Result.passed(f"{where} is free")
    if "free" not in p:
        return Result.failed(f"{where}: {p.get('error', 'cannot test the port')}",
                             "Set [server] host and port to a valid address in the config.")
    owners = p.get("owners") or []
    who = ", ".join(f"PID {o['pid']} ({o['cmdline'][:80]})" for o in owners) or "unknown owner"
    if p.get("errno") == "EADDRINUSE":
        return Result.failed(f"{where} is in use by {who}", Remediation(
            "Stop the process holding the port (a stale server?) or set [server] port in the config.",
            [f"ss -ltnp 'sport = :{p.get('port')}'"] + [f"kill {o['pid']}" for o in owners]),
            owners=owners)
    return Result.failed(f"cannot bind {where}: {p.get('error')}", Remediation(
        "Ports below 1024 need root or CAP_NET_BIND_SERVICE; the host must be an address of this machine."),
        errno=p.get("errno"))


@lru_cache(maxsize=1)
def env_rules() -> list[dict[str, Any]]:
    return list(load_toml(ENV_RULES).get("rule", []))


TRUTHY = {"1", "true", "yes", "on", "y"}


def rule_hits(rule: dict[str, Any], value: str | None) -> bool:
    if value is None:
        return False
    kind = rule.get("match", "set")
    v = value.strip()
    if kind == "set":
        return v != ""
    if kind == "truthy":
        return v.lower() in TRUTHY
    if kind == "equals":
        return v.lower() == str(rule.get("value", "")).lower()
    if kind == "in":
        return v.lower() in {str(x).lower() for x in rule.get("values", [])}
    if kind == "regex":
        return re.search(str(rule.get("pattern", "")), v) is not None
    return False


def visible_device_count(value: str) -> int:
    return len([d for d in value.split(",") if d.strip()])


@check("host.env", "Environment variables that break or slow the service", needs=("env",))
def host_env(ctx: Context) -> Result:
    """The service's environment (this process's, the profile's [server.env] and the profile's
    EnvironmentFile) against a table of variables known to break or slow SGLang/NCCL
    (doctor/data/env_rules.toml): NCCL_P2P_DISABLE=1, CUDA_LAUNCH_BLOCKING=1, TRITON_INTERPRET=1,
    CUDA_VISIBLE_DEVICES with fewer GPUs than the TP group, and more.

    Why: these are debugging switches or site leftovers that turn TP8 over NVLink into something
    many times slower, or hide GPUs, without any error message.
    Fix by hand: unset them in /etc/environment, the unit's Environment= and its EnvironmentFile.
    """
    env = ctx.fact("env")
    vars_: dict[str, str] = env.get("vars") or {}
    fails, warns = [], []
    hits: list[dict[str, str]] = []
    for rule in env_rules():
        value = vars_.get(rule["name"])
        if rule_hits(rule, value):
            hits.append({"name": rule["name"], "value": value or "", "status": rule["status"], "why": rule["why"],
                         "fix": rule["fix"]})
            (fails if rule["status"] == "fail" else warns).append(f"{rule['name']}={value}")
    cvd = vars_.get("CUDA_VISIBLE_DEVICES")
    need = ctx.settings.world_size
    if cvd and cvd.strip() and visible_device_count(cvd) < need:
        fails.append(f"CUDA_VISIBLE_DEVICES={cvd}")
        hits.append({"name": "CUDA_VISIBLE_DEVICES", "value": cvd, "status": "fail",
                     "why": f"lists {visible_device_count(cvd)} GPU(s); the service needs {need} (TP x PP x DP)",
                     "fix": "list every GPU of the group, or unset it"})
    if env.get("env_file") and env.get("env_file_state") not in (None, "read", "missing"):
        warns.append(f"env file {env['env_file']} {env['env_file_state']}")
    details = {"findings": hits, "env_file": env.get("env_file"), "env_file_state": env.get("env_file_state")}
    if fails:
        return Result.failed("; ".join(fails) + (f" (and {len(warns)} warning(s))" if warns else ""), Remediation(
            " ".join(f"{h['name']}: {h['why']}; {h['fix']}." for h in hits if h["status"] == "fail"),
            ["grep -rn '" + "\\|".join(sorted({h['name'] for h in hits})) + "' /etc/environment "
             + (env.get("env_file") or "") + " /etc/systemd/system/*.service 2>/dev/null"]), **details)
    if warns:
        return Result.warned("; ".join(warns), " ".join(f"{h['name']}: {h['why']}." for h in hits), **details)
    return Result.passed(f"none of {len(env_rules())} known-bad settings present", **details)


@check("host.exposure", "The server listening beyond loopback without an API key")
def host_exposure(ctx: Context) -> Result:
    """Reads the server arguments the launcher will use (the profile's [server] host, api_key and args):
    a server bound beyond loopback (0.0.0.0, ::, a routable address or a host name) without --api-key
    serves the model to anyone who can reach the port.

    Why: SGLang's HTTP API has no authentication unless --api-key is given; the profiles bind 0.0.0.0
    so that other hosts can reach it. Fix by hand: require a key ([server] api_key in the config, which
    the launcher passes as --api-key; keep that file mode 0640), or bind 127.0.0.1 behind a reverse proxy
    that authenticates ([server] host = "127.0.0.1")."""
    try:
        args, _ = build_server_args(ctx.settings, placeholders=True)
    except ConfigError as exc:
        return Result.failed(f"the server arguments cannot be built: {exc}",
                             "Fix the [server] table of the config (see `k26-doctor launch --dry-run`).")
    seen = exposure(args)
    where = f"{seen['host']}:{seen['port']}"
    details = dict(seen, source="profile/config [server] host, api_key, args")
    if seen["scope"] == "loopback":
        return Result.passed(f"{where}: loopback only" + ("; API key required" if seen["api_key"] else ""),
                             **details)
    reach = "every interface" if seen["scope"] == "all" else f"{seen['host']} (beyond loopback)"
    if seen["api_key"]:
        return Result.passed(f"{where}: listens on {reach}; API key required", **details)
    config = ctx.settings.config_path or "/etc/k26-doctor/config.toml"
    return Result.warned(
        f"{where}: listens on {reach} without --api-key: anyone who can reach port {seen['port']} can use the model",
        Remediation(f"Require a key: [server] api_key = \"...\" in {config} (the launcher passes --api-key; keep "
                    "the file mode 0640, group of the service's user), or bind loopback behind an authenticating "
                    "reverse proxy: [server] host = \"127.0.0.1\".",
                    ["openssl rand -hex 32    # a key for [server] api_key",
                     shlex.join(["sudo", "chmod", "0640", config])]), **details)
