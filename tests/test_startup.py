"""`k26-doctor --help` and `list` load only what they print (they run on every ExecStartPre).

Structure, not seconds (the seconds are bench/bench_startup.py's, against a baseline of the same run): `--help`
lists the lazy commands from ``doctor.cli.LAZY_HELP`` and imports none of them, and that text is each command's own
short help, so the two cannot drift; `list` loads the registry without packaging, the launcher's command module or
the report renderers.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import click
import pytest
from conftest import doctor_env

from doctor.cli import LAZY_COMMANDS, LAZY_HELP

IMPORTED = """
import contextlib, io, json, sys
from doctor.cli import run_cli
with contextlib.redirect_stdout(io.StringIO()):
    run_cli(sys.argv[1:])
print(json.dumps(sorted(sys.modules)))
"""


def imported(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", IMPORTED, *args], capture_output=True, text=True,
                         env=doctor_env(), timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("name", sorted(LAZY_COMMANDS))
def test_the_help_line_of_a_lazy_command_is_its_own(name: str) -> None:
    module, attr = LAZY_COMMANDS[name].split(":")
    cmd: click.Command = getattr(importlib.import_module(module), attr)
    assert LAZY_HELP[name] == cmd.get_short_help_str(limit=10_000), name


def test_help_imports_no_command_it_only_names() -> None:
    mods = imported("--help")
    lazy = {target.split(":")[0] for target in LAZY_COMMANDS.values()}
    assert not mods & lazy, sorted(mods & lazy)
    assert not {"doctor.app", "doctor.core.registry", "packaging"} & mods


def test_list_loads_the_registry_and_not_what_it_never_prints() -> None:
    mods = imported("list")
    assert "doctor.core.registry" in mods and "checks.gpu" in mods
    assert not {m for m in mods if m.split(".")[0] == "packaging"}, "packaging is imported where versions are read"
    assert not {"doctor.app", "doctor.report.text", "doctor.commands.launch", "doctor.model.hashing"} & mods
