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


def tree_state(*roots: Path) -> dict[str, tuple[int, int, int]]:
    state: dict[str, tuple[int, int, int]] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in (".git", "__pycache__", ".tox", ".pytest_cache",
                                                            ".ruff_cache", ".hypothesis")]
            for name in filenames + dirnames:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                state[p] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return state


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
                           "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["summary"]["counts"]["fail"] >= 1
    after = tree_state(ROOT, home, model)
    changed = sorted(set(before.items()) ^ set(after.items()))
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
