"""The first screen of `k26-doctor check` on a GPU-less host: short, right, and in the order to fix things.

``gpuless-fresh-venv.json`` is ``k26-doctor snapshot`` recorded on a GPU-less Debian 12 container (no NVIDIA
driver) from a fresh Python 3.12 venv holding only k26-doctor, no model, ``--python`` not given: what a newcomer's
first run sees. Its replay at 80 columns is compared with the golden text (tests/fixtures/golden/); the same
rules are then checked on this machine's live run.

Rules: at most 30 lines, none over 100 columns at 80 columns (a word longer than the line is never broken);
root causes first, each dependent folded under its root and never on a line of its own; the service-interpreter
notice before everything; the one next step last; no line of ``--ignore`` flags.

``K26_UPDATE_GOLDEN=1`` rewrites the golden file (review the diff, commit it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, doctor_env, run_doctor

from doctor.report.text import unfold_ids

SNAP = ROOT / "tests" / "fixtures" / "snapshots" / "gpuless-fresh-venv.json"
GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "gpuless-first-screen.txt"
GLYPHS = ("✔", "!", "✘", "-", "‼")


def normalized(text: str) -> str:
    """The run's duration is the only thing that varies between runs."""
    # (the summary may wrap just before it: "... 0 errors in" / "  0.09s")
    return re.sub(r" in(\n +| )\d+\.\d\ds$", r" in\1<t>s", text, flags=re.M)


def logical(lines: list[str], start: int, indent: int) -> str:
    """The logical line that starts at ``lines[start]``: its wrapped continuation lines (indented deeper) joined."""
    out = [lines[start].strip()]
    for ln in lines[start + 1:]:
        if len(ln) - len(ln.lstrip()) <= indent or not ln.strip():
            break
        out.append(ln.strip())
    return " ".join(out)


def screen_rules(text: str, results: dict[str, dict], max_lines: int | None = 30) -> None:
    """The rules above, against the JSON report of the same run (``results`` by id)."""
    lines = text.rstrip("\n").splitlines()
    assert max_lines is None or len(lines) <= max_lines, f"{len(lines)} lines:\n{text}"
    assert max(len(ln) for ln in lines) <= 100, max(lines, key=len)
    assert "--ignore" not in text
    assert lines[-1].startswith("next: k26-doctor "), lines[-1]
    own = {}  # id -> line index of its own line
    for i, ln in enumerate(lines):
        parts = ln.split()
        if ln[:1] in GLYPHS and len(parts) > 1 and parts[1] in results:
            own[parts[1]] = i
    folded = {}
    for i, ln in enumerate(lines):
        m = re.match(r"^(\s*)(same cause|concerns) \((\d+)\): ", ln)
        if not m:
            continue
        ids = unfold_ids(logical(lines, i, len(m.group(1)))[m.end() - len(m.group(1)):])
        assert len(ids) == int(m.group(3)), (ln, ids)
        for dep in ids:
            folded[dep] = i
    for dep, at in folded.items():
        assert dep not in own, f"{dep} is folded under a cause and also has its own line"
        root = results[dep].get("root")
        assert root is not None, dep
        assert root == "doctor.python" or own[root] < at, f"{dep} is listed before its root {root}"
    assert set(folded) == {i for i, r in results.items() if r.get("root")}
    roots = [i for i in own if results[i]["status"] != "pass"]
    statuses = [results[i]["status"] for i in roots]
    first_warn = next((k for k, s in enumerate(statuses) if s == "warn"), len(statuses))
    assert all(s in ("fail", "error", "skip") for s in statuses[:first_warn]), "failures before warnings"
    assert all(s == "warn" for s in statuses[first_warn:]), "failures before warnings"


def replay(*args: str, columns: str | None = "80", cwd: Path) -> subprocess.CompletedProcess[str]:
    """``check --from-snapshot gpuless.json`` run where the snapshot lies (a short relative path: the wrapping
    does not depend on where this checkout is)."""
    shutil.copy(SNAP, cwd / "gpuless.json")
    env = doctor_env(**({"COLUMNS": columns} if columns else {}))
    if columns is None:
        env.pop("COLUMNS", None)
    return subprocess.run([sys.executable, "-m", "doctor", "check", "--from-snapshot", "gpuless.json", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=120, stdin=subprocess.DEVNULL)


def test_the_first_screen_of_a_gpuless_host_is_golden(tmp_path: Path):
    out = replay(cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    text = normalized(out.stdout)
    if os.environ.get("K26_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    js = json.loads(replay("--format", "json", cwd=tmp_path).stdout)
    results = {r["id"]: r for r in js["results"]}
    screen_rules(out.stdout, results)
    lines = text.splitlines()
    assert lines[1].startswith("! note: --python is not set")  # said once, first
    assert js["summary"]["roots"][:3] == ["doctor.python", "gpu.driver", "model.shards"]
    assert lines[-1] == f"next: {js['summary']['next_step']}"


def test_a_narrow_terminal_wraps_and_a_wide_one_does_not(tmp_path: Path):
    narrow = replay(columns="60", cwd=tmp_path).stdout
    wide = replay(columns="250", cwd=tmp_path).stdout
    words = lambda text: normalized(text).split()  # noqa: E731 - the same words, whatever the width
    assert words(narrow) == words(wide)
    assert max(len(ln) for ln in narrow.splitlines() if " " in ln.strip()) <= 60 + 25  # a long path may overhang
    assert len(wide.splitlines()) < len(narrow.splitlines())
    assert max(len(ln) for ln in wide.splitlines()) > 100  # not wrapped at 80 when the terminal is wider


def test_not_a_terminal_defaults_to_80_columns(tmp_path: Path):
    out = replay(columns=None, cwd=tmp_path).stdout  # a pipe, no COLUMNS: no terminal width to read
    assert normalized(out) == GOLDEN.read_text()


def test_the_live_first_screen_follows_the_same_rules(tmp_path: Path):
    """This machine, live: no model where the profile says, whatever GPUs and stack it has. (Its length is the
    golden test's business: a test run adds PYTHONPATH, CI's interpreter has torch, each a warning of its own.)"""
    args = ["check", "--model-path", str(tmp_path / "no-model"), "--draft-model-path", str(tmp_path / "no-drafter")]
    env = doctor_env(COLUMNS="80")
    text = run_doctor(*args, env=env).stdout
    js = json.loads(run_doctor(*args, "--format", "json", env=env).stdout)
    results = {r["id"]: r for r in js["results"]}
    screen_rules(text, results, None)
