"""bench/bench_hash_parts.py runs end to end on a small set: every way of hashing it times gives the same
digests as the doctor (the bench stops on a mismatch), every figure it prints is in its JSON, and the fork server
it starts for its start-up figures and its forked children leave nothing behind.

The figures themselves are the bench's business (they are read on the host that matters, never here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WAYS = {"xargs sha256sum", "doctor", "threads", "processes", "fork mmap", "threads mmap", "memory threads",
        "threads switch 0.5 ms", "threads 4M", "threads 8M"}


def test_every_way_runs_and_agrees(tmp_path: Path) -> None:
    out = tmp_path / "parts.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_hash_parts.py"), "--sets", "3x2", "--runs",
                          "1", "--workers", "2", "--tmp", str(tmp_path), "--json", str(out)],
                         capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    doc = json.loads(out.read_text())
    got = doc["sets"]["3x2"]
    assert WAYS <= set(got["median_gib_s"]) and got["over_xargs"]["xargs sha256sum"] == 1.0
    assert all(v > 0 for v in got["median_gib_s"].values())
    assert got["timeline_ms"]["calls"] == 5 and got["timeline_ms"]["last_end"] >= got["timeline_ms"]["median_end"]
    assert set(doc["startup_ms"]) == {"python -I -S -c pass", "fork server up",
                                      "fork server and 2 workers, every first answer",
                                      "fork server with a pool of 2, every worker's first answer"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("k26-hash-parts-")]  # its data removed
