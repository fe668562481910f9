#!/usr/bin/env python3
"""The recorded starts of a ``bench_start_plan.py`` call predicted again by the start plan as it is now, beside what
each start measured: how a change of the model (or of its constants) reads on starts already made.

Why: the plan's constants are measured on such runs; a constant fitted on a run and then checked on the same run is
not an independent check, and this script's output says which runs a constant was measured on (``measured_on`` of
doctor/data/start_constants.toml naming the results directory) so that a reader can tell a check from a fit.

The inputs are the recorded ones (``runs[].inputs``). A call recorded before its inputs were kept whole held only
the target, the caches and meminfo: the rest is read from the run's log (the exec line's server arguments, the
plan's "SGLang's import" seconds) and from ``--gpu``/``--cc``, and the script says so.

Usage: python bench/replan_start.py bench/results/ddtree-h200-start-coldwarm [--gpu "NVIDIA H200"] [--cc 9.0]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.service import startplan  # noqa: E402


def completed_inputs(run: dict, folder: Path, gpu: str, cc: str) -> tuple[dict, list[str]]:
    """The run's inputs, with what an older record lacks read from its log; the names of the fields so read."""
    inputs = dict(run.get("inputs") or {})
    filled: list[str] = []
    log = (folder / run["log"]).read_text(errors="replace") if run.get("log") else ""
    if not inputs.get("server_args"):
        m = re.search(r"^k26-doctor: exec: (.*)$", log, re.M)
        argv = shlex.split(m.group(1)) if m else []
        inputs["server_args"] = argv[argv.index("sglang.launch_server") + 1:] if "sglang.launch_server" in argv \
            else argv
        inputs["algorithm"] = startplan.arg_value(inputs["server_args"], "--speculative-algorithm")
        filled.append("server_args")
    if "import_s" not in inputs:
        m = re.search(r"sglang \S+ imports in ([\d.]+)s", log)
        inputs["import_s"] = float(m.group(1)) if m else None
        filled.append("import_s")
    for key, value in (("gpu_name", gpu), ("compute_capability", cc), ("tp", 1)):
        if key not in inputs:
            inputs[key] = value
            filled.append(key)
    return inputs, filled


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--gpu", default="NVIDIA H200")
    ap.add_argument("--cc", default="9.0")
    ns = ap.parse_args(argv)
    data = json.loads((ns.results / "start-plan.json").read_text())
    table = startplan.constants()
    fitted_here = sorted({f"{kind}.{name}" for kind, spec in table["kinds"].items() for name, c in spec.items()
                          if isinstance(c, dict) and ns.results.name in str(c.get("measured_on", ""))}
                         | {f"{kind}.jit.{name}" for kind, spec in table["kinds"].items()
                            for name, c in spec.get("jit", {}).items() if ns.results.name in str(c.get("measured_on"))})
    print(json.dumps({"constants_measured_on_these_runs": fitted_here}))
    for run in data["runs"]:
        if not run.get("actual"):
            continue
        inputs, filled = completed_inputs(run, ns.results, ns.gpu, ns.cc)
        plan = startplan.predict(inputs, table)
        rows = startplan.compare(plan.to_dict(), {"parts": run["actual"]},
                                 launched_to_ready_s=run.get("server_ready_after_s"))
        print(json.dumps({"run": run["run"], "recorded_prediction_s": run.get("predicted_s"),
                          "prediction_now_s": plan.total_s, "actual_s": run.get("server_ready_after_s"),
                          "inputs_read_from_the_log": filled,
                          "parts_now": {p.name: p.seconds for p in plan.parts}, "comparison_now": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
