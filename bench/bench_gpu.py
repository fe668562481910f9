"""Wall time of the default-tier GPU checks on this host, against a baseline measured in the same run.

    PYTHONPATH=. python3 bench/bench_gpu.py [--profile h200-tp8] [--tp N] [--repeat 5] [--deep] [--output FILE]

Baseline: the least an isolated NVML reading can cost, a child interpreter that imports pynvml,
initialises NVML and counts the GPUs. Measured: every default-tier ``gpu.*`` check through the
real runner, live (the ``nvml`` fact collected once in its killable child process, then judged),
and the same checks replayed from the facts just collected (judging alone). Reported: medians,
the ratio to the baseline, NVML's own time and call count. ``--deep`` adds the measured
GPU-to-GPU bandwidth (the probe, in ``--python``'s interpreter).
Without a GPU it still runs: NVML's failure is what gets timed, and it says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doctor import app
from doctor.facts.store import CollectOptions
from doctor.gpu.facts import collect_p2p_bandwidth

BASELINE = ("import pynvml\ntry:\n    pynvml.nvmlInit(); pynvml.nvmlDeviceGetCount(); pynvml.nvmlShutdown()\n"
            "except pynvml.NVMLError:\n    pass\n")


def baseline_s() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", BASELINE], check=True, capture_output=True, timeout=60)
    return time.perf_counter() - start


def live_run(profile: str, tp: int | None) -> tuple[float, Any]:
    settings = app.settings_from_flags({"profile": profile, "tp": tp, "only": ["gpu.*"]})
    start = time.perf_counter()
    report = app.run(settings)[0]
    return time.perf_counter() - start, report


def replay_run(profile: str, tp: int | None, facts: dict[str, Any]) -> float:
    settings = app.settings_from_flags({"profile": profile, "tp": tp, "only": ["gpu.*"]})
    settings.snapshot = {"kind": "k26-doctor-snapshot", "schema_version": 1, "facts": facts}
    start = time.perf_counter()
    app.run(settings)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200-tp8")
    ap.add_argument("--tp", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--deep", action="store_true")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch for --deep")
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)

    base = [baseline_s() for _ in range(args.repeat)]
    lives, report = [], None
    for _ in range(args.repeat):
        wall, report = live_run(args.profile, args.tp)
        lives.append(wall)
    assert report is not None
    ctx_facts = {"nvml": app.make_context(report.settings).fact("nvml")}
    replays = [replay_run(args.profile, args.tp, ctx_facts) for _ in range(args.repeat)]
    nvml = ctx_facts["nvml"]
    out: dict[str, Any] = {
        "host": {"available": nvml.get("available"), "error": nvml.get("error"),
                 "driver": nvml.get("driver_version"), "gpus": [d.get("name") for d in nvml.get("devices") or []]},
        "profile": args.profile, "tp": report.settings.tp, "repeat": args.repeat,
        "baseline_nvml_child_s": round(statistics.median(base), 4),
        "default_gpu_checks_live_s": round(statistics.median(lives), 4),
        "default_gpu_checks_live_min_s": round(min(lives), 4),
        "default_gpu_checks_replay_s": round(statistics.median(replays), 5),
        "ratio_live_to_baseline": round(statistics.median(lives) / statistics.median(base), 2),
        "nvml_elapsed_s": nvml.get("elapsed_s"), "nvml_calls": nvml.get("nvml_calls"),
        "checks": {r.id: {"status": r.status.value, "duration_s": round(r.duration_s, 4), "summary": r.summary}
                   for r in report.results},
    }
    if args.deep:
        start = time.perf_counter()
        n = len(nvml.get("devices") or []) or 1
        bw = collect_p2p_bandwidth(CollectOptions(deep=True, python=args.python, tp=n, profile={}))
        out["p2p_bandwidth"] = {"wall_s": round(time.perf_counter() - start, 2), "measured": bw.get("measured"),
                                "reason": bw.get("reason"), "local": bw.get("local"), "pairs": bw.get("pairs"),
                                "probe_elapsed_s": bw.get("elapsed_s"), "torch": bw.get("torch")}
    text = json.dumps(out, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
