"""Where the service's JIT compilers keep what they built (host.jit_cache), and whether it survives.

A start on an empty cache compiles FlashInfer's modules (sampling ~107 s, norm ~40 s on the H200) and every Triton
kernel of the CUDA-graph captures (~130 s for a DDTree server): minutes of each start that a persistent cache
makes a one-time cost. A cache on tmpfs (a /tmp or /dev/shm mount, a container's ephemeral home) is wiped at every
boot; a cache the service's user cannot write is compiled again at every start (or fails). The places follow the
libraries' own rules: FlashInfer's under ``FLASHINFER_WORKSPACE_BASE``, else SGLang's ``SGLANG_CACHE_DIR``, else
``~/.cache/sglang`` (sglang/srt/environ.py points FlashInfer there), then ``.cache/flashinfer/<version>/<archs>/
cached_ops/<module>/<module>.so``; Triton's ``TRITON_CACHE_DIR`` else ``~/.triton/cache``.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation

VOLATILE_FS = ("tmpfs", "ramfs")
VOLATILE = "host.jit_cache.volatile"
NOT_WRITABLE = "host.jit_cache.not_writable"
PERSISTENT = "host.jit_cache.persistent"
CACHE_VARS = {"flashinfer": "FLASHINFER_WORKSPACE_BASE", "triton": "TRITON_CACHE_DIR", "sglang": "SGLANG_CACHE_DIR"}
PERSISTENT_BASE = "/var/cache/sglang-k26"  # the unit's CacheDirectory= (doctor.service.systemd SERVICE_DIR_NAME)
MAX_ENTRIES = 100_000
MAX_READS = 70_000  # entries and stats one cache reader looks at (a real cache needs a few hundred): ~0.3 s at most
PART_READS = 2_000  # of them, what one target (SGLang) or one version/arch folder (FlashInfer) may take
# systemd-tmpfiles' configuration, by precedence: a file of /etc replaces the same name in /run and /usr/lib
TMPFILES_DIRS = ("/etc/tmpfiles.d", "/run/tmpfiles.d", "/usr/lib/tmpfiles.d")
BOOT_WIPE_TYPES = ("D", "R")  # emptied (D) or removed (R) by `systemd-tmpfiles --remove` at every boot


def cache_dirs(env: dict[str, str], home: str) -> dict[str, dict[str, str]]:
    """``{cache: {"path", "var", "from"}}`` for FlashInfer, Triton and SGLang, as the service's environment sets
    them. ``path`` is the directory the variable names (FlashInfer's modules go under ``<path>/.cache/flashinfer``)."""
    def expand(p: str) -> str:
        return os.path.join(home, p[2:]) if p.startswith("~/") else p

    sglang = expand(env["SGLANG_CACHE_DIR"]) if env.get("SGLANG_CACHE_DIR") else os.path.join(home, ".cache", "sglang")
    sglang_from = "SGLANG_CACHE_DIR" if env.get("SGLANG_CACHE_DIR") else "SGLang's default ~/.cache/sglang"
    if env.get("FLASHINFER_WORKSPACE_BASE"):
        fi, fi_from = expand(env["FLASHINFER_WORKSPACE_BASE"]), "FLASHINFER_WORKSPACE_BASE"
    else:
        fi, fi_from = sglang, f"{sglang_from} (SGLang points FlashInfer there)"
    triton = expand(env["TRITON_CACHE_DIR"]) if env.get("TRITON_CACHE_DIR") else os.path.join(home, ".triton", "cache")
    triton_from = "TRITON_CACHE_DIR" if env.get("TRITON_CACHE_DIR") else "Triton's default ~/.triton/cache"
    return {"flashinfer": {"path": fi, "var": "FLASHINFER_WORKSPACE_BASE", "from": fi_from},
            "triton": {"path": triton, "var": "TRITON_CACHE_DIR", "from": triton_from},
            "sglang": {"path": sglang, "var": "SGLANG_CACHE_DIR", "from": sglang_from}}


def boot_wipes(configs: dict[str, str]) -> list[dict[str, str]]:
    """The directories systemd-tmpfiles empties or removes at boot (``D /tmp 1777 root root -`` on Debian and
    Ubuntu, where /tmp is wiped even on a disk), from the effective configuration ``{file name: text}`` (each name
    already resolved by precedence): ``[{"path", "line", "file"}]``."""
    out = []
    for name, text in sorted(configs.items()):
        for raw in text.splitlines():
            fields = raw.split()
            if len(fields) < 2 or fields[0].startswith("#"):
                continue
            kind = fields[0].rstrip("!-=+~^")
            if kind in BOOT_WIPE_TYPES and fields[1].startswith("/"):
                out.append({"path": fields[1].rstrip("/") or "/", "line": raw.strip(), "file": name})
    return out


def wiped_by(path: str, wipes: list[dict[str, str]]) -> str | None:
    """The tmpfiles.d line that wipes ``path`` at boot (it lies under a wiped directory), or None."""
    real = os.path.normpath(path)
    for w in wipes:
        if real == w["path"] or real.startswith(w["path"].rstrip("/") + "/"):
            return f"{w['file']}: {w['line']}"
    return None


def flashinfer_compiled(base: str) -> list[str]:
    """FlashInfer's compiled modules under ``base`` as ``<version>/<archs>/<module>`` (stat and listdir only, at most
    ``MAX_READS`` entries looked at: a hostile cache costs a bounded time on every ``check -v``)."""
    root = os.path.join(base, ".cache", "flashinfer")
    reads = Reads()
    out: list[str] = []
    for version in reads.listdir(root, 64):
        for arch in reads.listdir(os.path.join(root, version), 64):
            ops = os.path.join(root, version, arch, "cached_ops")
            part = reads.part()
            out += [f"{version}/{arch}/{n}" for n in part.listdir(ops, 256)
                    if part.isfile(os.path.join(ops, n, n + ".so"))]
            reads.charge(part)
    return out


def sglang_jit_dir(env: dict[str, str], home: str) -> str:
    """SGLang's own JIT kernel cache (its tree-verify kernels among them): ``SGLANG_JIT_CACHE_DIR``, else
    ``~/.cache/sglang/jit`` (sglang/kernels/jit/utils/compile/cache.py ``cache_root``: not under SGLANG_CACHE_DIR)."""
    given = env.get("SGLANG_JIT_CACHE_DIR")
    if given:
        return os.path.join(home, given[2:]) if given.startswith("~/") else given
    return os.path.join(home, ".cache", "sglang", "jit")


def server_triton_dir(env: dict[str, str], home: str) -> tuple[str, str]:
    """The Triton cache a SGLang 0.5.2x server uses, and why: ``TRITON_CACHE_DIR``, else ``<SGLANG_CACHE_DIR>/
    triton`` (``import sglang`` sets that default before Triton is imported: sglang/srt/environ.py
    ``redirect_third_party_caches``), not Triton's own ``~/.triton/cache``."""
    if env.get("TRITON_CACHE_DIR"):
        t = env["TRITON_CACHE_DIR"]
        return (os.path.join(home, t[2:]) if t.startswith("~/") else t), "TRITON_CACHE_DIR"
    return os.path.join(cache_dirs(env, home)["sglang"]["path"], "triton"), "SGLang's default <SGLANG_CACHE_DIR>/triton"


SGLANG_JIT_PREFIX = "sgl_kernel_jit_"  # sglang/kernels/jit/utils/compile/spec.py _MODULE_NAME_PREFIX (0.5.23)


def sglang_module_name(*args: object) -> str:
    """The directory (and library) name SGLang 0.5.23 gives a JIT module built by ``load_jit(*args)``:
    ``BuildSpec.module_name`` is ``"sgl_kernel_jit_" + "_".join(str(a) for a in args)``, so the tree kernels are
    ``sgl_kernel_jit_speculative_tree`` and the sampling kernel ``sgl_kernel_jit_speculative_sampling_4_True``
    (``load_jit("speculative_sampling", vec_size, deterministic)``). Why it matters: a cache read by the bare
    first argument never finds a module, and a warm start is planned (and prewarmed) as a cold one."""
    return SGLANG_JIT_PREFIX + "_".join(str(a) for a in args)


def sglang_jit_compiled(root: str) -> list[str]:
    """SGLang's JIT modules built under ``root`` as ``<target>/<module_name>`` (``<root>/<target>/<module_name>/
    build-<key>/deps-<key>/<module_name>.so``, its content-addressed layout; ``module_name`` as
    ``sglang_module_name`` spells it): stat and listdir only, at most ``MAX_READS`` entries looked at (a cache of
    linked directories once made this 32 x 256 x 64 x 64 stats: minutes of every ``check -v``)."""
    reads = Reads()
    out: list[str] = []
    for target in reads.listdir(root, 32):
        part = reads.part()  # a target full of links cannot hide the next one's modules
        for module in part.listdir(os.path.join(root, target), 256):
            mdir = os.path.join(root, target, module)
            if any(part.isfile(os.path.join(mdir, b, d, module + ".so"))
                   for b in part.listdir(mdir, 64) if b.startswith("build-")
                   for d in part.listdir(os.path.join(mdir, b), 64) if d.startswith("deps-")):
                out.append(f"{target}/{module}")
        reads.charge(part)
    return out


def entry_count(path: str) -> int | None:
    """Entries directly in ``path`` (Triton keeps one directory per kernel), None when it is not a directory."""
    try:
        with os.scandir(path) as it:
            n = 0
            for _ in it:
                n += 1
                if n >= MAX_ENTRIES:
                    break
            return n
    except OSError:
        return None


class Reads:
    """One cache reader's budget: the directory entries and stats it may still look at (``MAX_READS``). Why: the
    readers run on every ``check -v`` and ``launch`` on caches anyone may have filled (100k entries, directories
    linked into themselves); each level's own cap bounds one listing, this bounds the walk. A listing stops after
    ``cap`` entries (``os.scandir``: a directory of a million names is never read whole), sorted for a stable order;
    a directory that cannot be read (missing, a file, mode 000, a symlink loop) lists nothing."""

    def __init__(self, limit: int | None = None) -> None:
        self.left = MAX_READS if limit is None else limit

    def part(self) -> Reads:
        """A budget for one part of the walk (``PART_READS``, within what is left): a hostile part spends its
        own, not its siblings'; ``charge`` takes what it used from this one."""
        return Reads(min(PART_READS, self.left))

    def charge(self, part: Reads) -> None:
        self.left -= min(PART_READS, self.left) - part.left

    def listdir(self, path: str, cap: int) -> list[str]:
        names: list[str] = []
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if len(names) >= cap or self.left <= 0:
                        break
                    self.left -= 1
                    names.append(entry.name)
        except OSError:
            return []
        return sorted(names)

    def isfile(self, path: str) -> bool:
        """``os.path.isfile`` (a stat: a FIFO named like a module is no module and is never opened), counted."""
        if self.left <= 0:
            return False
        self.left -= 1
        return os.path.isfile(path)


def module_compiled(compiled: list[str], module: str, version: str | None, cc: str | None) -> bool:
    """Whether ``<version>/<archs>/<module>`` is among ``compiled`` for this FlashInfer version (any when not
    known) and a GPU of compute capability ``cc`` ("9.0": an archs directory naming 90, "90a" or "90a_100a")."""
    want = (cc or "").replace(".", "")
    for item in compiled:
        parts = str(item).split("/")
        if len(parts) != 3 or parts[2] != module or (version and parts[0] != version):
            continue
        archs = {"".join(ch for ch in a if ch.isdigit()) for a in parts[1].split("_")}
        if not want or want in archs:
            return True
    return False


def _volatile_names(volatile: dict[str, Any]) -> str:
    """Each wiped cache with what wipes it (a tmpfs mount or a systemd-tmpfiles rule): the warning names the cause."""
    return "; ".join(f"{k} cache {v['path']} ({v.get('from')}) is " + (
        f"on {v['fstype']} mounted at {v.get('mount_point')}" if v.get("fstype") in VOLATILE_FS else
        f"emptied at boot by systemd-tmpfiles ({v.get('wiped_at_boot_by')})") for k, v in volatile.items())


def _denied_names(denied: dict[str, Any]) -> str:
    """Each cache the service's user cannot write, with the folder where the write stopped: where to look."""
    return "; ".join(f"{k} cache {v['path']} (stopped at {v.get('denied_at')})" for k, v in denied.items())


def _unread_names(caches: dict[str, Any], unknown: list[str]) -> str:
    """Each cache whose place could not be judged, with the error that stopped it."""
    return "; ".join(f"{k} cache: {caches[k]['error']}" for k in unknown)


def judge_jit_cache(fact: dict[str, Any]) -> Findings:
    """Each cache: on tmpfs (wiped at boot: warn), not writable for the service's user (warn), else persistent."""
    caches = fact.get("caches") or {}
    if not caches:
        raise NotJudged.missing("the JIT caches' locations were not recorded")
    user = fact.get("user") or "the service's user"
    out = Findings(caches={k: f"{v.get('path')} ({v.get('fstype') or '?'})" for k, v in caches.items()}, user=user)
    volatile = {k: v for k, v in caches.items() if v.get("fstype") in VOLATILE_FS or v.get("wiped_at_boot_by")}
    denied = {k: v for k, v in caches.items() if v.get("writable") is False}
    unknown = [k for k, v in caches.items() if v.get("error")]
    if volatile:
        out.warn(VOLATILE, f"{_volatile_names(volatile)}: wiped at every boot, so every first start after one "
                 "compiles again (FlashInfer's modules and Triton's kernels: minutes on the H200)",
                 _move_fix(volatile, user))
    if denied:
        out.warn(NOT_WRITABLE, f"{user} cannot write {_denied_names(denied)}: each start compiles again, or fails",
                 _move_fix(denied, user))
    if unknown:
        out.warn("host.jit_cache.unreadable", _unread_names(caches, unknown))
    if not (volatile or denied or unknown):
        out.info(PERSISTENT, "the JIT caches are on persistent filesystems and writable for " + str(user) + ": "
                 + ", ".join(f"{k} {v['path']} ({v.get('fstype')})" for k, v in caches.items()))
    return out


def persistent_dir(cache: str) -> str:
    """Where a cache moves when its place does not survive: under the unit's CacheDirectory=."""
    return os.path.join(PERSISTENT_BASE, cache)


def _move_fix(bad: dict[str, dict[str, Any]], user: str) -> Remediation:
    cmds = [shlex.join(["sudo", "install", "-d", "-o", user, "-m", "0750", persistent_dir(k)]) for k in bad]
    cmds += [f"# in the service's environment file: {CACHE_VARS[k]}={persistent_dir(k)}" for k in bad]
    return Remediation("Keep the caches on a persistent filesystem the service's user owns (`k26-doctor fix` plans "
                       "it: the directory, and the variable in the profile's server.env_file):", cmds)
