"""The service's environment against a table of variables known to break or slow SGLang/NCCL (host.env,
``doctor/data/env_rules.toml``): debugging switches and site leftovers that turn TP8 over NVLink into something many
times slower, or hide GPUs, without any error message."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml
from doctor.core.result import Findings, Remediation

ENV_RULES = Path(__file__).resolve().parents[1] / "data" / "env_rules.toml"
TRUTHY = {"1", "true", "yes", "on", "y"}


@lru_cache(maxsize=1)
def env_rules() -> list[dict[str, Any]]:
    return list(load_toml(ENV_RULES).get("rule", []))


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


def hits_of(vars_: dict[str, str], need: int) -> list[dict[str, str]]:
    """Every rule the environment hits, and CUDA_VISIBLE_DEVICES listing fewer GPUs than the service needs."""
    hits: list[dict[str, str]] = []
    for rule in env_rules():
        value = vars_.get(rule["name"])
        if rule_hits(rule, value):
            hits.append({"name": rule["name"], "value": value or "", "status": rule["status"], "why": rule["why"],
                         "fix": rule["fix"]})
    cvd = vars_.get("CUDA_VISIBLE_DEVICES")
    if cvd and cvd.strip() and visible_device_count(cvd) < need:
        hits.append({"name": "CUDA_VISIBLE_DEVICES", "value": cvd, "status": "fail",
                     "why": f"lists {visible_device_count(cvd)} GPU(s); the service needs {need} (TP x PP x DP)",
                     "fix": "list every GPU of the group, or unset it"})
    return hits


def judge_env(env: dict[str, Any], world_size: int) -> Findings:
    hits = hits_of(env.get("vars") or {}, world_size)
    fails = [f"{h['name']}={h['value']}" for h in hits if h["status"] == "fail"]
    warns = [f"{h['name']}={h['value']}" for h in hits if h["status"] != "fail"]
    if env.get("env_file") and env.get("env_file_state") not in (None, "read", "missing"):
        warns.append(f"env file {env['env_file']} {env['env_file_state']}")
    out = Findings(findings=hits, env_file=env.get("env_file"), env_file_state=env.get("env_file_state"))
    if fails:
        grep = ("grep -rn '" + "\\|".join(sorted({h['name'] for h in hits})) + "' /etc/environment "
                + (env.get("env_file") or "") + " /etc/systemd/system/*.service 2>/dev/null")
        return out.fail("host.env.breaking", "; ".join(fails) + (f" (and {len(warns)} warning(s))" if warns else ""),
                        Remediation(" ".join(f"{h['name']}: {h['why']}; {h['fix']}." for h in hits
                                             if h["status"] == "fail"), [grep]))
    if warns:
        return out.warn("host.env.slowing", "; ".join(warns), " ".join(f"{h['name']}: {h['why']}." for h in hits))
    return out.info("host.env.clean", f"none of {len(env_rules())} known-bad settings present")
