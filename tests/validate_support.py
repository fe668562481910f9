"""Helpers of the ``k26-doctor validate`` tests: a profile whose server is the fake SGLang of
tests/fake_sglang (started by the launcher's real argv: ``python -m sglang.launch_server``), free ports."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

FAKE = Path(__file__).resolve().parent / "fake_sglang"


def free_port_base(n: int = 8) -> int:
    """A base port with ``n`` free ports after it."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65000:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


def profile(tmp: Path, faults: str = "", budget: int = 16, round_s: float = 0.0002) -> Path:
    """A DDTREE profile on small real model directories, served by the fake SGLang."""
    for name in ("model", "drafter"):
        d = tmp / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(f'{{"name": "{name}"}}')
    text = f"""
name = "fake-ddtree"
[parallel]
tp = 1
[patches]
set = "ddtree-0.5.23"
[model]
path = "{tmp / 'model'}"
trust_remote_code = false
[drafter]
path = "{tmp / 'drafter'}"
[server]
host = "127.0.0.1"
port = 30000
attention_backend = "triton"
speculative_algorithm = "DDTREE"
ddtree_budget = {budget}
args = ["--skip-tokenizer-init"]
start_timeout_s = 30
[server.env]
PYTHONPATH = "{FAKE}"
FAKE_SGLANG_FAULTS = "{faults}"
FAKE_SGLANG_ROUND_S = "{round_s}"
"""
    path = tmp / "profile.toml"
    path.write_text(text)
    return path


def settings(tmp: Path, **kw: object):
    from doctor.app import settings_from_flags

    return settings_from_flags({"profile": str(profile(tmp, **kw)), "python": sys.executable,
                                "state_dir": str(tmp / "state")})
