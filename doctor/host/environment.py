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


PATH_EMPTY = "host.env.path_empty_entry"  # PATH with an empty entry: the working directory is searched
CUDA_HOME_BAD = "host.env.cuda_home"  # CUDA_HOME/CUDA_PATH empty, a search path, or not a whole toolkit


def search_path_problems(vars_: dict[str, str]) -> Findings:
    """A warning each for PATH with empty entries (a leading or trailing ':', a '::': each one means the working
    directory, where an nvcc or ninja the service did not mean is found first) and for a CUDA_HOME / CUDA_PATH that
    is set empty or holds a search path (FlashInfer, tvm-ffi and torch read one directory)."""
    out = Findings()
    path = vars_.get("PATH")
    if path is not None:
        parts = path.split(":")
        empty = [i for i, p in enumerate(parts) if not p.strip()]
        if empty:
            where = ("a leading ':'" if empty[0] == 0 else "a trailing ':'" if empty[0] == len(parts) - 1
                     else "a '::'")
            out.warn(PATH_EMPTY, f"PATH has {len(empty)} empty entr{'y' if len(empty) == 1 else 'ies'} ({where}): "
                     "each searches the working directory, so the nvcc or ninja a JIT build runs depends on where "
                     "the service starts", "Remove the empty entries of PATH (no leading, trailing or double ':') "
                     "in the unit's Environment= and its EnvironmentFile.")
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = vars_.get(var)
        if value is not None and not value.strip():
            out.warn(CUDA_HOME_BAD, f"{var} is set but empty: a JIT build takes it as unset or as the working "
                     "directory", f"Set {var} to the CUDA toolkit directory, or unset it.")
        elif value and ":" in value:
            out.warn(CUDA_HOME_BAD, f"{var}={value} is a search path; it names one toolkit directory (the JIT "
                     f"builds look for {value}/bin/nvcc)", f"Set {var} to one toolkit directory.")
    return out


def toolkit_problems(toolkits: Any) -> Findings:
    """A warning for each toolkit directory the environment names that a JIT build cannot use."""
    out = Findings()
    for tk in toolkits if isinstance(toolkits, list) else []:
        lacks = (["the directory itself"] if not tk.get("is_dir") else
                 [n for n, ok in (("bin/nvcc", tk.get("nvcc")), ("include/cuda_runtime.h", tk.get("cuda_runtime_h")))
                  if not ok])
        if lacks:
            out.warn(CUDA_HOME_BAD, f"{tk.get('var')}={tk.get('path')} lacks {' and '.join(lacks)}: FlashInfer's "
                     "and SGLang's JIT builds would find no compiler or no CUDA headers there",
                     f"Point {tk.get('var')} at a whole CUDA toolkit (bin/nvcc and include/cuda_runtime.h), "
                     "or unset it.")
    return out


def judge_env(env: dict[str, Any], world_size: int) -> Findings:
    out = judge_known(env, world_size)
    for found in search_path_problems(env.get("vars") or {}) + toolkit_problems(env.get("toolkits")):
        out.details.setdefault("malformed", []).append(found.message)
        out.append(found)
    if out.details.get("malformed"):  # the clean line is no longer true
        out[:] = [f for f in out if f.code != "host.env.clean"]
    return out


def judge_known(env: dict[str, Any], world_size: int) -> Findings:
    """The environment against the table of known-bad settings (``env_rules.toml``)."""
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
