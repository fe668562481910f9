"""Process isolation for collectors that can hang in C (NVML): the collector runs in a child of this
interpreter (``python -m doctor.facts.worker``), killed at its deadline; the parent reads one JSON line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from doctor.core.registry import Collector
    from doctor.facts.store import CollectOptions


def collect_isolated(coll: Collector, options: CollectOptions) -> Any:
    """Run a collector in a child process of this interpreter, killed at its deadline."""
    from doctor.core.proc import run
    from doctor.facts.store import FactUnavailable

    payload = json.dumps({"name": coll.name, "module": coll.func.__module__, "func": coll.func.__name__,
                          "options": options.to_dict()})
    res = run([sys.executable, "-m", "doctor.facts.worker"], coll.timeout, input=payload,
              env=worker_env())
    if res.timed_out and res.extra.get("not_started"):
        raise FactUnavailable(coll.name, f"not collected: {res.extra['not_started']}")
    if res.timed_out:
        waited = res.extra.get("timeout", coll.timeout)
        raise FactUnavailable(coll.name, f"collector hung and was killed after {waited:g}s")
    if not res.ok:
        raise FactUnavailable(coll.name, f"collector process failed: {res.why()}")
    try:
        doc = json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise FactUnavailable(coll.name, "collector process printed no JSON") from None
    if "error" in doc:
        raise FactUnavailable(coll.name, doc["error"])
    return doc["value"]


def worker_env() -> dict[str, str]:
    """The worker must import this very doctor and the collector's module, wherever they came from."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    paths = [root] + [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env
