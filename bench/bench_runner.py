#!/usr/bin/env python3
"""Runner concurrency: N checks that each wait T take about T, not N x T.

Baseline in the same run: the same N checks run one after the other (N x T). Prints the ratio
concurrent / T (ideal 1.0) and serial / concurrent (ideal N).

    python bench/bench_runner.py [--n 24] [--t 0.25]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doctor.app import planned_server
from doctor.core.context import Context
from doctor.core.registry import Check
from doctor.core.result import Result
from doctor.core.runner import execute, run_all
from doctor.core.settings import resolve
from doctor.facts.store import CollectOptions, FactStore


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--t", type=float, default=0.25)
    args = ap.parse_args()

    def waits(ctx: Context) -> Result:
        time.sleep(args.t)
        return Result.passed("waited")

    checks = [Check(f"bench.{i}", "waits", waits) for i in range(args.n)]
    ctx = Context(resolve({}, environ={}), FactStore(CollectOptions(), snapshot={"facts": {}}), planned_server)
    t0 = time.perf_counter()
    for c in checks:
        execute(c, ctx)
    serial = time.perf_counter() - t0
    t0 = time.perf_counter()
    outcome = run_all(checks, ctx)
    concurrent = time.perf_counter() - t0
    assert all(r.status.value == "pass" for r in outcome.results)
    print(f"N={args.n} T={args.t}s  serial={serial:.3f}s  concurrent={concurrent:.3f}s")
    print(f"concurrent/T = {concurrent / args.t:.2f} (ideal 1.0)   serial/concurrent = {serial / concurrent:.1f}x "
          f"(ideal {args.n})")


if __name__ == "__main__":
    main()
