#!/usr/bin/env python3
"""`check --only model.shards` on the sparse K2.6 replica against the floor, whole processes.

The floor: a Python process that loads model.safetensors.index.json and opens every shard it names
with `safetensors.safe_open` (the reference Rust parser) listing its keys. The doctor's run validates
much more (offsets, sizes, the index against every header, leftovers), in Python. Target: median
ratio <= 2.0. Runs alternate floor/doctor so that machine load hits both alike.

    python bench/bench_model_shards.py [--dir /tmp/k26-replica] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from k26_replica import disk_usage, ensure_replica  # noqa: E402

FLOOR = r"""
import json, os, sys
from safetensors import safe_open
d = sys.argv[1]
with open(os.path.join(d, "model.safetensors.index.json")) as fh:
    idx = json.load(fh)
n = 0
for f in dict.fromkeys(idx["weight_map"].values()):
    with safe_open(os.path.join(d, f), "np") as s:
        n += len(s.keys())
print(n)
"""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    return timed_cpu(argv, env)[0], timed_cpu.last  # type: ignore[attr-defined]


def timed_cpu(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one whole child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    timed_cpu.last = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)  # type: ignore
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/k26-replica")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    t0 = time.perf_counter()
    info = ensure_replica(args.dir)
    print(f"replica: {info['shards']} shards, {info['tensors']:,} tensors, "
          f"{int(info['apparent_bytes']) / 1024 ** 3:.1f} GiB apparent, {disk_usage(args.dir) / 1e6:.1f} MB on disk "
          f"(ready in {time.perf_counter() - t0:.1f}s)")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    env.pop("K26_DOCTOR_CONFIG", None)
    # An installed doctor has its bytecode compiled (pip does it); let the warm-up run write it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    py = sys.executable
    floor_argv = [py, "-c", FLOOR, args.dir]
    doctor_argv = [py, "-m", "doctor", "check", "--only", "model.shards", "--model-path", args.dir,
                   "--format", "json"]
    # Warm the page cache and check both work.
    _, f_out = timed(floor_argv, env)
    _, d_out = timed(doctor_argv, env)
    assert f_out.returncode == 0, f_out.stderr
    rep = json.loads(d_out.stdout)
    (res,) = [r for r in rep["results"] if r["id"] == "model.shards"]
    # The replica's data are holes: the doctor says so (warn), and that is the only thing it may say.
    assert res["status"] in ("pass", "warn") and not res["details"]["bad_shards"], res["summary"]
    print(f"model.shards: {res['summary']}")
    floor, doctor, floor_cpu, doctor_cpu = [], [], [], []
    for _ in range(args.runs):
        w, c = timed_cpu(floor_argv, env)
        floor.append(w)
        floor_cpu.append(c)
        w, c = timed_cpu(doctor_argv, env)
        doctor.append(w)
        doctor_cpu.append(c)
    fm, dm = statistics.median(floor), statistics.median(doctor)
    ratio = dm / fm
    print(f"floor  (index + safe_open x{info['shards']}): wall median {fm * 1000:7.1f} ms  min {min(floor) * 1000:7.1f}"
          f"  cpu median {statistics.median(floor_cpu) * 1000:7.1f} ms")
    print(f"doctor (check --only model.shards):    wall median {dm * 1000:7.1f} ms  min {min(doctor) * 1000:7.1f}"
          f"  cpu median {statistics.median(doctor_cpu) * 1000:7.1f} ms")
    print(f"ratio doctor/floor: wall median {ratio:.2f}, wall min {min(doctor) / min(floor):.2f}, "
          f"cpu median {statistics.median(doctor_cpu) / statistics.median(floor_cpu):.2f}  "
          f"(target <= 2.0: {'OK' if ratio <= 2.0 else 'OVER'})  cores: {len(os.sched_getaffinity(0))}, "
          f"load average {os.getloadavg()[0]:.1f}")
    return 0 if ratio <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
