"""``fix`` wraps to the terminal as ``check`` does: ``COLUMNS``, else its width, else 80 columns.

The plan of the GPU-less recording (every fix by hand: the driver, the exposure, the model paths) at 60 and at 100
columns: no line wider than the terminal (but for a word longer than a line, which is never cut), the same words
at both widths (commands wrap with a shell continuation, so they still paste).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, doctor_env

SNAP = ROOT / "tests" / "fixtures" / "snapshots" / "gpuless-fresh-venv.json"


def plan(tmp_path: Path, columns: str) -> str:
    shutil.copy(SNAP, tmp_path / "gpuless.json")
    out = subprocess.run([sys.executable, "-m", "doctor", "fix", "--from-snapshot", "gpuless.json"],
                         capture_output=True, text=True, env=doctor_env(COLUMNS=columns), cwd=tmp_path, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    return out.stdout


def test_fix_wraps_to_columns(tmp_path: Path) -> None:
    narrow, wide = plan(tmp_path, "60"), plan(tmp_path, "100")
    for text, width in ((narrow, 60), (wide, 100)):
        over = [ln for ln in text.splitlines() if len(ln) > width and len(ln.split()) > 1]
        assert not over, over
    words = lambda text: [w for w in text.split() if w != "\\"]  # noqa: E731 - a wrapped command's continuation
    assert words(narrow) == words(wide)
    assert len(narrow.splitlines()) > len(wide.splitlines())
    assert "$ ldconfig -p | grep libnvidia-ml" in wide
