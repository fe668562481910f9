#!/usr/bin/env python3
"""Startup cost of `k26-doctor --help` and `k26-doctor list` (runs on every ExecStartPre).

Whole processes, each timed by ``timing.measure`` (best and median of R runs), against the baseline `python -c pass`
measured in the same run with the same loop: the ratio holds on a loaded machine where the seconds do not.
Target: both medians under 0.3 s on an idle 2-core machine. Also printed: what each command imports that it never
prints (torch-free, but packaging, the launcher, the patch engine...): `--help` lists the lazy commands from
``doctor.cli.LAZY_HELP`` and imports none of them; `list` loads the registry, not the launcher or packaging.

    python bench/bench_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from timing import Timing, measure

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("packaging", "doctor.app", "doctor.service.launcher", "doctor.sglang.patching.engine", "doctor.model.hashing",
         "doctor.commands.fix", "doctor.commands.launch")
IMPORTED = """
import contextlib, io, json, sys
from doctor.cli import run_cli
with contextlib.redirect_stdout(io.StringIO()):
    run_cli(sys.argv[1:])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("packaging", "doctor", "checks", "fixes"))))
"""


def imported(args: list[str], env: dict[str, str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", IMPORTED, *args], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # As installed (pip writes bytecode): with PYTHONDONTWRITEBYTECODE set every module would be compiled
    # from source on every start, which no installed doctor does.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    py = sys.executable

    def timed(argv: list[str]) -> Timing:
        return measure(lambda: subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                              check=False), args.runs)

    base = timed([py, "-c", "pass"])
    print(f"{'python -c pass (baseline)':32s} median {base.median * 1000:7.1f} ms  best {base.best * 1000:7.1f} ms")
    for label, cli in (("k26-doctor --help", ["--help"]), ("k26-doctor list", ["list"]),
                       ("k26-doctor list --format json", ["list", "--format", "json"])):
        t = timed([py, "-m", "doctor", *cli])
        heavy = [m for m in imported(cli, env) if m.startswith(HEAVY)]
        print(f"{label:32s} median {t.median * 1000:7.1f} ms  best {t.best * 1000:7.1f} ms  "
              f"{t.median / base.median:4.1f}x baseline  {'OK' if t.median < 0.3 else 'OVER 0.3 s'}  "
              f"imports never printed: {', '.join(heavy) or 'none'}")


if __name__ == "__main__":
    main()
