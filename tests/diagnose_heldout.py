"""The held-out corpus of `diagnose` (tests/fixtures/diagnose_heldout/) and how a diagnosis of one log is scored.

Shared by tests/test_diagnose_heldout.py and bench/bench_diagnose_heldout.py. The manifest names, per log, the
check a human engineer blames (decided from the thread's resolution), the checks that resemble it (``near``) and
its split (dev: looked at while generalising the signatures; test: never). Its header documents the fields and
the split rule.

A diagnosis is scored by the first finding (what the report puts first, and what `launch` prints):
- ``right``: it names the labelled check;
- ``near``: it names a check the manifest lists as resembling the cause, or the labelled check is found
  lower in the list: the engineer is one step from the cause;
- ``nothing``: no finding, or the first one names no check (a consequence without one);
- ``wrong``: it names another check: the engineer is sent the wrong way.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from doctor.core.datafile import read_toml
from doctor.service.diagnose import LogMatch, Signature, diagnose_lines

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "tests" / "fixtures" / "diagnose_heldout"
OUTCOMES = ("right", "near", "nothing", "wrong")


@dataclass(frozen=True)
class HeldOutLog:
    file: str
    source: str
    label: str
    near: tuple[str, ...]
    split: str
    case: str | None
    why: str
    batch: int = 1

    @property
    def lines(self) -> list[str]:
        return (HELDOUT / self.file).read_text(encoding="utf-8").splitlines()


def load_manifest(path: Path = HELDOUT / "manifest.toml") -> list[HeldOutLog]:
    data = read_toml(path, "held-out manifest")
    return [HeldOutLog(e["file"], e["source"], e["label"], tuple(e.get("near", ())), e["split"], e.get("case"),
                       e["why"], int(e.get("batch", 1))) for e in data["log"]]


def expected_split(logs: list[HeldOutLog]) -> dict[str, str]:
    """The split the manifest's rule gives: in batch 1 a named case is dev and, of the others, the half (rounded up)
    with the lowest sha256 of its source is test; a later batch (gathered after the generalisation) is test."""
    first = [g for g in logs if g.batch == 1]
    rest = sorted((g for g in first if g.case is None), key=lambda g: hashlib.sha256(g.source.encode()).hexdigest())
    test = {g.file for g in rest[: (len(rest) + 1) // 2]} | {g.file for g in logs if g.batch > 1}
    return {g.file: ("test" if g.file in test else "dev") for g in logs}


def score(log: HeldOutLog, found: list[LogMatch]) -> str:
    top = found[0].signature.check if found else None
    if top == log.label:
        return "right"
    if top is None:
        return "nothing"
    if top in log.near or any(f.signature.check == log.label for f in found[1:]):
        return "near"
    return "wrong"


def diagnose(log: HeldOutLog, signatures: list[Signature]) -> tuple[str, list[LogMatch]]:
    found = diagnose_lines(log.lines, signatures)
    return score(log, found), found


def tally(outcomes: list[str]) -> Counter[str]:
    counts: Counter[str] = Counter({k: 0 for k in OUTCOMES})
    counts.update(outcomes)
    return counts
