#!/usr/bin/env python3
"""`--deep` hashing throughput on page-cached data against one hashlib thread, and `sha256sum`.

Builds a model directory of real (random) data: an index and N shards (default 4 x cores files of
128 MiB), reads it once so it sits in the page cache, then measures in the same run:
  * one hashlib thread over one shard (readinto + update, the doctor's loop): the per-core baseline;
  * the doctor's deep tier (``verify_model_hashes``, verification cache off) over every shard;
  * `sha256sum` over the same files (one process), and `xargs -P cores sha256sum` (one per core).
Target: doctor throughput >= 0.75 x cores x the one-thread baseline.

    python bench/bench_model_deep.py [--dir /tmp/k26-deep-bench] [--files N] [--mib 128] [--runs 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the replica builder is a test fixture

from model_replica import header_bytes, shard_name  # noqa: E402

from doctor.model.hashing import BLOCK, default_workers, verify_model_hashes  # noqa: E402


def build(directory: str, files: int, mib: int) -> list[str]:
    """Shards of one U8 tensor each, filled with random bytes (a 16 MiB random block, repeated)."""
    os.makedirs(directory, exist_ok=True)
    size = mib << 20
    marker = os.path.join(directory, ".bench.json")
    names = [shard_name(i, files) for i in range(1, files + 1)]
    if os.path.exists(marker) and json.loads(Path(marker).read_text()) == {"files": files, "mib": mib}:
        return names
    block = os.urandom(16 << 20)
    weight_map = {}
    for i, name in enumerate(names):
        head, data = header_bytes([(f"t{i}", "U8", (size,))])
        with open(os.path.join(directory, name), "wb") as fh:
            fh.write(head)
            left = data
            while left:
                chunk = block[: min(left, len(block))]
                fh.write(chunk)
                left -= len(chunk)
        weight_map[f"t{i}"] = name
    Path(directory, "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": size * files}, "weight_map": weight_map}))
    Path(marker).write_text(json.dumps({"files": files, "mib": mib}))
    return names


def one_thread_rate(path: str) -> float:
    """bytes/s of one thread hashing one page-cached file with the doctor's read loop."""
    h = hashlib.sha256()
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    t0 = time.perf_counter()
    n_total = 0
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
            n_total += n
    return n_total / (time.perf_counter() - t0)


PROC_HASH = ("import hashlib, sys\nfor p in sys.argv[1:]:\n    h = hashlib.sha256(); buf = bytearray(1 << 23); "
             "v = memoryview(buf)\n    with open(p, 'rb', buffering=0) as fh:\n        while n := fh.readinto(buf): "
             "h.update(v[:n])\n")


def procs_rate(paths: list[str], cores: int, total: int) -> float:
    """``cores`` separate processes (no GIL shared at all), each hashing its share: the ceiling."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", PROC_HASH, *paths[i::cores]]) for i in range(cores)]
    for p in procs:
        p.wait()
    return total / (time.perf_counter() - t0)


def cmd_rate(argv: list[str], total: int, cwd: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, check=True)
    return total / (time.perf_counter() - t0)


def main() -> int:
    cores = default_workers()
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/k26-deep-bench")
    ap.add_argument("--files", type=int, default=4 * cores)
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    names = build(args.dir, args.files, args.mib)
    paths = [os.path.join(args.dir, n) for n in names]
    total = sum(os.path.getsize(p) for p in paths)
    for p in paths:  # into the page cache
        with open(p, "rb") as fh:
            while fh.read(64 << 20):
                pass
    gib = 1024 ** 3
    single, doctor, sums, sums_par, busy, ceiling = [], [], [], [], [], []
    for _ in range(args.runs):
        single.append(one_thread_rate(paths[0]))
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        res = verify_model_hashes(args.dir, use_cache=False, progress=False)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        assert all(f.get("sha256") for f in res["files"]), res
        doctor.append(res["bytes_hashed"] / res["seconds"])
        busy.append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / res["seconds"])
        ceiling.append(procs_rate(paths, cores, total))
        sums.append(cmd_rate(["sha256sum", *names], total, args.dir))
        sums_par.append(cmd_rate(["sh", "-c", f"printf '%s\\n' {' '.join(names)} | xargs -P {cores} -n 1 sha256sum"],
                                 total, args.dir))
    s, d = statistics.median(single), statistics.median(doctor)
    target = 0.75 * cores * s
    print(f"data: {len(paths)} files, {total / gib:.2f} GiB, page-cached; cores: {cores}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"one hashlib thread:          {s / gib:6.2f} GiB/s")
    print(f"doctor --deep ({cores} threads):    {d / gib:6.2f} GiB/s  = {d / s:.2f} x one thread "
          f"(target >= {0.75 * cores:.2f} x: {'OK' if d >= target else 'UNDER'}); "
          f"CPU busy {statistics.median(busy):.2f} cores while hashing")
    c = statistics.median(ceiling)
    print(f"{cores} hashlib processes (ceiling): {c / gib:6.2f} GiB/s; doctor = {d / c:.2f} x the ceiling "
          "(when this is ~1 but the target is missed, the host had no free cores: see load average)")
    print(f"sha256sum (one process):     {statistics.median(sums) / gib:6.2f} GiB/s")
    print(f"xargs -P{cores} sha256sum:         {statistics.median(sums_par) / gib:6.2f} GiB/s")
    return 0 if d >= target else 1


if __name__ == "__main__":
    sys.exit(main())
