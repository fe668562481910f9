"""The deep tier: sha256 of every shard at disk speed, compared with the digests the download promised.

Expected digests, in this order: a manifest k26-doctor wrote (``k26-doctor manifest write``),
huggingface_hub's ``--local-dir`` metadata (the etag of an LFS file is its sha256), the Hugging Face
cache's blob names (``blobs/<sha256>``). All three are the sha256 of the whole file, so a file is one
digest, computed front to back by one core: files are hashed in parallel, a file at a time from one
queue, largest first, never split.

Two ways to hash, the same bytes either way, in one thread per file at a time (``run_slots``: all started
before any begins):
  * by the thread itself, ``readinto`` one buffer of half the core's L2 per thread, kept for all its files
    (hashlib and the read release the GIL): nothing to start, but every byte is copied once;
  * through a worker process the thread drives (``doctor/model/sha256_worker.py``: stdlib only, the page
    cache hashed through a memory map, no copy, no GIL shared), taken from the pool of a fork server. ``check
    --deep`` starts that server when its run begins (``workers_for_run``), and every file goes to a worker.
    A call outside such a run starts a server of its own where each thread has enough to hash
    (``WORKER_WAIT_MIN``, ``plan``). A file that large waits for a server still starting; a smaller one is
    hashed by its thread meanwhile. Where the server cannot start, or a worker dies, the thread reads the
    file itself.
Reads are announced sequential (``POSIX_FADV_SEQUENTIAL``: a larger readahead on a cold cache). Where at
most half the cores hash (a few large files), each large file also gets a thread that reads it ahead of
its hasher (``Prefetch``), so that the disk is not idle while the hasher hashes; it stops at once on a
file that reads faster than a core hashes (cached, or a disk that outruns hashing).
Hashing stops within a few MiB when the run's deadline passes or on Ctrl-C (a file not finished is an
error, never read again after its worker was killed). A verification cache, keyed by (device, inode,
size, mtime_ns, ctime_ns) and kept outside the model directory, lets a restart re-hash only what changed.
"""

from __future__ import annotations

import array
import collections
import contextlib
import functools
import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from doctor.core import deadline
from doctor.core import proc as proc_registry
from doctor.core.fileio import NotRegularFile, atomic_write, describe_error, kind_of, open_regular, read_capped
from doctor.model.index import INDEX_NAME, SINGLE_NAME, read_index
from doctor.model.layout import file_state, read_hf_local_metadata
from doctor.model.manifest import MANIFEST_NAME, read_manifest
from doctor.model.workers import cpu_count

MIB = 1024 * 1024
# The in-process read loop's buffer: copied into and hashed while it is still in the core's L2 cache, so half
# the L2 (``l2_block``), between 256 KiB and 1 MiB. Measured: on a loaded 2-core VM (L2 512 KiB) one thread
# hashed page-cached data at 0.73, 0.80, 0.65, 0.54, 0.42 GiB/s with 64 KiB, 256 KiB, 1, 4, 16 MiB reads (and
# 1.04 through a memory map: what the worker processes do); on a 16-core host (L2 2 MiB), 1 GiB in 64 files,
# 16 threads, against `xargs -P16 sha256sum`: 0.31, 0.56, 0.71, 0.93, 0.91, 0.84 with 128, 256, 512 KiB, 1, 2,
# 4 MiB and a buffer per file (bench/results/h200x1-deep-hashing-3.txt); 0.94, 0.99, 1.00, 1.00 with 256, 512 KiB,
# 1, 2 MiB and one per thread (-4). ``BLOCK`` set overrides it (bench variants, tests).
BLOCK: int | None = None
BLOCK_MIN, BLOCK_MAX = 256 * 1024, 1024 * 1024
REPORT_BYTES = 16 * MIB  # progress, and a look at the deadline, every this many bytes of a file
# A file at least this large waits for the worker fork server to start (about 20 ms on the 16-core host) rather
# than be hashed by a thread while it starts: a worker hashes without a copy, 10-20% faster than a thread there
# (bench/bench_hash_parts.py), which repays the wait from about 150-200 ms of hashing (a few hundred MiB) up.
# bench/bench_model_deep.py times threads and processes at each size ("threads", "processes") to check it.
WORKER_WAIT_MIN = 256 * MIB
# On a cold cache a file's readahead alone leaves the disk idle while the file's hasher hashes: a thread of
# its own per file (``Prefetch``) reads up to PREFETCH_AHEAD bytes past what was hashed, PREFETCH_STEP at a
# time, for files larger than PREFETCH_MIN (PREFETCH_AHEAD 0: never).
PREFETCH_AHEAD = 64 * MIB
PREFETCH_STEP = 16 * MIB  # as `dd bs=16M`
PREFETCH_MIN = 64 * MIB
FD_SIZE = array.array("i").itemsize
MIN_SLOT_BYTES = 8 * MIB  # no thread or worker for less than this (a start costs more than it hashes)
WORKER = Path(__file__).with_name("sha256_worker.py")
CACHE_FILE = "verify-cache.json"
CACHE_VERSION = 1
MAX_CACHE_BYTES = 256 * 1024 * 1024


def default_workers() -> int:
    return max(1, cpu_count())


def default_cache_dir(environ: dict[str, str] | None = None) -> str:
    """``$K26_DOCTOR_VERIFY_CACHE_DIR``, else ``/var/tmp/k26-doctor-<uid>``.

    Why /var/tmp: the contract lets ``check`` write only in a temporary directory, and /var/tmp is the
    one temporary directory the FHS keeps across reboots, so a restart re-hashes only what changed.
    The cache is never inside the model directory, and a lost cache only costs a re-hash.
    """
    env = os.environ if environ is None else environ
    if env.get("K26_DOCTOR_VERIFY_CACHE_DIR"):
        return env["K26_DOCTOR_VERIFY_CACHE_DIR"]
    return os.path.join(env.get("K26_DOCTOR_VAR_TMP") or "/var/tmp", f"k26-doctor-{os.getuid()}")


class Stopped(Exception):
    """Hashing stops: the run's deadline passed or Ctrl-C (``str()`` says which); raised by a progress
    callback, so a loop stops at its next report."""


def advise_sequential(fd: int) -> None:
    """Tell the kernel the whole file is read once, front to back (its readahead window doubles)."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except (AttributeError, OSError):  # not Linux, or a file system that takes no advice
        pass


def l2_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The first core's L2 cache in bytes (sysfs), or None when unknown."""
    for index in sorted(Path(sysfs).glob("index*")):
        try:
            if read_capped(index / "level", 64, "a cache level").strip() != b"2":
                continue
            size = read_capped(index / "size", 64, "a cache size").decode("ascii", "replace").strip().upper()
        except OSError:
            continue
        unit = {"K": 1024, "M": MIB}.get(size[-1:], 1)
        digits = size.rstrip("KMB")
        if digits.isdigit():
            return int(digits) * unit
    return None


@functools.lru_cache(maxsize=1)
def l2_block(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Half the first core's L2 cache (``l2_bytes``), within ``BLOCK_MIN``-``BLOCK_MAX``; ``BLOCK_MIN`` when
    unknown."""
    l2 = l2_bytes(sysfs)
    return BLOCK_MIN if l2 is None else max(BLOCK_MIN, min(BLOCK_MAX, l2 // 2))


def read_block() -> int:
    """The read loop's buffer size now: ``BLOCK`` where set, else ``l2_block()``."""
    return BLOCK or l2_block()


def sha256_file(path: str, on_bytes: Callable[[int], None] | None = None, block: int | None = None,
                buf: bytearray | None = None) -> str:
    """sha256 of one file, read with ``readinto`` into one reused buffer: ``buf`` (a thread hashing many files
    passes the same one: a buffer freed per file costs a 16-thread process an ``munmap`` each, with its TLB
    shootdown on every core), else a new one of ``block`` bytes (default ``read_block()``); ``on_bytes(n)``
    every ``REPORT_BYTES`` and at the end (it may raise ``Stopped`` to stop)."""
    h = hashlib.sha256()
    if buf is None:
        buf = bytearray(block or read_block())
    view = memoryview(buf)
    size = len(buf)
    pending = 0
    with open_regular(path, buffering=0) as fh:  # a FIFO where a shard should be is refused, never waited on
        advise_sequential(fh.fileno())
        while True:
            n = fh.readinto(buf)  # type: ignore[attr-defined]
            if not n:
                break
            h.update(buf if n == size else view[:n])
            pending += n
            if pending >= REPORT_BYTES and on_bytes is not None:
                on_bytes(pending)
                pending = 0
    if pending and on_bytes is not None:
        on_bytes(pending)
    return h.hexdigest()


class Prefetch:
    """A thread that reads one file ahead of its hasher, like `dd`: ``step`` bytes at a time into a scratch
    buffer, whenever fewer than ``ahead`` bytes past what was hashed (``advance``) have been read.

    Why: on a cold cache, hashing a file and reading it take turns in one thread (its readahead covers only a
    few MiB), so a disk that two streams could keep busy idles while each hasher hashes. This thread keeps a
    stream of reads going behind the kernel's readahead (large page-cache folios), and the hasher finds the
    pages cached. Not ``POSIX_FADV_WILLNEED``: measured, it made cold hashing slower (0.70 against 0.81 of
    `dd` on the 16-core host; 0.4-0.6 against 1.1 GiB/s on a 2-core VM). It stops at once where reads come
    back faster than ``FAST_RATE``, more than a hashing core can take (the pages were cached, or the disk
    outruns the hasher: either way the copy would only cost). Three ``PROBE`` reads before its first ``step``
    say so (a cached file costs it 3 MiB of copying): without readahead (``POSIX_FADV_RANDOM`` meanwhile, so
    that one probe's readahead does not serve the next), and ahead of the hasher (it starts ``2 * step`` into
    the file), so that pages the hasher's own readahead just brought in are not taken for a fast disk. It does
    nothing that hashing depends on: whatever it cannot do is not done."""

    FAST_RATE = 2 * 1024 * MIB  # bytes/s: one core hashes about 1.2 GiB/s (sha_ni; far less without)
    PROBE = MIB

    def __init__(self, path: str, size: int, ahead: int, step: int = PREFETCH_STEP) -> None:
        self.path, self.size, self.ahead, self.step = path, size, ahead, step
        self.hashed = 0
        self.done = False
        self.read = 0
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="k26-prefetch", daemon=True)
        self.thread.start()

    @classmethod
    def maybe(cls, job: HashJob, hashers: int) -> Prefetch | None:
        """One for ``job`` when prefetching is on (``PREFETCH_AHEAD``), the file is larger than
        ``PREFETCH_MIN`` and every hasher has a spare core for its reader (at most half the cores hash)."""
        if PREFETCH_AHEAD <= 0 or job.st.st_size <= PREFETCH_MIN or hashers * 2 > cpu_count():
            return None
        return cls(job.path, job.st.st_size, PREFETCH_AHEAD)

    def advance(self, n: int) -> None:
        with self.cond:
            self.hashed += n
            self.cond.notify()

    def close(self) -> None:
        """Stop at the next step; wait for it a few seconds at most (a read of a stalled mount may never end:
        the thread is a daemon, and closes its descriptor itself)."""
        with self.cond:
            self.done = True
            self.cond.notify()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        try:
            with open_regular(self.path, buffering=0) as fh:
                scratch = bytearray(self.step)
                self.read = min(self.size, 2 * self.step)  # the file's head: the hasher's own readahead has it
                if self._fast(fh.fileno(), memoryview(scratch)[:self.PROBE]):
                    return
                while self.read < self.size:
                    with self.cond:
                        while not self.done and self.read - self.hashed >= self.ahead:
                            self.cond.wait()
                        if self.done:
                            return
                    n = os.preadv(fh.fileno(), [scratch], self.read)
                    if n <= 0:
                        return
                    self.read += n
        except (AttributeError, OSError):  # not Linux, a file that went away or changed kind: no prefetch
            return

    def _fast(self, fd: int, probe: memoryview) -> bool:
        """Three small reads where the prefetch starts: the second and third both faster than ``FAST_RATE``
        (the first faults the buffer in) say the file is cached or the disk outruns a hasher."""
        fast = 0
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # a probe reads what it asks, not its readahead's
        for i in range(3):
            if self.read >= self.size:
                return True
            t0 = time.monotonic()
            n = os.preadv(fd, [probe], self.read)
            if n <= 0:
                return True
            self.read += n
            fast += i > 0 and n >= self.FAST_RATE * (time.monotonic() - t0)
        advise_sequential(fd)
        return fast == 2


def file_key(st: os.stat_result) -> str:
    """The verification cache key: a file is the same file with the same bytes while these hold."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


class VerifyCache:
    """sha256 by file identity, one JSON file, written atomically (merged with concurrent writers)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, CACHE_FILE)
        self.entries: dict[str, dict[str, Any]] = self._load()
        self.new: dict[str, dict[str, Any]] = {}
        self.error: str | None = None

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            doc = json.loads(read_capped(self.path, MAX_CACHE_BYTES, "a verification cache"))
        except (OSError, ValueError, RecursionError):
            return {}
        if not isinstance(doc, dict) or doc.get("version") != CACHE_VERSION or not isinstance(doc.get("entries"), dict):
            return {}
        return {k: v for k, v in doc["entries"].items() if isinstance(v, dict) and isinstance(v.get("sha256"), str)}

    def get(self, st: os.stat_result) -> str | None:
        hit = self.entries.get(file_key(st))
        return hit["sha256"] if hit else None

    def put(self, st: os.stat_result, path: str, digest: str) -> None:
        self.new[file_key(st)] = {"sha256": digest, "path": path, "at": int(time.time())}

    def save(self) -> None:
        """Merge what was hashed into the cache file; a failure is recorded, never raised."""
        if not self.new:
            return
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            merged = self._load()
            merged.update(self.new)
            merged = _prune(merged)
            atomic_write(self.path, json.dumps({"version": CACHE_VERSION, "entries": merged}).encode(), 0o600)
            self.entries = merged
            self.new = {}
        except OSError as exc:
            self.error = f"cannot write {self.path}: {exc.strerror or exc}"


def _prune(entries: dict[str, dict[str, Any]], limit: int = 20000) -> dict[str, dict[str, Any]]:
    """Drop entries whose file is gone or changed (a different key now), and the oldest beyond ``limit``."""
    keep: dict[str, dict[str, Any]] = {}
    for key, entry in entries.items():
        try:
            if file_key(os.stat(entry.get("path") or "")) != key:
                continue
        except OSError:
            continue
        keep[key] = entry
    if len(keep) > limit:
        keep = dict(sorted(keep.items(), key=lambda kv: kv[1].get("at", 0))[-limit:])
    return keep


class Progress:
    """Bytes, rate and ETA on one terminal line (stderr), at most a few times a second."""

    def __init__(self, total: int, files: int, stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.total = total
        self.files = files
        self.done_files = 0
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled if enabled is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._last = 0.0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if self.enabled and now - self._last >= 0.25:
                self._last = now
                self._draw(now)

    def file_done(self) -> None:
        with self._lock:
            self.done_files += 1

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        el = max(now - self.start, 1e-9)
        rate = self.done / el
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        gib = 1024 ** 3
        eta_s = "--" if eta == float("inf") else f"{int(eta // 60)}m{int(eta % 60):02d}s"
        return (f"sha256 {self.done / gib:7.1f}/{self.total / gib:.1f} GiB  {rate / gib:5.2f} GiB/s  "
                f"ETA {eta_s}  [{self.done_files}/{self.files} files]")

    def _draw(self, now: float) -> None:
        try:
            self.stream.write("\r\x1b[2K" + self.line(now))
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def close(self) -> None:
        if self.enabled:
            try:
                self.stream.write("\r\x1b[2K")
                self.stream.flush()
            except (OSError, ValueError):
                pass


@dataclass
class HashJob:
    name: str
    path: str
    st: os.stat_result


def plan(todo: list[HashJob], workers: int | None, processes: bool | None) -> tuple[int, bool]:
    """How many files at once, and whether to start worker processes: ``(n, processes)``.

    ``n``: the workers asked for (default: cores), at most one per file and one per ``MIN_SLOT_BYTES``.
    Processes (unless ``processes`` says) when the least a thread hashes, the largest file or an equal share
    of the whole, is at least ``WORKER_WAIT_MIN``: less than that, the server's start-up (and the core it takes
    from the threads meanwhile) costs more than the copy it saves."""
    total = sum(j.st.st_size for j in todo)
    n = max(1, min(workers or default_workers(), len(todo), -(-total // MIN_SLOT_BYTES)))
    share = max([total / n, *(j.st.st_size for j in todo)])
    return n, (share >= WORKER_WAIT_MIN if processes is None else processes)


def waits_for_worker(job: HashJob, processes: bool | None) -> bool:
    """Whether a thread waits for the fork server before hashing ``job`` (else it hashes the file itself while
    the server starts): always when workers were asked for, else for a file of ``WORKER_WAIT_MIN`` or more."""
    return processes is True or job.st.st_size >= WORKER_WAIT_MIN


def hash_files(jobs: list[HashJob], *, workers: int | None = None, cache: VerifyCache | None = None,
               progress: Progress | None = None, processes: bool | None = None) -> dict[str, dict[str, Any]]:
    """sha256 per job name: ``{"sha256", "cached", "seconds"}`` or ``{"error"}``; largest files first.

    ``processes``: True, every file through a worker (a thread waits for the fork server); False, threads
    only; None, the run's server where there is one (``workers_for_run``), else ``plan`` decides."""
    results, todo = from_cache(jobs, cache, progress)
    if not todo:
        return results
    todo.sort(key=lambda j: -j.st.st_size)
    n, use_processes = plan(todo, workers, processes)
    run = HashRun(todo, n, cache, progress, processes)
    run.server = run_server() if processes is not False else None
    own = run.server is None and use_processes
    if own:
        run.server = WorkerServer.start(n)
    elif run.server is not None and run.server.ready():
        # The run's server, up long since: its "ready" is taken here, before the threads start (left to them, one
        # would take it while the others, finding the server busy and a small file not worth a wait, read theirs
        # themselves: on the 16-core host 3 to 15 of 16 threads did, in a run's first call), and every thread's
        # worker is asked for in one request (one at a time, the 16th thread had its worker 4-5 ms after the first).
        run.handed.extend(run.server.fork_many(n))
    try:
        parts = run_slots(run.slot, n, run.interrupted)
    finally:
        while run.handed:  # a thread that found no file (a stop) left its worker
            run.handed.pop().close()
        if own and run.server is not None:
            run.server.close()
    for part in parts:
        results.update(part)
    why = run.stop_reason() or "hashing interrupted"
    for job in todo:  # left in the queue by a stop
        results.setdefault(job.name, {"error": why})
    return results


def from_cache(jobs: list[HashJob], cache: VerifyCache | None, progress: Progress | None
               ) -> tuple[dict[str, dict[str, Any]], list[HashJob]]:
    """(the results the verify cache already holds, the jobs left to hash); a cached file counts as done for the
    progress line and its bytes leave the total."""
    results: dict[str, dict[str, Any]] = {}
    todo: list[HashJob] = []
    for job in jobs:
        digest = cache.get(job.st) if cache is not None else None
        if digest:
            results[job.name] = {"sha256": digest, "cached": True}
            if progress is not None:
                progress.total -= job.st.st_size
                progress.file_done()
        else:
            todo.append(job)
    return results, todo


class HashRun:
    """One ``hash_files`` call's shared state: the queue of files (largest first), the stop (Ctrl-C or the run's
    deadline), the progress line, the verify cache, the fork server and the workers taken from it before the
    threads start. Each of the ``n`` threads runs ``slot``."""

    def __init__(self, todo: list[HashJob], n: int, cache: VerifyCache | None, progress: Progress | None,
                 processes: bool | None) -> None:
        self.queue = collections.deque(todo)
        self.lock = threading.Lock()
        self.n = n
        self.cache = cache
        self.progress = progress
        self.processes = processes
        self.interrupted = threading.Event()
        self.server: WorkerServer | None = None
        self.handed: collections.deque[WorkerProcess] = collections.deque()  # workers taken before the threads

    def stop_reason(self) -> str | None:
        if self.interrupted.is_set():
            return "hashing interrupted"
        if deadline.expired():
            return f"hashing stopped: {deadline.ended()}"
        return None

    def tick(self, nbytes: int) -> None:
        """Progress, and the stop: every report of every file looks at the deadline."""
        if self.progress is not None:
            self.progress.add(nbytes)
        why = self.stop_reason()
        if why:
            raise Stopped(why)

    def take(self) -> HashJob | None:
        with self.lock:
            return self.queue.popleft() if self.queue and self.stop_reason() is None else None

    def finish(self, job: HashJob, t0: float, digest: str | None, error: str | None) -> tuple[str, dict[str, Any]]:
        """A file's result; a file that changed while it was hashed is said so and not cached."""
        if self.progress is not None:
            self.progress.file_done()
        if error is not None or digest is None:
            return job.name, {"error": error or "no digest"}
        try:
            after = os.stat(job.path)
        except OSError:
            after = None
        res: dict[str, Any] = {"sha256": digest, "cached": False, "seconds": round(time.monotonic() - t0, 3)}
        if after is None or file_key(after) != file_key(job.st):
            res["changed_while_hashing"] = True
        elif self.cache is not None:
            self.cache.put(job.st, job.path, digest)
        return job.name, res

    @contextlib.contextmanager
    def reading(self, job: HashJob) -> Iterator[Callable[[int], None]]:
        """The progress callback for hashing ``job``: ``tick``, and where ``Prefetch.maybe`` gives one, its
        prefetch told each step too (stopped when the hashing ends, however it ends)."""
        prefetch = Prefetch.maybe(job, self.n)
        if prefetch is None:
            yield self.tick
            return

        def both(nbytes: int) -> None:
            prefetch.advance(nbytes)
            self.tick(nbytes)
        try:
            yield both
        finally:
            prefetch.close()

    def in_thread(self, job: HashJob, buf: bytearray) -> tuple[str, dict[str, Any]]:
        t0 = time.monotonic()
        try:
            with self.reading(job) as on_bytes:
                digest = sha256_file(job.path, on_bytes, buf=buf)
        except Stopped as stop:
            return job.name, {"error": str(stop)}
        except OSError as exc:
            return self.finish(job, t0, None, f"cannot read: {exc.strerror or exc}")
        return self.finish(job, t0, digest, None)

    def by_worker(self, worker: WorkerProcess, job: HashJob) -> tuple[str, dict[str, Any]] | None:
        """The worker's answer for ``job``, or a stop; None when the worker died and the file is to be
        read here."""
        t0 = time.monotonic()
        try:
            with self.reading(job) as on_bytes:
                answer = worker.hash(job.path, on_bytes)
        except Stopped as stop:
            worker.close(kill=True)
            return job.name, {"error": str(stop)}
        if answer is not None:
            return self.finish(job, t0, answer.get("sha256"), answer.get("error"))
        why = self.stop_reason()  # killed at the run's deadline, or Ctrl-C: nothing is read again
        return (job.name, {"error": why}) if why else None

    def took(self) -> WorkerProcess | None:
        try:
            return self.handed.popleft()
        except IndexError:
            return None

    def worker_for(self, job: HashJob, worker: WorkerProcess | None) -> WorkerProcess | None:
        """This thread's worker for ``job``: the one it has, else one handed out before the threads started, else
        one forked now (for a small file, only if the server is already up)."""
        if worker is None:
            worker = self.took()
        if worker is None and self.server is not None and self.server.ready(
                WorkerServer.READY_WAIT if waits_for_worker(job, self.processes) else 0.0):
            worker = self.server.fork()
        return worker

    def slot(self) -> list[tuple[str, dict[str, Any]]]:
        """One thread taking files until the queue is empty (or a stop): each through this thread's worker,
        forked when first needed (for a small file, only if the server is already up), else by reading it
        itself."""
        out: list[tuple[str, dict[str, Any]]] = []
        worker: WorkerProcess | None = None
        buf: bytearray | None = None  # this thread's read buffer, made when first needed, kept for its files
        try:
            while (job := self.take()) is not None:
                worker = self.worker_for(job, worker)
                if worker is not None:
                    done = self.by_worker(worker, job)
                    if done is None or not worker.alive():
                        worker.close()  # it died (e.g. SIGBUS: the file shrank under its map): read it here
                        worker = None
                    if done is not None:
                        out.append(done)
                        continue
                buf = buf if buf is not None else bytearray(read_block())
                out.append(self.in_thread(job, buf))
        finally:
            if worker is not None:
                worker.close()
        return out


def run_slots(slot: Callable[[], list[tuple[str, dict[str, Any]]]], n: int,
              interrupted: threading.Event) -> list[list[tuple[str, dict[str, Any]]]]:
    """``slot()`` in ``n`` threads that start together, and what each returned.

    Why not a thread pool: a pool starts its threads one by one as work is submitted, and each start waits for
    the new thread to take the GIL from the ones already hashing; on the 16-core host the 16th thread began
    7 ms after the first (of a 100 ms call hashing 1 GiB, bench/bench_hash_parts.py), and a file begun late
    ends late. Here every thread is started first and waits (without the GIL) until all are there, then all
    begin at once. Ctrl-C in the waiting thread stops the others at their next report, and is raised once
    they have stopped."""
    go = threading.Event()
    outs: list[list[tuple[str, dict[str, Any]]]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        go.wait()
        try:
            outs[i] = slot()
        except BaseException as exc:  # kept for the caller: a slot's failure is the call's
            interrupted.set()
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=f"k26-hash-{i}", daemon=True) for i in range(n)]
    try:
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
    except BaseException:  # Ctrl-C here: the slots stop at their next report
        interrupted.set()
        go.set()
        for t in threads:
            if t.ident is not None:
                t.join()
        raise
    if errors:
        raise errors[0]
    return outs


def worker_error(path: str, said: str) -> str:
    """A worker's ``err`` line in the words the read loop here gives the same failure (``cannot read: is
    a FIFO (named pipe), not a regular file``, ``cannot read: Permission denied``)."""
    what, _, number = said.partition(" ")
    if what in ("errno", "mode") and number.isdigit():
        exc = (OSError(int(number), os.strerror(int(number)), path) if what == "errno"
               else NotRegularFile(path, kind_of(int(number))))
        return f"cannot read: {describe_error(exc)}"
    return said


_RUN_SERVER: WorkerServer | None = None
# The run's pool: a worker per core, at most this many forked in advance (a model has a few dozen shards, and a
# worker beyond the pool is forked when asked for: about a millisecond, against seconds to hash a real shard).
RUN_POOL_MAX = 32


@contextlib.contextmanager
def workers_for_run() -> Iterator[WorkerServer | None]:
    """A fork server for the whole of a run that will hash (``check --deep``), started when the run begins and
    closed when it ends; every hashing call of the run takes its workers from it (``run_server``).

    Why at the run's start: between the start of a run and its first hashing call the doctor loads and
    selects its checks (about 150 ms on a 2-core VM), longer than the server takes to start and fork its pool
    (about 30 ms on the 16-core host), so the pool is there when the first shard is hashed: every file, however
    small, then hashes through a worker without a copy. A call without a run's server starts its own, whose
    start-up it waits for, and so uses workers only where each thread has enough to hash (``plan``)."""
    global _RUN_SERVER
    server = WorkerServer.start(min(default_workers(), RUN_POOL_MAX)) if _RUN_SERVER is None else None
    if server is None:  # a run within a run keeps the outer one's server; where none starts, threads read
        yield _RUN_SERVER
        return
    _RUN_SERVER = server
    try:
        yield server
    finally:
        _RUN_SERVER = None
        server.close()


def run_server() -> WorkerServer | None:
    """The run's fork server (``workers_for_run``), unless there is none or it is gone."""
    server = _RUN_SERVER
    return server if server is not None and server.state != "gone" else None


class WorkerServer:
    """``sha256_worker.py --serve N``, started once per run (``workers_for_run``) or per hashing call: it hands
    a worker to each hashing thread that asks, from a pool of ``N`` it forks as soon as it is up (see that
    file's docstring for the protocol).

    Why a fork server: an interpreter per worker costs 20 ms, and 16 started at once took 110-124 ms on the
    16-core host before any of them hashed a byte; a fork of this one small process is ready at once. It runs
    in a session of its own, so Ctrl-C at the terminal reaches only the doctor, which stops its workers; it is
    registered with ``doctor.core.proc`` (``kill_all`` kills its process group, its workers with it), and it
    kills its workers itself when its socket closes (the doctor exits, or is killed)."""

    READY_WAIT = 10.0  # seconds a thread waits at most for the server to start (a loaded host); then it reads
    MAX_HANDOUT = 64  # workers per request (sha256_worker.MAX_HANDOUT)
    ANSWER_WAIT = 5.0  # seconds for the answer to a request, once the server is up

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc, self.sock = proc, sock
        self.state = "starting"  # then "ready", or "gone" (no more requests: the threads read the files)
        self.lock = threading.Lock()

    @classmethod
    def start(cls, pool: int = 0) -> WorkerServer | None:
        """The server, starting (``ready`` says when it is up) with ``pool`` workers forked in advance, or None
        where it cannot start."""
        try:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except (OSError, AttributeError):  # no Unix sockets with descriptor passing here
            return None
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", str(WORKER), "--serve", str(max(0, pool))],
                                    stdin=theirs.fileno(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
                                    start_new_session=True)
        except OSError:
            mine.close()
            return None
        finally:
            theirs.close()
        proc_registry.track(proc)  # its process group is killed if the doctor exits while it hashes
        return cls(proc, mine)

    def ready(self, wait: float = 0.0) -> bool:
        """Whether the server takes requests, waiting up to ``wait`` seconds (within the run's deadline) for
        it to come up. A thread that must not wait never blocks behind one that does."""
        if self.state != "starting":
            return self.state == "ready"
        if not self.lock.acquire(timeout=-1 if wait > 0 else 0):
            return False
        try:
            if self.state == "starting":
                self.sock.settimeout(max(0.0, deadline.clip(wait)) if wait > 0 else 0.0)
                try:
                    said = self.sock.recv(16)
                    self.state = "ready" if said == b"ready" else "gone"
                except (BlockingIOError, TimeoutError):
                    pass
                except OSError:
                    self.state = "gone"
            return self.state == "ready"
        finally:
            self.lock.release()

    def _ask(self, msg: bytes, room: int = 1) -> tuple[bytes, list[int]] | None:
        """One request and its answer with the descriptors it carried (room for ``room`` workers' answer, under
        the lock), or None when the server is gone. Descriptors arrive close-on-exec: no probe the doctor starts
        inherits a worker's pipe (a copy open elsewhere would keep that worker's input from ending)."""
        with self.lock:
            if self.state != "ready":
                return None
            try:
                self.sock.settimeout(self.ANSWER_WAIT)
                self.sock.send(msg)
                said, anc, _flags, _addr = self.sock.recvmsg(16 * room + 16, socket.CMSG_SPACE(2 * room * FD_SIZE),
                                                             getattr(socket, "MSG_CMSG_CLOEXEC", 0))
            except OSError:
                self.state = "gone"
                return None
            if not said:  # its end closed: killed (the run's deadline) or ended
                self.state = "gone"
        fds = array.array("i")
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % FD_SIZE])
        return said, list(fds)

    def fork(self) -> WorkerProcess | None:
        """A worker (from the server's pool, or forked for this request), or None (the server not up yet, or
        gone, or an answer that is not a pid with its two pipes)."""
        got = self.fork_many(1)
        return got[0] if got else None

    def fork_many(self, count: int) -> list[WorkerProcess]:
        """Up to ``count`` workers in one request (fewer where the server could fork no more; none where it
        is not up or gone, or its answer is not pids each with two pipes: what came is closed)."""
        count = max(0, min(count, self.MAX_HANDOUT))
        if not count or not self.ready():
            return []
        answer = self._ask(b"f %d" % count, count)
        if answer is None:
            return []
        said, fds = answer
        pids = said.split()
        if not pids or not all(p.isdigit() for p in pids) or len(fds) != 2 * len(pids):
            for fd in fds:
                os.close(fd)
            return []
        # each worker reads paths from its end of the first pipe and writes answers to the second
        return [WorkerProcess(int(pid), os.fdopen(fds[2 * i], "w", encoding="ascii", buffering=1),
                              os.fdopen(fds[2 * i + 1], "r", encoding="ascii", errors="replace"), self)
                for i, pid in enumerate(pids)]

    def kill(self, pid: int) -> None:
        answer = self._ask(b"k %d" % pid)
        for fd in answer[1] if answer else ():
            os.close(fd)

    def close(self) -> None:
        """End the server (it kills and reaps any worker still running); never raises."""
        with self.lock:
            self.state = "gone"
            self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc_registry.kill_group(self.proc)
            self.proc.wait()
        finally:
            proc_registry.untrack(self.proc)


class WorkerProcess:
    """One worker forked by a ``WorkerServer``: a path in, progress and a digest out (see sha256_worker.py)."""

    def __init__(self, pid: int, requests: IO[str], answers: IO[str], server: WorkerServer) -> None:
        self.pid, self.requests, self.answers, self.server = pid, requests, answers, server
        self.gone = False

    def alive(self) -> bool:
        return not self.gone

    def hash(self, path: str, on_bytes: Callable[[int], None] | None) -> dict[str, Any] | None:
        """The worker's answer for ``path`` (``{"sha256", "bytes"}`` or ``{"error"}``), or None when the
        worker is gone; ``on_bytes`` at each of its progress lines (it may raise ``Stopped``)."""
        try:
            self.requests.write(os.fsencode(path).hex() + "\n")
            self.requests.flush()
            for line in self.answers:
                kind, _, rest = line.rstrip("\n").partition(" ")
                if kind == "p":
                    if on_bytes is not None:
                        on_bytes(int(rest))
                    continue
                if kind == "ok":
                    digest, _, size = rest.partition(" ")
                    return {"sha256": digest, "bytes": int(size)}
                if kind == "err":
                    return {"error": worker_error(path, rest)}
                break
        except (OSError, ValueError):
            pass
        self.gone = True  # it died (SIGBUS: the file shrank under its map), or said what no worker says
        return None

    def close(self, kill: bool = False) -> None:
        """End of input ends the worker; ``kill``: at once, by its server (which knows whether that pid is
        still its worker). Never raises."""
        if kill and not self.gone:
            self.server.kill(self.pid)
        self.gone = True
        for stream in (self.requests, self.answers):
            try:
                stream.close()
            except OSError:
                pass


def shard_names(model_dir: str) -> tuple[list[str], str | None]:
    """The model's shard names from its index (or the single file); (names, problem)."""
    if os.path.lexists(os.path.join(model_dir, INDEX_NAME)):
        idx = read_index(os.path.join(model_dir, INDEX_NAME))
        return idx.shards, (idx.problems[0].message if idx.problems else None)
    if os.path.lexists(os.path.join(model_dir, SINGLE_NAME)):
        return [SINGLE_NAME], None
    return [], f"neither {INDEX_NAME} nor {SINGLE_NAME} found"


def expected_digests(model_dir: str, names: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Expected sha256 per name with its source: manifest > hf local-dir metadata > HF cache blob name."""
    out: dict[str, dict[str, Any]] = {}
    man = read_manifest(os.path.join(model_dir, MANIFEST_NAME))
    man_info: dict[str, Any] = {"path": MANIFEST_NAME, "present": man.present, "error": man.error}
    for name in names:
        entry = man.files.get(name) if man.ok else None
        if entry:
            out[name] = {"sha256": entry["sha256"], "size": entry.get("size"), "source": "manifest"}
            continue
        meta = read_hf_local_metadata(model_dir, name)
        if meta and meta.get("sha256"):
            out[name] = {"sha256": meta["sha256"], "source": "hf-metadata", "commit": meta.get("commit")}
            continue
        fs = file_state(model_dir, name)
        if fs.blob_sha256:
            out[name] = {"sha256": fs.blob_sha256, "source": "hf-cache-blob"}
    return out, man_info


def _stat_shards(model_dir: str, names: list[str]) -> tuple[dict[str, dict[str, Any]], list[HashJob]]:
    """Each shard's record and the jobs to hash: a shard that cannot be stat'ed or is not a regular file gets
    its verdict here and is not hashed (nothing to read); the rest start with their size."""
    jobs: list[HashJob] = []
    files: dict[str, dict[str, Any]] = {}
    for name in names:
        path = os.path.join(model_dir, name)
        try:
            st = os.stat(path)
        except OSError as exc:
            files[name] = {"verdict": "missing", "error": exc.strerror or str(exc)}
            continue
        if not stat.S_ISREG(st.st_mode):
            files[name] = {"verdict": "error", "error": "not a regular file"}
            continue
        files[name] = {"size": st.st_size}
        jobs.append(HashJob(name, path, st))
    return files, jobs


def _hash_verdict(rec: dict[str, Any], res: dict[str, Any], exp: dict[str, Any] | None) -> str:
    """One hashed shard's verdict against its promised digest (``rec`` gains ``expected`` where there is one):
    a promised size that differs makes a matching digest a mismatch too."""
    if "error" in res:
        return "error"
    if exp is None:
        return "no_reference"
    rec["expected"] = exp
    if exp["sha256"] != res["sha256"]:
        return "mismatch"
    if exp.get("size") is not None and exp["size"] != rec["size"]:
        return "mismatch"
    return "match"


def _record_hashes(files: dict[str, dict[str, Any]], hashed: dict[str, dict[str, Any]],
                   expected: dict[str, dict[str, Any]]) -> int:
    """Fold the hashing results and their verdicts into ``files``; the bytes hashed now (a cached answer read
    nothing, so it counts for none of the rate)."""
    bytes_hashed = 0
    for name, res in hashed.items():
        rec = files[name]
        rec.update(res)
        if not res.get("cached") and "sha256" in res:
            bytes_hashed += rec["size"]
        rec["verdict"] = _hash_verdict(rec, res, expected.get(name))
    return bytes_hashed


def _cache_summary(cache: VerifyCache | None, hashed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fact's ``cache`` part: whether a verify cache was used, where, its hits and its error."""
    return {"used": cache is not None, "path": cache.path if cache else None,
            "hits": sum(1 for r in hashed.values() if r.get("cached")),
            "error": cache.error if cache else None}


def verify_model_hashes(model_dir: str, *, use_cache: bool = True, cache_dir: str | None = None,
                        workers: int | None = None, progress: bool | None = None,
                        processes: bool | None = None) -> dict[str, Any]:
    """Hash every shard of ``model_dir`` and compare; the ``model.hashes`` fact for one directory
    (``processes``: as ``hash_files``)."""
    names, problem = shard_names(model_dir)
    # The promised digests are read while the shards hash (off the critical path: on 16 cores, 1 GiB hashes in
    # about 90 ms, and reading a manifest and 64 shards' metadata takes one or two of them).
    lookup = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k26-expected")
    pending = lookup.submit(expected_digests, model_dir, names)
    lookup.shutdown(wait=False)
    files, jobs = _stat_shards(model_dir, names)
    cache = VerifyCache(cache_dir or default_cache_dir()) if use_cache else None
    prog = Progress(sum(j.st.st_size for j in jobs), len(jobs), enabled=progress)
    t0 = time.monotonic()
    try:
        hashed = hash_files(jobs, workers=workers, cache=cache, progress=prog, processes=processes)
    finally:
        prog.close()
    seconds = time.monotonic() - t0
    expected, man_info = pending.result()
    if cache is not None:
        cache.save()
    bytes_hashed = _record_hashes(files, hashed, expected)
    return {
        "given": True, "path": model_dir, "problem": problem,
        "files": [{"name": n, **files[n]} for n in names],
        "manifest": man_info,
        "bytes_hashed": bytes_hashed, "seconds": round(seconds, 3),
        "rate_bytes_s": round(bytes_hashed / seconds) if seconds > 0 and bytes_hashed else None,
        "workers": workers or default_workers(),
        "cache": _cache_summary(cache, hashed),
    }
