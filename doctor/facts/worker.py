"""Child-process side of an isolated collector: ``python -m doctor.facts.worker`` < request.

Imports only the collector's own module, runs it, prints ``{"value": ...}`` or ``{"error": ...}``.
The parent kills this process at the collector's deadline (see ``doctor.facts.isolation.collect_isolated``).
"""

from __future__ import annotations

import importlib
import json
import sys


def main() -> int:
    req = json.loads(sys.stdin.read())
    from doctor.facts.store import CollectOptions

    func = getattr(importlib.import_module(req["module"]), req["func"])
    try:
        value = func(CollectOptions.from_dict(req["options"]))
        out = {"value": value}
    except Exception as exc:  # reported as the fact's error, never a traceback on the terminal
        out = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
