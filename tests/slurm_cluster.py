"""A real single-node Slurm cluster for the tests: munged, slurmctld and slurmd from the distribution's packages
(Debian: munge, slurmctld, slurmd, slurm-client), started here, stopped by the test, nothing left behind.

Every daemon listens on loopback only, on free ports. Two ways, chosen by what the machine allows:

* ``loopback``: the host name resolves to a loopback address (Debian's ``127.0.1.1 host``): slurmctld and slurmd
  bind exactly that address (``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny``);
* ``netns``: otherwise (a container whose name resolves to its bridge address), as root: the daemons and every
  command that talks to them run in a network namespace of their own whose only interface is ``lo``
  (``K26_TEST_SLURM_NETNS=1`` forces this way).

munge's socket and key, slurm.conf, the state and the logs live in the test's directory; the daemons run as the
user running the tests. ``why_not()`` says exactly what is missing when the cluster cannot run here.
"""

from __future__ import annotations

import contextlib
import getpass
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

DAEMONS = {"munged": "munge", "munge": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
           "scontrol": "slurm-client", "srun": "slurm-client", "squeue": "slurm-client", "scancel": "slurm-client"}
START_S = 40.0
FORCE_NETNS = "K26_TEST_SLURM_NETNS"  # =1: the network namespace even where the host name is loopback


def _tool(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)),
                                      None)


def host_short() -> str:
    return socket.gethostname().split(".")[0]


def loopback_address() -> str | None:
    """The IPv4 address the host name resolves to, when it is a loopback one (what NoInAddrAny binds)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    addr = infos[0][4][0] if infos else None
    return addr if addr and ipaddress.ip_address(addr).is_loopback else None


def netns_possible() -> bool:
    return os.geteuid() == 0 and bool(_tool("unshare")) and bool(_tool("nsenter")) and bool(_tool("ip"))


def why_not() -> str | None:
    """None when a cluster can run here, else exactly what stops it."""
    missing = sorted({pkg for name, pkg in DAEMONS.items() if _tool(name) is None})
    if missing:
        return "not installed: " + " ".join(missing) + " (apt-get install munge slurmctld slurmd slurm-client)"
    if (loopback_address() is None or os.environ.get(FORCE_NETNS)) and not netns_possible():
        return (f"the host name {socket.gethostname()!r} does not resolve to a loopback address and a private "
                "network namespace needs root with unshare, nsenter and ip (iproute2)")
    return None


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class Cluster:
    """munged + slurmctld + slurmd of one node; ``prefix`` runs a command where the daemons can be reached."""

    def __init__(self, root: Path, extra_conf: str = "") -> None:
        self.root = root
        self.node = host_short()
        self.conf = root / "slurm.conf"
        self.extra_conf = extra_conf
        self.procs: list[subprocess.Popen[bytes]] = []
        self.prefix: list[str] = []
        self.mode = "loopback" if loopback_address() and not os.environ.get(FORCE_NETNS) else "netns"

    # -- life cycle ---------------------------------------------------------------------------------------
    def start(self) -> Cluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        root = self.root
        for sub in ("munge", "state", f"spool/{self.node}", "log"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "munge").chmod(0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        if self.mode == "netns":
            # lo up, plus an address that is not loopback (on lo, so still nowhere else): getaddrinfo's
            # AI_ADDRCONFIG, which Slurm uses, resolves nothing, not even 127.0.0.1, without one.
            up = "ip link set lo up && ip addr add 10.254.254.254/32 dev lo && exec sleep 3600"
            holder = self._spawn("netns", ["unshare", "--net", "sh", "-c", up])
            self.prefix = ["nsenter", f"--net=/proc/{holder.pid}/ns/net", "--"]
            _wait(lambda: _run([*self.prefix, "ip", "-o", "link", "show", "lo"]).stdout.find("UP") >= 0,
                  "the network namespace's lo to come up")
            addr, params = "127.0.0.1", ""
        else:
            addr, params = loopback_address() or "127.0.0.1", "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny\n"
        ctld_port, slurmd_port = free_ports(2, addr if self.mode == "loopback" else "127.0.0.1")
        sock = root / "munge" / "munge.socket"
        user = getpass.getuser()
        self.conf.write_text(
            f"ClusterName=k26test\nSlurmctldHost={self.node}({addr})\nSlurmctldPort={ctld_port}\n"
            f"SlurmdPort={slurmd_port}\nSlurmUser={user}\nSlurmdUser={user}\n"
            f"AuthType=auth/munge\nAuthInfo=socket={sock}\nCredType=cred/munge\n{params}"
            f"StateSaveLocation={root}/state\nSlurmdSpoolDir={root}/spool/%n\n"
            f"SlurmctldPidFile={root}/slurmctld.pid\nSlurmdPidFile={root}/slurmd.pid\n"
            f"SlurmctldLogFile={root}/log/slurmctld.log\nSlurmdLogFile={root}/log/slurmd.log\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\nMpiDefault=none\n"
            "SchedulerType=sched/builtin\nSelectType=select/linear\nReturnToService=2\nMailProg=/bin/true\n"
            f"{self.extra_conf}"
            f"NodeName={self.node} NodeAddr={addr} CPUs=1 RealMemory=100 State=UNKNOWN\n"
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n")
        self._spawn("munged", [_tool("munged") or "munged", "--foreground", "--force", f"--socket={sock}",
                               f"--key-file={key}", f"--pid-file={root}/munge/munged.pid",
                               f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/seed"])
        _wait(sock.exists, "munged's socket")
        self._spawn("slurmctld", [*self.prefix, _tool("slurmctld") or "slurmctld", "-D", "-f", str(self.conf)])
        _wait(lambda: self.scontrol("ping").returncode == 0 and "UP" in self.scontrol("ping").stdout,
              "slurmctld to answer", self)
        self._spawn("slurmd", [*self.prefix, _tool("slurmd") or "slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        _wait(lambda: self.states() == ["IDLE"], "the node to register IDLE", self)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / "log" / f"{name}.out", "wb")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=self.env(), start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def jobs(self) -> list[str]:
        res = _run([*self.prefix, _tool("squeue") or "squeue", "-h", "-o", "%i"], env=self.env())
        return res.stdout.split() if res.returncode == 0 else []

    def cancel_jobs(self, timeout: float = 20) -> None:
        """Cancel every job of this cluster and wait for their processes (slurmstepd's, outside the daemons'
        process groups) to be gone."""
        deadline = time.monotonic() + timeout
        while self.jobs() and time.monotonic() < deadline:
            _run([*self.prefix, _tool("scancel") or "scancel", *self.jobs()], env=self.env())
            time.sleep(0.3)

    def stop(self) -> None:
        """Cancel the jobs, then SIGTERM each daemon's process group (last started first), SIGKILL what is left
        after 10 s."""
        if self.procs:
            try:
                self.cancel_jobs()
            except (OSError, subprocess.TimeoutExpired):
                pass
        for proc in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(5)
        self.procs.clear()

    # -- talking to it ------------------------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ, SLURM_CONF=str(self.conf))
        env.update(extra)
        return env

    def scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run([*self.prefix, _tool("scontrol") or "scontrol", *args], env=self.env())

    def show(self) -> str:
        return self.scontrol("-o", "show", "node", self.node).stdout

    def states(self) -> list[str]:
        import re

        m = re.search(r"(?:^| )State=(\S+)", self.show())
        return m.group(1).split("+") if m else []

    def reason(self) -> str | None:
        import re

        m = re.search(r"(?:^| )Reason=(.*)$", self.show().strip())
        return m.group(1) if m else None

    @contextlib.contextmanager
    def holding(self, port: int) -> Iterator[None]:
        """Someone listens on ``port`` where the daemons and the doctor run (in their namespace, if any)."""
        code = ("import socket, sys, time\ns = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(1)\n"
                "print('ready', flush=True)\ntime.sleep(600)\n")
        holder = subprocess.Popen([*self.prefix, sys.executable, "-c", code, str(port)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
            yield
        finally:
            _signal_group(holder, signal.SIGKILL)
            holder.wait(10)

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").iterdir()):
            out.append(f"== {f.name}\n" + f.read_text(errors="replace")[-3000:])
        return "\n".join(out)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, stdin=subprocess.DEVNULL)


def _wait(pred, what: str, cluster: Cluster | None = None, timeout: float = START_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except (OSError, subprocess.TimeoutExpired):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}" + (f"\n{cluster.logs()}" if cluster else ""))
