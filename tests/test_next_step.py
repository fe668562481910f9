"""The ``next:`` line runs as written on the host it is shown on, or names what the user must supply.

Every recorded snapshot is replayed; its next step is either a ``k26-doctor`` command whose subcommand exists and
whose check ids are registered (``explain ID`` is run and answers), or it names in capitals what only the user
knows (``PYTHON``), each such word said after the command from ``doctor/data/next_steps.toml``'s
``[placeholders]``. No made-up path (``/path/to/...``) that fails when pasted; an interrupted run has none.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import ROOT, run_doctor

from doctor.core.datafile import load_toml
from doctor.core.registry import load
from doctor.report.story import NEXT_STEPS, placeholders, supplied

SNAPSHOTS = sorted(p for p in (ROOT / "tests" / "fixtures" / "snapshots").rglob("*.json")
                   if json.loads(p.read_text()).get("kind") == "k26-doctor-snapshot")
SUBCOMMANDS = {"check", "fix", "explain", "list", "launch", "snapshot", "env", "patches", "manifest", "smoke",
               "wait-ready", "diagnose", "systemd-unit", "slurm-health"}


def command_and_words(step: str) -> tuple[list[str], str]:
    """The command of a next step (before what its placeholders stand for) as argv, and the rest."""
    command, _, said = step.partition("   (")
    return shlex.split(command), said


def assert_runs_or_names_what_to_supply(step: str) -> None:
    argv, said = command_and_words(step)
    assert argv[:1] == ["k26-doctor"] and argv[1] in SUBCOMMANDS, step
    assert "/path/to" not in step, step
    wanted = [w for w in argv if re.fullmatch(r"[A-Z][A-Z_]+", w)]
    for word in wanted:
        assert word in placeholders() and f"{word}: {placeholders()[word]}" in said, (word, step)
    checks = load(plugins=False).checks
    for flag, value in itertools.pairwise(argv):
        if flag == "--only":
            assert value in checks, step
    if argv[1] == "explain":
        assert argv[2] in checks, step


def test_the_table_names_no_made_up_path_and_explains_each_placeholder() -> None:
    doc = load_toml(NEXT_STEPS)
    for step in doc["step"]:
        assert_runs_or_names_what_to_supply(supplied(step["command"]))
    assert supplied("k26-doctor explain gpu.driver") == "k26-doctor explain gpu.driver"  # nothing to supply


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=[p.stem for p in SNAPSHOTS])
def test_every_recorded_next_step_runs_or_names_what_to_supply(snapshot: Path) -> None:
    from doctor.app import run as run_report
    from doctor.app import settings_from_flags
    from doctor.report.story import story

    report, _ = run_report(settings_from_flags({"from_snapshot": str(snapshot)}))
    step = story(report).next_step
    if step is not None:
        assert_runs_or_names_what_to_supply(step)


def test_an_explain_step_answers() -> None:
    out = run_doctor("explain", "gpu.driver")
    assert out.returncode == 0 and out.stdout.startswith("gpu.driver"), out.stderr
