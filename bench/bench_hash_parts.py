#!/usr/bin/env python3
"""Where the deep tier's time goes on page-cached shards: each part of `verify_model_hashes` timed beside
`xargs -P cores sha256sum`, in the same rounds.

`bench_model_deep.py` says whether the doctor meets its targets; this one says why it does or does not, by
timing, interleaved round by round on the same warm files, ways of hashing that each leave one cost out:

  * doctor, threads, processes: as in bench_model_deep (the whole call; ``hash_files`` in each mode);
  * fork mmap: children forked, at each call, by a small process started before the rounds, that map and
    hash their files: processes without a copy and without an interpreter's start-up (what a fork server
    would give, its own start-up aside: printed as "fork server ready");
  * threads mmap: threads of this process hashing through a memory map (unsafe in the doctor: a file
    truncated under it kills the process with SIGBUS; safe here on the bench's own files): the read()
    copy's cost, against threads;
  * memory threads: threads hashing bytes already in this process's memory: no I/O at all, only the hash
    and the GIL handed between threads;
  * threads switch 0.5 ms: threads with ``sys.setswitchinterval(0.0005)``: whether a thread waiting for the
    GIL waits on the default 5 ms interval;
  * threads 1M/4M/8M: threads with other read buffers (the default is half the core's L2): a larger one
    hands the GIL over fewer times per byte, and leaves the L2.

Then one timeline of the threads mode (when each file's hashing began and ended, from the call's start), and
start-up figures: `python -I -S -c pass`, one hashing worker ready, and as many as the cores started at once.

    python3 bench/bench_hash_parts.py [--sets 16x64,64x16] [--runs 20] [--json OUT] [--tmp DIR]

Exit 0; 2 on a wrong setup. It prints figures and judges nothing: the targets are bench_model_deep's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_model_deep as deep

from doctor.model import hashing

GIB, MIB = deep.GIB, deep.MIB
SLICE = MIB
BLOCKS = (MIB, 4 * MIB, 8 * MIB)  # the threads' read buffer (one per thread): fewer GIL hand-overs per byte


# One memory-mapped digest, run by the threads here and by the forked children of ``FORKER`` (a small process:
# it imports nothing of the bench, so that a fork copies little).
MMAP_DIGEST = r"""
import hashlib, mmap, os

def mmap_digest(path):
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                mm.madvise(mmap.MADV_SEQUENTIAL)
                view = memoryview(mm)
                try:
                    for i in range(0, size, 1 << 20):
                        h.update(view[i:i + (1 << 20)])
                finally:
                    view.release()
    return h.hexdigest()
"""
_ns: dict[str, Any] = {}
exec(MMAP_DIGEST, _ns)
mmap_digest: Callable[[str], str] = _ns["mmap_digest"]


def pooled(paths: list[str], cores: int, digest: Callable[[str], str]) -> dict[str, str]:
    """``digest`` of every path in ``cores`` threads, largest first, from one queue (as ``hash_files``)."""
    order = sorted(paths, key=lambda p: -os.path.getsize(p))
    with ThreadPoolExecutor(max_workers=min(cores, len(order))) as pool:
        return {os.path.basename(p): d for p, d in zip(order, pool.map(digest, order), strict=True)}


def threads_mmap(paths: list[str], cores: int) -> Callable[[], dict[str, str]]:
    return lambda: pooled(paths, cores, mmap_digest)


def memory_threads(paths: list[str], cores: int) -> tuple[Callable[[], dict[str, str]], int]:
    """Threads hashing the files' bytes from this process's memory (read once, here, untimed)."""
    blobs = {p: Path(p).read_bytes() for p in paths}

    def one(path: str) -> str:
        view = memoryview(blobs[path])
        h = hashlib.sha256()
        for i in range(0, len(view), SLICE):
            h.update(view[i:i + SLICE])
        return h.hexdigest()

    return (lambda: pooled(paths, cores, one)), sum(len(b) for b in blobs.values())


FORKER = MMAP_DIGEST + r"""
import json, sys
paths, cores = json.loads(sys.argv[1]), int(sys.argv[2])
print("ready", flush=True)
for _ in sys.stdin:
    kids = []
    for k in range(min(cores, len(paths))):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, json.dumps({os.path.basename(p): mmap_digest(p) for p in paths[k::cores]}).encode())
            os._exit(0)
        os.close(w)
        kids.append((pid, r))
    got = {}
    for pid, r in kids:
        with os.fdopen(r, "rb") as fh:
            got.update(json.loads(fh.read()))
        os.waitpid(pid, 0)
    print(json.dumps(got), flush=True)
"""


class ForkMmap:
    """A small single-threaded process, started untimed, that forks ``cores`` children per call, each mapping
    and hashing every ``cores``-th file (largest first): processes that hash without a copy, minus any
    interpreter start-up (a fork of a small process only)."""

    def __init__(self, paths: list[str], cores: int) -> None:
        order = sorted(paths, key=lambda p: -os.path.getsize(p))
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", FORKER, json.dumps(order), str(cores)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"
        self.start_ms = round((time.perf_counter() - t0) * 1e3, 1)

    def __call__(self) -> dict[str, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def switch_interval(fn: Callable[[], Any], seconds: float) -> Callable[[], Any]:
    def run() -> Any:
        saved = sys.getswitchinterval()
        sys.setswitchinterval(seconds)
        try:
            return fn()
        finally:
            sys.setswitchinterval(saved)
    return run


def timeline(paths: list[str], cores: int, calls: int = 5) -> dict[str, Any]:
    """Threads-mode calls with each file's start, end and CPU time recorded (ms from its call's start; CPU:
    ``time.thread_time``, the copy in the kernel included): a file whose wall time is well above its CPU time
    waited (for the GIL, or for a core), one whose CPU time is high was hashed by a slow core."""
    marks: list[tuple[float, float, float]] = []
    lock = threading.Lock()
    real = hashing.sha256_file
    t0 = time.perf_counter()

    def traced(*a: Any, **k: Any) -> str:
        s, c = time.perf_counter(), time.thread_time()
        try:
            return real(*a, **k)
        finally:
            with lock:
                marks.append((s - t0, time.perf_counter() - t0, time.thread_time() - c))
    jobs = [hashing.HashJob(os.path.basename(p), p, os.stat(p)) for p in paths]
    rows = []
    hashing.sha256_file = traced  # type: ignore[assignment]
    try:
        for _ in range(calls):
            marks.clear()
            t0 = time.perf_counter()
            hashing.hash_files(jobs, workers=cores, processes=False)
            total = time.perf_counter() - t0
            starts = sorted(m[0] for m in marks)
            ends = sorted(m[1] for m in marks)
            slow = max(marks, key=lambda m: m[1] - m[0])
            waits = [(e - s) / c for s, e, c in marks if c > 0]
            rows.append({"call": total, "first_start": starts[0], "last_start": starts[-1],
                         "median_end": statistics.median(ends), "last_end": ends[-1],
                         "slowest_wall": slow[1] - slow[0], "slowest_cpu": slow[2],
                         "median_wall_over_cpu": statistics.median(waits) if waits else 0.0})
    finally:
        hashing.sha256_file = real  # type: ignore[assignment]
    return {k: round(statistics.median(r[k] for r in rows) * (1 if k == "median_wall_over_cpu" else 1e3), 2)
            for k in rows[0]} | {"calls": calls}


def startup(cores: int, tiny: str) -> dict[str, Any]:
    """Interpreter and worker start-up, in ms (medians of 7): a bare interpreter, the fork server until it is
    up, and until every one of ``cores`` workers from it (forked on request, or from a pool forked in advance)
    has answered for a small file."""
    def bare() -> None:
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)

    def server_up() -> None:
        server = hashing.WorkerServer.start()
        assert server is not None and server.ready(30)
        server.close()

    def all_workers(pool: int) -> Callable[[], None]:
        def run() -> None:
            server = hashing.WorkerServer.start(pool)
            assert server is not None and server.ready(30)
            workers = [server.fork() for _ in range(cores)]
            for w in workers:
                assert w is not None and w.hash(tiny, None) is not None
                w.close()
            server.close()
        return run
    out = {}
    for name, fn in (("python -I -S -c pass", bare), ("fork server up", server_up),
                     (f"fork server and {cores} workers, every first answer", all_workers(0)),
                     (f"fork server with a pool of {cores}, every worker's first answer", all_workers(cores))):
        out[name] = round(statistics.median(deep.timed(fn)[0] for _ in range(7)) * 1e3, 1)
    return out


def host_extra() -> dict[str, Any]:
    out: dict[str, Any] = {}
    sha = shutil.which("sha256sum")
    if sha and shutil.which("ldd"):
        libs = subprocess.run(["ldd", sha], capture_output=True, text=True).stdout
        out["sha256sum_libcrypto"] = "libcrypto" in libs
    try:
        import socket

        s = socket.socket(socket.AF_ALG, socket.SOCK_SEQPACKET, 0)  # type: ignore[attr-defined]
        s.bind(("hash", "sha256"))
        s.close()
        out["af_alg_sha256"] = True
    except (OSError, AttributeError) as exc:
        out["af_alg_sha256"] = f"no: {exc}"
    import ssl

    out["openssl"] = ssl.OPENSSL_VERSION
    out["switch_interval_s"] = sys.getswitchinterval()
    return out


def parts_set(d: str, cores: int, runs: int) -> dict[str, Any]:
    paths = deep.shard_paths(d)
    total = sum(os.path.getsize(p) for p in paths)
    deep.warm_up(paths)
    mem, mem_bytes = memory_threads(paths, cores)
    forker = ForkMmap(paths, cores)
    tools: dict[str, Callable[[], Any]] = {
        "xargs sha256sum": deep.xargs_cmd(paths, cores, ["sha256sum"]),
        "doctor": deep.doctor_call(d, cores),
        "threads": deep.engine_call(paths, cores, False),
        "processes": deep.engine_call(paths, cores, True),
        "fork mmap": forker,
        "threads mmap": threads_mmap(paths, cores),
        "memory threads": mem,
        "threads switch 0.5 ms": switch_interval(deep.engine_call(paths, cores, False), 0.0005),
    }
    for block in BLOCKS:
        if block != hashing.read_block():
            tools[f"threads {block // MIB}M"] = deep.with_block(deep.engine_call(paths, cores, False), block)
    rates: dict[str, list[float]] = {k: [] for k in tools}
    want = None
    for i in range(runs):
        order = list(tools) if i % 2 == 0 else list(reversed(tools))
        for name in order:
            seconds, digests = deep.timed(tools[name])
            want = want or digests
            if digests != want:
                raise SystemExit(f"{name} gave other digests on {d}")
            rates[name].append((mem_bytes if name == "memory threads" else total) / seconds)
    base = rates["xargs sha256sum"]
    out = {"median_gib_s": {k: round(statistics.median(v) / GIB, 3) for k, v in rates.items()},
           "over_xargs": {k: round(statistics.median(a / b for a, b in zip(v, base, strict=True)), 3)
                          for k, v in rates.items()},
           "over_threads": {k: round(statistics.median(a / b for a, b in zip(v, rates["threads"], strict=True)), 3)
                            for k, v in rates.items()},
           "runs": runs, "timeline_ms": timeline(paths, cores), "fork_server_ready_ms": forker.start_ms}
    forker.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="16x64,64x16,32x64", help="FILESxMIB sets, e.g. 16x64,64x16")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    if not (shutil.which("sha256sum") and shutil.which("xargs")):
        print("sha256sum and xargs are needed (the baseline)")
        return 2
    cores = args.workers or hashing.default_workers()
    parent = args.tmp or os.environ.get("TMPDIR") or "/var/tmp"
    root = tempfile.mkdtemp(prefix="k26-hash-parts-", dir=parent)
    doc: dict[str, Any] = {"host": {**deep.host_facts(root, cores), **host_extra()}, "sets": {}}
    t_start = time.monotonic()
    try:
        data = deep.Data(root)
        tiny = os.path.join(root, "tiny")
        Path(tiny).write_bytes(b"x" * 4096)
        doc["startup_ms"] = startup(cores, tiny)
        print("host:", {k: doc["host"].get(k) for k in ("cores", "cpu", "l2", "kernel", "python",
                                                          "sha256sum_libcrypto", "af_alg_sha256", "openssl")})
        print("start-up, ms:", doc["startup_ms"], flush=True)
        for key in deep.parse_sets(args.sets):
            res = parts_set(data.dir_for(key), cores, args.runs)
            doc["sets"][f"{key[0]}x{key[1]}"] = res
            print(f"{key[0]} x {key[1]} MiB, {args.runs} rounds, GiB/s (median) | over xargs | over threads:")
            for name, rate in res["median_gib_s"].items():
                print(f"   {name:24} {rate:6.2f}   {res['over_xargs'][name]:.2f}   {res['over_threads'][name]:.2f}")
            print("   threads timeline, ms (medians of 5 calls; median_wall_over_cpu: a ratio):", res["timeline_ms"],
                  f"; fork server ready in {res['fork_server_ready_ms']} ms", flush=True)
            deep.write_json(args.json_out, doc)
    finally:
        doc["seconds"] = round(time.monotonic() - t_start, 1)
        deep.write_json(args.json_out, doc)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
