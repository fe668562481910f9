#!/usr/bin/env python3
"""Startup cost of `k26-doctor --help` and `k26-doctor list` (runs on every ExecStartPre).

Whole processes, median of R runs, against the baseline `python -c pass` measured in the same run.
Target: both medians under 0.3 s.

    python bench/bench_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def median_time(argv: list[str], runs: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # As installed (pip writes bytecode): with PYTHONDONTWRITEBYTECODE set every module would be compiled
    # from source on every start, which no installed doctor does.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    py = sys.executable
    base = median_time([py, "-c", "pass"], args.runs, env)
    rows = [("python -c pass (baseline)", base)]
    for label, argv in (("k26-doctor --help", [py, "-m", "doctor", "--help"]),
                        ("k26-doctor list", [py, "-m", "doctor", "list"]),
                        ("k26-doctor list --format json", [py, "-m", "doctor", "list", "--format", "json"])):
        rows.append((label, median_time(argv, args.runs, env)))
    for label, t in rows:
        print(f"{label:32s} median {t * 1000:7.1f} ms   {t / base:5.1f}x baseline   "
              f"{'OK' if t < 0.3 or label.startswith('python') else 'OVER 0.3 s'}")


if __name__ == "__main__":
    main()
