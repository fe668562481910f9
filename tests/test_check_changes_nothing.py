"""CONTRACT guarantee: ``check`` changes nothing anywhere (no file written outside a temporary
directory, no process left behind), on a host where many checks fail and some have fixers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import ROOT, doctor_env
from safetensors.numpy import save_file

IGNORED = (".git", "__pycache__", ".tox", ".pytest_cache", ".ruff_cache", ".hypothesis")
PYCACHE = "__pycache__"


def tree_state(*roots: Path) -> dict[str, tuple[int, int, int]]:
    """Size, time and mode of every file and directory under ``roots`` (the ignored folders not walked; a
    ``__pycache__`` only noted as there)."""
    state: dict[str, tuple[int, int, int]] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            if PYCACHE in dirnames:
                state[os.path.join(dirpath, PYCACHE)] = (0, 0, 0)
            dirnames[:] = [d for d in dirnames if d not in IGNORED]
            for name in filenames + dirnames:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                state[p] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return state


def changes(before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]) -> list:
    """What differs between two states, less the bytecode folders and a directory whose time moved only because
    a ``__pycache__`` was made in it meanwhile: other tests import this checkout's modules in parallel, and the
    first import of a fresh checkout's ``scripts/`` (CI's) creates its bytecode folder. Every file and every
    other entry a directory gains or loses still counts."""
    out = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b or os.path.basename(path) == PYCACHE:
            continue
        cache = os.path.join(path, PYCACHE)
        if a and b and a[2] == b[2] and os.path.isdir(path) and cache in after and cache not in before:
            continue
        out.append((path, a, b))
    return out


def make_model(path: Path) -> None:
    path.mkdir()
    save_file({"model.embed_tokens.weight": np.zeros((4, 8), dtype=np.float32)}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1,
                                                  "hidden_size": 8, "vocab_size": 4}))
    (path / "model.safetensors.aria2").write_bytes(b"\x00" * 16)  # a leftover a fixer would move


def test_check_writes_nothing_and_leaves_no_process(tmp_path: Path) -> None:
    home, model, tmp = tmp_path / "home", tmp_path / "model", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    make_model(model)
    before = tree_state(ROOT, home, model)
    env = doctor_env(HOME=str(home), TMPDIR=str(tmp), PYTHONDONTWRITEBYTECODE="1",
                     XDG_CACHE_HOME=str(home / ".cache"), NCCL_P2P_DISABLE="1")
    proc = subprocess.run([sys.executable, "-m", "doctor", "check", "--model-path", str(model),
                           "--draft-model-path", str(tmp_path / "no-drafter"), "--format", "json",
                           "--state-dir", str(tmp_path / "state"), "-v"],  # -v: the start plan's facts too
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["summary"]["counts"]["fail"] >= 1
    assert "doctor.start_plan" in [n["id"] for n in report["doctor"]["notices"]]  # planned; nothing compiled
    after = tree_state(ROOT, home, model)
    changed = changes(before, after)
    assert not changed, f"check changed files: {changed[:10]}"
    assert not (tmp_path / "state").exists(), "check must not create its state directory"
    leftovers = [p for p in tmp.iterdir()]
    assert not leftovers, f"temporary files left behind: {leftovers}"
    # No process started by the doctor outlives it: nothing of ours has the temp dir in its environment.
    mine = []
    for pid_dir in Path("/proc").iterdir():
        if pid_dir.name.isdigit() and int(pid_dir.name) != os.getpid():
            try:
                if str(tmp).encode() in (pid_dir / "environ").read_bytes():
                    mine.append((pid_dir.name, (pid_dir / "cmdline").read_bytes()[:200]))
            except OSError:
                continue
    assert not mine, f"processes left running: {mine}"


def test_tree_changes_ignore_a_new_bytecode_folder_only(tmp_path: Path) -> None:
    """A ``__pycache__`` made in a directory moves its time and is not a change; a file made there is one."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "a.py").write_text("x = 1\n")
    os.utime(tmp_path / "scripts", ns=(1, 1))  # the directory's time as before, then moved by the folder
    before = tree_state(tmp_path)
    (tmp_path / "scripts" / "__pycache__").mkdir()
    assert changes(before, tree_state(tmp_path)) == []
    (tmp_path / "scripts" / "b.tmp").write_text("")
    changed = changes(before, tree_state(tmp_path))
    assert [c[0] for c in changed] == [str(tmp_path / "scripts" / "b.tmp")]
