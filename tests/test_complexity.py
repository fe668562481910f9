"""The product's complexity budget, measured with radon (DEVELOPING.md, "The complexity budget").

The budget, for every function of ``doctor/``, ``checks/`` and ``fixes/`` (methods and closures included):
cyclomatic complexity at most ``MAX_CC`` (30), at most ``MAX_OVER_20`` (15) functions above 20, none over
``MAX_LINES`` (100) lines. The tree meets it: no function is above 20, so ``RATCHET`` is empty. It held the
offenders with their figures (complexity, lines) while they were split, and may hold some again only as the list
it was, shrinking:

* a function above 20 or over 100 lines that is not listed fails (a new offender);
* a listed function whose complexity or length grew past its figure fails (a grown one);
* a listed function that is gone or now within the budget fails until its entry is removed.

The list never grows (``RATCHET_AT_START``).

Re-measure by hand: ``radon cc -s -n C doctor checks fixes`` (grade C and worse: complexity above 10).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("doctor", "checks", "fixes")
MAX_CC = 30
OVER = 20
MAX_OVER_20 = 15
MAX_LINES = 100
RATCHET_AT_START = 67  # entries in RATCHET when the budget came in: the list never holds more

# "path:qualified name": (cyclomatic complexity, lines) as measured when the entry was last reviewed.
RATCHET: dict[str, tuple[int, int]] = {
}


def functions(root: Path = ROOT) -> Iterator[tuple[str, int, int]]:
    """(``path:qualified name``, complexity, lines) of every function, method and closure of the product."""

    def walk(block, prefix: str) -> Iterator[tuple[str, int, int]]:
        name = f"{prefix}{block.name}"
        yield name, block.complexity, block.endline - block.lineno + 1
        for inner in block.closures:
            yield from walk(inner, f"{name}.")

    for pkg in PRODUCT:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for block in cc_visit(path.read_text(encoding="utf-8")):
                if hasattr(block, "methods"):  # a class: its methods come as blocks of their own
                    continue
                prefix = f"{block.classname}." if block.is_method else ""
                for name, cc, lines in walk(block, prefix):
                    yield f"{rel}:{name}", cc, lines


def over_budget(root: Path = ROOT) -> dict[str, tuple[int, int]]:
    """Every function above complexity 20 or over 100 lines (the same name twice keeps the worse figures)."""
    out: dict[str, tuple[int, int]] = {}
    for key, cc, lines in functions(root):
        if cc > OVER or lines > MAX_LINES:
            old = out.get(key, (0, 0))
            out[key] = (max(old[0], cc), max(old[1], lines))
    return out


def ratchet_breaches(found: dict[str, tuple[int, int]], allowed: dict[str, tuple[int, int]]) -> list[str]:
    """What breaks the ratchet: new offenders, grown ones, and entries to remove."""
    bad = []
    for key, (cc, lines) in sorted(found.items()):
        if key not in allowed:
            bad.append(f"{key}: complexity {cc}, {lines} lines: over the budget (split it into named helpers)")
            continue
        max_cc, max_lines = allowed[key]
        if cc > max_cc or lines > max_lines:
            bad.append(f"{key}: complexity {cc} (listed {max_cc}), {lines} lines (listed {max_lines}): it grew")
    gone = sorted(set(allowed) - set(found))
    bad += [f"{key}: gone or within the budget now: remove it from RATCHET" for key in gone]
    return bad


def test_no_new_or_grown_offender() -> None:
    assert ratchet_breaches(over_budget(), RATCHET) == []


def test_the_ratchet_only_shrinks() -> None:
    """No entry is added: the list holds at most what it held when the budget came in, and once it is down to the
    budget's allowance (none above 30 or over 100 lines, at most 15 above 20) it never holds more."""
    worst = [k for k, (cc, lines) in RATCHET.items() if cc > MAX_CC or lines > MAX_LINES]
    assert len(RATCHET) <= RATCHET_AT_START
    if not worst:
        assert len(RATCHET) <= MAX_OVER_20


def test_the_ratchet_catches_a_new_and_a_grown_offender(tmp_path: Path) -> None:
    (tmp_path / "doctor").mkdir()
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(25))
    body = branches.replace("    ", "        ")
    (tmp_path / "doctor" / "big.py").write_text(f"class K:\n    def judge(self, x):\n{body}        return -1\n\n\n"
                                                "def small(x):\n    return x\n")
    found = over_budget(tmp_path)
    assert found == {"doctor/big.py:K.judge": (26, 52)}
    assert ratchet_breaches(found, {}) == [
        "doctor/big.py:K.judge: complexity 26, 52 lines: over the budget (split it into named helpers)"]
    assert ratchet_breaches(found, {"doctor/big.py:K.judge": (25, 60)}) == [
        "doctor/big.py:K.judge: complexity 26 (listed 25), 52 lines (listed 60): it grew"]
    assert ratchet_breaches(found, {"doctor/big.py:K.judge": (26, 52), "doctor/big.py:gone": (40, 10)}) == [
        "doctor/big.py:gone: gone or within the budget now: remove it from RATCHET"]
