"""bench/bench_deep_cli.py end to end on a small set: the real CLI, the call in process and xargs each timed
in every round, the timelines complete (every file begun and ended, every thread's worker), the data removed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_round_times_the_cli_the_call_and_xargs(tmp_path: Path) -> None:
    out = tmp_path / "cli.json"
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_deep_cli.py"), "--sets", "3x4", "--runs", "2",
                          "--tmp", str(tmp_path), "--json", str(out)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    doc = json.loads(out.read_text())
    got = doc["sets"]["3x4"]
    assert set(got["rounds"]) == {"check --deep", "in process", "xargs"}
    for name in ("check --deep", "in process"):
        for r in got["rounds"][name]:
            assert len(r["files"]) == 3 and all(0 <= s <= e <= r["call_ms"] for s, e in r["files"])
            assert len(r["forks"]) == 2  # 12 MiB: two slots (MIN_SLOT_BYTES), their workers handed out at once
    assert all(r["check_ms"] >= r["call_ms"] for r in got["rounds"]["check --deep"])
    assert got["lead_ms"] > 0 and "check --deep  call" in run.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("k26-deep-cli-")]
