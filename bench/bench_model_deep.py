#!/usr/bin/env python3
"""`--deep` hashing at every size, page-cached and cold, against `xargs -P cores sha256sum` and `dd`.

Builds, under a new temporary directory, model directories of real (random) data: an index and N
shards each, for several sizes and shapes from 1 GiB up (many small files, one file per core, a few
large files that no per-file parallelism can spread), and measures in the same run:

warm (every file read once, so it sits in the page cache), interleaved, ``--runs`` times:
  * doctor:      ``verify_model_hashes`` as ``check --deep`` calls it (verification cache off): inside a run
                 whose fork server started as long before the hashing as it does in this host's real
                 ``check --deep`` (measured first: ``run_lead``), the hashing call timed;
  * doctor call: ``verify_model_hashes`` on its own (as ``manifest verify`` calls it), its whole call timed,
                 with the mode ``plan`` picks for that input (a fork server of its own where it pays);
  * doctor check --deep (``--cli``): the real ``k26-doctor check --deep`` in a process of its own, the
                 seconds of its ``model.shards.deep`` result;
  * threads, processes: ``hash_files`` made to hash in threads / in worker processes (to see which mode
                 wins at which size: ``WORKER_WAIT_MIN`` in doctor/model/hashing.py is the crossover);
  * the baseline `xargs -P cores -n 1 sha256sum`, and `xargs ... openssl dgst -sha256` where present;
  every tool's digests are compared with the doctor's (a mismatch ends the bench).
cold (``--cold``, the default; ``--no-cold`` to skip): before each timed read every file's pages are
  dropped (``posix_fadvise(POSIX_FADV_DONTNEED)`` per file, clean pages, unprivileged; then
  ``/proc/sys/vm/drop_caches`` where writable if pages remained) and the drop is VERIFIED (pages
  resident, per file: ``mincore(2)`` through ctypes, else util-linux ``fincore``); a run whose files
  were not dropped is not counted. Then: `dd if=F of=/dev/null bs=16M` over the files one after another
  (the disk's sequential read rate, one stream) and the doctor (``--cold-xargs``: the baseline too).

Ratios: doctor / xargs sha256sum (warm; target >= 1.0) and doctor / dd (cold; target >= 0.9), the
median of the per-run ratios. A cold rate is also bounded by hashing: a set of F files cannot be hashed
faster than F cores hash (sha256 of one file is sequential), so the cold table shows the ceiling
min(dd, warm doctor) too. A last warm line gives threads / processes by the share each worker hashes
(where ``WORKER_WAIT_MIN`` belongs on this host). Exit 0 when every measured target is met, 1
otherwise, 2 on a wrong setup.

    python3 bench/bench_model_deep.py [--quick] [--json OUT] [--tmp DIR] [--budget S] [--runs N]
    python3 bench/bench_model_deep.py --files 64 --mib 128 --runs 3      # one set, as before

Needs python3, this checkout and coreutils (sha256sum, dd, xargs); nothing else. ``--budget`` (seconds,
default 110) skips what would not finish in time, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the replica builder is a test fixture

import deep_timeline  # noqa: E402
from model_replica import header_bytes, shard_name  # noqa: E402
from timing import measure  # noqa: E402

from doctor.model import hashing  # noqa: E402
from doctor.model.hashing import HashJob, default_workers, hash_files, verify_model_hashes  # noqa: E402
from doctor.model.residency import Residency as MincoreResidency  # noqa: E402

GIB = 1024 ** 3
MIB = 1024 ** 2
# (files, MiB each), in the order they run (what matters most first, should the budget run out): 1 GiB as
# one file per core on 16 cores and as two large files, 8 GiB (the shape first measured on the 16-core H200
# host), 2 GiB, 4 GiB (two files per core), 1 GiB in many small files, 4 GiB in eight large files. Files of
# one size are shared (32 x 64 holds 16 x 64's): 15 GiB on disk in all.
SETS = [(16, 64), (2, 512), (64, 128), (32, 64), (32, 128), (64, 16), (8, 512)]
# Cold: two large files (hashing one file is one core's work, so the disk must serve two streams), a file per
# core, two per core, and eight large files (a hasher per two cores: where each file's prefetch thread runs).
COLD_SETS = [(2, 512), (16, 64), (32, 128), (8, 512)]
QUICK_SETS = [(16, 64), (2, 512)]
WARM_TARGET, COLD_TARGET = 1.0, 0.9
RESIDENT_MAX = 0.01  # a run counts as cold when at most 1% of its bytes were resident before it


def say(*parts: Any) -> None:
    print(*parts, flush=True)


# -- data ------------------------------------------------------------------------------------------

def write_file(path: str, size: int, block: bytes, seed: int) -> None:
    """One shard: a real safetensors header for one U8 tensor, then random bytes (fsynced before a cold
    read, by ``drop``)."""
    head, data = header_bytes([(f"t{seed}", "U8", (size,))])
    k = (seed * 7919 * 4096) % len(block)
    rotated = block[k:] + block[:k]  # a different byte stream per file
    with open(path, "wb") as fh:
        fh.write(head)
        left = data
        while left:
            chunk = rotated[: min(left, len(rotated))]
            fh.write(chunk)
            left -= len(chunk)


class Data:
    """The sets' model directories, each made when first asked for: its shards are hard links to data files
    (``data/<MiB>-<i>``) shared by the sets of one file size (same inode: same page cache)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.data = os.path.join(root, "data")
        os.makedirs(self.data)
        self.block = os.urandom(16 * MIB)
        self.dirs: dict[tuple[int, int], str] = {}
        self.written = 0
        self.seconds = 0.0

    def rate(self) -> float | None:
        """Bytes per second written so far (None before the first file)."""
        return self.written / self.seconds if self.seconds > 0 else None

    def missing_bytes(self, key: tuple[int, int]) -> int:
        files, mib = key
        return sum(mib * MIB for i in range(files) if not os.path.exists(os.path.join(self.data, f"{mib}-{i}")))

    def dir_for(self, key: tuple[int, int]) -> str:
        if key in self.dirs:
            return self.dirs[key]
        files, mib = key
        t0 = time.monotonic()
        d = os.path.join(self.root, f"set-{files}x{mib}M")
        os.makedirs(d)
        weight_map = {}
        for i in range(files):
            src = os.path.join(self.data, f"{mib}-{i}")
            if not os.path.exists(src):
                write_file(src, mib * MIB, self.block, mib * 1000 + i)
                self.written += os.path.getsize(src)
            name = shard_name(i + 1, files)
            try:
                os.link(src, os.path.join(d, name))
            except OSError:  # no hard links here: a symlink (the doctor and sha256sum follow it)
                os.symlink(src, os.path.join(d, name))
            weight_map[f"t{i}"] = name
        Path(d, "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": files * mib * MIB}, "weight_map": weight_map}))
        self.seconds += time.monotonic() - t0
        self.dirs[key] = d
        return d


def shard_paths(d: str) -> list[str]:
    return sorted(str(p) for p in Path(d).glob("model-*.safetensors"))


def warm_up(paths: list[str]) -> None:
    """Every file read once (into the page cache), after the writeback of what the bench just wrote: the
    kernel's flusher threads would otherwise copy pages to disk under the first timed runs."""
    os.sync()
    for p in paths:
        with open(p, "rb", buffering=0) as fh:
            while fh.read(64 * MIB):
                pass


# -- the page cache: drop and verify ------------------------------------------------------------------

class Residency:
    """Bytes of a file in the page cache: the product's ``mincore(2)`` reader (``doctor.model.residency``, the
    start plan's ``weights_resident`` fact: a shared read-only map, windowed), else util-linux ``fincore``;
    ``method`` says which (None: neither works)."""

    def __init__(self) -> None:
        self._mincore = MincoreResidency()
        self.method: str | None = self._mincore.method
        if self.method is None and shutil.which("fincore"):
            self.method = "fincore"

    def resident(self, path: str) -> int | None:
        if self.method == "mincore(2)":
            try:
                return self._mincore.resident(path)[1]
            except OSError:
                return None
        if self.method == "fincore":
            out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", path],
                                 capture_output=True, text=True)
            return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.split() else None
        return None


def drop(paths: list[str], res: Residency) -> dict[str, Any]:
    """Drop the files' pages (written back first: only clean pages can be dropped, and no writeback may
    run under a cold read); ``{"method", "resident_bytes", "cold"}`` (cold: verified)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    method = "posix_fadvise(DONTNEED)"
    left = _resident(paths, res)
    total = sum(os.path.getsize(p) for p in paths)
    if left is not None and left > RESIDENT_MAX * total:
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as fh:
                fh.write("1\n")
            method += " + drop_caches"
            left = _resident(paths, res)
        except OSError:
            pass
    return {"method": method, "verified_by": res.method, "resident_bytes": left,
            "cold": left is not None and left <= RESIDENT_MAX * total}


def _resident(paths: list[str], res: Residency) -> int | None:
    total = 0
    for p in paths:
        r = res.resident(p)
        if r is None:
            return None
        total += r
    return total


# -- the tools -------------------------------------------------------------------------------------

def parse_sums(text: str) -> dict[str, str]:
    """`sha256sum` / `openssl dgst -r` lines (``HEX *path`` or ``HEX  path``) by file name."""
    out = {}
    for line in text.splitlines():
        digest, _, name = line.partition(" ")
        out[os.path.basename(name.lstrip(" *"))] = digest
    return out


def xargs_cmd(paths: list[str], cores: int, tool: list[str]) -> Callable[[], dict[str, str]]:
    def run() -> dict[str, str]:
        out = subprocess.run(["xargs", "-0", "-P", str(cores), "-n", "1", *tool], input="\0".join(paths).encode(),
                             stdout=subprocess.PIPE, check=True)
        return parse_sums(out.stdout.decode())
    return run


class Took:
    """What a tool returns when it times itself: its digests, and the seconds that count (not the set-up it
    needed around them)."""

    def __init__(self, digests: dict[str, str], seconds: float) -> None:
        self.digests, self.seconds = digests, seconds


def doctor_call(d: str, cores: int) -> Callable[[], dict[str, str]]:
    """``verify_model_hashes`` called on its own (as ``manifest verify`` calls it): a fork server of its own,
    where ``plan`` wants one, started inside the call."""
    def run() -> dict[str, str]:
        res = verify_model_hashes(d, use_cache=False, progress=False, workers=cores)
        return {f["name"]: f.get("sha256", "?") for f in res["files"]}
    return run


def run_call(d: str, cores: int, lead: float) -> Callable[[], Any]:
    """The deep tier as ``check --deep`` calls it: inside a run whose fork server started ``lead`` seconds
    before the hashing (``hashing.workers_for_run``; the lead as this host's real ``check --deep`` has it,
    ``run_lead``); only the hashing call is timed. Where this checkout has no run server: ``doctor_call``."""
    for_run = getattr(hashing, "workers_for_run", None)
    if for_run is None:
        return doctor_call(d, cores)

    def run() -> Took:
        with for_run():
            time.sleep(lead)
            seconds, digests = timed(doctor_call(d, cores))
        return Took(digests, seconds)
    return run


def run_lead(d: str, runs: int = 5) -> dict[str, float] | None:
    """Seconds from the start of a real ``check --deep`` run (where its fork server starts) to its first
    hashing call on this host (``lead``), and in the same runs the seconds of that call (``hash_files``), of
    the shard verification around it (``verify``) and of the check (``check``): medians of ``runs`` real CLI
    runs on ``d`` (bench/deep_timeline.py), or None where none said."""
    got: dict[str, list[float]] = {"lead": [], "hash_files": [], "verify": [], "check": []}
    for _ in range(runs):
        said = deep_timeline.run_cli(d)
        if not said["calls"]:
            continue
        first, res = said["calls"][0], said["result"]
        for key, ms in (("lead", first.get("lead_ms")), ("hash_files", first["call_ms"]),
                        ("verify", first.get("verify_ms")), ("check", res and res["duration_s"] * 1e3)):
            if ms is not None:
                got[key].append(ms / 1e3)
    if not got["lead"]:
        return None
    return {k: statistics.median(v) for k, v in got.items() if v}


def cli_call(d: str, cores: int) -> Callable[[], Took]:
    """The real ``k26-doctor check --deep`` on ``d`` (a process of its own, verification cache off): the
    seconds its ``model.shards.deep`` result took, and the digests it hashed (``--format json`` gives the
    verdicts: a match against the manifest the bench wrote is the doctor's digest)."""
    def run() -> Took:
        out = subprocess.run([sys.executable, "-m", "doctor", *deep_timeline.CHECK_DEEP, "--model-path", d],
                             capture_output=True, text=True, cwd=ROOT, timeout=600)
        res = next(r for r in json.loads(out.stdout)["results"] if r["id"] == "model.shards.deep")
        if res["status"] != "pass":
            raise SystemExit(f"check --deep on {d}: {res['status']}: {res.get('summary')}")
        return Took(MANIFEST_DIGESTS[d], float(res["duration_s"]))
    return run


MANIFEST_DIGESTS: dict[str, dict[str, str]] = {}  # the digests of each set, as the doctor hashed them first


def ensure_manifest(d: str, cores: int) -> None:
    """A k26-doctor manifest in ``d`` (what ``check --deep`` compares against), from the doctor's digests,
    which every tool's are then compared with."""
    if d in MANIFEST_DIGESTS:
        return
    from doctor.model.manifest import MANIFEST_NAME, manifest_text

    res = verify_model_hashes(d, use_cache=False, progress=False, workers=cores)
    files = {f["name"]: {"size": f["size"], "sha256": f["sha256"]} for f in res["files"]}
    Path(d, MANIFEST_NAME).write_text(manifest_text(files, "bench_model_deep"))
    MANIFEST_DIGESTS[d] = {n: f["sha256"] for n, f in files.items()}


def engine_call(paths: list[str], cores: int, processes: bool) -> Callable[[], dict[str, str]]:
    def run() -> dict[str, str]:
        jobs = [HashJob(os.path.basename(p), p, os.stat(p)) for p in paths]
        res = hash_files(jobs, workers=cores, processes=processes)
        return {k: v.get("sha256", "?") for k, v in res.items()}
    return run


VARIANT_BLOCKS = (256 * 1024, 512 * 1024, 1024 * 1024, 2048 * 1024)


def with_setting(fn: Callable[[], Any], name: str, value: Any) -> Callable[[], Any]:
    """``fn`` with ``hashing.<name>`` set to ``value`` while it runs, restored after."""
    def run() -> Any:
        saved = getattr(hashing, name)
        setattr(hashing, name, value)
        try:
            return fn()
        finally:
            setattr(hashing, name, saved)
    return run


def with_block(fn: Callable[[], Any], block: int) -> Callable[[], Any]:
    """``fn`` with the in-process read loop's buffer at ``block`` bytes (``hashing.BLOCK``)."""
    return with_setting(fn, "BLOCK", block)


def variant_tools(d: str, cores: int) -> dict[str, Callable[[], Any]]:
    """``--variants``: the doctor with other read-loop buffers (its threads' ``BLOCK``), timed beside it on the
    page cache, where a larger buffer takes the GIL back fewer times per byte but may leave the core's L2; with
    its prefetch threads off (or on); and with workers from other shares (``WORKER_WAIT_MIN``)."""
    tools = {f"doctor {b // 1024}K": with_block(doctor_call(d, cores), b) for b in VARIANT_BLOCKS
             if b != hashing.read_block()}
    other = 64 * MIB if hashing.PREFETCH_AHEAD == 0 else 0  # the prefetch threads on or off: what they cost warm
    tools[f"doctor prefetch {other // MIB}M"] = with_prefetch(doctor_call(d, cores), other)
    for wait in WAIT_VARIANTS:  # where workers begin to pay (hashing.WORKER_WAIT_MIN)
        if wait != getattr(hashing, "WORKER_WAIT_MIN", wait):
            tools[f"doctor workers from {wait // MIB}M"] = with_setting(doctor_call(d, cores), "WORKER_WAIT_MIN", wait)
    return tools


WAIT_VARIANTS = (64 * MIB, 128 * MIB, 256 * MIB)


def variant_ratios(rates: dict[str, list[float]], base: str) -> dict[str, float]:
    """Each doctor variant's median per-run ratio to ``base``, run by run (every tool runs in every round)."""
    out = {}
    for name, vals in rates.items():
        if name.startswith("doctor") and rates.get(base):
            pairs = [a / b for a, b in zip(vals, rates[base], strict=True)]
            if pairs:
                out[name] = round(statistics.median(pairs), 3)
    return out


def with_prefetch(fn: Callable[[], Any], ahead: int) -> Callable[[], Any]:
    """``fn`` with each large file's prefetch thread reading up to ``ahead`` bytes past what was hashed
    (``hashing.PREFETCH_AHEAD``; 0: none)."""
    return with_setting(fn, "PREFETCH_AHEAD", ahead)


PREFETCH_VARIANTS = (0, 32 * MIB, 64 * MIB, 128 * MIB)


def cold_variant_tools(d: str, cores: int) -> dict[str, Callable[[], Any]]:
    """``--cold-variants``: other ways to read a cold set, timed beside dd and the doctor: `dd` over every file
    at once (``xargs -P cores``: the disk's rate with as many streams as the doctor opens), the doctor made to
    hash in threads / processes, and the doctor with each large file's prefetch thread at other depths."""
    paths = shard_paths(d)
    tools: dict[str, Callable[[], Any]] = {
        "dd xP": dd_parallel_call(paths, cores),
        "threads": engine_call(paths, cores, False),
        "processes": engine_call(paths, cores, True),
    }
    for ahead in PREFETCH_VARIANTS:
        if ahead != hashing.PREFETCH_AHEAD:
            tools[f"doctor prefetch {ahead // MIB}M"] = with_prefetch(doctor_call(d, cores), ahead)
    return tools


def dd_parallel_call(paths: list[str], cores: int) -> Callable[[], None]:
    def run() -> None:
        subprocess.run(["xargs", "-0", "-P", str(cores), "-I{}", "dd", "if={}", "of=/dev/null", "bs=16M",
                        "status=none"], input="\0".join(paths).encode(), check=True)
    return run


def dd_call(paths: list[str]) -> Callable[[], None]:
    script = 'for f do dd if="$f" of=/dev/null bs=16M 2>/dev/null || exit 1; done'

    def run() -> None:
        subprocess.run(["sh", "-c", script, "sh", *paths], check=True)
    return run


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """One call timed by the benches' one loop (``timing.measure``, once: the tools take turns), and what
    it returned."""
    out: list[Any] = []
    return measure(lambda: out.append(fn()), 1).best, out[0]


def mode_of(paths: list[str], cores: int) -> tuple[str, float]:
    """The mode the doctor picks for these files (``hashing.plan``, where this checkout has it), and the
    MiB the least busy of its workers hashes (the largest file or an equal share)."""
    sizes = [os.path.getsize(p) for p in paths]
    plan = getattr(hashing, "plan", None)
    if plan is None:
        n = max(1, min(cores, len(paths)))
        return ("processes" if n > 1 else "threads"), max(sum(sizes) / n, *sizes) / MIB
    jobs = [HashJob(os.path.basename(p), p, os.stat(p)) for p in paths]
    n, processes = plan(jobs, cores, None)
    if hasattr(hashing, "workers_for_run"):  # check --deep: every file through the run's workers
        return f"run's workers x{n}", max(sum(sizes) / n, *sizes) / MIB
    return f"{'processes' if processes else 'threads'} x{n}", max(sum(sizes) / n, *sizes) / MIB


# -- the runs --------------------------------------------------------------------------------------

class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def allows(self, estimate: float) -> bool:
        return time.monotonic() + estimate <= self.end


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# A warm run of 1 GiB on 16 cores takes a tenth of a second, whose start-up jitter (threads, processes,
# xargs's children) moved single ratios between 0.76 and 1.15 on the H200 host: small sets run until every
# tool has been timed for at least this long (at most MAX_RUNS runs), so that their median is a figure.
MIN_TIMED_S = 1.5
MAX_RUNS = 25


def warm_set(d: str, cores: int, runs: int, peers: dict[str, list[str]],
             min_timed_s: float = MIN_TIMED_S, variants: bool = False, lead: float = 0.0,
             cli: bool = False) -> dict[str, Any]:
    paths = shard_paths(d)
    total = sum(os.path.getsize(p) for p in paths)
    warm_up(paths)
    tools: dict[str, Callable[[], Any]] = {
        "doctor": run_call(d, cores, lead),
        "doctor call": doctor_call(d, cores),
        "threads": engine_call(paths, cores, False),
        "processes": engine_call(paths, cores, True),
    }
    if cli:
        ensure_manifest(d, cores)
        tools["doctor check --deep"] = cli_call(d, cores)
    if variants:
        tools.update(variant_tools(d, cores))
    for name, argv in peers.items():
        tools[name] = xargs_cmd(paths, cores, argv)
    rates: dict[str, list[float]] = {k: [] for k in tools}
    ratios: list[float] = []
    want: dict[str, str] | None = None
    mode, share = mode_of(paths, cores)
    spent = dict.fromkeys(tools, 0.0)
    i = 0
    while i < runs or (min(spent.values()) < min_timed_s and i < MAX_RUNS):
        order = list(tools) if i % 2 == 0 else list(reversed(tools))  # neither side always goes first
        for name in order:
            seconds, digests = timed(tools[name])
            if isinstance(digests, Took):
                seconds, digests = digests.seconds, digests.digests
            want = want or digests
            if digests != want:
                raise SystemExit(f"{name} gave other digests than the doctor on {d}: {digests} != {want}")
            rates[name].append(total / seconds)
            spent[name] += seconds
        ratios.append(rates["doctor"][-1] / rates["xargs sha256sum"][-1])
        i += 1
    return {"rates_gib_s": {k: [round(r / GIB, 3) for r in v] for k, v in rates.items()},
            "median_gib_s": {k: round(med(v) / GIB, 3) for k, v in rates.items()},
            "doctor_over_xargs": {"per_run": [round(r, 3) for r in ratios], "median": round(med(ratios), 3)},
            "mode": mode, "share_mib": round(share, 1), "runs": i,
            "over_xargs": variant_ratios(rates, "xargs sha256sum")}


def cold_set(d: str, cores: int, runs: int, res: Residency, budget: Budget, dd_rate: float | None,
             warm: dict[str, Any] | None, with_xargs: bool, variants: bool = False,
             lead: float = 0.0) -> dict[str, Any]:
    paths = shard_paths(d)
    total = sum(os.path.getsize(p) for p in paths)
    tools: dict[str, Callable[[], Any]] = {"dd": dd_call(paths), "doctor": run_call(d, cores, lead)}
    if with_xargs:
        tools["xargs sha256sum"] = xargs_cmd(paths, cores, ["sha256sum"])
    if variants:
        tools.update(cold_variant_tools(d, cores))
    rates: dict[str, list[float]] = {k: [] for k in tools}
    drops: list[dict[str, Any]] = []
    ratios: list[float] = []
    over_dd: dict[str, list[float]] = {}  # every tool's rate over dd's in the same round (--cold-variants)
    skipped = None
    for i in range(runs):
        est = len(tools) * total / dd_rate if dd_rate else 0.0  # a read per tool at the disk's rate, once known
        if not budget.allows(est):
            skipped = f"runs {i + 1}-{runs} skipped: about {est:.0f} s each, past the budget"
            break
        order = list(tools) if i % 2 == 0 else list(reversed(tools))
        got: dict[str, float] = {}
        for name in order:
            state = drop(paths, res)
            drops.append({"before": name, **state})
            if not state["cold"]:
                continue
            seconds, took = timed(tools[name])
            if isinstance(took, Took):
                seconds = took.seconds
            got[name] = total / seconds
            rates[name].append(got[name])
            if name == "dd":
                dd_rate = got[name]
        if "doctor" in got and "dd" in got:
            ratios.append(got["doctor"] / got["dd"])
        if variants and "dd" in got:
            for name, rate in got.items():
                if name != "dd":
                    over_dd.setdefault(name, []).append(rate / got["dd"])
    out: dict[str, Any] = {
        "rates_gib_s": {k: [round(r / GIB, 3) for r in v] for k, v in rates.items()},
        "median_gib_s": {k: (round(med(v) / GIB, 3) if v else None) for k, v in rates.items()},
        "doctor_over_dd": {"per_run": [round(r, 3) for r in ratios],
                           "median": round(med(ratios), 3) if ratios else None},
        "drops": drops, "skipped": skipped,
        "not_cold": sum(1 for x in drops if not x["cold"]),
    }
    if over_dd:
        out["over_dd"] = {k: round(statistics.median(v), 3) for k, v in over_dd.items()}
    if warm and "median_gib_s" in warm and rates["dd"]:
        ceiling = min(med(rates["dd"]) / GIB, warm["median_gib_s"]["doctor"])
        out["ceiling_gib_s"] = round(ceiling, 3)
        if rates["doctor"]:
            out["doctor_over_ceiling"] = round(med(rates["doctor"]) / GIB / ceiling, 3)
    return out


def host_facts(tmp: str, cores: int) -> dict[str, Any]:
    facts: dict[str, Any] = {"cores": cores, "os_cpu_count": os.cpu_count(), "python": platform.python_version(),
                             "kernel": platform.release(), "machine": platform.machine(), "tmp": tmp,
                             "load_average_start": [round(x, 2) for x in os.getloadavg()]}
    try:
        facts["filesystem"] = subprocess.run(["stat", "-f", "-c", "%T", tmp], capture_output=True,
                                             text=True).stdout.strip()
    except OSError:
        pass
    st = os.stat(tmp)
    dev = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for q in (f"{dev}/queue", f"{dev}/../queue"):
        try:
            facts["read_ahead_kb"] = int(Path(q, "read_ahead_kb").read_text())
            facts["rotational"] = Path(q, "rotational").read_text().strip() == "1"
            break
        except OSError:
            continue
    for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines() if os.path.exists(
            "/proc/cpuinfo") else []:
        if line.startswith("model name"):
            facts["cpu"] = line.split(":", 1)[1].strip()
            facts["sha_ni"] = " sha_ni" in Path("/proc/cpuinfo").read_text(errors="replace")
            break
    facts.update(cpu_caches())
    return facts


def cpu_caches() -> dict[str, Any]:
    """The first core's L2 size and how many logical CPUs share its core (2: hyper-threads share one SHA unit),
    from sysfs: what the read loop's buffer and the number of hashers are judged against."""
    out: dict[str, Any] = {}
    cpu = Path("/sys/devices/system/cpu/cpu0")
    l2 = hashing.l2_bytes(str(cpu / "cache"))
    if l2 is not None:
        out["l2"] = f"{l2 // 1024}K"  # as sysfs words it
    try:
        siblings = (cpu / "topology/thread_siblings_list").read_text().strip()
        out["threads_per_core"] = sum(
            (int(b) - int(a) + 1) if "-" in part else 1
            for part in siblings.split(",") for a, _, b in [part.partition("-")])
    except (OSError, ValueError):
        pass
    return out


def spread(xs: list[float]) -> str:
    """Every per-run ratio when there are a few; the count and the quartiles when there are many."""
    if len(xs) <= 5:
        return ", ".join(f"{x:.2f}" for x in xs)
    q = statistics.quantiles(xs, n=4)
    return f"{len(xs)} runs, quartiles {q[0]:.2f}-{q[2]:.2f}"


def report_warm(key: tuple[int, int], w: dict[str, Any]) -> None:
    files, mib = key
    m = w["median_gib_s"]
    peers = "  ".join(f"{k} {v:6.2f}" for k, v in m.items() if k.startswith("xargs"))
    r = w["doctor_over_xargs"]
    say(f"  {files:3d} x {mib:4d} MiB = {files * mib / 1024:4.1f} GiB  doctor {m['doctor']:6.2f} "
        f"({w['mode']})  threads {m['threads']:6.2f}  processes {m['processes']:6.2f}  {peers}   "
        f"doctor/xargs {r['median']:.2f} [{spread(r['per_run'])}] "
        f"{'OK' if r['median'] >= WARM_TARGET else 'UNDER'}")
    others = {k: v for k, v in w.get("over_xargs", {}).items() if k != "doctor"}
    if others:
        say("      over xargs, run by run: " + "  ".join(f"{k} {v:.2f}" for k, v in others.items()))


def report_cold(key: tuple[int, int], c: dict[str, Any]) -> None:
    files, mib = key
    m = c["median_gib_s"]

    def f(x: float | None) -> str:
        return "   n/a" if x is None else f"{x:6.2f}"
    r = c["doctor_over_dd"]["median"]
    xargs = f"  xargs sha256sum {f(m['xargs sha256sum'])}" if "xargs sha256sum" in m else ""
    line = (f"  {files:3d} x {mib:4d} MiB = {files * mib / 1024:4.1f} GiB  dd {f(m['dd'])}  doctor {f(m['doctor'])}"
            f"{xargs}   doctor/dd "
            + ("n/a" if r is None else f"{r:.2f} [{', '.join(f'{x:.2f}' for x in c['doctor_over_dd']['per_run'])}] "
               f"{'OK' if r >= COLD_TARGET else 'UNDER'}"))
    if "ceiling_gib_s" in c:
        line += f"   ceiling min(dd, warm doctor) {c['ceiling_gib_s']:.2f}"
        if "doctor_over_ceiling" in c:
            line += f" -> doctor/ceiling {c['doctor_over_ceiling']:.2f}"
    if c["not_cold"]:
        line += f"   ({c['not_cold']} reads not counted: pages not dropped)"
    if c["skipped"]:
        line += f"   ({c['skipped']})"
    say(line)
    if c.get("over_dd"):
        say("      over dd, run by run: " + "  ".join(f"{k} {v:.2f}" for k, v in c["over_dd"].items()))


def crossover(doc: dict[str, Any]) -> None:
    """Threads against processes by the share one worker hashes (``hashing.plan``'s measure), to place
    ``WORKER_WAIT_MIN`` on this host."""
    rows = []
    for key, w in doc["warm"].items():
        if "median_gib_s" not in w:
            continue
        m = w["median_gib_s"]
        rows.append((w["share_mib"], key, m["threads"] / m["processes"]))
    if not rows:
        return
    rows.sort()
    limit = getattr(hashing, "WORKER_WAIT_MIN", None)
    doc["crossover"] = {"threads_over_processes": {k: round(r, 3) for _, k, r in rows},
                        "process_min_share_mib": limit // MIB if limit else None}
    say("threads / processes by the MiB each worker hashes: "
        + ", ".join(f"{share:.0f} MiB ({k}) {r:.2f}" for share, k, r in rows)
        + (f"; WORKER_WAIT_MIN = {limit // MIB} MiB (processes from there up)" if limit else ""))


def write_json(path: str | None, doc: dict[str, Any]) -> None:
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, path)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"sets {QUICK_SETS} only, 1 cold run")
    ap.add_argument("--files", type=int, help="one set of FILES shards (with --mib) instead of the table")
    ap.add_argument("--mib", type=int, default=128, help="MiB per shard of --files")
    ap.add_argument("--runs", type=int, default=3, help="warm runs per set (default 3)")
    ap.add_argument("--cold-runs", type=int, default=None, help="cold runs per set (default 2, --quick 1)")
    ap.add_argument("--no-cold", dest="cold", action="store_false", help="skip the cold-cache measurements")
    ap.add_argument("--cold-xargs", action="store_true", help="time `xargs sha256sum` on the cold cache too")
    ap.add_argument("--variants", action="store_true",
                    help="time the doctor beside itself with read-loop buffers of "
                         + ", ".join(f"{b // 1024} KiB" for b in VARIANT_BLOCKS) + " (warm sets)")
    ap.add_argument("--cold-variants", action="store_true",
                    help="time other ways to read a cold set beside dd and the doctor (dd on every file at once, "
                         "threads, processes, the doctor prefetching "
                         + "/".join(str(a // MIB) for a in PREFETCH_VARIANTS) + " MiB ahead)")
    ap.add_argument("--cli", action="store_true",
                    help="time the real `k26-doctor check --deep` too (its model.shards.deep result's seconds)")
    ap.add_argument("--sets", default=None, help="warm sets instead of the table, e.g. 16x64,64x16")
    ap.add_argument("--cold-sets", default=None, help="cold sets instead of the table's, e.g. 2x512")
    ap.add_argument("--tmp", "--dir", dest="tmp", default=None,
                    help="where the temporary data directory goes (default $TMPDIR, else /var/tmp: a disk, "
                         "not tmpfs); it is removed at the end unless --keep")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--workers", type=int, default=None, help="hashing workers (default: cores)")
    ap.add_argument("--budget", type=float, default=110.0, help="seconds; what would run past it is skipped")
    ap.add_argument("--json", dest="json_out", default=None, help="write every figure to this file")
    return ap.parse_args()


def parse_sets(text: str) -> list[tuple[int, int]]:
    """``16x64,2x512`` -> ``[(16, 64), (2, 512)]`` (files x MiB each)."""
    out = []
    for part in text.split(","):
        files, _, mib = part.strip().partition("x")
        if not (files.isdigit() and mib.isdigit()) or int(files) < 1 or int(mib) < 1:
            raise SystemExit(f"--sets: {part!r} is not FILESxMIB")
        out.append((int(files), int(mib)))
    return out


def fit(sets: list[tuple[int, int]], parent: str) -> tuple[list[tuple[int, int]], int]:
    """The sets whose data fits on ``parent``'s file system (with 1 GiB to spare), the largest left out
    first, and the bytes they need."""
    def need(chosen: list[tuple[int, int]]) -> int:
        per_size: dict[int, int] = {}
        for files, mib in chosen:
            per_size[mib] = max(per_size.get(mib, 0), files)
        return sum(mib * MIB * n for mib, n in per_size.items())

    free = shutil.disk_usage(parent).free
    while need(sets) + GIB > free and len(sets) > 1:
        big = max(sets, key=lambda s: s[0] * s[1])
        say(f"left out {big[0]} x {big[1]} MiB: {free / GIB:.1f} GiB free in {parent}")
        sets = [s for s in sets if s != big]
    return sets, need(sets)


def warm_phase(args: argparse.Namespace, doc: dict[str, Any], data: Data, sets: list[tuple[int, int]],
               cores: int, budget: Budget) -> None:
    peers = {"xargs sha256sum": ["sha256sum"]}
    if shutil.which("openssl"):
        peers["xargs openssl"] = ["openssl", "dgst", "-sha256", "-r"]
    say(f"warm (page-cached), GiB/s, medians of {args.runs} runs or more (until each tool was timed "
        f"{MIN_TIMED_S:.1f} s, at most {MAX_RUNS}); target doctor/xargs >= {WARM_TARGET}:")
    per_stream = None  # the slowest tool's bytes/s per file hashed at once, in the set before
    lead = 0.0
    if hasattr(hashing, "workers_for_run") and sets:
        measured = run_lead(data.dir_for(sets[0]))
        lead = measured["lead"] if measured is not None else 0.0
        doc["host"]["run_lead_ms"] = None if measured is None else round(lead * 1e3, 1)
        doc["host"]["run_breakdown_ms"] = {k: round(v * 1e3, 1) for k, v in (measured or {}).items()}
        say(f"  a real `check --deep` run hashes {lead * 1e3:.0f} ms after it starts (median of 5 runs): the lead "
            "its fork server has, and the \"doctor\" tool's" + ("" if measured is not None else " (not measured: 0)"))
        if measured:
            say(f"  in those runs ({sets[0][0]} x {sets[0][1]} MiB), ms: "
                + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in measured.items()))
    for key in sets:
        size = key[0] * key[1] * MIB
        streams = min(cores, key[0])
        est = (len(peers) + 4 + args.cli) * args.runs * size / (per_stream * streams) if per_stream else 0.0
        rate = data.rate()
        est += data.missing_bytes(key) / rate if rate else 0.0
        if not budget.allows(est):
            say(f"  {key[0]} x {key[1]} MiB skipped: about {est:.0f} s needed, past the budget")
            doc["warm"][f"{key[0]}x{key[1]}"] = {"skipped": "budget"}
            continue
        w = warm_set(data.dir_for(key), cores, args.runs, peers, variants=args.variants, lead=lead, cli=args.cli)
        per_stream = min(v * GIB for v in w["median_gib_s"].values()) / streams
        doc["warm"][f"{key[0]}x{key[1]}"] = w
        report_warm(key, w)
        write_json(args.json_out, doc)
    crossover(doc)


def cold_phase(args: argparse.Namespace, doc: dict[str, Any], data: Data, sets: list[tuple[int, int]],
               cores: int, budget: Budget, cold_runs: int) -> None:
    res = Residency()
    doc["host"]["residency_check"] = res.method
    if not args.cold_sets:
        sets = [k for k in sets if k in data.dirs] or sets[:1]  # the sets built for the warm runs
    probe = drop(shard_paths(data.dir_for(sets[0])), res)
    doc["cold_drop_probe"] = probe
    if not probe["cold"]:
        say(f"cold: skipped: the files' pages could not be dropped ({probe['method']}; resident "
            f"{probe['resident_bytes']} bytes by {probe['verified_by']}): tmpfs, or no way to check")
        return
    say(f"cold (pages dropped by {probe['method']}, verified by {probe['verified_by']} before every read), "
        f"GiB/s, medians of {cold_runs} runs; target doctor/dd >= {COLD_TARGET}:")
    dd_rate = None
    for key in sets:
        warm = doc["warm"].get(f"{key[0]}x{key[1]}")
        c = cold_set(data.dir_for(key), cores, cold_runs, res, budget, dd_rate, warm, args.cold_xargs,
                     args.cold_variants, (doc["host"].get("run_lead_ms") or 0.0) / 1e3)
        if c["rates_gib_s"]["dd"]:
            dd_rate = statistics.median(c["rates_gib_s"]["dd"]) * GIB
        doc["cold"][f"{key[0]}x{key[1]}"] = c
        report_cold(key, c)
        write_json(args.json_out, doc)


def verdict(doc: dict[str, Any], json_out: str | None) -> int:
    warm = [w["doctor_over_xargs"]["median"] for w in doc["warm"].values() if "median_gib_s" in w]
    cold = [c["doctor_over_dd"]["median"] for c in doc["cold"].values() if c["doctor_over_dd"]["median"] is not None]
    warm_ok = all(r >= WARM_TARGET for r in warm)
    cold_ok = all(r >= COLD_TARGET for r in cold)
    cold_said = ("met" if cold_ok else "NOT met") if cold else "not measured"
    say(f"targets: warm {'met' if warm_ok else 'NOT met'}; cold {cold_said}; {doc['seconds']} s"
        + (f"; figures in {json_out}" if json_out else ""))
    return 0 if warm_ok and cold_ok else 1


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: the data is still removed
    budget = Budget(args.budget)
    start = time.monotonic()
    cores = args.workers or default_workers()
    if args.files:
        sets, cold_sets = [(args.files, args.mib)], [(args.files, args.mib)]
    elif args.quick:
        sets, cold_sets = QUICK_SETS, QUICK_SETS
    else:
        sets, cold_sets = SETS, COLD_SETS
    if args.sets:
        sets = parse_sets(args.sets)
    if args.cold_sets:
        cold_sets = parse_sets(args.cold_sets)
    cold_runs = args.cold_runs if args.cold_runs is not None else (1 if args.quick else 2)
    for tool in ("sha256sum", "xargs", "dd"):
        if not shutil.which(tool):
            say(f"{tool} not found: the baseline cannot run")
            return 2
    parent = args.tmp or os.environ.get("TMPDIR") or "/var/tmp"
    os.makedirs(parent, exist_ok=True)
    fitted, need = fit(sets + [k for k in cold_sets if k not in sets], parent)
    sets = [k for k in sets if k in fitted]
    cold_sets = [k for k in cold_sets if k in fitted]
    root = tempfile.mkdtemp(prefix="k26-deep-bench-", dir=parent)
    doc: dict[str, Any] = {"host": host_facts(root, cores), "targets": {"warm_doctor_over_xargs": WARM_TARGET,
                           "cold_doctor_over_dd": COLD_TARGET}, "runs": args.runs, "cold_runs": cold_runs,
                           "warm": {}, "cold": {}}
    h = doc["host"]
    say(f"data: up to {need / GIB:.1f} GiB in {root} ({h.get('filesystem', '?')}, read_ahead_kb "
        f"{h.get('read_ahead_kb', '?')}); cores {cores}; {h.get('cpu', '?')} sha_ni={h.get('sha_ni', '?')}; "
        f"L2 {h.get('l2', '?')}, {h.get('threads_per_core', '?')} threads per core; "
        f"Python {h['python']}; load {h['load_average_start']}; budget {args.budget:.0f} s")
    try:
        data = Data(root)
        warm_phase(args, doc, data, sets, cores, budget)
        if args.cold and cold_sets:
            cold_phase(args, doc, data, cold_sets, cores, budget, cold_runs)
    finally:
        doc["host"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        doc["seconds"] = round(time.monotonic() - start, 1)
        if "data" in locals():
            doc["data"] = {"written_gib": round(data.written / GIB, 2), "write_seconds": round(data.seconds, 1)}
        write_json(args.json_out, doc)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return verdict(doc, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
