"""SIGTERM (systemd's stop, a fleet's timeout) in the middle of ``fix --apply`` and of ``launch``'s checks.

- ``fix --apply`` stopped while a fixer writes (before its temporary file is renamed over the target, and before
  the temporary file is even written): exit 143, the message names SIGTERM (it said Ctrl-C), the target as it was,
  its backup whole, no temporary file left beside either;
- ``launch`` stopped while a check's probe runs: exit 143 as ``check`` exits (it was 1, a refused start, as if a
  check had failed), the short report naming SIGTERM, and the probe's process gone.

Real parts: the doctor as a child process, a site plugin installed as a distribution (its module and its
``.dist-info`` with the entry point, on PYTHONPATH) whose fixer's write pauses at a stage of ``atomic_write`` the
test names, a real ``sleep`` as the hung probe.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path

import pytest
from conftest import doctor_env, signal_once_started

pytestmark = pytest.mark.timeout(180)

PLUGIN = '''
"""A site plugin whose fixer's write pauses at the stage SLOW_AT of atomic_write, and whose probe hangs."""
import os
import time
from dataclasses import dataclass
from pathlib import Path

from doctor.core import proc
from doctor.core.actions import WriteFile, backup_file
from doctor.core.fileio import atomic_write
from doctor.core.registry import check, fixer
from doctor.core.result import Result


def _pause(stage, target):
    if stage == os.environ.get("SLOW_AT"):
        Path(os.environ["SLOW_STARTED"]).write_text(stage)
        time.sleep(120)


@dataclass
class SlowWrite(WriteFile):
    def apply(self, backup_dir):
        target = Path(self.path)
        backup = backup_file(target, backup_dir)
        atomic_write(target, self.new_text.encode(), 0o644, hook=_pause)
        return f"wrote {target} (backup {backup})"


@check("slow.file", "A file that must say 'fixed'", fixer="slow.write")
def slow_file(ctx):
    path = os.environ["SLOW_FILE"]
    text = Path(path).read_text()
    if text.strip() != "fixed":
        return Result.failed(f"{path} says {text.strip()!r}", file=path)
    return Result.passed("fixed")


@fixer("slow.write", "Write 'fixed'")
def plan(ctx, result):
    return [SlowWrite(summary="write fixed", path=result.details["file"], new_text="fixed\\n")]


@check("slow.probe", "A check whose probe hangs", timeout=300)
def slow_probe(ctx):
    started = proc.start(["sleep", os.environ["SLOW_SLEEP"]])
    Path(os.environ["SLOW_STARTED"]).write_text("probe")
    res = proc.finish(started, 300)
    return Result.passed(f"answered {res.returncode}")
'''


def install_plugin(site: Path) -> Path:
    """The plugin as pip would leave it: the module and its distribution's metadata with the entry point."""
    dist = site / "k26_slow_site-1.0.dist-info"
    dist.mkdir(parents=True)
    (site / "k26_slow_site.py").write_text(PLUGIN)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: k26-slow-site\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[k26_doctor.checks]\nslow = k26_slow_site\n")
    return site


def terminated(tmp_path: Path, args: list[str], **env: str) -> tuple[int, str, str]:
    """The doctor with ``args``, sent SIGTERM once the plugin says it has reached its slow point."""
    started = tmp_path / "started"
    full = doctor_env(PYTHONPATH=str(install_plugin(tmp_path / "site")), SLOW_STARTED=str(started), COLUMNS="80",
                      **env)
    proc = signal_once_started([sys.executable, "-m", "doctor", *args], started, signal.SIGTERM, env=full, cwd=tmp_path,
                               what="the plugin's slow point")
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("stage", ["write", "tmp-written"])
def test_sigterm_during_fix_apply_leaves_nothing_half_written(tmp_path: Path, stage: str) -> None:
    work = tmp_path / "etc"
    work.mkdir()
    target = work / "target.conf"
    target.write_text("broken\n")
    state = tmp_path / "state"
    code, out, err = terminated(tmp_path, ["fix", "--apply", "--yes", "--only", "slow.file", "--state-dir",
                                           str(state)], SLOW_AT=stage, SLOW_FILE=str(target))
    assert code == 143, (code, out, err)
    assert "interrupted (SIGTERM)" in err and "Ctrl-C" not in err and "Traceback" not in out + err, err
    assert target.read_text() == "broken\n"
    assert sorted(p.name for p in work.iterdir()) == ["target.conf"]  # no temporary file beside it
    backups = [p for p in state.rglob("*") if p.is_file()]
    assert [(p.name, p.read_text()) for p in backups] == [("target.conf", "broken\n")], backups


def probes_running(marker: str) -> list[int]:
    """The processes whose command line carries ``marker`` (the hung probe's unique argument)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline.split(b"\0"):
            found.append(int(pid))
    return found


def test_sigterm_during_launchs_checks_exits_143_with_the_short_report_and_no_probe_left(tmp_path: Path) -> None:
    marker = f"{3000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"  # a sleep no one else runs
    try:
        code, out, err = terminated(tmp_path, ["launch", "--only", "slow.probe", "--no-prewarm", "--model-path",
                                               str(tmp_path / "no-model")], SLOW_SLEEP=marker,
                                    SLOW_FILE=str(tmp_path / "unused"))
        assert code == 143, (code, out, err)
        assert "INTERRUPTED (SIGTERM), a partial report" in err and "Traceback" not in out + err, err
        assert "not launching: the run was interrupted" in err and "`k26-doctor fix`" not in err, err
        assert probes_running(marker) == []
    finally:
        for pid in probes_running(marker):
            os.kill(pid, signal.SIGKILL)
