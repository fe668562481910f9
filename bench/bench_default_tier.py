r"""Benchmark: the default tier (``k26-doctor check`` without ``--deep``) vs ``import torch``, one run, interleaved.

Issue 14's target: on the H200 host the whole default tier takes at most 0.5x what ``python -c "import torch"``
takes in the service's interpreter. The default tier imports none of torch, triton or SGLang: cuda.compat reads
``torch/version.py``, torch.arch torch's fat binaries, sglang.install SGLang's metadata and files (``--deep``,
``--import-sglang`` and ``launch`` import). Three things are timed, interleaved (floor, tier, stack, floor, ...)
so that drift and the page cache hit them alike, each as the user runs it (a fresh process):

* the floor: ``<service python> -c "import torch"``;
* the default tier: ``python -m doctor check --profile P --python <service python> --format json``;
* the stack and SGLang checks alone (``--only`` stack.*, cuda.*, torch.*, triton.*, python.*, sglang.*).

It prints one JSON object (medians, every run, the ratios, each check's status and seconds from the last
run) and exits 0 when the default tier's median is at most ``--target`` (0.5) x the floor's, 1 otherwise.

On the H200 host (``python3`` is /opt/torch/.venv/bin/python3: Python 3.12.3, torch 2.11.0+cu130,
triton 3.6.0), from the repository root::

    PYTHONPATH=$PWD python3 bench/bench_default_tier.py \
        --python /opt/torch/.venv/bin/python3 --profile h200-tp8 --tp 2

and with SGLang 0.5.23 unpacked in /tmp/site (it is then found through PYTHONPATH, by the service's probes too)::

    PYTHONPATH=$PWD:/tmp/site python3 bench/bench_default_tier.py \
        --python /opt/torch/.venv/bin/python3 --profile h200-tp8 --tp 2

Elsewhere (a CPU machine): ``python bench/bench_default_tier.py`` uses the running interpreter as the service's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STACK_AREAS = ("stack.*", "cuda.*", "torch.*", "triton.*", "python.*", "sglang.*")
TARGET = 0.5


def doctor_env() -> dict[str, str]:
    """The caller's environment with this repository first on PYTHONPATH (as the H200 command line sets it)."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in parts:
        parts.insert(0, str(ROOT))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts)}


def floor_once(python: str) -> float:
    """``import torch`` in the service's interpreter, in a fresh process."""
    start = time.monotonic()
    subprocess.run([python, "-c", "import torch"], check=True, capture_output=True, env=doctor_env())
    return time.monotonic() - start


def check_once(argv: list[str]) -> tuple[float, dict[str, Any]]:
    """One ``python -m doctor check ...`` as the CLI runs it: (seconds, the JSON report or {})."""
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "doctor", "check", *argv, "--format", "json"], capture_output=True,
                         text=True, cwd=ROOT, env=doctor_env())
    took = time.monotonic() - start
    try:
        report = json.loads(out.stdout)
    except ValueError:
        report = {"error": f"exit {out.returncode}: {out.stderr.strip()[-500:]}"}
    return took, report


def per_check(report: dict[str, Any]) -> dict[str, Any]:
    return {r["id"]: [r["status"], r.get("duration_s")] for r in report.get("results", [])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the service's interpreter (default: this one)")
    ap.add_argument("--profile", default="h200-tp8")
    ap.add_argument("--tp", type=int, help="tensor-parallel size (default: the profile's)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--target", type=float, default=TARGET, help="the default tier / import torch ratio to meet")
    ns = ap.parse_args()
    common = ["--profile", ns.profile, "--python", ns.python] + (["--tp", str(ns.tp)] if ns.tp else [])
    stack_only = [*common, *(a for area in STACK_AREAS for a in ("--only", area))]
    floor_once(ns.python)  # warm the page cache for all three
    check_once(common)
    floors: list[float] = []
    tiers: list[float] = []
    stacks: list[float] = []
    report: dict[str, Any] = {}
    for _ in range(ns.runs):
        floors.append(floor_once(ns.python))
        took, report = check_once(common)
        tiers.append(took)
        stacks.append(check_once(stack_only)[0])
    floor, tier, stack = (statistics.median(x) for x in (floors, tiers, stacks))
    out = {"python": ns.python, "profile": ns.profile, "tp": ns.tp, "runs": ns.runs,
           "floor_import_torch_s": round(floor, 3), "default_tier_s": round(tier, 3),
           "stack_sglang_checks_s": round(stack, 3), "ratio": round(tier / floor, 3),
           "stack_ratio": round(stack / floor, 3), "target_ratio": ns.target, "met": tier / floor <= ns.target,
           "floor_runs": [round(x, 3) for x in floors], "default_tier_runs": [round(x, 3) for x in tiers],
           "stack_runs": [round(x, 3) for x in stacks], "checks": per_check(report)}
    if "error" in report:
        out["error"] = report["error"]
    print(json.dumps(out, indent=2))
    return 0 if out["met"] and "error" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
