"""Benchmark: the seven stack checks together vs ``python -c "import torch"`` in the same interpreter.

The floor is importing torch (torch.arch and cuda.compat must import it once to read what it was
built for). The target: all of cuda.compat, torch.arch, stack.versions, triton.jit, triton.ptxas,
python.venv and sglang.install, run concurrently as the runner runs them, in at most 1.3x the floor.
Runs are interleaved (floor, checks, floor, checks...) so that drift hits both alike.

    python3 bench/bench_stack.py [--python /path/to/venv/bin/python] [--runs 5] [--cli]

Without ``--python`` it makes (once) a venv under /tmp with ``pip install torch==2.13.0`` (CPU) and
the triton 3.6.0 and sglang 0.5.23 wheels without their dependencies.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.app import planned_server  # noqa: E402
from doctor.core import registry  # noqa: E402
from doctor.core import settings as doctor_settings  # noqa: E402
from doctor.core.context import Context, FactUnavailable  # noqa: E402
from doctor.core.result import Result  # noqa: E402
from doctor.facts.store import CollectOptions, FactStore  # noqa: E402

IDS = ("cuda.compat", "torch.arch", "stack.versions", "triton.jit", "triton.ptxas", "python.venv", "sglang.install")
VENV = Path("/tmp/k26-bench-stack-venv")


# sglang wheels: $SGLANG_WHEELS, else the tests' per-user wheel cache (tests/sglang_wheels.py)
WHEELS = os.environ.get("SGLANG_WHEELS") or str(Path.home() / ".cache" / "k26-doctor-tests")

def ensure_venv() -> Path:
    py = VENV / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode == 0:
        return py
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, "--no-deps", "triton==3.6.0"], check=True)
    wheel = sorted(Path(WHEELS).glob("sglang-0.5.23-*.whl"))
    subprocess.run([*pip, "--no-deps", str(wheel[0]) if wheel else "sglang==0.5.23"], check=True)
    return py


def floor_once(python: str) -> float:
    start = time.monotonic()
    subprocess.run([python, "-c", "import torch"], check=True, capture_output=True)
    return time.monotonic() - start


def checks_once(python: str) -> tuple[float, dict[str, str], dict[str, float]]:
    """All seven checks on a fresh FactStore, concurrently (as doctor.core.runner runs them)."""
    st = doctor_settings.resolve({"python": python}, environ={})
    opts = CollectOptions(python=st.python, profile=st.profile, tp=st.tp, env=dict(os.environ))
    ctx = Context(st, FactStore(opts), planned_server)
    ctx.facts._values["nvml"] = {"available": False, "error": "no GPU on the bench host"}

    def one(cid: str) -> tuple[str, str]:
        try:
            return cid, registry.load(plugins=False).checks[cid].run(ctx).status.value
        except FactUnavailable as exc:
            return cid, Result.errored(exc.reason).status.value

    start = time.monotonic()
    with cf.ThreadPoolExecutor(len(IDS)) as pool:
        statuses = dict(pool.map(one, IDS))
    return time.monotonic() - start, statuses, {k: round(v, 3) for k, v in ctx.facts.durations().items()}


def cli_once(python: str) -> float:
    args = [sys.executable, "-m", "doctor", "check", "--python", python, "--format", "json"]
    for cid in IDS:
        args += ["--only", cid]
    start = time.monotonic()
    subprocess.run(args, capture_output=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", help="interpreter with torch (default: a bench venv under /tmp)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cli", action="store_true", help="also time `python -m doctor check --only ...` end to end")
    ns = ap.parse_args()
    python = ns.python or str(ensure_venv())
    floor_once(python)  # warm the page cache for both
    checks_once(python)
    floors, checks, clis = [], [], []
    statuses: dict[str, str] = {}
    durations: dict[str, float] = {}
    for _ in range(ns.runs):
        floors.append(floor_once(python))
        t, statuses, durations = checks_once(python)
        checks.append(t)
        if ns.cli:
            clis.append(cli_once(python))
    floor, total = statistics.median(floors), statistics.median(checks)
    out = {"python": python, "runs": ns.runs, "floor_import_torch_s": round(floor, 3),
           "checks_s": round(total, 3), "ratio": round(total / floor, 3), "target_ratio": 1.3,
           "statuses": statuses, "fact_durations_s": durations,
           "floor_runs": [round(x, 3) for x in floors], "checks_runs": [round(x, 3) for x in checks]}
    if clis:
        out["cli_s"] = round(statistics.median(clis), 3)
        out["cli_ratio"] = round(out["cli_s"] / floor, 3)
    print(json.dumps(out, indent=2))
    return 0 if out["ratio"] <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())
