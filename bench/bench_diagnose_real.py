"""`diagnose` on the real-failure corpus (tests/fixtures/diagnose_real/): per split, the explained cases named right,
the none cases that blame nothing, and the wrong blames; `--against REV` measures that revision's signature table on
the same corpus (the figures before a change).

    python bench/bench_diagnose_real.py [--against REV] [--show-dev] [--batch N] [--split dev|test]

`--batch N` (repeatable) also prints the figures of batch N alone (batch 5 was committed before the fifth round of
signatures: `--against` its commit measures it under the signatures it was gathered against).

The dev split's per-excerpt outcomes are printed with --show-dev; the test split only as figures (it is not read while
signatures are written). `--split dev` prints the dev split alone: the test split is measured once, after a round of
signatures, not at every step of writing them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_diagnose import previous_signatures  # noqa: E402
from diagnose_real import diagnose, figures, load_manifest  # noqa: E402

from doctor.service.diagnose import load_signatures  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default="", metavar="REV")
    ap.add_argument("--show-dev", action="store_true")
    ap.add_argument("--batch", type=int, action="append", default=[], metavar="N", help="also batch N alone "
                    "(repeatable: one run prints several batches, the test split measured once)")
    ap.add_argument("--split", choices=("dev", "test"), action="append", help="only this split (default: both)")
    args = ap.parse_args()
    splits = tuple(args.split or ("dev", "test"))
    logs = [g for g in load_manifest() if g.split in splits]
    tables = [("this table", load_signatures())]
    if args.against:
        tables.insert(0, (args.against, previous_signatures(args.against)))
    for name, sigs in tables:
        outcomes = {}
        for log in logs:
            outcome, found = diagnose(log, sigs)
            outcomes[log.file] = outcome
            if args.show_dev and log.split == "dev" and outcome != "right":
                top = found[0].signature if found else None
                print(f"  {outcome:8} {log.label:15} top={top.id if top else None}  {log.file}")
        for split in splits:
            print(f"{name}: " + figures([g for g in logs if g.split == split], outcomes).line(split))
            for batch in args.batch:
                group = [g for g in logs if g.split == split and g.batch == batch]
                print(f"{name}: " + figures(group, outcomes).line(f"{split}-batch{batch}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
