"""Issue 21, destructive writes: the doctor writes only its state directory and the files it is asked to
write, never through a symlink it did not create, never onto a file that is not a regular file, and says so
with exit 2 (before the run where it can).

Real ``/dev/full``, real symlinks and FIFOs, a real full filesystem (a small tmpfs in a user namespace, where
the host allows one), a real ``RLIMIT_FSIZE`` failure mid-write, a real SGLang 0.5.23 install for the patch
engine, ``systemd-analyze verify`` for the units.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import doctor_env, run_doctor
from hostile_support import small_model

pytestmark = pytest.mark.timeout(180)
DEV_FULL = Path("/dev/full")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_model(tmp_path_factory.mktemp("writes") / "model")


def output_commands(model: Path, target: str) -> list[list[str]]:
    return [["check", "--only", "host.port", "--output", target],
            ["check", "--only", "host.port", "--format", "json", "--output", target],
            ["snapshot", "--fact", "env", "--output", target],
            ["systemd-unit", "--doctor", "/usr/bin/true", "--output", target],
            ["manifest", "write", str(model), "--output", target, "--force"]]


@pytest.mark.skipif(not DEV_FULL.exists(), reason="no /dev/full on this host")
def test_output_onto_a_device_is_refused_and_the_device_survives(model: Path) -> None:
    for argv in output_commands(model, str(DEV_FULL)):
        out = run_doctor(*argv, timeout=120)
        assert out.returncode == 2 and "character device, not a regular file" in out.stderr, (argv, out.stderr)
        assert stat.S_ISCHR(DEV_FULL.stat().st_mode), f"{argv} replaced /dev/full"


def planted_targets(where: Path) -> tuple[Path, Path, Path]:
    """(a file, a symlink to it, a FIFO): what no write may replace or write through."""
    victim = where / "victim.txt"
    victim.write_text("keep me\n")
    link = where / "link.json"
    link.symlink_to(victim)
    fifo = where / "pipe.json"
    os.mkfifo(fifo)
    return victim, link, fifo


def intact(victim: Path, link: Path, fifo: Path) -> bool:
    return (link.is_symlink() and os.readlink(link) == str(victim) and victim.read_text() == "keep me\n"
            and stat.S_ISFIFO(fifo.lstat().st_mode))


def test_output_onto_a_symlink_or_fifo_is_refused_and_nothing_is_written_through(model: Path,
                                                                                  tmp_path: Path) -> None:
    victim, link, fifo = planted_targets(tmp_path)
    for target, words in ((link, "is a symbolic link"), (fifo, "is a FIFO")):
        for argv in output_commands(model, str(target)):
            out = run_doctor(*argv, timeout=120)
            assert out.returncode == 2 and words in out.stderr, (argv, out.stderr)
    assert intact(victim, link, fifo)


def test_the_writer_never_replaces_what_is_not_a_regular_file(tmp_path: Path) -> None:
    from doctor.core.fileio import atomic_write

    victim, link, fifo = planted_targets(tmp_path)
    for target in (link, fifo, tmp_path):
        with pytest.raises(OSError, match="not a regular file"):
            atomic_write(target, b"new")
    assert intact(victim, link, fifo)


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    res = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                         capture_output=True, timeout=30)
    return res.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="no user namespace with a tmpfs mount here (unprivileged "
                    "user namespaces off): the full disk is checked through RLIMIT_FSIZE below")
def test_output_on_a_full_filesystem_is_refused_before_the_run(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = (f"mount -t tmpfs -o size=64k tmpfs {mnt} && dd if=/dev/zero of={mnt}/fill bs=4k count=16 "
              f"2>/dev/null; {sys.executable} -m doctor check --only host.port --format json --output {mnt}/r.json")
    res = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                         env=doctor_env(), timeout=60)
    assert res.returncode == 2 and "is full" in res.stderr, res.stderr
    assert "internal error" not in res.stderr and res.stdout == ""


def test_a_write_that_fails_midway_is_exit_2_and_keeps_the_old_file(tmp_path: Path) -> None:
    """The file size limit makes the report's write fail with EFBIG half-way (as a full disk fails it with
    ENOSPC): an I/O failure named with exit 2, the previous report intact, no temporary file left."""
    report = tmp_path / "report.json"
    report.write_text('{"old": true}\n')

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600))

    res = subprocess.run([sys.executable, "-m", "doctor", "check", "--only", "host.*", "--format", "json",
                          "--output", str(report)], capture_output=True, text=True, env=doctor_env(), timeout=120,
                         preexec_fn=limit)
    assert res.returncode == 2 and "cannot write the report to" in res.stderr, res.stderr
    assert "internal error" not in res.stderr
    assert json.loads(report.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_state_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    for argv in (["check", "--only", "host.port"], ["patches", "status"], ["fix", "--only", "host.port"]):
        out = run_doctor(*argv, "--state-dir", str(state), timeout=60)
        assert out.returncode == 2 and "is a regular file, not a directory" in out.stderr, (argv, out.stderr)
    assert state.read_text() == "not a directory\n"


@pytest.fixture
def engine_venv(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path):  # type: ignore[no-untyped-def]
    from patches_install import fresh_venv

    return fresh_venv("0.5.23", tmp_path_factory, tmp_path / "venv")


def _engine(venv, state: Path):  # type: ignore[no-untyped-def]
    from patches_install import FIXTURE_SETS

    from doctor.sglang.patching import manifest, record
    from doctor.sglang.patching.engine import Engine

    return Engine(manifest.resolve("t-0.5.23", str(FIXTURE_SETS)), record.installed_in(venv.site_packages),
                  state_dir=str(state))


@pytest.mark.network  # reads the released SGLang 0.5.23 wheel (a first-run download)
def test_a_journal_pointing_outside_site_packages_is_not_rolled_back(engine_venv, tmp_path: Path) -> None:
    from doctor.sglang.patching.engine import EngineError
    from doctor.sglang.patching.state import StateStore

    state = tmp_path / "state"
    eng = _engine(engine_venv, state)
    eng.apply()
    rel = "sglang/srt/layers/attention/triton_backend.py"
    patched = (engine_venv.site_packages / rel).read_bytes()
    outside = tmp_path / "elsewhere"
    (outside / rel).parent.mkdir(parents=True)
    (outside / rel).write_bytes(patched)  # what a roll-back would overwrite there
    chain = eng.pset.chains()[rel]
    store = StateStore.open(str(state), engine_venv.site_packages)
    store.write_journal({"kind": "k26-doctor-patch-journal", "schema_version": 1, "op": "apply", "set": "t-0.5.23",
                         "site_packages": str(engine_venv.site_packages), "package_root": str(outside),
                         "files": [{"path": rel, "old": chain[0][1].before, "new": chain[-1][1].after}]})
    with pytest.raises(EngineError, match="outside this environment's site-packages"):
        _engine(engine_venv, state).revert()
    assert (outside / rel).read_bytes() == patched, "a file outside site-packages was written"
    assert store.journal_path.exists()


@pytest.mark.network  # reads the released SGLang 0.5.23 wheel (a first-run download)
def test_a_patch_target_whose_directory_leads_out_of_site_packages_is_refused(engine_venv,
                                                                              tmp_path: Path) -> None:
    attention = engine_venv.site_packages / "sglang/srt/layers/attention"
    outside = tmp_path / "elsewhere-attention"
    shutil.copytree(attention, outside)
    shutil.rmtree(attention)
    attention.symlink_to(outside)
    before = (outside / "triton_backend.py").read_bytes()
    plan = _engine(engine_venv, tmp_path / "state").plan_apply()
    assert not plan.ok and any("through a symbolic link" in r and "triton_backend.py" in r for r in plan.refusals), \
        plan.refusals
    assert (outside / "triton_backend.py").read_bytes() == before


@pytest.mark.parametrize("flag, value", [
    ("--model-path", "/models/K2.6\nExecStartPre=/bin/sh -c 'id > /tmp/owned'"),
    ("--user", "sglang\nUser=root"),
    ("--draft-model-path", "/models/d\rX=1"),
])
def test_a_control_character_never_reaches_a_unit(flag: str, value: str) -> None:
    out = run_doctor("systemd-unit", "--doctor", "/usr/bin/true", flag, value, timeout=60)
    assert out.returncode == 2 and "control character" in out.stderr and out.stdout == "", out.stderr


def test_a_control_character_in_the_config_never_reaches_a_unit(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text('[server]\nuser = "sglang\\nExecStartPost=/bin/evil"\n')
    out = run_doctor("systemd-unit", "--config", str(cfg), "--doctor", "/usr/bin/true", timeout=60)
    assert out.returncode == 2 and "control character" in out.stderr and out.stdout == "", out.stderr
    out = run_doctor("systemd-unit", "--doctor", "/usr/bin/true", "--", "--served-model-name", "a\nb", timeout=60)
    assert out.returncode == 2 and "control character" in out.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed "
                    "(.ci/run installs systemd)")
def test_a_unit_from_odd_but_valid_values_verifies(tmp_path: Path) -> None:
    unit = tmp_path / "sglang-k26-ddtree.service"
    out = run_doctor("systemd-unit", "--doctor", "/usr/bin/true", "--model-path", "/models/K 2.6 %n $HOME 'q'",
                     "--output", str(unit), timeout=60)
    assert out.returncode == 0, out.stderr
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert [ln for ln in res.stderr.splitlines() if unit.name in ln] == [], res.stderr
    assert "TimeoutStartSec=-" not in unit.read_text()
