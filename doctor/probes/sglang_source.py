"""Probe: where the service interpreter would import ``sglang`` from, without importing it.

Runs under the service's interpreter (``doctor.proc.run_probe``), stdlib only, Python >= 3.8.
``importlib.util.find_spec`` on the top-level name only searches ``sys.path`` (executing nothing),
and the version comes from the distribution metadata. The doctor then reads the flag definitions
from that directory with ``ast`` (``doctor.sglang_flags``). Prints one JSON object.
"""

import json
import sys
from importlib import util

try:
    from importlib import metadata
except ImportError:  # pragma: no cover - Python < 3.8
    metadata = None


def main():
    out = {"python": sys.executable, "python_version": ".".join(str(v) for v in sys.version_info[:3]), "found": False}
    try:
        spec = util.find_spec("sglang")
    except (ImportError, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        spec = None
    if spec is not None:
        locations = list(spec.submodule_search_locations or [])
        out["found"] = bool(locations)
        out["package_dir"] = locations[0] if locations else None
        out["origin"] = spec.origin
        if not locations:
            out["error"] = f"sglang resolves to {spec.origin}, not a package directory"
    version = None
    if metadata is not None:
        try:
            version = metadata.version("sglang")
        except Exception:  # PackageNotFoundError, broken metadata
            version = None
    out["version"] = version
    print(json.dumps(out))


if __name__ == "__main__":
    main()
