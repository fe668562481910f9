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
import time
from pathlib import Path

import pytest
from conftest import interruptible
from model_replica import shard_name

from doctor.core import deadline, proc
from doctor.model import hashing
from doctor.model.hashing import (
    MIB,
    REPORT_BYTES,
    WORKER_WAIT_MIN,
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


def _procs() -> list[tuple[int, str, int, int, str]]:
    """Every live process (zombies excluded): (pid, state, parent, session, command line)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if fields[0] != "Z":
            out.append((int(d.name), fields[0], int(fields[1]), int(fields[3]), cmd))
    return out


def _children(pid: int) -> set[int]:
    return {p for p, _, parent, *_ in _procs() if parent == pid}


def _until(cond, seconds: float = 20.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.fixture
def servers(monkeypatch):
    """The pids of the fork servers the test's hashing starts (each is the leader of its workers' session)."""
    started: list[int] = []
    real = hashing.WorkerServer.start.__func__

    def start(cls, pool=0):
        server = real(cls, pool)
        if server is not None:
            started.append(server.proc.pid)
        return server
    monkeypatch.setattr(hashing.WorkerServer, "start", classmethod(start))
    return started


def _left_behind(servers: list[int]) -> list[str]:
    """Hashing processes still alive: a worker child of this process, a fork server, or any process in a
    server's session (its workers)."""
    return [cmd for pid, _, parent, session, cmd in _procs()
            if session in servers or pid in servers or (parent == os.getpid() and "sha256_worker" in cmd)]


def test_processes_and_threads_give_hashlib_digests(tmp_path, servers):
    paths = _files(tmp_path)
    want = {p.name: _sha(p) for p in paths}
    total = sum(p.stat().st_size for p in paths)
    for processes in (True, False, None):
        prog = Progress(total, len(paths), enabled=False)
        res = hash_files(_jobs(paths), workers=3, processes=processes, progress=prog)
        assert {k: v["sha256"] for k, v in res.items()} == want, processes
        assert all(v["cached"] is False and "changed_while_hashing" not in v for v in res.values())
        assert prog.done == total and prog.done_files == len(paths)
    assert len(servers) == 1 + (plan(_jobs(paths), 3, None)[1])  # True: one; None: as plan says; False: none
    assert not _left_behind(servers)


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


@pytest.mark.parametrize("serve", [False, True])
def test_the_worker_imports_no_json_typing_or_enum(serve):
    """Its start-up is what a hashing call waits for (the fork server's, before its first worker): the heavy
    stdlib imports stay out, in both modes."""
    import socket

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with mine, theirs:
        argv = [sys.executable, "-I", "-S", "-X", "importtime", str(WORKER), *(["--serve"] if serve else [])]
        child = subprocess.Popen(argv, stdin=theirs.fileno() if serve else subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        if serve:
            mine.settimeout(60)
            assert mine.recv(16) == b"ready"
            mine.shutdown(socket.SHUT_RDWR)  # the doctor's end closes: the server ends
        _, err = child.communicate(timeout=60)
    assert child.returncode == 0, err[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if "|" in line}
    assert "hashlib" in imported and "mmap" in imported
    assert not imported & {"json", "re", "typing", "enum", "signal", "socket"}, sorted(imported)


def _sparse(tmp_path: Path, name: str, size: int) -> HashJob:
    p = tmp_path / name
    with open(p, "wb") as fh:
        fh.truncate(size)
    return HashJob(name, str(p), os.stat(p))


def test_plan_threads_for_small_inputs_workers_for_large_shares(tmp_path):
    """Real (sparse) files of the sizes the bench measures: the choice is made on sizes alone."""
    small = [_sparse(tmp_path, f"s{i}", 64 * MIB) for i in range(16)]  # 1 GiB, one file per core
    assert plan(small, 16, None) == (16, False)
    large = [_sparse(tmp_path, f"l{i}", 512 * MIB) for i in range(2)]  # two large files: worth the wait
    assert plan(large, 16, None) == (2, True)
    many = [_sparse(tmp_path, f"m{i}", 128 * MIB) for i in range(64)]  # 8 GiB on 16 cores: 512 MiB each
    assert plan(many, 16, None) == (16, True)
    assert plan(many, 64, None) == (64, False)  # 128 MiB each: below WORKER_WAIT_MIN
    one = [_sparse(tmp_path, "one", WORKER_WAIT_MIN)]
    assert plan(one, 1, None) == (1, True)
    tiny = [_sparse(tmp_path, f"t{i}", MIB) for i in range(10)]  # 10 MiB: two slots are enough
    assert plan(tiny, 16, None) == (2, False)
    assert plan(tiny, 16, True) == (2, True) and plan(large, 16, False) == (2, False)
    assert plan([_sparse(tmp_path, "empty", 0)], 16, None) == (1, False)


def test_only_a_file_worth_the_wait_waits_for_the_fork_server(tmp_path):
    """With workers chosen, a file of ``WORKER_WAIT_MIN`` or more waits for the server; a smaller one is read
    by its thread while the server starts; asked for workers (``processes=True``), every file waits."""
    big, small = _sparse(tmp_path, "big", WORKER_WAIT_MIN), _sparse(tmp_path, "small", WORKER_WAIT_MIN - 1)
    assert hashing.waits_for_worker(big, None) and not hashing.waits_for_worker(small, None)
    assert hashing.waits_for_worker(small, True)


@pytest.fixture
def run_deadline():
    """The run's deadline, as ``app.run`` sets it; none again afterwards."""
    yield deadline
    deadline.start(None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [False, True])
def test_hashing_stops_at_the_run_deadline(tmp_path, run_deadline, processes, servers):
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
    # SIGKILLed is not yet reaped: a killed worker can still be listed for a moment (an empty command line while
    # the kernel tears it down), so wait for it to be gone -- bounded, never by sleeping a guessed time.
    assert len(servers) == processes and _until(lambda: not _left_behind(servers)), _left_behind(servers)


@pytest.mark.parametrize("processes", [False, True])
def test_nothing_starts_after_the_deadline(tmp_path, run_deadline, processes):
    paths = _files(tmp_path)[:3]
    run_deadline.start(0, "the run's deadline (--timeout 5s)")
    res = hash_files(_jobs(paths), workers=2, processes=processes)
    assert res == {p.name: {"error": "hashing stopped: the run's deadline (--timeout 5s) passed"} for p in paths}


CTRL_C_IN_MAIN = """
import json, os, signal, sys, threading, time
from doctor.model import hashing
from doctor.model.hashing import HashJob, Progress, hash_files
path, processes = sys.argv[1], sys.argv[2] == "processes"
st = os.stat(path)
prog = Progress(st.st_size, 1, enabled=False)
servers = []
real = hashing.WorkerServer.start.__func__
hashing.WorkerServer.start = classmethod(lambda cls, pool=0: servers.append(real(cls, pool)) or servers[-1])

def ctrl_c():
    while prog.done == 0:
        time.sleep(0.01)
    os.killpg(os.getpgid(0), signal.SIGINT)  # as Ctrl-C at a terminal: to the doctor's process group

threading.Thread(target=ctrl_c, daemon=True).start()
try:
    hash_files([HashJob("big", path, st)], workers=1, processes=processes, progress=prog)
    doc = {"interrupted": False}
except KeyboardInterrupt:
    doc = {"interrupted": True}
print(json.dumps({**doc, "done": prog.done, "servers": [s.proc.pid for s in servers if s is not None],
                  "server_exit": [s.proc.poll() for s in servers if s is not None]}))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", ["threads", "processes"])
def test_ctrl_c_stops_the_hashing(tmp_path, processes):
    """``manifest write`` hashes in the main thread's call: Ctrl-C at the terminal (SIGINT to the doctor's
    process group, in a session of its own here) stops the threads too, and the workers: the fork server has
    a session of its own, so the signal reaches only the doctor, which kills its worker and ends the server
    before the interrupt goes on."""
    job = _sparse(tmp_path, "big", 2 << 30)
    env = dict(os.environ, PYTHONPATH=str(Path(hashing.__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", CTRL_C_IN_MAIN, job.path, processes], capture_output=True,
                         text=True, timeout=110, env=env, start_new_session=True,
                         preexec_fn=interruptible)  # SIGINT as a terminal gives it, however the suite started
    doc = json.loads(out.stdout)
    assert doc["interrupted"] is True and doc["done"] < job.st.st_size, (doc, out.stderr[-2000:])
    assert len(doc["servers"]) == (processes == "processes") and None not in doc["server_exit"], doc
    assert not _left_behind(doc["servers"])


def _dying_worker(tmp_path: Path, how: str) -> Path:
    """The real worker whose forked workers die as ``how`` (a signal's name) when asked for a file: a mapped
    file shrinking under a worker (SIGBUS) cannot be timed from a test, the death it causes can."""
    real = WORKER.read_text()
    hook = "def hash_path(path: str, report, parent: int) -> str:\n"
    assert real.count(hook) == 1
    script = tmp_path / "dying_worker.py"
    script.write_text(real.replace(hook, hook + f"    _signal.signal(_signal.{how}, _signal.SIG_DFL)\n"
                                         f"    os.kill(os.getpid(), _signal.{how})\n"))
    return script


@pytest.mark.parametrize("how", ["SIGBUS", "SIGINT"])
def test_a_dying_worker_is_replaced_by_the_read_loop(tmp_path, monkeypatch, servers, how):
    """Whatever kills a worker (SIGBUS; SIGINT now reaches it only if sent to it alone: its session is not
    the terminal's), its file is read by its thread, and the next file gets a new worker."""
    paths = _files(tmp_path)[:5]
    monkeypatch.setattr(hashing, "WORKER", _dying_worker(tmp_path, how))
    res = hash_files(_jobs(paths), workers=2, processes=True)
    assert {k: v.get("sha256") for k, v in res.items()} == {p.name: _sha(p) for p in paths}
    assert len(servers) == 1 and not _left_behind(servers)


def test_a_worker_that_cannot_run_falls_back(tmp_path, monkeypatch, servers):
    paths = _files(tmp_path)[:4]
    monkeypatch.setattr(hashing, "WORKER", tmp_path / "no-such-worker.py")
    res = hash_files(_jobs(paths), workers=2, processes=True)
    assert {k: v.get("sha256") for k, v in res.items()} == {p.name: _sha(p) for p in paths}
    assert len(servers) == 1 and not _left_behind(servers)


def test_the_fork_server_kills_its_workers_when_the_doctor_is_gone(tmp_path):
    """The doctor killed (SIGKILL: no cleanup of its own) while a worker hashes: the server sees its socket
    close, kills the worker and ends."""
    job = _sparse(tmp_path, "big", 8 << 30)
    code = ("import os, sys, time\nfrom doctor.model import hashing\n"
            "server = hashing.WorkerServer.start()\nassert server.ready(30)\nworker = server.fork()\n"
            "print(server.proc.pid, worker.pid, flush=True)\n"
            "worker.requests.write(os.fsencode(sys.argv[1]).hex() + '\\n'); worker.requests.flush()\n"
            "worker.answers.readline()\nos.kill(os.getpid(), 9)\n")
    env = dict(os.environ, PYTHONPATH=str(Path(hashing.__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code, job.path], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    server, worker = (int(x) for x in out.stdout.split())
    assert _until(lambda: not {pid for pid, *_ in _procs()} & {server, worker}, 30)


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

MODES = {"threads": False, "processes": True}  # verify_model_hashes' processes= for each mode


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
    for mode, processes in MODES.items():
        res = verify_model_hashes(str(d), use_cache=False, progress=False, workers=4, processes=processes)
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


# -- the slots: started together ----------------------------------------------------------------------------


def test_every_slot_thread_exists_before_any_begins():
    """A slot begun while the others are still being started makes their files begin late: when any slot
    begins, all of them are there."""
    seen: list[int] = []
    lock = threading.Lock()
    all_begun = threading.Barrier(8, timeout=10)  # no slot ends (and its thread with it) before all have begun

    def slot():
        alive = sum(1 for t in threading.enumerate() if t.name.startswith("k26-hash-"))
        with lock:
            seen.append(alive)
        all_begun.wait()
        return [(f"f{alive}", {})]

    outs = hashing.run_slots(slot, 8, threading.Event())
    assert seen == [8] * 8 and len(outs) == 8


def test_a_slot_that_fails_fails_the_call_and_stops_the_others():
    stop = threading.Event()

    def slot():
        if threading.current_thread().name == "k26-hash-0":
            raise OSError("boom")
        assert stop.wait(10)  # set by the failing slot's call, not by a timeout
        return []

    with pytest.raises(OSError, match="boom"):
        hashing.run_slots(slot, 3, stop)
    assert stop.is_set()


def test_the_fork_server_kills_only_its_own_workers(servers):
    """``k PID`` of a pid that is not one of its workers (here: this test's own process) does nothing, and a
    request it does not know is answered ``?``; its workers hash as the plain worker does."""
    server = hashing.WorkerServer.start()
    assert server is not None and server.ready(30)
    try:
        assert server._ask(b"k %d" % os.getpid()) == (b"k", [])  # still here
        assert server._ask(b"what") == (b"?", [])
        worker = server.fork()
        assert worker is not None
        assert worker.hash(__file__, None) == {"sha256": _sha(Path(__file__)), "bytes": Path(__file__).stat().st_size}
        worker.close(kill=True)
        assert not worker.alive()
    finally:
        server.close()
    assert server.proc.returncode == 0 and not _left_behind(servers)


def _worker_paths(monkeypatch) -> list[str]:
    """The paths workers are asked to hash from now on (the rest are read by the threads themselves)."""
    used: list[str] = []
    real = hashing.WorkerProcess.hash

    def spy(self, path, on_bytes):
        used.append(path)
        return real(self, path, on_bytes)
    monkeypatch.setattr(hashing.WorkerProcess, "hash", spy)
    return used


def test_the_pool_is_forked_before_any_request_and_refilled(tmp_path, servers):
    """A server started with a pool of 3 has forked them before it is asked; a request takes one of them
    (no fork); the pipes arrive close-on-exec; a worker's input ends when the doctor closes it even while
    other pooled workers live (none kept a copy of its pipe); the pool is refilled; nothing outlives close."""
    import fcntl

    server = hashing.WorkerServer.start(3)
    assert server is not None and server.ready(30)
    try:
        assert _until(lambda: len(_children(server.proc.pid)) == 3)
        pool = _children(server.proc.pid)
        worker = server.fork()
        assert worker is not None and worker.pid in pool
        for stream in (worker.requests, worker.answers):
            assert fcntl.fcntl(stream.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        f = tmp_path / "f"
        f.write_bytes(os.urandom(3 << 20))
        assert worker.hash(str(f), None) == {"sha256": _sha(f), "bytes": 3 << 20}
        worker.close()
        assert _until(lambda: worker.pid not in _children(server.proc.pid))  # ended (a zombie is not listed)
        assert _until(lambda: len(_children(server.proc.pid)) == 3)  # two left and one new
        assert len(_children(server.proc.pid) & pool) == 2
        idle = _children(server.proc.pid)
        many = server.fork_many(4)  # one request: the pool's three and one forked for it
        assert len({w.pid for w in many}) == 4 and idle < {w.pid for w in many}
        assert f"MAX_HANDOUT = {hashing.WorkerServer.MAX_HANDOUT}" in WORKER.read_text()  # both ends agree
        g = tmp_path / "g"
        g.write_bytes(os.urandom(1 << 20))
        assert [w.hash(str(g), None)["sha256"] for w in many] == [_sha(g)] * 4
        new = next(w for w in many if w.pid not in idle)  # forked for the request, after the others were chosen
        for w in many:
            if w is not new:
                w.close()
        # their inputs end although a worker forked after them lives: it kept no copy of their pipes
        assert _until(lambda: not ({w.pid for w in many if w is not new} & _children(server.proc.pid)))
        assert new.pid in _children(server.proc.pid)
        new.close()
        for bad in (b"f 0", b"f %d" % (hashing.WorkerServer.MAX_HANDOUT + 1), b"f x"):
            assert server._ask(bad) == (b"?", [])
    finally:
        server.close()
    assert server.proc.returncode == 0 and not _left_behind(servers)


def test_every_hashing_call_of_a_run_takes_the_runs_workers(tmp_path, monkeypatch, servers):
    """Inside ``workers_for_run`` a call starts no server of its own and hashes every file through a worker,
    small ones too (``plan`` alone would read them in threads); ``processes=False`` still reads in threads;
    the run's server is gone with its run."""
    paths = _files(tmp_path)
    jobs = _jobs(paths)
    assert plan(jobs, 2, None)[1] is False  # on its own, this call would not start a server
    used = _worker_paths(monkeypatch)
    with hashing.workers_for_run() as run:
        assert run is not None and run.ready(30) and hashing.run_server() is run
        res = hash_files(jobs, workers=2)
        assert sorted(used) == sorted(str(p) for p in paths)
        used.clear()
        again = hash_files(jobs, workers=2, processes=False)
        assert used == []
    assert {k: v.get("sha256") for k, v in res.items()} == {k: v.get("sha256") for k, v in again.items()} == {
        p.name: _sha(p) for p in paths}
    assert hashing.run_server() is None and len(servers) == 1 and not _left_behind(servers)


def test_a_run_server_killed_leaves_the_files_to_the_threads(tmp_path, servers):
    """The run's server killed (as ``proc.kill_all`` does at the run's deadline): the next call reads every
    file in its threads, with the same digests, and the run no longer offers that server."""
    paths = _files(tmp_path)[:6]
    with hashing.workers_for_run() as run:
        assert run is not None and run.ready(30)
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
        res = hash_files(_jobs(paths), workers=2)
        assert hashing.run_server() is None
    assert {k: v.get("sha256") for k, v in res.items()} == {p.name: _sha(p) for p in paths}
    assert not _left_behind(servers)


def test_check_deep_starts_one_server_for_its_run_and_a_check_without_hashing_none(tmp_path, servers):
    """``check --deep`` with a model starts the run's server before its checks (one, with the run's pool)
    and ends it with the run; without --deep, or judging a snapshot, none starts."""
    from click.testing import CliRunner

    from doctor.cli import cli

    model = tmp_path / "m"
    model.mkdir()
    paths = []
    for i in range(2):
        p = model / shard_name(i + 1, 2)
        p.write_bytes(os.urandom(1 << 20))
        paths.append(p)
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {f"t{i}": p.name for i, p in enumerate(paths)}}))
    from doctor.model.manifest import MANIFEST_NAME, manifest_text

    (model / MANIFEST_NAME).write_text(manifest_text({p.name: {"size": 1 << 20, "sha256": _sha(p)} for p in paths}))
    base = ["check", "--only", "model.shards.deep", "--no-verify-cache", "--format", "json"]
    out = CliRunner().invoke(cli, [*base, "--deep", "--model-path", str(model)])
    doc = json.loads(out.output)
    assert [r["status"] for r in doc["results"]] == ["pass"], out.output[-2000:]
    assert len(servers) == 1 and hashing.run_server() is None and not _left_behind(servers)
    CliRunner().invoke(cli, ["check", "--only", "model.shards", "--model-path", str(model), "--format", "json"])
    snap = Path(__file__).parent / "fixtures" / "snapshots" / "b300x8-healthy.json"
    replay = CliRunner().invoke(cli, [*base, "--deep", "--model-path", str(model), "--from-snapshot", str(snap)])
    assert json.loads(replay.output)["results"], replay.output[-2000:]
    assert len(servers) == 1


def test_the_pool_is_refilled_only_once_requests_pause(tmp_path, monkeypatch, servers):
    """Requests coming one after another are served from the pool with no fork between them (a fork would
    hold up the threads still asking); once they pause for ``REFILL_QUIET`` the pool is forked full again.
    Here the pause is 1 s, so that the test's own pace cannot pass for one."""
    real = WORKER.read_text()
    assert real.count("REFILL_QUIET = 0.02") == 1
    script = tmp_path / "slow_refill_worker.py"
    script.write_text(real.replace("REFILL_QUIET = 0.02", "REFILL_QUIET = 1.0"))
    monkeypatch.setattr(hashing, "WORKER", script)
    server = hashing.WorkerServer.start(3)
    assert server is not None and server.ready(30)
    try:
        assert _until(lambda: len(_children(server.proc.pid)) == 3)
        pool = _children(server.proc.pid)
        taken = []
        for _ in range(3):
            taken.append(server.fork())
            time.sleep(0.1)
        assert {w.pid for w in taken} == pool == _children(server.proc.pid)  # all three handed out, none forked
        assert _until(lambda: len(_children(server.proc.pid) - pool) == 3, 10)  # after the pause: three more
        for w in taken:
            w.close()
    finally:
        server.close()
    assert not _left_behind(servers)


def test_a_run_server_up_before_the_call_serves_every_thread_from_the_first_file(tmp_path, monkeypatch, servers):
    """The run's server up (its pool forked) but nobody has heard its "ready" yet, as in a run's first call:
    every thread hashes through a worker from its first file, none reads its file itself because another
    thread was taking the "ready" at that moment."""
    paths = []
    for i in range(16):
        p = tmp_path / f"s{i}"
        p.write_bytes(os.urandom(MIB))
        paths.append(p)
    used = _worker_paths(monkeypatch)
    monkeypatch.setattr(hashing, "MIN_SLOT_BYTES", MIB)  # a thread per file
    seen: list[str] = []
    real_slots = hashing.run_slots

    def slots(*a, **k):
        seen.append(run.state)  # what the threads find when they start
        return real_slots(*a, **k)
    monkeypatch.setattr(hashing, "run_slots", slots)
    with hashing.workers_for_run() as run:
        assert run is not None
        assert _until(lambda: len(_children(run.proc.pid)) >= 1)  # "ready" is sent before the pool is forked
        assert run.state == "starting"
        res = hash_files(_jobs(paths), workers=8)
    assert seen == ["ready"]
    assert sorted(used) == sorted(str(p) for p in paths)
    assert {k: v.get("sha256") for k, v in res.items()} == {p.name: _sha(p) for p in paths}
    assert not _left_behind(servers)
