"""Hostile directories where the start plan reads the server's caches (``doctor.host.jitcache``, read by
``startplan.cache_state`` on every ``check -v`` and twice by ``launch``): directories linked into themselves, a
directory of 100k names, mode 000, a file where a directory is expected, a FIFO named like a module's library,
names with control characters. The readers look at a bounded number of entries (a cache of linked directories
once cost 32 x 256 x 64 x 64 stats), never open a FIFO, and still find the real modules beside the hostile ones.

Real parts: real directories, symlinks, a FIFO and a mode-000 directory under ``tmp_path``; the stat and listing
calls are the real ones, counted (never answered) by a wrapper that stops a walk past its bound.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from test_start_caches import SAMPLING, TREE, env_for, flashinfer_module, sglang_module

from doctor.host import jitcache
from doctor.service import startplan

pytestmark = pytest.mark.timeout(120)
BOUND = 50_000  # far above MAX_READS plus the Triton count; far below the 33M stats of the walk it replaced


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The directory listings and stats the readers make, counted; a walk past ``BOUND`` fails at once (so a test
    of an unbounded walk fails in a second, not after minutes)."""
    calls = [0]

    def count(real):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[0] += 1
            if calls[0] > BOUND:
                raise AssertionError(f"the cache reader walked past {BOUND} listings and stats")
            return real(*args, **kwargs)
        return wrapper

    for name in ("listdir", "scandir"):
        monkeypatch.setattr(jitcache.os, name, count(getattr(os, name)))
    monkeypatch.setattr(jitcache.os.path, "isfile", count(os.path.isfile))
    return calls


def linked_sglang_cache(root: Path) -> None:
    """32 targets, each a link to one directory of 256 modules, each a link to one directory of 64 builds, each
    a link to one directory of 64 deps: a few hundred inodes that an unbounded walk reads as 33M paths."""
    deps, builds, modules = root.parent / "B", root.parent / "M", root.parent / "T"
    for d in (deps, builds, modules, root):
        d.mkdir(parents=True, exist_ok=True)
    for i in range(64):
        (deps / f"deps-{i:02d}").mkdir()
        (builds / f"build-{i:02d}").symlink_to(deps)
    for i in range(256):
        (modules / f"sgl_kernel_jit_m{i:03d}").symlink_to(builds)
    for i in range(32):
        (root / f"sm90a_{i:02d}").symlink_to(modules)


def test_a_cache_of_linked_directories_is_read_in_bounded_steps(tmp_path: Path, counted: list[int]) -> None:
    """SGLang's JIT cache and FlashInfer's as linked trees (and a link to itself), beside one real module each: the
    real ones found (sorted first), the walk bounded."""
    env = env_for(tmp_path)
    sgl = Path(env["SGLANG_JIT_CACHE_DIR"])
    sglang_module(sgl, *TREE, target="sm90a")
    linked_sglang_cache(sgl / "zz")
    (sgl / "zz").rename(sgl / "zz-links")
    (sgl / "loop").symlink_to(sgl / "loop")
    fi = Path(env["FLASHINFER_WORKSPACE_BASE"])
    flashinfer_module(fi, "sampling")
    ops = fi / ".cache" / "flashinfer" / "0.7.2"
    for i in range(64):
        (ops / f"90a_{i:02d}").symlink_to(ops / "90a")
    state = startplan.cache_state(env, env["HOME"])
    assert "sm90a/sgl_kernel_jit_speculative_tree" in state["sglang_jit"]["compiled"]
    assert "0.7.2/90a/sampling" in state["flashinfer"]["compiled"]
    assert counted[0] <= BOUND


def test_a_directory_of_100k_names_is_not_listed_whole(tmp_path: Path, counted: list[int],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """100k entries in SGLang's JIT cache and FlashInfer's version folder: each listing stops at its cap."""
    env = env_for(tmp_path)
    sgl = Path(env["SGLANG_JIT_CACHE_DIR"])
    sgl.mkdir(parents=True)
    versions = Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache" / "flashinfer"
    versions.parent.mkdir(parents=True)
    versions.symlink_to(sgl)  # the same 100k names as FlashInfer's versions
    for i in range(100_000):
        os.close(os.open(sgl / f"t{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    seen: list[int] = []  # entries each listing read
    real_scandir, real_listdir = jitcache.os.scandir, jitcache.os.listdir

    class Counting:
        def __init__(self, path: str) -> None:
            self.it = real_scandir(path)
            seen.append(0)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.it.close()

        def __iter__(self):  # type: ignore[no-untyped-def]
            for entry in self.it:
                seen[-1] += 1
                yield entry

    def listdir(path: str) -> list[str]:
        names = real_listdir(path)
        seen.append(len(names))
        return names

    monkeypatch.setattr(jitcache.os, "scandir", Counting)
    monkeypatch.setattr(jitcache.os, "listdir", listdir)
    try:
        state = startplan.cache_state(env, env["HOME"])
        listed = sorted(seen)
    finally:
        monkeypatch.undo()
        shutil.rmtree(sgl)  # 100k names left behind cost every later session's clean-up of old temporary folders
    assert state["sglang_jit"]["compiled"] == [] and state["flashinfer"]["compiled"] == []
    assert listed and listed[-1] <= 257, listed[-3:]  # each listing at its cap (64 versions, 32 targets), + the one
    # entry read that finds the cap reached


def test_unreadable_odd_and_misnamed_entries_are_no_modules_and_never_opened(tmp_path: Path,
                                                                                 counted: list[int]) -> None:
    """A FIFO named like a module's library (never opened: no hang), a mode-000 directory, a file where a directory
    is expected, a dangling link and a name with control characters: none is a module, the real one still is."""
    env = env_for(tmp_path)
    sgl = Path(env["SGLANG_JIT_CACHE_DIR"])
    sglang_module(sgl, *SAMPLING, target="sm90a")
    fifo_leaf = sgl / "sm90a" / "sgl_kernel_jit_speculative_tree" / "build-1" / "deps-1"
    fifo_leaf.mkdir(parents=True)
    os.mkfifo(fifo_leaf / "sgl_kernel_jit_speculative_tree.so")
    (sgl / "sm100a").write_text("a file where a target directory goes\n")
    locked = sgl / "sm90"
    locked.mkdir()
    (sgl / "sm89").symlink_to(tmp_path / "nowhere")
    weird = sgl / "sm90a" / "sgl_kernel_jit_\x1b[31mred\n"
    (weird / "build-1" / "deps-1").mkdir(parents=True)
    fi = Path(env["FLASHINFER_WORKSPACE_BASE"])
    flashinfer_module(fi, "norm")
    ops = fi / ".cache" / "flashinfer" / "0.7.2" / "90a" / "cached_ops"
    (ops / "sampling").mkdir()
    os.mkfifo(ops / "sampling" / "sampling.so")
    locked.chmod(0)
    try:
        state = startplan.cache_state(env, env["HOME"])
    finally:
        locked.chmod(0o755)
    assert state["sglang_jit"]["compiled"] == ["sm90a/sgl_kernel_jit_speculative_sampling_4_True"]
    assert state["flashinfer"]["compiled"] == ["0.7.2/90a/norm"]


@pytest.mark.parametrize("wall", ["1" + "0" * 400, "1e400", "NaN", "-5", "true", "86400"])
def test_a_prewarm_reporting_an_impossible_time_is_timed_by_the_doctor(tmp_path: Path, wall: str) -> None:
    """The prewarm's probe says its own time (``wall_s``); a 400-digit integer raised OverflowError (``launch``'s
    traceback), inf, nan, a negative or a day longer than it ran went into the plan. Each is replaced by the
    time the doctor waited for it, and the modules it built are still said."""
    import sys

    from doctor.service.prewarm import Prewarm, PrewarmPlan

    line = '{"wall_s": ' + wall + ', "modules": [{"module": "norm", "ok": true, "seconds": 1}]}'
    plan = PrewarmPlan([sys.executable, "-c", f"print({line!r})"], dict(os.environ), ["norm"], str(tmp_path))
    outcome = Prewarm(plan).start(str(tmp_path)).finish(60)
    assert outcome.ok and "norm 1 s" in outcome.reason, outcome
    assert 0.0 <= outcome.seconds < 60 and "inf" not in outcome.reason and "nan" not in outcome.reason, outcome
