#!/usr/bin/env python3
"""Where a real `check --deep` run's hashing time goes: the same page-cached shards hashed, in interleaved
rounds, by the real CLI (a process of its own), by the same call in this process (inside a run whose fork
server started as long before as the CLI's does), and by `xargs -P cores sha256sum`.

Both doctor calls carry the same timeline (bench/deep_timeline.py): when each thread had its worker, when
each file began and ended, every garbage collection, and the call's length. Medians over the rounds, in ms
from the call's start, say which part differs between a fresh CLI process and a process that has hashed
before (bench_model_deep's "doctor check --deep" against its "doctor").

    python3 bench/bench_deep_cli.py [--sets 16x64,64x16] [--runs 15] [--tmp DIR] [--json OUT]

Needs python3, this checkout and coreutils; nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import bench_model_deep as deep  # noqa: E402
import deep_timeline  # noqa: E402

from doctor.model import hashing  # noqa: E402


def cli_round(d: str) -> dict[str, Any]:
    said = deep_timeline.run_cli(d)
    res, calls = said["result"], said["calls"]
    if res is None or res["status"] != "pass" or len(calls) != 1:
        raise SystemExit(f"check --deep on {d}: {res and res['status']} ({len(calls)} calls): {said['stderr']}")
    return {**calls[0], "check_ms": round(res["duration_s"] * 1e3, 3)}


def inproc_round(d: str, lead: float) -> dict[str, Any]:
    with hashing.workers_for_run():
        time.sleep(lead)
        res = hashing.verify_model_hashes(d, use_cache=False, progress=False)
    if any(f.get("verdict") != "match" for f in res["files"]):
        raise SystemExit(f"in-process verification of {d} did not match its manifest")
    return deep_timeline.CALLS[-1]


def xargs_round(paths: list[str], cores: int) -> dict[str, Any]:
    t0 = time.monotonic()
    deep.xargs_cmd(paths, cores, ["sha256sum"])()
    return {"call_ms": round((time.monotonic() - t0) * 1e3, 3)}


def summary(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the rounds of each part of a call."""
    def med(key: Any) -> float | None:
        vals = [v for r in rounds if (v := key(r)) is not None]
        return round(statistics.median(vals), 2) if vals else None
    out = {"call": med(lambda r: r["call_ms"])}
    if rounds and "files" in rounds[0]:
        out.update({
            "last_worker": med(lambda r: max(r["forks"]) if r["forks"] else None),
            "first_file_start": med(lambda r: min(s for s, _ in r["files"])),
            "last_file_start": med(lambda r: max(s for s, _ in r["files"])),
            "file_median": med(lambda r: statistics.median(e - s for s, e in r["files"])),
            "file_longest": med(lambda r: max(e - s for s, e in r["files"])),
            "last_file_end": med(lambda r: max(e for _, e in r["files"])),
            "gc_runs": med(lambda r: len(r["gc"])),
            "gc_ms": med(lambda r: sum(g[2] for g in r["gc"])),
        })
    if rounds and "check_ms" in rounds[0]:
        out["check"] = med(lambda r: r["check_ms"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="16x64,64x16")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    deep_timeline.install()
    cores = hashing.default_workers()
    parent = args.tmp or os.environ.get("TMPDIR") or "/var/tmp"
    root = tempfile.mkdtemp(prefix="k26-deep-cli-", dir=parent)
    doc: dict[str, Any] = {"cores": cores, "runs": args.runs, "sets": {}}
    try:
        data = deep.Data(root)
        for key in deep.parse_sets(args.sets):
            d = data.dir_for(key)
            paths = deep.shard_paths(d)
            deep.ensure_manifest(d, cores)
            deep.warm_up(paths)
            lead = (deep.run_lead(d) or {}).get("lead", 0.0)
            rounds: dict[str, list[dict[str, Any]]] = {"check --deep": [], "in process": [], "xargs": []}
            for i in range(args.runs):
                order = list(rounds) if i % 2 == 0 else list(reversed(rounds))
                for name in order:
                    rounds[name].append(cli_round(d) if name == "check --deep" else
                                        inproc_round(d, lead) if name == "in process" else xargs_round(paths, cores))
            got = {name: summary(r) for name, r in rounds.items()}
            doc["sets"][f"{key[0]}x{key[1]}"] = {"lead_ms": round(lead * 1e3, 1), "medians_ms": got, "rounds": rounds}
            print(f"{key[0]} x {key[1]} MiB, {args.runs} rounds, lead {lead * 1e3:.0f} ms; medians, ms from the call's "
                  "start:")
            for name, s in got.items():
                print(f"  {name:13s} " + "  ".join(f"{k} {v}" for k, v in s.items()))
            sys.stdout.flush()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
