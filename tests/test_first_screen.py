"""The first screen of `k26-doctor check` on a GPU-less host: short, right, and in the order to fix things.

``gpuless-fresh-venv.json`` is ``k26-doctor snapshot`` recorded on a GPU-less Debian 12 container (no NVIDIA
driver) from a fresh Python 3.12 venv holding only k26-doctor, no model, ``--python`` not given: what a newcomer's
first run sees. Its replay at 80 columns is compared with the golden text (tests/fixtures/golden/); the same
rules are then checked on this machine's live run. Three more first screens of that host are golden: a wrong
``--python`` and a wrong ``--model-path`` (the recording with the facts of that path collected here: a path that
does not exist reads the same on every machine), and Ctrl-C during ``check --deep`` (a real child, a real SIGINT).

Rules: at most 34 lines (the first root's fix shown in full; the recording predates host.jit_cache's fact, which
then takes two lines as not judged), none over 100 columns at 80 columns (a word longer
than the line is never broken); root causes first, in the order of what blocks the most (the --python notice ranked
among them: no NVIDIA driver comes first), each dependent folded under its root and never on a line of its own; the
counts of what the screen shows; the one next step last, a command that runs as written or names what the user
supplies; no line of ``--ignore`` flags.

``K26_UPDATE_GOLDEN=1`` rewrites the golden files (review the diff, commit it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, doctor_env, penv, run_doctor, signal_once_started

from doctor.report.text import unfold_ids

SNAP = ROOT / "tests" / "fixtures" / "snapshots" / "gpuless-fresh-venv.json"
GOLDENS = ROOT / "tests" / "fixtures" / "golden"
GOLDEN = GOLDENS / "gpuless-first-screen.txt"
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


def screen_rules(text: str, results: dict[str, dict], max_lines: int | None = 34) -> None:
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


def golden(name: str, text: str) -> str:
    """``text`` (normalized) against the golden file ``name``; ``K26_UPDATE_GOLDEN=1`` writes it first."""
    text = normalized(text)
    if os.environ.get("K26_UPDATE_GOLDEN"):
        (GOLDENS / name).write_text(text)
    assert text == (GOLDENS / name).read_text()
    return text


def next_line(text: str) -> str:
    """The ``next:`` line, its wrapped continuation joined."""
    lines = text.rstrip("\n").splitlines()
    at = max(i for i, ln in enumerate(lines) if ln.startswith("next: "))
    return logical(lines, at, 0)


def test_the_first_screen_of_a_gpuless_host_is_golden(tmp_path: Path):
    out = replay(cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    text = golden("gpuless-first-screen.txt", out.stdout)
    js = json.loads(replay("--format", "json", cwd=tmp_path).stdout)
    results = {r["id"]: r for r in js["results"]}
    screen_rules(out.stdout, results)
    lines = text.splitlines()
    assert lines[1].startswith("✘ gpu.driver ")  # it blocks the most checks (the notice's 8 among them)
    assert js["summary"]["roots"][:3] == ["gpu.driver", "doctor.python", "model.shards"]
    assert next_line(text) == f"next: {js['summary']['next_step']}" == \
        "next: k26-doctor explain gpu.driver (what it looks at and how to fix it)".replace(" (", "   (")
    tally = next(ln for ln in lines if ln.startswith("FAIL: "))
    # how many checks the three roots take down is the golden file's (a new GPU check adds one there)
    assert re.match(r"FAIL: 3 root causes failed \(\d+ checks\), 1 note \(8 checks\), 2 not judged, 1", tally), tally
    assert len([ln for ln in lines if ln.startswith("✘ ")]) == 3  # the 3 it counts


def derived(tmp_path: Path, name: str, flag: str, value: str, facts: list[str]) -> Path:
    """The recording as that host would record it with ``flag value``: ``facts`` collected here for that value
    (a path that does not exist, the same everywhere), the rest as recorded."""
    snap = json.loads(SNAP.read_text())
    live = run_doctor("snapshot", flag, value, *[a for f in facts for a in ("--fact", f)], env=doctor_env())
    assert live.returncode == 0, live.stderr
    snap["facts"].update(json.loads(live.stdout)["facts"])
    snap["options"][flag.lstrip("-").replace("-", "_")] = value
    if flag == "--python":
        snap["options"]["python_given"] = True
    (tmp_path / name).write_text(json.dumps(snap))
    return tmp_path / name


# the facts read through the service's interpreter: a wrong --python changes every one of them
INTERPRETER_FACTS = ["venv", "stack", "kernels", "sglang_flags", "sglang_import", "sglang_patches", "torch_info",
                     "triton_build", "ptxas", "libcuda"]


def test_a_wrong_python_is_the_first_root_and_its_next_step_names_what_to_supply(tmp_path: Path):
    snap = derived(tmp_path, "wrong-python.json", "--python", "/nonexistent/bin/python", INTERPRETER_FACTS)
    out = subprocess.run([sys.executable, "-m", "doctor", "check", "--from-snapshot", snap.name], capture_output=True,
                         text=True, env=doctor_env(COLUMNS="80"), cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 1, out.stderr
    text = golden("gpuless-wrong-python.txt", out.stdout)
    lines = text.splitlines()
    assert lines[1].startswith("✘ python.venv     /nonexistent/bin/python does not exist")
    assert "--python is not set" not in text and "/path/to" not in text
    assert next_line(text) == "next: k26-doctor check --python PYTHON   (PYTHON: the python SGLang runs in)"


def test_a_wrong_model_path_is_ranked_and_the_next_step_follows_the_first_root(tmp_path: Path):
    snap = derived(tmp_path, "wrong-model.json", "--model-path", "/srv/models/kimi-k2.6", ["model"])
    out = subprocess.run([sys.executable, "-m", "doctor", "check", "--from-snapshot", snap.name], capture_output=True,
                         text=True, env=doctor_env(COLUMNS="80"), cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 1, out.stderr
    text = golden("gpuless-wrong-model-path.txt", out.stdout)
    roots = [ln.split()[1] for ln in text.splitlines() if ln[:2] in ("✘ ", "! ", "- ")]
    assert roots[:3] == ["gpu.driver", "note:", "model.shards"], roots
    assert "model path /srv/models/kimi-k2.6 does not exist" in text
    assert next_line(text).startswith("next: k26-doctor explain gpu.driver")  # the first root's, not --python's


def test_ctrl_c_during_check_deep_reports_what_finished_in_one_line_and_exits_130(tmp_path: Path, plugin_site: str):
    """A real ``check --deep`` of the recording, a real SIGINT once every check but the hung one has finished
    (the site plugin's site.hang, told to be last): what finished as usual, one line for what was stopped, the
    counts, exit 130, no next step (the run judged too little to name one)."""
    shutil.copy(SNAP, tmp_path / "gpuless.json")
    started = tmp_path / "started"
    env = penv(plugin_site, SITE_HANG="100", SITE_HANG_LAST="1", SITE_STARTED=str(started), COLUMNS="80")
    proc = signal_once_started([sys.executable, "-m", "doctor", "check", "--deep", "--from-snapshot", "gpuless.json",
                                "--timeout", "300"], started, signal.SIGINT, env=env, cwd=tmp_path, what="site.hang")
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 130, (proc.returncode, out, err)
    text = golden("gpuless-ctrl-c.txt", out)
    lines = text.splitlines()
    assert [ln for ln in lines if "interrupted before they finished" in ln] == [
        "‼ interrupted before they finished (1): site.hang"]
    assert not [ln for ln in lines if ln.startswith("next:")]
    assert lines[-1] == "interrupted: the same command again judges the rest"
    done = re.search(r"\nINTERRUPTED \(Ctrl-C\), a partial report: (\d+) of (\d+) checks finished: 3 root causes\n",
                     text)
    assert done and int(done[1]) == int(done[2]) - 1, "every check but the hung one finished"
    assert "Traceback" not in err


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


def test_sigterm_during_check_deep_is_the_same_short_report_and_exits_143(tmp_path: Path, plugin_site: str):
    """systemd's stop of an ExecStartPre (TimeoutStartSec) and a fleet's timeout send SIGTERM: the same partial
    report as Ctrl-C, naming SIGTERM, the hung check's probe ended, exit 143 (128 + SIGTERM) instead of a silent
    death at -15."""
    shutil.copy(SNAP, tmp_path / "gpuless.json")
    started = tmp_path / "started"
    env = penv(plugin_site, SITE_HANG="100", SITE_HANG_LAST="1", SITE_STARTED=str(started), COLUMNS="80")
    proc = signal_once_started([sys.executable, "-m", "doctor", "check", "--deep", "--from-snapshot", "gpuless.json",
                                "--timeout", "300"], started, signal.SIGTERM, env=env, cwd=tmp_path, what="site.hang")
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 143, (proc.returncode, out, err)
    assert "\nINTERRUPTED (SIGTERM), a partial report: " in out, out
    assert [ln for ln in out.splitlines() if "interrupted before they finished" in ln] == [
        "‼ interrupted before they finished (1): site.hang"]
    assert "Traceback" not in err
