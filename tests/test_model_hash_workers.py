"""The deep tier's hashing: worker processes (memory-mapped page cache) and the in-process read loop
give the same bytes as hashlib, ``plan`` hashes small inputs in threads and large shares in workers, a
worker that dies is replaced by the in-process loop for that file, Ctrl-C and the run's deadline stop
hashing (in threads and in workers), hostile files get the same verdicts either way, and no worker
outlives a run."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from model_replica import shard_name

from doctor.core import deadline, proc
from doctor.model import hashing
from doctor.model.hashing import (
    MIB,
    PROCESS_MIN_SHARE,
    REPORT_BYTES,
    HashJob,
    Progress,
    hash_files,
    plan,
    verify_model_hashes,
)

WORKER = Path(hashing.__file__).with_name("sha256_worker.py")


def _files(tmp_path: Path) -> list[Path]:
    """Sizes around the worker's window and slice edges, the read loop's block and report edges, an empty
    file, one larger than a window."""
    edge = hashing.read_block()
    sizes = [0, 1, 4095, edge - 1, edge + 1, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 17, REPORT_BYTES,
             (64 << 20) + 12345]
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
    for processes in (True, False, None):
        prog = Progress(total, len(paths), enabled=False)
        res = hash_files(_jobs(paths), workers=3, processes=processes, progress=prog)
        assert {k: v["sha256"] for k, v in res.items()} == want, processes
        assert all(v["cached"] is False and "changed_while_hashing" not in v for v in res.values())
        assert prog.done == total and prog.done_files == len(paths)
    assert not [c for c in _children() if "sha256_worker" in c]


def test_worker_protocol_answers_errors_as_data(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"abc")
    odd = tmp_path / os.fsdecode(b"odd\nname \xff")  # a newline and a byte that is not UTF-8: hex carries it
    odd.write_bytes(b"odd")
    hexed = [os.fsencode(str(x)).hex() for x in (p, tmp_path / "missing", odd, tmp_path)]
    lines = [hexed[0], hexed[1], "not hex", "", hexed[2], hexed[3]]
    out = subprocess.run([sys.executable, "-I", "-S", str(WORKER)], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    answers = [line for line in out.stdout.splitlines() if not line.startswith("p ")]
    assert answers[0] == f"ok {hashlib.sha256(b'abc').hexdigest()} 3"
    assert answers[1] == f"err errno {errno.ENOENT}"
    assert answers[2] == answers[3] == "err bad request"
    assert answers[4] == f"ok {hashlib.sha256(b'odd').hexdigest()} 3"
    assert answers[5].startswith("err mode ") and stat.S_ISDIR(int(answers[5].split()[-1]))
    assert len(answers) == 6


def test_the_worker_imports_no_json_typing_or_enum():
    """Its start-up is what small inputs pay (16 interpreters at once): the heavy stdlib imports stay out."""
    out = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", str(WORKER)], input="",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "hashlib" in imported and "mmap" in imported
    assert not imported & {"json", "re", "typing", "enum", "signal"}, sorted(imported)


def _sparse(tmp_path: Path, name: str, size: int) -> HashJob:
    p = tmp_path / name
    with open(p, "wb") as fh:
        fh.truncate(size)
    return HashJob(name, str(p), os.stat(p))


def test_plan_threads_for_small_inputs_workers_for_large_shares(tmp_path):
    """Real (sparse) files of the sizes the bench measures: the choice is made on sizes alone."""
    small = [_sparse(tmp_path, f"s{i}", 64 * MIB) for i in range(16)]  # 1 GiB, one file per core
    assert plan(small, 16, None) == (16, False)
    large = [_sparse(tmp_path, f"l{i}", 512 * MIB) for i in range(2)]  # two large files: no start-up to share
    assert plan(large, 16, None) == (2, True)
    many = [_sparse(tmp_path, f"m{i}", 128 * MIB) for i in range(64)]  # 8 GiB on 16 cores: 512 MiB each
    assert plan(many, 16, None) == (16, True)
    assert plan(many, 64, None) == (64, False)  # 128 MiB each: below PROCESS_MIN_SHARE
    one = [_sparse(tmp_path, "one", PROCESS_MIN_SHARE)]
    assert plan(one, 1, None) == (1, True)
    tiny = [_sparse(tmp_path, f"t{i}", MIB) for i in range(10)]  # 10 MiB: two slots are enough
    assert plan(tiny, 16, None) == (2, False)
    assert plan(tiny, 16, True) == (2, True) and plan(large, 16, False) == (2, False)
    assert plan([_sparse(tmp_path, "empty", 0)], 16, None) == (1, False)


@pytest.fixture
def run_deadline():
    """The run's deadline, as ``app.run`` sets it; none again afterwards."""
    yield deadline
    deadline.start(None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [False, True])
def test_hashing_stops_at_the_run_deadline(tmp_path, run_deadline, processes):
    """At the deadline the CLI reports, then kills every registered child (``proc.kill_all``): a worker
    killed then is not replaced by reading its file here, and a thread stops within ``REPORT_BYTES``; a
    2 GiB file (a hole: no disk needed) takes seconds, the stop a fraction of one."""
    job = _sparse(tmp_path, "big", 2 << 30)
    prog = Progress(job.st.st_size, 1, enabled=False)
    run_deadline.start(None)

    def at_deadline():
        run_deadline.expire("the run was interrupted (Ctrl-C)")
        proc.kill_all()

    timer = threading.Timer(0.3, at_deadline)
    timer.start()
    try:
        res = hash_files([job], workers=1, processes=processes, progress=prog)
    finally:
        timer.cancel()
    assert res == {"big": {"error": "hashing stopped: the run was interrupted (Ctrl-C)"}}, res
    assert prog.done < job.st.st_size
    assert not [c for c in _children() if "sha256_worker" in c]


@pytest.mark.parametrize("processes", [False, True])
def test_nothing_starts_after_the_deadline(tmp_path, run_deadline, processes):
    paths = _files(tmp_path)[:3]
    run_deadline.start(0, "the run's deadline (--timeout 5s)")
    res = hash_files(_jobs(paths), workers=2, processes=processes)
    assert res == {p.name: {"error": "hashing stopped: the run's deadline (--timeout 5s) passed"} for p in paths}


CTRL_C_IN_MAIN = """
import json, os, signal, sys, threading, time
from doctor.model.hashing import HashJob, Progress, hash_files
path = sys.argv[1]
st = os.stat(path)
prog = Progress(st.st_size, 1, enabled=False)

def ctrl_c():
    while prog.done == 0:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGINT)  # to the process: the kernel hands it to the main thread

threading.Thread(target=ctrl_c, daemon=True).start()
try:
    hash_files([HashJob("big", path, st)], workers=1, processes=False, progress=prog)
    print(json.dumps({"interrupted": False, "done": prog.done}))
except KeyboardInterrupt:
    print(json.dumps({"interrupted": True, "done": prog.done}))
"""


@pytest.mark.timeout(120)
def test_ctrl_c_stops_the_hashing_threads(tmp_path):
    """``manifest write`` hashes in the main thread's call: Ctrl-C there must stop the threads too (the
    executor waits for them), not let them read the rest of the file."""
    job = _sparse(tmp_path, "big", 2 << 30)
    env = dict(os.environ, PYTHONPATH=str(Path(hashing.__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", CTRL_C_IN_MAIN, job.path], capture_output=True, text=True,
                         timeout=110, env=env)
    doc = json.loads(out.stdout)
    assert doc["interrupted"] is True and doc["done"] < job.st.st_size, (doc, out.stderr[-2000:])


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
@pytest.mark.parametrize("processes", [True, False])
def test_a_file_that_shrinks_is_reported_changed(tmp_path, processes):
    """A file truncated before it is read (the real worker, the read loop): the digest of what is there
    now, flagged."""
    p = tmp_path / "shrinks"
    p.write_bytes(os.urandom(2 << 20))
    job = HashJob(p.name, str(p), os.stat(p))
    with open(p, "r+b") as fh:
        fh.truncate(1 << 20)
    res = hash_files([job, *_jobs(_files(tmp_path)[:2])], workers=2, processes=processes)
    assert res[p.name]["sha256"] == _sha(p) and res[p.name]["changed_while_hashing"] is True


# -- hostile files: the same verdicts in threads and in workers -------------------------------------------

MODES = {"threads": 1 << 62, "processes": 0}  # PROCESS_MIN_SHARE that makes ``plan`` pick each mode


def _hostile_model(tmp_path: Path) -> tuple[Path, list[str], bytes]:
    """A model directory whose index names a good shard, a FIFO, a symlink loop, a dangling symlink, a
    directory, and a symlink to a good file outside (followed, as the HF cache's snapshot links are)."""
    d = tmp_path / "model"
    d.mkdir()
    names = [shard_name(i, 6) for i in range(1, 7)]
    data = os.urandom((3 << 20) + 5)
    (d / names[0]).write_bytes(data)
    os.mkfifo(d / names[1])
    os.symlink(names[2], d / names[2])
    os.symlink("nowhere.safetensors", d / names[3])
    (d / names[4]).mkdir()
    (tmp_path / "blob").write_bytes(data[::-1])
    os.symlink(tmp_path / "blob", d / names[5])
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {f"t{i}": n for i, n in enumerate(names)}}))
    return d, names, data


@pytest.mark.timeout(120)
def test_hostile_shards_get_the_same_verdicts_either_way(tmp_path, monkeypatch):
    d, names, data = _hostile_model(tmp_path)
    seen = {}
    for mode, share in MODES.items():
        monkeypatch.setattr(hashing, "PROCESS_MIN_SHARE", share)
        res = verify_model_hashes(str(d), use_cache=False, progress=False, workers=4)
        seen[mode] = {f["name"]: {k: v for k, v in f.items() if k != "seconds"} for f in res["files"]}
    assert seen["threads"] == seen["processes"]
    got = seen["threads"]
    assert got[names[0]] == {"name": names[0], "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                             "cached": False, "verdict": "no_reference"}
    assert got[names[1]] == {"name": names[1], "verdict": "error", "error": "not a regular file"}
    assert got[names[2]]["verdict"] == "missing" and got[names[2]]["error"] == os.strerror(errno.ELOOP)
    assert got[names[3]] == {"name": names[3], "verdict": "missing", "error": os.strerror(errno.ENOENT)}
    assert got[names[4]] == {"name": names[4], "verdict": "error", "error": "not a regular file"}
    assert got[names[5]]["sha256"] == hashlib.sha256(data[::-1]).hexdigest()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [False, True])
def test_a_shard_replaced_by_a_fifo_after_its_stat_is_refused_not_waited_on(tmp_path, processes):
    """Between the stat and the read a shard becomes a FIFO (nobody writes it): refused in the same words
    by the read loop (``open_regular``) and by a worker."""
    p = tmp_path / "shard"
    p.write_bytes(b"x" * 100)
    job = HashJob(p.name, str(p), os.stat(p))
    p.unlink()
    os.mkfifo(p)
    res = hash_files([job, *_jobs(_files(tmp_path)[:2])], workers=2, processes=processes)
    assert res[p.name] == {"error": "cannot read: is a FIFO (named pipe), not a regular file"}
    assert all("sha256" in v for k, v in res.items() if k != p.name)


UNREADABLE = """
import ctypes, json, os, sys
from doctor.model.hashing import HashJob, hash_files
path = sys.argv[1]
if os.geteuid() == 0:  # root reads anything: give up the two capabilities that let it, here and in children
    libc = ctypes.CDLL(None, use_errno=True)
    dac = (1, 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    for cap in dac:
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: an exec'd worker does not get them back
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    hdr, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = ~sum(1 << c for c in dac) & 0xFFFFFFFF
    data[0].effective &= keep
    data[0].permitted &= keep
    data[0].inheritable &= keep
    if libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
try:
    open(path, "rb").close()
    print(json.dumps("readable"))
except PermissionError:
    print(json.dumps([hash_files([HashJob("f", path, os.stat(path))], workers=1, processes=p)["f"]
                      for p in (False, True)]))
"""


@pytest.mark.timeout(120)
def test_an_unreadable_shard_is_an_error_in_both_modes(tmp_path):
    """Mode 000, read by a process that may not read it (as root: without CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH, dropped from its bounding set too, so its worker processes lack them as well)."""
    p = tmp_path / "shard"
    p.write_bytes(b"secret")
    os.chmod(p, 0)
    root = str(Path(hashing.__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {root!r})\n" + UNREADABLE,
                          str(p)], capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [{"error": "cannot read: Permission denied"}] * 2
