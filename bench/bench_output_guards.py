#!/usr/bin/env python3
"""What the output guards of hostile input, round two cost inside `k26-doctor check` on the default profile.

The guards: the terminal-safe renderer (``doctor.core.printable.printable`` where foreign text enters the text
report, ``terminal_safe`` on every write of ``RedactingStream``), the numeric parser of the flags
(``doctor.core.settings.number``) and the output planner (``doctor.commands.options.plan_outputs``). A before and
after of `check` cannot be timed in one run, so this times, in one run, the seconds spent inside the guards
(every call wrapped with ``time.perf_counter``) against the seconds of the whole `check` they ran in, and, as
a second figure, `check` with the guards replaced by the identity (the run without them) against `check` as it
is, interleaved round by round so that load changes both alike.

    python bench/bench_output_guards.py [--rounds 5] [--only GLOB]

Target: the guards under 1% of `check`'s run; the two `check` medians within noise of each other.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (module, attribute): every place a guard is called through
GUARDS = [("doctor.report.text", "printable"), ("doctor.report.environment", "printable"),
          ("doctor.service.smoke", "printable"), ("doctor.service.diagnose", "printable"),
          ("doctor.service.http", "printable"), ("doctor.facts.redaction", "terminal_safe"),
          ("doctor.commands.options", "plan_outputs"), ("doctor.core.settings", "number")]


@contextlib.contextmanager
def guards(mode: str, spent: list[float]) -> Iterator[None]:
    """``timed``: every guard call adds its seconds to ``spent``; ``off``: every guard is the identity."""
    import importlib

    saved = []
    for module_name, attr in GUARDS:
        module = importlib.import_module(module_name)
        real = getattr(module, attr)
        saved.append((module, attr, real))

        def timed(*args: Any, _real: Callable[..., Any] = real, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - t0)

        def off(*args: Any, _real: Callable[..., Any] = real, _attr: str = attr, **kwargs: Any) -> Any:
            if _attr in ("printable", "terminal_safe"):
                return args[0]
            return _real(*args, **kwargs)  # the parser and the planner decide: they stay

        setattr(module, attr, timed if mode == "timed" else off)
    try:
        yield
    finally:
        for module, attr, real in saved:
            setattr(module, attr, real)


def run_check(argv: list[str]) -> tuple[float, int]:
    """`k26-doctor check ARGV` in this process, its report written to a buffer through the CLI's streams."""
    from doctor.cli import run_cli

    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        t0 = time.perf_counter()
        code = run_cli(["check", *argv])
        return time.perf_counter() - t0, code
    finally:
        sys.stdout, sys.stderr = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default=None, help="a selection instead of the whole default tier")
    args = ap.parse_args()
    argv = ["--only", args.only] if args.only else []
    run_check(argv)  # warm: imports, the registry, caches
    with_guards, without, shares = [], [], []
    for _ in range(args.rounds):
        spent: list[float] = []
        with guards("timed", spent):
            seconds, code = run_check(argv)
        with_guards.append(seconds)
        shares.append(sum(spent) / seconds)
        with guards("off", []):
            without.append(run_check(argv)[0])
    med_with, med_without = statistics.median(with_guards), statistics.median(without)
    print(f"check {' '.join(argv) or '(default profile, default tier)'}: exit {code}, {args.rounds} rounds")
    print(f"  inside the guards: median {statistics.median(shares) * 100:.3f}% of check's run "
          f"(max {max(shares) * 100:.3f}%), {len(spent)} calls per run")
    print(f"  check with the guards {med_with:.3f}s, without {med_without:.3f}s: ratio {med_with / med_without:.3f} "
          f"(best {min(with_guards):.3f}s / {min(without):.3f}s)")


if __name__ == "__main__":
    main()
