"""Probes under the service's interpreter, in the service's environment, with a deadline.

``probe_service`` runs one stdlib probe of ``doctor/probes`` under ``opts.python`` with the
environment the service gets (``doctor.host.facts.service_env``); ``stack_probe`` runs the ``stack``
probe once per run for every fact that shares it (stack, ptxas).
"""

from __future__ import annotations

import json
import shlex
import threading
from pathlib import Path
from typing import Any

from doctor.core import proc
from doctor.core.datafile import load_toml
from doctor.core.result import Findings, Remediation
from doctor.facts.shape import NUM, opt
from doctor.facts.store import CollectOptions
from doctor.host.facts import service_env

STACK_PROBE_TIMEOUT = 30.0
# What SGLang's server imports at start (judged by doctor.sglang.runtime): the stack probe finds it on disk.
SGLANG_RUNTIME_FILE = Path(__file__).resolve().parents[1] / "data" / "sglang_runtime.toml"
# What every fact from a probe of the service's interpreter carries (doctor.facts.shape): whether it ran, and why not.
PROBE_SHAPE = {"ok": opt(bool), "error": opt(str), "timed_out": opt(bool), "python": opt(str), "stderr_tail": opt(str),
               "probe_s": opt(NUM), "service_env": opt(dict)}
_memo_lock = threading.Lock()


def probe_rules() -> dict[str, Any]:
    """The rules as the ``stack`` probe takes them (``--sglang-runtime JSON``): the modules to find, the
    directories under each package, DFlash's files. The data file stays the one list."""
    r = load_toml(SGLANG_RUNTIME_FILE)
    return {"modules": {"flashinfer": {"module": r["flashinfer"]["module"], "dirs": list(r["flashinfer"]["jit_dirs"])},
                        "cute_dsl": {"module": r["cute_dsl"]["module"]}},
            "dflash": dict(r["dflash"])}


def probe_service(opts: CollectOptions, probe: str, args: list[str], timeout: float) -> dict[str, Any]:
    env, env_info = service_env(opts)
    data, res = proc.run_probe(opts.python, probe, args, timeout=timeout, env=env)
    if data is None:
        return {"ok": False, "error": res.why(), "timed_out": res.timed_out, "python": opts.python,
                "stderr_tail": (res.stderr or "")[-2000:], "service_env": env_info}
    data["probe_s"] = round(res.duration_s, 3)
    data["service_env"] = env_info
    return data


def stack_probe(opts: CollectOptions) -> dict[str, Any]:
    """The ``stack`` probe's result, run once per run (cached on ``opts``) for the facts that share it; it
    also finds on disk what SGLang's server imports at start (``doctor/data/sglang_runtime.toml``)."""
    with _memo_lock:
        cell = opts.__dict__.setdefault("_k26_stack_probe", {"lock": threading.Lock()})
    with cell["lock"]:
        if "value" not in cell:
            cell["value"] = probe_service(opts, "stack", ["--sglang-runtime", json.dumps(probe_rules())],
                                          STACK_PROBE_TIMEOUT)
        return cell["value"]




def probe_failure(python: str, fact: dict[str, Any], what: str) -> Findings:
    """A probe that could not run under the service interpreter: that is itself the finding."""
    return Findings(python=python, probe=fact).fail(
        "stack.probe_failed", f"cannot {what} with {python}: {fact.get('error') or 'the probe failed'}",
        Remediation("The service's interpreter must start and run a stdlib script; see python.venv.",
                    [shlex.join([python, "-c", "import sys; print(sys.version)"])]))
