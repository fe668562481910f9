"""How long the flag check costs before a launch, against the cheapest thing a launch must do anyway.

Baseline (measured in the same run): starting the service interpreter once (``python -c pass``).
Measured: the probe that locates sglang in that interpreter, reading the flag table from the real
sources (0.5.23: annotated fields; 0.5.13.post1: add_argument), and judging the profile's argv.

    python bench/bench_sglang_flags.py [--wheels DIR] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from timing import measure  # noqa: E402 (bench/timing.py: the script's folder is on sys.path)

from doctor.core.settings import resolve  # noqa: E402
from doctor.service.launcher import build_server_args  # noqa: E402
from doctor.sglang.flag_reader import read_flags  # noqa: E402
from doctor.sglang.flag_validator import validate_args  # noqa: E402
from doctor.sglang.flags import locate_sglang  # noqa: E402

# sglang wheels: $SGLANG_WHEELS, else the tests' per-user wheel cache (tests/sglang_wheels.py)
WHEELS = os.environ.get("SGLANG_WHEELS") or str(Path.home() / ".cache" / "k26-doctor-tests")

def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheels", default=WHEELS,
                    help="directory with sglang wheels (default $SGLANG_WHEELS, else the tests' wheel cache)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    base_min, base_med = measure(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), args.repeat)
    print(f"baseline: interpreter start {base_min * 1000:.1f} ms (median {base_med * 1000:.1f})")
    argv, _ = build_server_args(resolve({"model_path": "/m", "draft_model_path": "/d"}, environ={}))
    with tempfile.TemporaryDirectory() as tmp:
        for version in ("0.5.23", "0.5.13.post1"):
            wheels = sorted(Path(args.wheels).glob(f"sglang-{version}-*.whl"))
            if not wheels:
                print(f"{version}: wheel not found in {args.wheels}, skipped")
                continue
            site = Path(tmp) / version
            with zipfile.ZipFile(wheels[0]) as zf:
                zf.extractall(site, [n for n in zf.namelist() if (n.startswith("sglang/") and n.endswith(".py"))
                                     or n.startswith(f"sglang-{version}.dist-info/")])
            env = dict(os.environ, PYTHONPATH=str(site))
            probe = measure(lambda env=env: locate_sglang(sys.executable, env), args.repeat)
            table = read_flags(site / "sglang", version)
            read = measure(lambda site=site, version=version: read_flags(site / "sglang", version), args.repeat)
            judge = measure(lambda table=table: validate_args(table, argv), args.repeat)
            total = probe[0] + read[0] + judge[0]
            print(f"{version}: {len(table.options)} flags ({table.style}); probe {probe[0] * 1000:.1f} ms, "
                  f"read {read[0] * 1000:.1f} ms, judge {judge[0] * 1000:.2f} ms; "
                  f"total {total * 1000:.1f} ms = {total / base_min:.1f}x the interpreter start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
