"""The README's table of checks is the registry's: scripts/make_check_table.py writes it, this fails on drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from file_modules import load_file

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make_check_table.py"


def maker():
    return load_file(SCRIPT, "make_check_table", register=False)


def test_readme_check_table_is_the_registrys() -> None:
    from doctor.core.registry import load

    mod = maker()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert mod.rewritten(text) == text, "README.md's table of checks is stale: python scripts/make_check_table.py"
    rows = text.split(mod.BEGIN)[1].split(mod.END)[0]
    for chk in load(plugins=False).sorted_checks():
        assert f"| `{chk.id}` | {chk.title} |" in rows


def test_the_table_check_fails_on_a_changed_title(tmp_path: Path) -> None:
    """A title changed in the registry (or a row edited by hand) is drift: ``--check`` exits 1 naming the row."""
    mod = maker()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    edited = text.replace("| `gpu.count` | GPUs visible vs the parallel size |", "| `gpu.count` | GPUs |")
    assert edited != text
    assert mod.rewritten(edited) == text
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for part in ("doctor", "checks", "fixes"):
        (tree / part).symlink_to(ROOT / part)
    (tree / "scripts" / "make_check_table.py").write_text(SCRIPT.read_text(encoding="utf-8"))
    (tree / "README.md").write_text(edited, encoding="utf-8")
    out = subprocess.run([sys.executable, str(tree / "scripts" / "make_check_table.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "- | `gpu.count` | GPUs |" in out.stdout
    assert (tree / "README.md").read_text(encoding="utf-8") == edited  # --check writes nothing
