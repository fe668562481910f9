"""bench/ddtree/slim_tree.sh: what no GPU session reads is moved out of the tree that travels, and put back
byte for byte; it refuses to overwrite either side."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    (repo / "bench" / "ddtree").mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "ddtree" / "slim_tree.sh", repo / "bench" / "ddtree" / "slim_tree.sh")
    for rel, data in (("bench/results/a/logs.tgz", b"x" * 5000), ("tests/fixtures/golden/verdicts.json", b"{}"),
                      ("tests/fixtures/snapshots/keep.json", b"kept"), ("doctor/x.py", b"pass\n")):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    (repo / ".gitignore").write_text("/.slim-aside/\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    return repo


def _run(repo: Path, verb: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "bench/ddtree/slim_tree.sh", verb], cwd=repo, capture_output=True, text=True,
                          timeout=60)


def test_aside_and_back(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    out = _run(repo, "aside")
    assert out.returncode == 0, out.stderr
    assert not (repo / "bench" / "results").exists() and not (repo / "tests" / "fixtures" / "golden").exists()
    assert (repo / "tests" / "fixtures" / "snapshots" / "keep.json").exists()  # not on the list
    assert (repo / ".slim-aside" / "bench" / "results" / "a" / "logs.tgz").read_bytes() == b"x" * 5000
    assert "MiB of the tree travels" in out.stdout
    assert _run(repo, "aside").returncode == 0  # nothing left to move: a no-op
    out = _run(repo, "back")
    assert out.returncode == 0, out.stderr
    assert (repo / "bench" / "results" / "a" / "logs.tgz").read_bytes() == b"x" * 5000
    assert (repo / "tests" / "fixtures" / "golden" / "verdicts.json").read_bytes() == b"{}"
    assert not (repo / ".slim-aside").exists()


def test_back_never_overwrites(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    assert _run(repo, "aside").returncode == 0
    (repo / "bench" / "results").mkdir()  # something new where the set-aside folder would go back
    out = _run(repo, "back")
    assert out.returncode == 1 and "resolve by hand" in out.stdout
    assert (repo / ".slim-aside" / "bench" / "results" / "a" / "logs.tgz").exists()
    assert _run(repo, "nonsense").returncode == 2
