"""The deep tier's read side: the read loop's buffer (half the L2, from sysfs), one buffer per hashing thread,
and ``Prefetch``, the thread that reads a large file ahead of its hasher on a cold cache.

How much the prefetch gains is bench/bench_model_deep.py's business (``--cold-variants``, on a host whose
disk and cores matter); what is checked here is what must hold anywhere: it never runs more than ``ahead``
past the hasher, stops where the file reads fast (cached) and at once when told, gives up quietly on what it
cannot read, engages only where there are spare cores, and never changes a digest.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from doctor.model import hashing
from doctor.model.hashing import MIB, HashJob, Prefetch, hash_files, l2_block, sha256_file


def _l2(tmp_path: Path, size: str | None, level: str = "2") -> str:
    root = tmp_path / "cache"
    (root / "index0").mkdir(parents=True)
    (root / "index0" / "level").write_text("1\n")
    (root / "index0" / "size").write_text("48K\n")
    if size is not None:
        (root / "index2").mkdir()
        (root / "index2" / "level").write_text(level + "\n")
        (root / "index2" / "size").write_text(size + "\n")
    return str(root)


@pytest.mark.parametrize(("size", "block"), [
    ("512K", 256 * 1024),     # a 2-core VM's EPYC: 256 KiB
    ("2048K", MIB),           # the 16-core host's Xeon: 1 MiB
    ("1280K", 640 * 1024),
    ("32768K", MIB),          # never above BLOCK_MAX
    ("256K", 256 * 1024),     # never below BLOCK_MIN
    ("2M", MIB),
    ("lots", 256 * 1024),     # unreadable: the minimum
    (None, 256 * 1024),       # no L2 listed
])
def test_the_read_block_is_half_the_l2_within_bounds(tmp_path: Path, size: str | None, block: int) -> None:
    l2_block.cache_clear()
    try:
        assert l2_block(_l2(tmp_path, size)) == block
    finally:
        l2_block.cache_clear()


def test_a_set_block_overrides_the_l2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "BLOCK", 64 * 1024)
    assert hashing.read_block() == 64 * 1024


def test_one_buffer_serves_many_files(tmp_path: Path) -> None:
    buf = bytearray(64 * 1024)
    for size in (0, 1, 64 * 1024, 64 * 1024 + 1, 3 * 64 * 1024 - 5):
        f = tmp_path / f"{size}.bin"
        data = os.urandom(size)
        f.write_bytes(data)
        assert sha256_file(str(f), buf=buf) == hashlib.sha256(data).hexdigest()


class _Never(Prefetch):
    FAST_RATE = float("inf")  # no read is ever fast: it reads to the end (as on a cold disk)
    PROBE = 64 * 1024


class _Always(Prefetch):
    FAST_RATE = 1.0  # every read is fast: it stops after its probes (as on a cached file)
    PROBE = 64 * 1024


def _file(tmp_path: Path, size: int) -> Path:
    f = tmp_path / "shard.bin"
    with open(f, "wb") as fh:
        fh.truncate(size)  # sparse: reads give zeros, fast, and take no disk
    return f


def test_it_stays_within_ahead_of_the_hasher_and_reaches_the_end(tmp_path: Path) -> None:
    step, ahead, size = MIB, 4 * MIB, 24 * MIB
    f = _file(tmp_path, size)
    pf = _Never(str(f), size, ahead, step)
    try:
        hashed = 0
        while hashed < size:
            time.sleep(0.02)  # let it run as far as it may
            with pf.cond:
                assert pf.read <= max(2 * step + 3 * pf.PROBE, hashed + ahead + step)
            pf.advance(MIB)
            hashed += MIB
        pf.thread.join(timeout=10)
        assert not pf.thread.is_alive() and pf.read == size
    finally:
        pf.close()


def test_a_file_that_reads_fast_stops_it_after_its_probes(tmp_path: Path) -> None:
    step, size = MIB, 64 * MIB
    f = _file(tmp_path, size)
    pf = _Always(str(f), size, 32 * MIB, step)
    pf.thread.join(timeout=10)
    assert not pf.thread.is_alive() and pf.read == 2 * step + 3 * pf.PROBE
    pf.close()


def test_close_stops_it_while_it_waits_for_the_hasher(tmp_path: Path) -> None:
    f = _file(tmp_path, 64 * MIB)
    pf = _Never(str(f), 64 * MIB, 2 * MIB, MIB)
    time.sleep(0.05)
    t0 = time.monotonic()
    pf.close()
    assert not pf.thread.is_alive() and time.monotonic() - t0 < 2 and pf.read < 64 * MIB


@pytest.mark.timeout(20)
def test_it_gives_up_quietly_on_a_fifo_and_a_missing_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path / "gone"):
        pf = _Never(str(path), 128 * MIB, 32 * MIB)
        pf.thread.join(timeout=5)
        assert not pf.thread.is_alive() and pf.read == 0
        pf.close()


def test_it_engages_only_for_large_files_with_spare_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _file(tmp_path, 2 * hashing.PREFETCH_MIN)
    big = HashJob("big", str(f), os.stat(f))
    small = HashJob("small", str(f), os.stat(f).__class__((0o100644, 0, 0, 1, 0, 0, hashing.PREFETCH_MIN, 0, 0, 0)))
    monkeypatch.setattr(hashing, "cpu_count", lambda: 16)
    monkeypatch.setattr(hashing, "PREFETCH_AHEAD", 64 * MIB)
    pf = Prefetch.maybe(big, 8)
    assert pf is not None
    pf.close()
    assert Prefetch.maybe(big, 9) is None  # 9 hashers on 16 cores: no spare core for each reader
    assert Prefetch.maybe(small, 1) is None  # at PREFETCH_MIN: its readahead is enough
    monkeypatch.setattr(hashing, "PREFETCH_AHEAD", 0)
    assert Prefetch.maybe(big, 1) is None


@pytest.mark.parametrize("processes", [False, True])
def test_hashing_with_prefetch_gives_the_same_digests_and_leaves_no_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: bool) -> None:
    monkeypatch.setattr(hashing, "cpu_count", lambda: 16)
    monkeypatch.setattr(hashing, "PREFETCH_AHEAD", 2 * MIB)
    monkeypatch.setattr(hashing, "PREFETCH_MIN", MIB)
    monkeypatch.setattr(hashing, "PREFETCH_STEP", 512 * 1024)
    started: list[str] = []
    real = Prefetch.__init__

    def spy(self: Prefetch, path: str, *args: object, **kw: object) -> None:
        started.append(os.path.basename(path))
        real(self, path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Prefetch, "__init__", spy)
    want, jobs = {}, []
    for i, size in enumerate((5 * MIB + 7, 3 * MIB, MIB // 2)):
        p = tmp_path / f"s{i}.bin"
        data = os.urandom(size)
        p.write_bytes(data)
        want[p.name] = hashlib.sha256(data).hexdigest()
        jobs.append(HashJob(p.name, str(p), os.stat(p)))
    got = hash_files(jobs, workers=2, processes=processes)
    assert {k: v["sha256"] for k, v in got.items()} == want
    assert sorted(started) == ["s0.bin", "s1.bin"]  # the file at or under PREFETCH_MIN has none
    assert not [t for t in threading.enumerate() if t.name == "k26-prefetch" and t.is_alive()]
