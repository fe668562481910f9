"""A hashing worker process: the sha256 of whole files named on stdin, one answer line out per file.

Why a process and not a thread: a worker hashes its file through a memory map of the page cache (no
copy into a buffer at all) in windows, and shares nothing with the others; a thread must ``read()`` a
copy first (a memory map in the doctor's own process would let a file truncated under it, or a read error
of its disk, kill the doctor with SIGBUS). On the 16-core host the copy costs threads 10-20% of their rate
(bench/bench_hash_parts.py: threads against threads hashing through a map, and against processes that do).

How workers start: ``doctor.model.hashing`` starts this file as ``python -I -S sha256_worker.py --serve N``,
a fork server on a Unix socket (``fork_server``), and asks it for a worker per hashing thread. The server
forks a pool of ``N`` workers as soon as it is up (and again once requests pause), each a fork of a small
single-threaded process that has already loaded hashlib, waiting on its own pipes; a request takes one (one
message, no fork). An interpreter per worker costs each 20 ms, and 16 of them started together took 110-124
ms on the 16-core host. ``check --deep`` starts the server when the run begins (``hashing.workers_for_run``),
so that its pool is up while the doctor loads its checks; a hashing call without one starts its own. Without
``--serve`` the file is one worker on its own stdin and stdout (the protocol's tests use it).

Stdlib only and no ``doctor`` import. It imports only what it uses: no ``json`` (its ``re``), no ``typing``,
``_signal`` and ``_socket`` rather than ``signal`` and ``socket`` (their ``enum``); those were two thirds of
its start-up imports (``-X importtime``: about 60 ms against 20 ms on a loaded 2-core VM). So the protocol
is plain lines:
  input:  a path, its bytes (``os.fsencode``) in hex; end of input ends the worker.
  output: ``p N`` progress (N more bytes hashed), then for that path ``ok HEX N`` (the digest, bytes
          hashed), ``err errno N`` (open, fstat or read failed), ``err mode M`` (not a regular file:
          its ``st_mode``) or ``err bad request``. The parent words an error as its own read loop does
          (``doctor.core.fileio``), so a file's verdict reads the same whichever way it was hashed.
A file truncated while it is mapped raises SIGBUS and kills this worker; the parent sees the worker
gone and hashes that file itself with ``read()``. Core dumps are off so that nothing is written.
A worker exits when its parent (the fork server, or the doctor) is gone, checked between windows; the fork
server kills its workers when the doctor's end of its socket closes.
"""

import _signal  # not ``signal``: its enum import would double this worker's start-up
import _socket  # not ``socket``: the same
import hashlib
import mmap
import os
import stat
import sys
import time

WINDOW = 64 * 1024 * 1024  # bytes mapped at a time (a multiple of the page size)
SLICE = 1024 * 1024  # bytes per hash update
REPORT = 16 * 1024 * 1024  # a progress line every this many bytes (the parent's prefetch follows them)
READ_BLOCK = 256 * 1024  # the read() path: small enough to stay in a core's L2 cache
REFILL_QUIET = 0.02  # seconds without a request before the fork server forks for its pool again
MAX_HANDOUT = 64  # workers per answer: two descriptors each, within SCM_RIGHTS' 253 per message


def _mapped(fd: int, size: int, h, report) -> None:
    off = 0
    while off < size:
        length = min(WINDOW, size - off)
        with mmap.mmap(fd, length, offset=off, access=mmap.ACCESS_READ) as mm:
            if hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mm)
            try:
                for i in range(0, length, REPORT):
                    for j in range(i, min(i + REPORT, length), SLICE):
                        h.update(view[j:j + SLICE])  # REPORT is a multiple of SLICE: a slice ends at i + REPORT
                    report(min(REPORT, length - i))
            finally:
                view.release()
        off += length


def _read(fd: int, h, report) -> int:
    buf = bytearray(READ_BLOCK)
    view = memoryview(buf)
    total = pending = 0
    while True:
        n = os.readv(fd, [buf])
        if not n:
            break
        h.update(view[:n])
        total += n
        pending += n
        if pending >= WINDOW:
            report(pending)
            pending = 0
    if pending:
        report(pending)
    return total


class Orphaned(Exception):
    """The doctor that asked is gone: nobody reads the answer (the worker ends)."""


def hash_path(path: str, report, parent: int) -> str:
    """``ok HEX N`` for one file, or ``err errno N`` / ``err mode M``; ``report(n)`` after every window."""
    def tick(n: int) -> None:
        report(n)
        if os.getppid() != parent:
            raise Orphaned

    try:  # O_NONBLOCK + fstat, as doctor.core.fileio.open_regular (this worker imports nothing of the doctor)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return f"err errno {exc.errno or 0}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"err mode {st.st_mode}"
        os.set_blocking(fd, True)
        size = st.st_size
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        h = hashlib.sha256()
        try:
            _mapped(fd, size, h, tick)
            return f"ok {h.hexdigest()} {size}"
        except (OSError, ValueError):  # a file that cannot be mapped (some FUSE/special files): read it
            h = hashlib.sha256()
            os.lseek(fd, 0, os.SEEK_SET)
            total = _read(fd, h, tick)
            return f"ok {h.hexdigest()} {total}"
    except OSError as exc:
        return f"err errno {exc.errno or 0}"
    finally:
        os.close(fd)


def serve(inp, out, parent: int) -> int:
    """The worker's loop: a path (hex) per line of ``inp``, its answer lines to ``out``; ends at end of input."""
    def emit(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    for line in inp:
        try:
            path = os.fsdecode(bytes.fromhex(line.strip()))
        except ValueError:
            emit("err bad request")
            continue
        if not path:
            emit("err bad request")
            continue
        try:
            emit(hash_path(path, lambda n: emit(f"p {n}"), parent))
        except Orphaned:
            return 0
    return 0


def fork_server(sock, pool: int = 0) -> int:
    """``--serve [N]``: hand the doctor a worker per request, on the Unix socket that is this process's stdin.

    Requests: ``f K`` (``f``: ``f 1``; K at most ``MAX_HANDOUT``), answered with K workers' pids in decimal,
    space-separated, and, as two descriptors each (SCM_RIGHTS, in the same order), the doctor's ends of its pipes
    (the worker's input to write paths to, its output to read answers from); fewer where no more can be forked,
    ``?`` where none. A worker comes from a pool of ``N`` forked in advance, each already waiting on its pipes,
    so that a hashing call's threads get theirs in one message and no fork; where the pool is empty one is
    forked for the request. The pool is refilled once requests pause (``REFILL_QUIET``). ``k PID`` kills that
    worker if it is still this server's, unreaped (so never a process that took over a recycled pid); answered
    ``k``. Anything else is answered ``?``. ``ready`` is sent once, when the server can fork. At the end of the
    socket (the doctor closed it, or is gone) every worker still running, in the pool or handed out, is killed
    and reaped, and the server ends."""
    import array

    hashlib.sha256(b"")  # OpenSSL loaded and its sha256 fetched before any fork: a worker starts with nothing to do
    b"".decode("ascii")  # and the codec of its pipes looked up (imported) once, here
    live = set()
    idle = {}  # pid -> (its input's write end, its output's read end): this server's ends until handed out
    last = float("-inf")  # when the last request came
    sock.send(b"ready")
    while True:
        # Refill only after REFILL_QUIET without a request: a fork takes this server about a millisecond, and
        # the threads of a hashing call ask one after another; a fork between two of them would hold up the rest.
        sock.settimeout(max(0.0, last + REFILL_QUIET - time.monotonic()) if len(idle) < pool else None)
        try:
            msg, anc, _flags, _addr = sock.recvmsg(64, _socket.CMSG_SPACE(2 * array.array("i").itemsize))
        except (BlockingIOError, TimeoutError):  # quiet: one more worker for the pool
            if _spawn(sock, live, idle) is None:
                pool = len(idle)  # no more processes (EAGAIN): serve with what there is
            continue
        except OSError:
            break
        last = time.monotonic()
        if not msg:
            break
        _reap(live, idle)
        _close_passed(anc)
        reply, fds = _answer(msg, sock, live, idle)
        if not _send_reply(sock, reply, fds):
            break
    for pid in list(live):
        _kill(pid, live, idle)
    return 0


def _close_passed(anc) -> None:
    """Close every descriptor a request carried (``anc``: ``recvmsg``'s ancillary data). No request carries
    any; one left open here would be inherited by every worker forked after it."""
    import array

    for level, kind, data in anc:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            for fd in fds:
                os.close(fd)


def _answer(msg: bytes, sock, live, idle):
    """The reply to one request and the descriptors that go with it (None: a plain reply): ``f [K]`` hands
    out workers, ``k PID`` kills one, anything else is ``?``."""
    count = msg[2:] if msg[:2] == b"f " else b"1" if msg == b"f" else b""
    if count.isdigit() and 1 <= int(count) <= MAX_HANDOUT:
        return _handout(int(count), sock, live, idle)
    if msg[:2] == b"k " and msg[2:].isdigit():
        _kill(int(msg[2:]), live, idle)
        return b"k", None
    return b"?", None


def _handout(count: int, sock, live, idle):
    """``count`` workers, pooled ones first, forked ones for the rest (fewer where no more can be forked):
    (their pids as the reply, or ``?`` where none; the doctor's ends of their pipes, or None where none).
    The chosen leave ``idle`` only after the forks, so that no forked worker keeps a copy of their ends."""
    pids = list(idle)[:count]
    while len(pids) < count:
        pid = _spawn(sock, live, idle)
        if pid is None:
            break
        pids.append(pid)
    fds = [fd for pid in pids for fd in idle.pop(pid)] or None
    return (b" ".join(b"%d" % pid for pid in pids) if pids else b"?"), fds


def _send_reply(sock, reply: bytes, fds) -> bool:
    """Send ``reply`` (with ``fds`` as SCM_RIGHTS where there are any); False where the socket is gone. This
    server's copies of the handed-out ends are closed either way: the doctor holds them now, or nobody does."""
    import array

    try:
        if fds is not None:
            sock.sendmsg([reply], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))])
        else:
            sock.send(reply)
    except OSError:
        return False
    finally:
        for fd in fds or ():
            os.close(fd)
    return True


def _spawn(sock, live, idle):
    """Fork a worker waiting on two new pipes; its pid (in ``live`` and ``idle``), or None where no process
    or pipe can be made. The worker closes every descriptor of the server's it inherits (the socket, the
    other pooled workers' ends: a copy left open in it would keep another worker's input from ever ending)."""
    try:
        req_r, req_w = os.pipe()
    except OSError:
        return None
    try:
        ans_r, ans_w = os.pipe()
    except OSError:
        os.close(req_r)
        os.close(req_w)
        return None
    try:
        pid = os.fork()
    except OSError:
        for fd in (req_r, req_w, ans_r, ans_w):
            os.close(fd)
        return None
    if pid == 0:  # the worker: its own pipes, nothing of the server's, then the worker's loop, then out
        code = 1
        try:
            sock.close()
            for fd in (req_w, ans_r, *(fd for ends in idle.values() for fd in ends)):
                os.close(fd)
            code = serve(open(req_r, encoding="ascii", errors="replace"), open(ans_w, "w", encoding="ascii"),
                         os.getppid())
        finally:
            os._exit(code)
    os.close(req_r)
    os.close(ans_w)
    live.add(pid)
    idle[pid] = (req_w, ans_r)
    return pid


def _reap(live, idle) -> None:
    """Reap the workers that have ended (a pid leaves ``live`` only here or in ``_kill``; a pooled one that
    ended, its pipes with it)."""
    while live:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            live.clear()
            return
        if pid == 0:
            return
        live.discard(pid)
        for fd in idle.pop(pid, ()):
            os.close(fd)


def _kill(pid: int, live, idle) -> None:
    """Kill and reap ``pid`` if it is a worker of this server not yet reaped (its pid cannot be reused yet)."""
    if pid not in live:
        return
    live.discard(pid)
    try:
        os.kill(pid, _signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
    for fd in idle.pop(pid, ()):
        os.close(fd)


def main() -> int:
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)  # Ctrl-C ends the worker quietly; the parent reports
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    if sys.argv[1:2] == ["--serve"]:
        pool = sys.argv[2] if len(sys.argv) == 3 else "0"
        return fork_server(_socket.socket(fileno=0), int(pool) if pool.isdigit() else 0)
    return serve(sys.stdin, sys.stdout, os.getppid())


if __name__ == "__main__":
    sys.exit(main())
