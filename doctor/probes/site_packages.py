"""Probe: where the service's interpreter finds a distribution (default sglang), without importing it.

The one way the doctor locates the service's SGLang: the patch engine (``doctor.sglang.patching.locate``)
and the flag reader (``doctor.sglang.flags``) both read this probe's answer.
Run by ``doctor.core.proc.run_probe`` under the service's ``--python``. Stdlib only, Python >= 3.8.
``importlib.util.find_spec`` on a top-level name locates the package without executing its
``__init__`` (which for SGLang would import torch). Prints one JSON object on the last line.

    python site_packages.py [DIST]
"""

import glob
import json
import os
import re
import site
import sys
import sysconfig


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_infos(dist):
    want = canonical(dist)
    found = []
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        for path in sorted(glob.glob(os.path.join(glob.escape(entry), "*.dist-info"))):
            base = os.path.basename(path)[: -len(".dist-info")]
            if canonical(base.split("-")[0]) == want:
                found.append({"path": path, "site_packages": entry})
    return found


def main():
    dist = sys.argv[1] if len(sys.argv) > 1 else "sglang"
    out = {
        "python": sys.executable,
        "python_version": "{}.{}.{}".format(*sys.version_info[:3]),
        "prefix": sys.prefix,
        "base_prefix": getattr(sys, "base_prefix", sys.prefix),
        "purelib": sysconfig.get_paths().get("purelib"),
        "platlib": sysconfig.get_paths().get("platlib"),
        "site_packages": list(getattr(site, "getsitepackages", lambda: [])()),
        "sys_path": [p for p in sys.path if p],
        "dist": dist,
        "dist_infos": dist_infos(dist),
        "package_origin": None,
        "package_dirs": [],
        "version": None,
    }
    try:
        from importlib import metadata

        out["version"] = metadata.version(dist)
    except Exception:  # PackageNotFoundError, broken metadata, Python < 3.8
        pass
    try:
        import importlib.util

        spec = importlib.util.find_spec(dist.replace("-", "_"))
        if spec is not None:
            out["package_origin"] = spec.origin
            out["package_dirs"] = list(spec.submodule_search_locations or [])
    except Exception as exc:  # a broken finder (.pth hook) is reported, not raised
        out["spec_error"] = f"{type(exc).__name__}: {exc}"
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
