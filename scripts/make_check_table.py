#!/usr/bin/env python3
"""Write the README's table of checks from the registry: id, title, tier and fixer of every built-in check.

The table sits between two markers in README.md; everything else in the file is left as it is. The registry
is the one source (a check's title is what ``list`` and every report show), so the README cannot fall behind
it: ``tests/test_readme_check_table.py`` fails when the table differs from what this writes.

    python scripts/make_check_table.py            # rewrite the table in README.md
    python scripts/make_check_table.py --check    # exit 1 (and say which rows) when it is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN = "<!-- check table: written by scripts/make_check_table.py from the registry; do not edit by hand -->"
END = "<!-- end of check table -->"


def table() -> str:
    """The markdown table of the built-in checks (plugins left out), sorted by id."""
    sys.path.insert(0, str(ROOT))
    from doctor.core.registry import load

    rows = ["| id | judges | tier | fixer |", "| --- | --- | --- | --- |"]
    for chk in load(plugins=False).sorted_checks():
        fixer = f"`{chk.fixer}`" if chk.fixer else "-"
        rows.append(f"| `{chk.id}` | {chk.title} | {'deep' if chk.deep else 'default'} | {fixer} |")
    return "\n".join(rows)


def rewritten(text: str) -> str:
    """``text`` (the README) with the table between the markers replaced by :func:`table`."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"README.md lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only say whether the README's table is up to date")
    args = ap.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    try:
        new = rewritten(text)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if new == text:
        return 0
    if args.check:
        old_rows, new_rows = set(text.splitlines()), set(new.splitlines())
        print("README.md's table of checks is out of date (python scripts/make_check_table.py rewrites it):")
        print("\n".join([f"- {r}" for r in text.splitlines() if r not in new_rows]
                        + [f"+ {r}" for r in new.splitlines() if r not in old_rows]))
        return 1
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
