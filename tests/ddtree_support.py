"""Shared helpers of the DDTree patch-set tests: the SGLang 0.5.23 wheel, the set applied, modules loaded.

The patched modules are loaded straight from a temporary unpack of the wheel with the patch set applied
(``importlib.util.spec_from_file_location``): importing the ``sglang`` package would pull its heavy
dependencies, and what is tested must be the file the patch produces, not a copy.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import downloads
import sglang_wheels
from file_modules import load_file
from interpreters import probe_env, run_identity

ROOT = Path(__file__).resolve().parents[1]
SET_DIR = ROOT / "sglang_patches" / "ddtree-0.5.23"
TOOL = ROOT / "sglang_patches" / "tools" / "patchset.py"
VERSION = "0.5.23"


def find_wheel() -> Path | None:
    """The sglang 0.5.23 wheel (``sglang_wheels.locate_wheel``: ``$SGLANG_WHEELS`` or the per-user cache,
    downloaded there when absent), or None."""
    return sglang_wheels.locate_wheel(VERSION)[0]


def require_wheel() -> Path:
    """The wheel, for a test: skips saying why without it (fails under CI, which reaches PyPI)."""
    return sglang_wheels.wheel_for(VERSION)


@functools.lru_cache(maxsize=1)
def patchset_tool() -> ModuleType:
    return load_file(TOOL, "k26_patchset_tool")


def _tmpdir(prefix: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, d, True)
    return d


@downloads.reads("the sglang 0.5.23 wheel")
def patched_tree(whole: bool = False) -> Path:
    """An unpack of the wheel (only the touched files unless ``whole``) with the set applied by the patch
    engine: made once into the test cache (``sglang_wheels.built_once``, about 10 s for the whole wheel) and
    remade whenever the set, the tool or the engine's sources change. The tests read it; none writes to it.
    (Applying the set to a fresh unpack is itself tested: test_ddtree_patchset's verify tests.)"""
    wheel = require_wheel()
    name = f"ddtree-patched-{'whole' if whole else 'touched'}-{wheel.name[:-len('.whl')]}"
    engine = ROOT / "doctor" / "sglang" / "patching"
    return sglang_wheels.built_once(name, [SET_DIR, TOOL, engine],
                                    lambda dest: patchset_tool().apply_to(SET_DIR, wheel, dest, whole=whole))


BARE_PROBE = Path(__file__).resolve().parent / "ddtree_bare_probe.py"
BARE_STUBBABLE = ("setproctitle", "aiohttp")


def bare_package_probe(tmp_path_factory) -> dict:
    """What tests/ddtree_bare_probe.py reports on the patched tree imported as a bare ``sglang`` package
    (``$K26_SGLANG_ARGS_PYTHON`` or this interpreter): one child per patched tree, probe and interpreter
    (``sglang_wheels.computed_once``: whichever test process asks first runs it, the others wait on its lock and
    read its result, and so do later runs until one of them changes). ``{"rc", "stderr", "parts": {...}}``."""
    python = os.environ.get("K26_SGLANG_ARGS_PYTHON", sys.executable)
    root = patched_tree(whole=True)
    env = {k: v for k, v in probe_env().items()
           if k not in ("SGLANG_DDTREE_UNVALIDATED_WORKER", "SGLANG_DDTREE_SITE_RECORD")}

    def run() -> tuple[dict, bool]:
        cwd = tmp_path_factory.mktemp("ddtree-bare-probe")
        proc = subprocess.run([python, str(BARE_PROBE), str(root), ",".join(BARE_STUBBABLE)],
                              capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        res = {"python": python, "rc": proc.returncode, "stderr": proc.stderr[-3000:],
               "parts": json.loads(lines[-1][len("RESULT "):]) if lines else {}}
        return res, proc.returncode == 0 and bool(res["parts"]) and all("result" in p for p in res["parts"].values())

    key = {"tree": root.name, "stubbable": BARE_STUBBABLE, **run_identity(python, env)}
    return sglang_wheels.computed_once("ddtree-bare-probe", sglang_wheels.project_sources(BARE_PROBE), key, run)


def bare_part(tmp_path_factory, name: str, needs: str) -> dict:
    """One part's result; skips naming a missing module (``needs``: what for), fails on any other error."""
    import pytest

    res = bare_package_probe(tmp_path_factory)
    part = res["parts"].get(name)
    if part is None:
        pytest.fail(f"the bare-package probe did not report {name!r} (rc {res['rc']}):\n{res['stderr']}")
    if "missing" in part:
        import ci_requirements

        ci_requirements.unavailable(ci_requirements.reason([part["missing"]], res["python"], needs)
                                    + "; or set K26_SGLANG_ARGS_PYTHON to an interpreter that has it")
    if "error" in part:
        pytest.fail(f"{name} raised in the probe:\n{part['error'][-3000:]}")
    return part["result"]


@downloads.reads("the sglang 0.5.23 wheel")
def pristine_tree() -> Path:
    wheel = require_wheel()
    root = _tmpdir("ddtree-pristine-")
    tool = patchset_tool()
    extra = ["sglang/srt/arg_groups/arg_utils.py", "sglang/srt/arg_groups/choices.py"]
    tool.unpack(wheel, root, tool.touched_paths(SET_DIR, tool.load_manifest(SET_DIR)) + extra)
    return root


@contextlib.contextmanager
def bare_sglang(root: Path, packages: tuple[str, ...], modules: dict[str, ModuleType] | None = None):
    """``sglang`` and ``packages`` as bare modules over ``root`` (their ``__init__`` files, which import the
    serving stack, do not run) plus ``modules`` registered by name, for the duration of the block; the
    caller's ``sglang*`` modules are put back afterwards."""
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    try:
        for name in ("sglang", *packages):
            pkg = ModuleType(name)
            pkg.__path__ = [str(Path(root) / name.replace(".", "/"))]
            sys.modules[name] = pkg
        sys.modules.update(modules or {})
        yield
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@downloads.reads("the sglang 0.5.23 wheel")
def ddtree_utils() -> ModuleType:
    """``sglang/srt/speculative/ddtree_utils.py`` as the patch set creates it (torch only)."""
    import ci_requirements

    ci_requirements.require("torch", needed_for="by the patched ddtree_utils")
    return load_file(patched_tree() / "sglang/srt/speculative/ddtree_utils.py", "k26_ddtree_utils")


@downloads.reads("the sglang 0.5.23 wheel")
def ddtree_step() -> ModuleType:
    """``sglang/srt/speculative/ddtree_step.py`` as the patch set creates it (torch + ddtree_utils only).

    Its ``from sglang.srt.speculative.ddtree_utils import ...`` is served by registering the patched
    ddtree_utils under that name for the duration of the load (no ``sglang`` package import).
    """
    name = "sglang.srt.speculative.ddtree_utils"
    saved = sys.modules.get(name)
    sys.modules[name] = ddtree_utils()
    try:
        return load_file(patched_tree() / "sglang/srt/speculative/ddtree_step.py", "k26_ddtree_step")
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved


def chi_square(codes, expected_p) -> tuple[float, int]:
    """Pearson statistic of integer outcome codes against expected cell probabilities (torch tensors);
    cells with an expected count < 5 pooled. ``inf`` if an impossible outcome occurred."""
    import torch

    n = codes.shape[0]
    counts = torch.bincount(codes, minlength=expected_p.numel()).double()
    exp = expected_p.reshape(-1).double() * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    ex = torch.cat([exp[big], exp[~big].sum().view(1)])
    keep = ex > 0
    if bool((obs[~keep] > 0).any()):
        return math.inf, int(keep.sum()) - 1
    stat = float(((obs[keep] - ex[keep]) ** 2 / ex[keep]).sum())
    return stat, int(keep.sum()) - 1


def chi_square_critical(df: int) -> float:
    """A generous bound (about 5 standard deviations) on a chi-square with ``df`` degrees of freedom."""
    return df + 5.0 * math.sqrt(2.0 * df)


WORKER_PKGS = ("sglang", "sglang.srt", "sglang.srt.speculative", "sglang.kernels", "sglang.kernels.ops",
               "sglang.kernels.ops.speculative")


def patched_worker() -> Iterator[ModuleType]:
    """The patched ddtree_worker.py loaded under its real name, with its parent packages as bare modules (SGLang's
    package ``__init__`` with its heavy imports does not run) and ddtree_utils registered; yields the module and
    puts back whatever ``sglang`` modules were loaded before (a fixture's body: ``yield from patched_worker()``)."""
    import types

    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    root = patched_tree()
    for name in WORKER_PKGS:
        mod = types.ModuleType(name)
        mod.__path__ = [str(root / name.replace(".", "/"))]
        sys.modules[name] = mod
    sys.modules["sglang.srt.speculative.ddtree_utils"] = ddtree_utils()
    try:
        yield load_file(root / "sglang/srt/speculative/ddtree_worker.py", "sglang.srt.speculative.ddtree_worker")
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def brute_force_top(lp, budget):
    """The ``budget`` best rank-prefixes by enumeration of every prefix."""
    depth, topk = lp.shape
    scored = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(topk), repeat=d):
            scored.append((sum(float(lp[i, r]) for i, r in enumerate(ranks)), ranks))
    scored.sort(key=lambda x: -x[0])
    return scored[:budget]
