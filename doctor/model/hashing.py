"""The deep tier: sha256 of every shard at disk speed, compared with the digests the download promised.

Expected digests, in this order: a manifest k26-doctor wrote (``k26-doctor manifest write``),
huggingface_hub's ``--local-dir`` metadata (the etag of an LFS file is its sha256), the Hugging Face
cache's blob names (``blobs/<sha256>``). Files are hashed in parallel threads (``hashlib`` and
``readinto`` release the GIL on large buffers) in large blocks. A verification cache, keyed by
(device, inode, size, mtime_ns, ctime_ns) and kept outside the model directory, lets a restart
re-hash only what changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from doctor.core.fileio import atomic_write
from doctor.model.index import INDEX_NAME, SINGLE_NAME, read_index
from doctor.model.layout import file_state, read_hf_local_metadata
from doctor.model.manifest import MANIFEST_NAME, read_manifest

BLOCK = 8 * 1024 * 1024
CACHE_FILE = "verify-cache.json"
CACHE_VERSION = 1


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


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


def sha256_file(path: str, on_bytes: Callable[[int], None] | None = None, block: int = BLOCK) -> str:
    """sha256 of one file, read with ``readinto`` into one reused buffer (no per-block allocation)."""
    h = hashlib.sha256()
    buf = bytearray(block)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)  # type: ignore[attr-defined]
            if not n:
                break
            h.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)
    return h.hexdigest()


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
            with open(self.path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
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


def hash_files(jobs: list[HashJob], *, workers: int | None = None, cache: VerifyCache | None = None,
               progress: Progress | None = None) -> dict[str, dict[str, Any]]:
    """sha256 per job name: ``{"sha256", "cached", "seconds"}`` or ``{"error"}``; largest files first."""
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
    todo.sort(key=lambda j: -j.st.st_size)

    def one(job: HashJob) -> tuple[str, dict[str, Any]]:
        t0 = time.monotonic()
        try:
            digest = sha256_file(job.path, progress.add if progress is not None else None)
        except OSError as exc:
            return job.name, {"error": f"cannot read: {exc.strerror or exc}"}
        finally:
            if progress is not None:
                progress.file_done()
        try:
            after = os.stat(job.path)
        except OSError:
            after = None
        res: dict[str, Any] = {"sha256": digest, "cached": False, "seconds": round(time.monotonic() - t0, 3)}
        if after is None or file_key(after) != file_key(job.st):
            res["changed_while_hashing"] = True
        elif cache is not None:
            cache.put(job.st, job.path, digest)
        return job.name, res

    n = workers or default_workers()
    if todo:
        with ThreadPoolExecutor(max_workers=max(1, min(n, len(todo)))) as pool:
            for name, res in pool.map(one, todo):
                results[name] = res
    return results


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


def verify_model_hashes(model_dir: str, *, use_cache: bool = True, cache_dir: str | None = None,
                        workers: int | None = None, progress: bool | None = None) -> dict[str, Any]:
    """Hash every shard of ``model_dir`` and compare; the ``model.hashes`` fact for one directory."""
    names, problem = shard_names(model_dir)
    expected, man_info = expected_digests(model_dir, names)
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
    cache = VerifyCache(cache_dir or default_cache_dir()) if use_cache else None
    prog = Progress(sum(j.st.st_size for j in jobs), len(jobs), enabled=progress)
    t0 = time.monotonic()
    try:
        hashed = hash_files(jobs, workers=workers, cache=cache, progress=prog)
    finally:
        prog.close()
    seconds = time.monotonic() - t0
    if cache is not None:
        cache.save()
    bytes_hashed = 0
    for name, res in hashed.items():
        rec = files[name]
        rec.update(res)
        if not res.get("cached") and "sha256" in res:
            bytes_hashed += rec["size"]
        exp = expected.get(name)
        if "error" in res:
            rec["verdict"] = "error"
        elif exp is None:
            rec["verdict"] = "no_reference"
        else:
            rec["expected"] = exp
            rec["verdict"] = "match" if exp["sha256"] == res["sha256"] else "mismatch"
            if exp.get("size") is not None and exp["size"] != rec["size"] and rec["verdict"] == "match":
                rec["verdict"] = "mismatch"
    return {
        "given": True, "path": model_dir, "problem": problem,
        "files": [{"name": n, **files[n]} for n in names],
        "manifest": man_info,
        "bytes_hashed": bytes_hashed, "seconds": round(seconds, 3),
        "rate_bytes_s": round(bytes_hashed / seconds) if seconds > 0 and bytes_hashed else None,
        "workers": workers or default_workers(),
        "cache": {"used": cache is not None, "path": cache.path if cache else None,
                  "hits": sum(1 for r in hashed.values() if r.get("cached")),
                  "error": cache.error if cache else None},
    }
