"""The server's port (host.port): bound the way SGLang binds it (SO_REUSEADDR) and released at once. A stale server
on it makes SGLang fail with "Address already in use" only after minutes of loading weights."""

from __future__ import annotations

from typing import Any

from doctor.core.result import Findings, Remediation


def judge_port(p: dict[str, Any]) -> Findings:
    where = f"{p.get('host')}:{p.get('port')}"
    out = Findings()
    if p.get("free"):
        return out.info("host.port.free", f"{where} is free")
    if "free" not in p:
        return out.fail("host.port.invalid", f"{where}: {p.get('error', 'cannot test the port')}",
                        "Set [server] host and port to a valid address in the config.")
    owners = p.get("owners") or []
    who = ", ".join(f"PID {o['pid']} ({o['cmdline'][:80]})" for o in owners) or "unknown owner"
    if p.get("errno") == "EADDRINUSE":
        out.details["owners"] = owners
        return out.fail("host.port.in_use", f"{where} is in use by {who}", Remediation(
            "Stop the process holding the port (a stale server?) or set [server] port in the config.",
            [f"ss -ltnp 'sport = :{p.get('port')}'"] + [f"kill {o['pid']}" for o in owners]))
    out.details["errno"] = p.get("errno")
    return out.fail("host.port.unbindable", f"cannot bind {where}: {p.get('error')}", Remediation(
        "Ports below 1024 need root or CAP_NET_BIND_SERVICE; the host must be an address of this machine."))
