"""The deep tier's hashing: worker processes (memory-mapped page cache) and the in-process read loop
give the same bytes as hashlib, a worker that dies is replaced by the in-process loop for that file,
Ctrl-C stops the run, and no worker outlives it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from doctor.model import hashing
from doctor.model.hashing import HashJob, Progress, hash_files

WORKER = Path(hashing.__file__).with_name("sha256_worker.py")


def _files(tmp_path: Path) -> list[Path]:
    """Sizes around the worker's window and slice edges, an empty file, one larger than a window."""
    sizes = [0, 1, 4095, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 17, (64 << 20) + 12345]
    out = []
    block = os.urandom(1 << 20)
    for i, size in enumerate(sizes):
        p = tmp_path / f"f{i}.bin"
        with open(p, "wb") as fh:
            left = size
            while left:
                chunk = block[: min(left, len(block))]
                fh.write(chunk)
                left -= len(chunk)
            fh.write(b"")
        out.append(p)
    return out


def _jobs(paths: list[Path]) -> list[HashJob]:
    return [HashJob(p.name, str(p), os.stat(p)) for p in paths]


def _sha(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _children() -> list[str]:
    """Command lines of this process's live children (zombies excluded)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                out.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ValueError):
            continue
    return out


def test_processes_and_threads_give_hashlib_digests(tmp_path):
    paths = _files(tmp_path)
    want = {p.name: _sha(p) for p in paths}
    total = sum(p.stat().st_size for p in paths)
    for processes in (True, False):
        prog = Progress(total, len(paths), enabled=False)
        res = hash_files(_jobs(paths), workers=3, processes=processes, progress=prog)
        assert {k: v["sha256"] for k, v in res.items()} == want, processes
        assert all(v["cached"] is False and "changed_while_hashing" not in v for v in res.values())
        assert prog.done == total and prog.done_files == len(paths)
    assert not [c for c in _children() if "sha256_worker" in c]


def test_worker_protocol_answers_errors_as_data(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"abc")
    lines = [json.dumps(str(p)), json.dumps(str(tmp_path / "missing")), "not json", json.dumps(["a"]),
             json.dumps(str(tmp_path))]
    out = subprocess.run([sys.executable, "-I", "-S", str(WORKER)], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = [json.loads(line) for line in out.stdout.splitlines() if '"p"' not in line]
    assert docs[0] == {"sha256": hashlib.sha256(b"abc").hexdigest(), "bytes": 3}
    assert docs[1]["error"].startswith("cannot read") and docs[2] == docs[3] == {"error": "bad request"}
    assert "error" in docs[4]  # a directory: read() fails with EISDIR


def _stand_in_worker(tmp_path: Path, body: str) -> Path:
    """A worker that dies as SIGBUS or Ctrl-C would kill the real one: the mapped file shrinking under it
    cannot be timed from a test, the death it causes can."""
    script = tmp_path / "dying_worker.py"
    script.write_text("import os, signal, sys\nsys.stdin.readline()\n" + body + "\n")
    return script


def test_a_dying_worker_is_replaced_by_the_read_loop(tmp_path, monkeypatch):
    paths = _files(tmp_path)[:5]
    monkeypatch.setattr(hashing, "WORKER", _stand_in_worker(
        tmp_path, "signal.signal(signal.SIGBUS, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGBUS)"))
    res = hash_files(_jobs(paths), workers=2, processes=True)
    assert {k: v.get("sha256") for k, v in res.items()} == {p.name: _sha(p) for p in paths}


def test_a_worker_that_cannot_run_falls_back(tmp_path, monkeypatch):
    paths = _files(tmp_path)[:4]
    monkeypatch.setattr(hashing, "WORKER", tmp_path / "no-such-worker.py")
    res = hash_files(_jobs(paths), workers=2, processes=True)
    assert {k: v.get("sha256") for k, v in res.items()} == {p.name: _sha(p) for p in paths}


def test_ctrl_c_in_a_worker_stops_the_run(tmp_path, monkeypatch):
    paths = _files(tmp_path)[:5]
    monkeypatch.setattr(hashing, "WORKER", _stand_in_worker(tmp_path, "os.kill(os.getpid(), signal.SIGINT)"))
    res = hash_files(_jobs(paths), workers=1, processes=True)
    assert set(res) == {p.name for p in paths}
    assert all(v == {"error": "hashing interrupted"} for v in res.values()), res


@pytest.mark.skipif(not hasattr(signal, "SIGBUS"), reason="POSIX only")
def test_a_file_that_shrinks_is_reported_changed(tmp_path):
    """The real worker on a file truncated before it is read: the digest of what is there now, flagged."""
    p = tmp_path / "shrinks"
    p.write_bytes(os.urandom(2 << 20))
    job = HashJob(p.name, str(p), os.stat(p))
    with open(p, "r+b") as fh:
        fh.truncate(1 << 20)
    res = hash_files([job, *_jobs(_files(tmp_path)[:2])], workers=2, processes=True)
    assert res[p.name]["sha256"] == _sha(p) and res[p.name]["changed_while_hashing"] is True
