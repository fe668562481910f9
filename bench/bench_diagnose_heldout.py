"""How well `diagnose` names the cause of start-up failures it was not written from.

Runs the shipped signatures (or `--signatures FILE` added to them) over the held-out corpus of
tests/fixtures/diagnose_heldout/ (real logs from public threads, each labelled with the check a human engineer
blames, from the thread's resolution) and prints, per log and in total, for the dev split, the test split (and its
batches: batch 2 was gathered after the generalisation was written) and all: named right / named a near-miss /
named nothing / named wrong (tests/diagnose_heldout.py defines them).
The baseline is the same corpus scored the same way: a change to the signatures shows as a change of these
counts, split by split.

    python bench/bench_diagnose_heldout.py [--split dev|test|all] [--quiet] [--signatures FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from diagnose_heldout import OUTCOMES, diagnose, load_manifest, tally  # noqa: E402

from doctor.service.diagnose import load_signatures  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", choices=("dev", "test", "all"), default="all")
    ap.add_argument("--quiet", action="store_true", help="totals only")
    ap.add_argument("--signatures", type=Path, action="append", default=[])
    args = ap.parse_args()
    sigs = load_signatures(args.signatures)
    logs = [g for g in load_manifest() if args.split == "all" or g.split == args.split]
    groups: dict[str, list[str]] = {"dev": [], "test": [], "test-batch1": [], "test-batch2+": [], "all": []}
    for log in logs:
        outcome, found = diagnose(log, sigs)
        for name in (log.split, "all", *((f"test-batch{'1' if log.batch == 1 else '2+'}",) if log.split == "test"
                                        else ())):
            groups[name].append(outcome)
        if not args.quiet:
            top = found[0] if found else None
            named = f"{top.signature.check} ({top.signature.id})" if top else "-"
            print(f"{outcome:8} {log.split:5} b{log.batch} {log.file:58} label {log.label:16} named {named}")
    print()
    for name, outcomes in groups.items():
        if not outcomes:
            continue
        counts = tally(outcomes)
        n = len(outcomes)
        print(f"{name:13} n={n:3}  " + "  ".join(f"{k} {counts[k]:2} ({100 * counts[k] / n:3.0f}%)"
                                                  for k in OUTCOMES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
