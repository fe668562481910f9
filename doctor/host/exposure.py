"""Who can reach the server: the address it binds and whether it asks for a key (``host.exposure``).

SGLang serves an OpenAI-compatible API without authentication unless ``--api-key`` is given, and the
profiles bind ``0.0.0.0`` so that clients on other hosts can reach it. Together that is an open model
endpoint on every interface. Read from the exact server arguments the launcher builds.
"""

from __future__ import annotations

import ipaddress
import shlex
from typing import Any

from doctor.core.result import Findings, Remediation
from doctor.core.settings import ConfigError, Settings

WILDCARDS = {"", "0.0.0.0", "::", "[::]", "*"}
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def option_value(args: list[str], name: str) -> str | None:
    """The last value of ``--name VALUE`` / ``--name=VALUE`` in an argv (argparse: the last one wins)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def bind_scope(host: str) -> str:
    """``loopback``, ``all`` (a wildcard address) or ``network`` (a routable address or a host name)."""
    h = host.strip()
    if h in WILDCARDS:
        return "all"
    if h.lower() in LOOPBACK_NAMES:
        return "loopback"
    try:
        addr = ipaddress.ip_address(h.strip("[]"))
    except ValueError:
        return "network"  # a name: whatever it resolves to at start, it is not known to be loopback
    if addr.is_loopback:
        return "loopback"
    return "all" if addr.is_unspecified else "network"


def exposure(args: list[str]) -> dict[str, Any]:
    """What the server argv says about exposure: host, scope, whether an API key is required."""
    host = option_value(args, "--host") or "127.0.0.1"  # SGLang's own default
    key = option_value(args, "--api-key")
    return {"host": host, "scope": bind_scope(host), "api_key": bool(key),
            "admin_api_key": bool(option_value(args, "--admin-api-key")), "port": option_value(args, "--port")}


def judge_exposure(args: list[str], problem: ConfigError | None, settings: Settings) -> Findings:
    """``args``: the server arguments the launcher will use; ``problem``: why they cannot be built."""
    out = Findings()
    if problem is not None:
        return out.fail("host.exposure.no_args", f"the server arguments cannot be built: {problem}",
                        "Fix the [server] table of the config (see `k26-doctor launch --dry-run`).")
    seen = exposure(args)
    where = f"{seen['host']}:{seen['port']}"
    out.details.update(seen, source="profile/config [server] host, api_key, args")
    if seen["scope"] == "loopback":
        return out.info("host.exposure.loopback", f"{where}: loopback only"
                        + ("; API key required" if seen["api_key"] else ""))
    reach = "every interface" if seen["scope"] == "all" else f"{seen['host']} (beyond loopback)"
    if seen["api_key"]:
        return out.info("host.exposure.key", f"{where}: listens on {reach}; API key required")
    config = settings.config_path or "/etc/k26-doctor/config.toml"
    return out.warn(
        "host.exposure.open", f"{where}: listens on {reach} without --api-key: anyone who can reach port "
        f"{seen['port']} can use the model",
        Remediation(f"Require a key: [server] api_key = \"...\" in {config} (the launcher passes --api-key; keep "
                    "the file mode 0640, group of the service's user), or bind loopback behind an authenticating "
                    "reverse proxy: [server] host = \"127.0.0.1\".",
                    ["openssl rand -hex 32    # a key for [server] api_key",
                     shlex.join(["sudo", "chmod", "0640", config])]))
