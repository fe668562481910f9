"""systemd-unit: what the unit's User= cannot reach, judged from mode bits, owners and that user's groups.

The trap: a venv made from a pyenv Python under /root (mode 0700). Its bin/python is a symlink into /root, and
the service's user cannot even execute it ("Permission denied"); the path given, /opt/.../venv/bin/python, looks
fine. Here the venvs are real (``python -m venv``), the directories real, the users real (``nobody``); the
doctor runs as root in CI, so access is computed for the named user (never ``os.access``), and where
``runuser`` is available the verdict is compared with what the kernel really does for that user.
"""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import run_doctor
from interpreters import find_python

from doctor.host.access import account, first_denied

USER = "nobody"


@pytest.fixture
def base() -> Path:
    """A directory every user may enter (pytest's own tmp_path lies under a 0700 directory)."""
    d = Path(tempfile.mkdtemp(prefix="k26-reach-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def venv_through(base: Path, python: str, mode: int, group: int | None = None) -> Path:
    """A venv made by ``python`` invoked through a symlink in ``base/private`` (``mode``): the venv's python links
    into that directory, as a venv made from ``~/.pyenv/versions/X/bin/python`` links into ``~``."""
    private = base / "private"
    private.mkdir()
    os.symlink(python, private / "python3")
    subprocess.run([str(private / "python3"), "-m", "venv", "--without-pip", str(base / "venv")], check=True,
                   capture_output=True, timeout=300)
    if group is not None:
        os.chown(private, -1, group)
    private.chmod(mode)
    return base / "venv" / "bin" / "python"


def runs_as(user: str, python: Path) -> bool | None:
    """Whether ``user`` can start ``python`` for real (``runuser``), or None where that cannot be asked."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return None
    res = subprocess.run(["runuser", "-u", user, "--", str(python), "-c", "pass"], capture_output=True, text=True,
                         timeout=60)
    return res.returncode == 0


def unit_notes(python: Path, *extra: str) -> list[str]:
    out = run_doctor("systemd-unit", "--python", str(python), "--user", USER, *extra)
    assert out.returncode == 0, out.stderr
    return [ln for ln in out.stderr.splitlines() if "note:" in ln]


def system_python() -> str:
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand) and first_denied(cand, account(USER), "x") is None:
            return cand
    pytest.skip(f"no system Python that {USER} can run on this machine")


def test_a_venv_linking_into_a_0700_directory_is_named(base: Path) -> None:
    pyenv = find_python("3.12")
    if pyenv is None:
        pytest.skip("no Python 3.12 (pyenv) on this machine")
    py = venv_through(base, str(pyenv), 0o700)
    notes = unit_notes(py)
    mine = [n for n in notes if str(py) in n]
    assert len(mine) == 1, notes
    assert f"{USER} cannot enter {base / 'private'} (owned by root:" in mine[0] and "mode 0700" in mine[0]
    assert f"the service's interpreter {py} (it resolves into {base / 'private'})" in mine[0]
    assert runs_as(USER, py) in (False, None)


def test_a_reachable_venv_gets_no_note_and_really_runs(base: Path) -> None:
    py = venv_through(base, system_python(), 0o755)
    assert not [n for n in unit_notes(py) if str(py) in n]
    assert runs_as(USER, py) in (True, None)


def test_group_bits_count_for_the_users_groups(base: Path) -> None:
    """0750 on the private directory: the user passes when it is in the directory's group, not otherwise."""
    if os.geteuid() != 0:
        pytest.skip("changing a directory's group to the service user's needs root")
    gid = grp.getgrnam("nogroup").gr_gid if "nogroup" in {g.gr_name for g in grp.getgrall()} else None
    who = account(USER)
    if gid is None or gid not in who.gids:
        pytest.skip(f"{USER} is not in a group named nogroup here")
    py = venv_through(base, system_python(), 0o750, group=gid)
    assert first_denied(str(py), who, "x") is None
    assert runs_as(USER, py) in (True, None)
    os.chown(base / "private", -1, 0)
    assert first_denied(str(py), who, "x")["path"] == str(base / "private")
    assert runs_as(USER, py) in (False, None)


def test_root_running_the_doctor_does_not_mask_it(base: Path) -> None:
    """The bits are judged for the named user: as root, ``os.access`` says yes to everything."""
    py = venv_through(base, system_python(), 0o700)
    assert os.access(py, os.X_OK) or os.geteuid() != 0  # what a check by os.access would have believed
    denied = first_denied(str(py), account(USER), "x")
    assert denied is not None and denied["path"] == str(base / "private") and denied["need"] == "x"
    assert first_denied(str(py), account("root"), "x") is None
    missing = account("k26-no-such-user")
    assert not missing.exists and first_denied(str(py), missing, "x")["path"] == str(base / "private")


def test_what_the_interpreter_needs_beyond_its_binary(base: Path) -> None:
    """A readable binary is not enough: its standard library, the venv's pyvenv.cfg and site-packages must be
    readable too; a private standard library is named."""
    from doctor.python.interpreter import needed_paths

    py = venv_through(base, sys.executable, 0o755)
    needed, why = needed_paths(str(py))
    assert why is None
    whats = {w for w, _, _ in needed}
    assert {"the interpreter", "pyvenv.cfg", "the interpreter's binary", "the standard library",
            "site-packages"} <= whats
    (base / "venv" / "pyvenv.cfg").chmod(0o600)
    notes = unit_notes(py)
    assert any(f"{USER} cannot read {base / 'venv' / 'pyvenv.cfg'}" in n for n in notes), notes
