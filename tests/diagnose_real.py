"""The real-failure corpus of `diagnose` (tests/fixtures/diagnose_real/) and how a diagnosis of one excerpt is scored.

Shared by tests/test_diagnose_real.py and bench/bench_diagnose_real.py. The manifest's header documents the fields and
the split rule (test when sha256(source) mod 3 == 0). Unlike the held-out corpus, a label may be ``none``: no
registered check explains the failure, and the right answer is to blame nothing.

A diagnosis is scored by the first finding (what the report puts first and what `launch` prints), a consequence
included: a consequence that names a check sends the engineer there as surely as a cause does.
- ``right``: it names the labelled check, or, for ``none``, no finding names a check first;
- ``near``: it names a check the manifest lists as resembling the cause, or the labelled check is found lower down;
- ``nothing``: a check explains the failure and the first finding names none (or there is no finding);
- ``wrong``: it names another check (for ``none``: any check): the engineer is sent the wrong way.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from doctor.core.datafile import read_toml
from doctor.service.diagnose import LogMatch, Signature, diagnose_lines

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "fixtures" / "diagnose_real"
OUTCOMES = ("right", "near", "nothing", "wrong")
NONE = "none"


@dataclass(frozen=True)
class RealLog:
    file: str
    source: str
    date: str
    label: str
    near: tuple[str, ...]
    split: str
    why: str
    batch: int = 1

    @property
    def lines(self) -> list[str]:
        return (REAL / self.file).read_text(encoding="utf-8").splitlines()


def load_manifest(path: Path = REAL / "manifest.toml") -> list[RealLog]:
    data = read_toml(path, "real-failure manifest")
    return [RealLog(e["file"], e["source"], e["date"], e["label"], tuple(e.get("near", ())), e["split"], e["why"],
                    int(e.get("batch", 1))) for e in data["log"]]


def expected_split(source: str) -> str:
    """The manifest's rule: test when the sha256 of the source URL, read as an integer, is divisible by 3."""
    return "test" if int(hashlib.sha256(source.encode()).hexdigest(), 16) % 3 == 0 else "dev"


def score(log: RealLog, found: list[LogMatch]) -> str:
    top = found[0].signature.check if found else None
    if log.label == NONE:
        return "right" if top is None else "wrong"
    if top == log.label:
        return "right"
    if top is None:
        return "nothing"
    if top in log.near or any(f.signature.check == log.label for f in found[1:]):
        return "near"
    return "wrong"


def diagnose(log: RealLog, signatures: list[Signature]) -> tuple[str, list[LogMatch]]:
    found = diagnose_lines(log.lines, signatures)
    return score(log, found), found


@dataclass(frozen=True)
class Figures:
    """One split's measure: of the cases a check explains, how many named right; wrong blames over all cases, and
    on the ``none`` class alone."""

    n: int
    explained: int
    right_explained: int
    none: int
    right_none: int
    wrong: int
    wrong_none: int
    counts: dict[str, int]

    @property
    def recall(self) -> float:
        return self.right_explained / self.explained if self.explained else 1.0

    @property
    def wrong_rate(self) -> float:
        return self.wrong / self.n if self.n else 0.0

    def line(self, name: str) -> str:
        return (f"{name}: {self.right_explained}/{self.explained} explained cases right ({self.recall:.0%}), "
                f"{self.right_none}/{self.none} none-cases blame nothing; wrong {self.wrong}/{self.n} "
                f"({self.wrong_rate:.1%}), {self.wrong_none} of them on none; " +
                ", ".join(f"{k} {v}" for k, v in self.counts.items()))


def figures(logs: list[RealLog], outcomes: dict[str, str]) -> Figures:
    explained = [g for g in logs if g.label != NONE]
    nones = [g for g in logs if g.label == NONE]
    counts: Counter[str] = Counter({k: 0 for k in OUTCOMES})
    counts.update(outcomes[g.file] for g in logs)
    return Figures(len(logs), len(explained), sum(outcomes[g.file] == "right" for g in explained), len(nones),
                   sum(outcomes[g.file] == "right" for g in nones), counts["wrong"],
                   sum(outcomes[g.file] == "wrong" for g in nones), dict(counts))
