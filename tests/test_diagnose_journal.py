"""`diagnose --journal UNIT` when the journal has nothing for the unit: say so, exit 2 (a bad invocation,
most often a misspelt unit name), rather than "no known failure signature found".

journalctl itself is replaced by a script on PATH (no journal daemon in CI) that prints exactly what
journalctl prints for a unit without entries: nothing with `-o cat`, "-- No entries --" otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import doctor_env, run_doctor


@pytest.mark.parametrize("output", ["", "-- No entries --\n"])
def test_journal_without_lines_for_the_unit(tmp_path: Path, output: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "journalctl"
    (tmp_path / "out.txt").write_text(output)
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.txt'}\nexit 0\n")
    fake.chmod(0o755)
    env = doctor_env(PATH=f"{bin_dir}:{os.environ.get('PATH', '')}")
    res = run_doctor("diagnose", "--journal", "nosuch.service", env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "the journal had no lines for nosuch.service since boot" in res.stderr
    assert "no known failure signature" not in res.stdout
    res = run_doctor("diagnose", "--journal", "sglang.service", "--invocation", "abc123", env=env)
    assert res.returncode == 2 and "no lines for sglang.service (invocation abc123)" in res.stderr


def test_journal_with_lines_is_diagnosed(tmp_path: Path) -> None:
    """The same stand-in, printing a real log (sglang#14075), still diagnoses it: the check above only
    fires when nothing came back."""
    body = [ln for ln in (Path(__file__).parent / "fixtures" / "diagnose" /
                          "ptxas-bare-255-sm103a-sglang-b300.log").read_text().splitlines()
            if not ln.startswith("# ")]
    (tmp_path / "out.txt").write_text("\n".join(body) + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "journalctl"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.txt'}\n")
    fake.chmod(0o755)
    res = run_doctor("diagnose", "--journal", "sglang.service",
                     env=doctor_env(PATH=f"{bin_dir}:{os.environ.get('PATH', '')}"))
    assert res.returncode == 0 and "-> check triton.ptxas" in res.stdout, res.stdout + res.stderr
