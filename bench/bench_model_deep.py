#!/usr/bin/env python3
"""`--deep` hashing throughput on page-cached data against the best peer, `xargs -P cores sha256sum`.

Builds a model directory of real (random) data: an index and N shards (default 4 x cores files of
128 MiB), reads it once so it sits in the page cache, then measures in the same run, interleaved:
  * one hashlib thread over one shard (readinto + update, the doctor's in-process loop);
  * the doctor's deep tier (``verify_model_hashes``, verification cache off) over every shard;
  * the peers, one process per file, cores at once: `xargs -P cores -n 1 sha256sum`, and where the
    `openssl` command exists `xargs -P cores -n 1 openssl dgst -sha256` (coreutils' sha256sum is built
    without SHA extensions on some distributions, OpenSSL's uses them: the faster of the two is the peer);
  * `sha256sum` over the same files (one process), and cores hashlib processes (8 MiB reads).
Target: the doctor >= 1.0 x the best peer (the median of the per-run ratios). Exit 0 when met.

    python bench/bench_model_deep.py [--dir /tmp/k26-deep-bench] [--files N] [--mib 128] [--runs 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
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
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    names = build(args.dir, args.files, args.mib)
    paths = [os.path.join(args.dir, n) for n in names]
    total = sum(os.path.getsize(p) for p in paths)
    for p in paths:  # into the page cache
        with open(p, "rb") as fh:
            while fh.read(64 << 20):
                pass
    gib = 1024 ** 3
    single, doctor, sums, busy, ceiling, ratios = [], [], [], [], [], []
    listing = f"printf '%s\\n' {' '.join(names)} | xargs -P {cores} -n 1"
    peers = {"sha256sum": ["sh", "-c", f"{listing} sha256sum"]}
    if shutil.which("openssl"):
        peers["openssl dgst -sha256"] = ["sh", "-c", f"{listing} openssl dgst -sha256"]
    peer_rates: dict[str, list[float]] = {k: [] for k in peers}
    for i in range(args.runs):
        single.append(one_thread_rate(paths[0]))
        # Alternate the order, so neither the doctor nor the peers always find the caches warm.
        first_peers = i % 2 == 1
        if first_peers:
            for name, argv in peers.items():
                peer_rates[name].append(cmd_rate(argv, total, args.dir))
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        res = verify_model_hashes(args.dir, use_cache=False, progress=False)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert all(f.get("sha256") for f in res["files"]), res
        doctor.append(res["bytes_hashed"] / res["seconds"])
        busy.append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime + c1.ru_utime - c0.ru_utime
                     + c1.ru_stime - c0.ru_stime) / res["seconds"])
        if not first_peers:
            for name, argv in peers.items():
                peer_rates[name].append(cmd_rate(argv, total, args.dir))
        ratios.append(doctor[-1] / max(rates[-1] for rates in peer_rates.values()))
        ceiling.append(procs_rate(paths, cores, total))
        sums.append(cmd_rate(["sha256sum", *names], total, args.dir))
    s, d = statistics.median(single), statistics.median(doctor)
    ratio = statistics.median(ratios)
    print(f"data: {len(paths)} files, {total / gib:.2f} GiB, page-cached; cores: {cores}; "
          f"load average {os.getloadavg()[0]:.1f}; {args.runs} runs, medians")
    print(f"one hashlib thread:          {s / gib:6.2f} GiB/s")
    print(f"doctor --deep ({cores} workers):    {d / gib:6.2f} GiB/s  = {d / s:.2f} x one thread; "
          f"CPU busy {statistics.median(busy):.2f} cores while hashing")
    for name, rates in peer_rates.items():
        print(f"xargs -P{cores} {name}: {statistics.median(rates) / gib:6.2f} GiB/s")
    print(f"doctor / best peer: {ratio:.2f} x (per run: {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"target >= 1.00: {'OK' if ratio >= 1.0 else 'UNDER'})")
    c = statistics.median(ceiling)
    print(f"{cores} hashlib processes, 8 MiB reads: {c / gib:6.2f} GiB/s")
    print(f"sha256sum (one process):     {statistics.median(sums) / gib:6.2f} GiB/s")
    return 0 if ratio >= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
