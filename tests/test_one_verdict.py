"""One host, one story: live, replayed, text, JSON and JUnit say the same thing.

Every recorded snapshot in tests/fixtures/snapshots is replayed and rendered three ways; each rendering is read
back (the text as a person reads it: root lines, the "same cause (N)" lists folded under them, the notice's
"concerns", the passes and what does not apply, "not judged", the counts, the next step) and the three must
agree check for check: status, root cause, not judged. "Not judged" is only ever a check skipped for want of
facts, in every rendering. A live run on this machine and the replay of its snapshot agree too, and a replay
keeps the --python notice of a run that judged the doctor's own interpreter.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import ROOT, doctor_env

from doctor.report.text import unfold_ids

SNAPSHOTS = sorted(p for p in (ROOT / "tests" / "fixtures" / "snapshots").rglob("*.json")
                   if json.loads(p.read_text()).get("kind") == "k26-doctor-snapshot")
GLYPH_STATUS = {"✘": "fail", "‼": "error", "!": "warn", "-": "skip", "✔": "pass"}


def run(*args: str, columns: str = "80") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "doctor", *args], capture_output=True, text=True, timeout=180,
                          env=doctor_env(COLUMNS=columns), stdin=subprocess.DEVNULL)


def from_json(doc: dict) -> dict:
    results = {r["id"]: (r["status"], r.get("root"), bool(r.get("unjudged"))) for r in doc["results"]}
    s = doc["summary"]
    return {"results": results, "roots": s["roots"], "next": s["next_step"], "unjudged": sorted(s["unjudged"]),
            "verdict": s["status"], "counts": s["counts"], "tally": tally_of_json(doc)}


def from_junit(xml: str) -> dict:
    suite = ET.fromstring(xml)
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    results = {}
    for case in suite.iter("testcase"):
        status, message = "pass", ""
        for tag, st in (("failure", "fail"), ("error", "error"), ("skipped", "skip")):
            el = case.find(tag)
            if el is not None:
                status, message = st, el.get("message") or ""
                break
        else:
            out = case.find("system-out")
            status = (out.text or "").split(":", 1)[0].lower() if out is not None else "pass"
        unjudged = message.startswith("not judged: ")
        rest = message[len("not judged: "):] if unjudged else message
        m = re.match(r"\[same cause as (\S+)\] ", rest)
        results[case.get("name")] = (status, m.group(1) if m else None, unjudged)
    failures, errors = int(suite.get("failures")), int(suite.get("errors"))
    return {"results": results, "roots": props["roots"].split(), "next": props["next_step"] or None,
            "verdict": "fail" if failures or errors else None}


def from_text(text: str, ids: set[str]) -> dict:
    """What a reader of the text learns: each check's status (a dependent: its root's line), root and the
    'not judged' mark, the roots in order, the counts, the verdict and the next step."""
    lines = text.rstrip("\n").splitlines()
    out: dict = {"roots": [], "results": {}, "unjudged": [], "next": None}
    current = None
    for ln in lines:
        parts = ln.split()
        if ln.startswith("! note: --python is not set"):
            current = "doctor.python"
            out["roots"].append(current)
        elif ln[:1] in GLYPH_STATUS and len(parts) > 2 and parts[1] in ids:
            current = parts[1]
            out["roots"].append(current)
            out["results"][current] = (GLYPH_STATUS[ln[0]], None, ln.split(None, 2)[2].startswith("not judged: "))
        m = re.match(r"^\s*(same cause|concerns) \((\d+)\): (.*)$", ln)
        if m:
            deps = unfold_ids(m.group(3))
            assert len(deps) == int(m.group(2)), ln
            for dep in deps:
                out["results"][dep] = ("?", current, None)
        m = re.match(r"^✔ passed \((\d+)\): (.*?)(?:; not applicable here \((\d+)\): (.*))?$", ln)
        n = re.match(r"^not applicable here \((\d+)\): (.*)$", ln)
        if m or n:
            passed = unfold_ids(m.group(2)) if m else []
            na = unfold_ids(m.group(4) or "") if m else unfold_ids(n.group(2))
            out["results"].update({i: ("pass", None, False) for i in passed})
            out["results"].update({i: ("skip", None, False) for i in na})
        m = re.match(r"^not judged \(.*?\): (.*)$", ln)
        if m:
            out["unjudged"] = sorted(unfold_ids(m.group(1)))
        m = re.match(r"^(PASS|WARN|FAIL): (.*) in \d+\.\d\ds$", ln)
        if m:
            out["verdict"] = m.group(1).lower()
            out["tally"] = tally_of_text(m.group(2))
        if ln.startswith("next: "):
            out["next"] = ln[len("next: "):]
    return out


TALLY_WORDS = {"root cause failed": "fail", "root causes failed": "fail", "errored": "error", "note": "note",
               "notes": "note", "not judged": "unjudged", "warning": "warn", "warnings": "warn", "passed": "pass",
               "not applicable": "na", "interrupted": "interrupted"}


def tally_of_text(text: str) -> dict[str, tuple[int, int]]:
    """``3 root causes failed (20 checks), 1 note (8 checks), 1 warning; 5 passed; 35 checks``: what each kind of
    line counts, and the checks it covers."""
    got = {}
    for n, word, covered in re.findall(r"(\d+) (" + "|".join(sorted(TALLY_WORDS, key=len, reverse=True))
                                       + r")(?: \((\d+) checks\))?", text):
        got[TALLY_WORDS[word]] = (int(n), int(covered or n))
    got["total"] = (int(re.search(r"(\d+) checks$", text).group(1)),) * 2
    return got


def tally_of_json(doc: dict) -> dict[str, tuple[int, int]]:
    """The same counts from the JSON report: its roots in order (a notice is a note), each with the results whose
    root it is; the passes and what does not apply that no root explains; every result."""
    results = {r["id"]: r for r in doc["results"]}
    got: dict[str, list[int]] = {}
    for root in doc["summary"]["roots"]:
        under = sum(1 for r in results.values() if r.get("root") == root)
        res = results.get(root)
        kind = "note" if res is None else "unjudged" if res.get("unjudged") else res["status"]
        n, covered = got.setdefault(kind, [0, 0])
        got[kind] = [n + 1, covered + under + (res is not None)]
    for kind, status in (("pass", "pass"), ("na", "skip")):
        n = sum(1 for r in results.values() if r["status"] == status and not r.get("root") and not r.get("unjudged"))
        if n:
            got[kind] = [n, n]
    got["total"] = [len(results)] * 2
    return {k: (v[0], v[1]) for k, v in got.items()}


def words(text: str) -> list[str]:
    """The report's words, without the run's duration and the shell continuations a wrapped command gets."""
    return [w for w in text.split() if w != "\\" and not re.fullmatch(r"\d+\.\d\ds", w)]


def stories(snapshot: Path, *, strict: bool = False) -> tuple[dict, dict, dict, str]:
    """One replay, rendered the three ways (in this process: the renderers are what is compared)."""
    from doctor.app import run as run_report
    from doctor.app import settings_from_flags
    from doctor.report.json_report import dumps
    from doctor.report.junit import to_junit
    from doctor.report.text import render_text

    report, _ = run_report(settings_from_flags({"from_snapshot": str(snapshot), "strict": strict or None}))
    js = from_json(json.loads(dumps(report)))
    ju = from_junit(to_junit(report))
    wide = render_text(report, color=False, columns=1000, stream=io.StringIO())  # a UTF-8 stream: the glyphs
    tx = from_text(wide, set(js["results"]))
    narrow = render_text(report, color=False, columns=80, stream=io.StringIO())
    assert words(narrow) == words(wide), "80 columns only wraps: the same words as an unwrapped report"
    assert max(len(ln) for ln in narrow.splitlines()) <= 100
    return js, ju, tx, narrow


@pytest.fixture(autouse=True)
def _no_site_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("K26_DOCTOR_CONFIG", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=[p.stem for p in SNAPSHOTS])
def test_every_recorded_snapshot_tells_one_story_in_text_json_and_junit(snapshot: Path) -> None:
    js, ju, tx, _ = stories(snapshot)
    assert js["roots"] == ju["roots"] == tx["roots"]
    assert js["next"] == ju["next"] == tx["next"]
    assert set(js["results"]) == set(ju["results"]) == set(tx["results"])
    for cid, (status, root, unjudged) in js["results"].items():
        assert ju["results"][cid] == (status, root, unjudged), (cid, js["results"][cid], ju["results"][cid])
        t_status, t_root, t_unjudged = tx["results"][cid]
        assert t_root == root, (cid, root, t_root)
        if root is None:
            assert (t_status, t_unjudged) == (status, unjudged), (cid, tx["results"][cid], js["results"][cid])
    assert tx["unjudged"] == js["unjudged"] == sorted(c for c, r in js["results"].items() if r[2])
    assert tx["tally"] == js["tally"] and tx["verdict"] == js["verdict"]  # the counts say what the screen shows
    assert sum(covered for kind, (_, covered) in tx["tally"].items() if kind != "total") == tx["tally"]["total"][0]
    assert ju["verdict"] in (js["verdict"], None) and (ju["verdict"] == "fail") == (js["verdict"] == "fail")


def test_strict_fails_on_what_is_not_judged_in_every_rendering() -> None:
    snap = next(p for p in SNAPSHOTS if p.name == "h200x1-real.json")  # a recording with few facts
    js, ju, tx, _ = stories(snap, strict=True)
    assert js["unjudged"] and js["verdict"] == "fail" == tx["verdict"] == ju["verdict"]


def test_a_live_run_and_the_replay_of_its_snapshot_agree(tmp_path: Path) -> None:
    """This machine, twice: live, and judged from the snapshot recorded with the same flags. The --python notice
    (not given here) survives the replay, and nothing proposes installing into the doctor's interpreter."""
    flags = ["--model-path", str(tmp_path / "no-model"), "--draft-model-path", str(tmp_path / "no-drafter")]
    snap = tmp_path / "host.json"
    rec = run("snapshot", *flags, "--output", str(snap))
    assert rec.returncode == 0, rec.stderr
    live_doc = json.loads(run("check", *flags, "--format", "json").stdout)
    doc = json.loads(run("check", "--from-snapshot", str(snap), "--format", "json").stdout)
    live, replay = from_json(live_doc), from_json(doc)
    volatile = {"host.port", "gpu.idle", "host.disk"}  # what another process may change between the two runs
    assert {k: v for k, v in live["results"].items() if k not in volatile} == \
        {k: v for k, v in replay["results"].items() if k not in volatile}
    assert live["roots"] == replay["roots"] and live["next"] == replay["next"]
    assert [n["id"] for n in doc["doctor"]["notices"]] == [n["id"] for n in live_doc["doctor"]["notices"]]
    if live_doc["doctor"]["notices"]:
        python = live_doc["doctor"]["python"]
        assert not [c for r in doc["results"] for c in (r["remediation"] or {}).get("commands", [])
                    if f"{python} -m pip install" in c]
