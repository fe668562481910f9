"""Every recorded host replays to the verdicts it gave when this file was written: the proof that a change of
structure changed no verdict.

Each case is a recording of ``tests/fixtures`` (the snapshots, real and synthetic) replayed by the doctor as users
run it (``python -m doctor check --from-snapshot FILE --format json``), under the profile (and TP, tier, config)
the recording is judged with elsewhere in the tests. Per check id the golden file keeps what a user and a launcher
see: status, summary, remediation, cause, unjudged, fixer; and per case the exit code. A change that means to
change a verdict regenerates the file in the same commit and says why:

    python tests/test_golden_verdicts.py        # rewrites tests/fixtures/golden/verdicts.json

It refuses to write from a checkout whose path a recording holds (h200x1-all-facts.json recorded one): there the
recorded path would be written as ``<checkout>`` and fail in every other checkout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from recordings import CONFIGS, RECORDED_STACK, ROOT, SNAPS, name_of, recorded_stack_config, recordings

GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "verdicts.json"
FIELDS = ("status", "summary", "remediation", "cause", "unjudged", "fixer")

# (snapshot, profile, tp) pairs judged beyond each recording's own profile (tests/test_gpu_checks.py's table).
PROFILED = [
    ("h200x2-reference.json", "h200-tp8", None), ("h200x2-reference.json", "h200-tp8", 2),
    ("h200x2-reference.json", "b300-tp8-ddtree", 2), ("rtxpro6000x8-pcie.json", "b300-tp8-ddtree", None),
    ("rtxpro6000x8-pcie.json", "rtxpro6000-ep8", None), ("rtxpro6000x8-acs-redirect.json", "rtxpro6000-ep8", None),
    ("h200x8.json", "h200-tp8", None), ("h200x8.json", "b300-tp8-ddtree", None),
    ("h200x1-real.json", "h200-tp8", None), ("h200x1-real.json", "h200-tp8", 1),
    ("h200x1-all-facts.json", "b300-tp8-ddtree", 8),
]


def cases() -> dict[str, list[str]]:
    """case name -> the arguments after ``check``: each recording in both tiers, then the profiled pairs."""
    out: dict[str, list[str]] = {}
    for path in recordings():
        rel = name_of(path)
        base = ["--from-snapshot", rel] + (["--config", CONFIGS[rel]] if rel in CONFIGS else [])
        out[rel] = base
        out[rel + " --deep"] = [*base, "--deep"]
    for snap, profile, tp in PROFILED:
        args = ["--from-snapshot", snap, "--profile", profile] + (["--tp", str(tp)] if tp else []) + ["--deep"]
        out[" ".join([snap, "--profile", profile] + (["--tp", str(tp)] if tp else []) + ["--deep"])] = args
    return out


def named(text: str, path: str, name: str) -> str:
    """``text`` (JSON) with every whole occurrence of ``path`` replaced by ``name``."""
    return re.sub(re.escape(json.dumps(path)[1:-1]) + r"(?![\w.-])", name, text)


def replay(args: list[str], where: Path) -> dict[str, Any]:
    """One case: the exit code and, per check id, the fields of FIELDS (machine paths replaced by names)."""
    real = [str(recorded_stack_config(where)) if a == RECORDED_STACK else
            str(SNAPS / a) if i and args[i - 1] in ("--from-snapshot", "--config") else a for i, a in enumerate(args)]
    env = {k: v for k, v in os.environ.items() if k not in ("K26_DOCTOR_CONFIG", "K26_DOCTOR_DISABLE_PLUGINS")}
    env.update(PYTHONPATH=str(ROOT), NO_COLOR="1")
    out = subprocess.run([sys.executable, "-m", "doctor", "check", *real, "--format", "json"], capture_output=True,
                         text=True, env=env, cwd=where, timeout=300, stdin=subprocess.DEVNULL)
    text = out.stdout
    for path, name in ((str(where), "<tmp>"), (str(ROOT), "<checkout>"), (sys.executable, "<python>")):
        text = named(text, path, name)
    try:
        report = json.loads(text)
    except ValueError:
        raise AssertionError(f"check {' '.join(args)} printed no JSON (exit {out.returncode}): {out.stderr[-2000:]}"
                             ) from None
    results = {r["id"]: {k: r.get(k) for k in FIELDS} for r in report["results"]}
    for r in results.values():
        r["unjudged"] = bool(r["unjudged"])
    return {"exit": out.returncode, "results": results}


def replay_all() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=2) as pool:
        todo = cases()
        dirs = {name: Path(tmp) / f"case{i}" for i, name in enumerate(todo)}
        for d in dirs.values():
            d.mkdir()
        got = dict(zip(todo, pool.map(lambda name: replay(todo[name], dirs[name]), todo), strict=True))
    return got


def test_every_recording_replays_to_its_golden_verdicts() -> None:
    # The checkout's own path is named in the golden text as in the replay (a recording may hold the path of the
    # checkout it was made in: where that is this one, the replay names it <checkout>).
    raw = GOLDEN.read_text(encoding="utf-8")
    golden = json.loads(named(raw, str(ROOT), "<checkout>"))
    got = replay_all()
    assert sorted(got) == sorted(golden), "the recordings or cases changed: regenerate (see the module docstring)"
    diffs = []
    for case, want in golden.items():
        have = got[case]
        if have["exit"] != want["exit"]:
            diffs.append(f"{case}: exit {have['exit']}, golden {want['exit']}")
        for cid in sorted(set(want["results"]) | set(have["results"])):
            a, b = have["results"].get(cid), want["results"].get(cid)
            if a != b:
                diffs.append(f"{case}: {cid}:\n    now    {json.dumps(a)}\n    golden {json.dumps(b)}")
    assert not diffs, "\n".join(diffs[:40]) + (f"\n... {len(diffs) - 40} more" if len(diffs) > 40 else "")


def test_the_golden_file_judges_every_area() -> None:
    """The cases are not all skips: every area's checks are judged (pass, warn, fail or error) somewhere."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    judged = {cid.split(".")[0] for case in golden.values() for cid, r in case["results"].items()
              if r["status"] != "skip"}
    assert {"gpu", "host", "model", "python", "sglang", "stack", "torch", "triton", "cuda"} <= judged


def recorded_paths_equal_to_checkout() -> list[str]:
    """Recordings that hold this checkout's own path as recorded text: regenerated here, that text would be
    written as ``<checkout>`` and read back as the literal path in any other checkout (CI's)."""
    texts = {f: f.read_text(encoding="utf-8", errors="replace") for f in SNAPS.rglob("*.json")}
    return sorted(str(f.relative_to(ROOT)) for f, text in texts.items() if named(text, str(ROOT), "<checkout>") != text)


if __name__ == "__main__":
    clash = recorded_paths_equal_to_checkout()
    if clash:
        sys.exit(f"not regenerated: {', '.join(clash)} recorded the path of this very checkout ({ROOT}); run this "
                 "from a checkout at another path (git worktree add /tmp/golden && cd /tmp/golden)")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(replay_all(), indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")
