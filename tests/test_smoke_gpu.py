"""``k26-doctor smoke`` against a real, running SGLang server (started elsewhere: this test starts nothing).

Set ``K26_SMOKE_URL`` (e.g. ``http://127.0.0.1:30000``) to the server; without it the test skips. On the GPU
host, with the tiny DDTree server of bench/ddtree running (``--skip-tokenizer-init``, DDTREE, budget 16):

    K26_SMOKE_URL=http://127.0.0.1:30000 python -m pytest -q -p no:cacheprovider -n 0 -m gpu tests/test_smoke_gpu.py

``K26_SMOKE_MIN_ACCEPT`` (default 1.1) is the accept length the server must reach; ``K26_SMOKE_TIMEOUT`` the
deadline (default 120 s); ``K26_SMOKE_INPUT_IDS`` (comma-separated) a prompt of the server's own language (the
trained pair's: ``bench/ddtree/make_trained.py --prompts``), else smoke's default ids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
URL = os.environ.get("K26_SMOKE_URL")


def smoke(*args: str) -> tuple[int, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    env.pop("K26_DOCTOR_CONFIG", None)
    ids = os.environ.get("K26_SMOKE_INPUT_IDS")
    prompt = ["--input-ids", ids] if ids else []
    argv = [sys.executable, "-m", "doctor", "smoke", "--url", str(URL), "--format", "json", *prompt, *args]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    return out.returncode, json.loads(out.stdout)


@pytest.mark.skipif(not URL, reason="K26_SMOKE_URL is not set: no running server to smoke")
def test_smoke_against_the_running_server():
    timeout = os.environ.get("K26_SMOKE_TIMEOUT", "120")
    floor = float(os.environ.get("K26_SMOKE_MIN_ACCEPT", "1.1"))
    code, rep = smoke("--timeout", timeout, "--requests", "4", "--max-tokens", "64", "--fail-below", str(floor))
    print(json.dumps(rep, indent=2))
    assert code == 0 and rep["status"] in ("pass", "warn"), rep["summary"]
    assert all(c["status"] == 200 for c in rep["calls"] if c["path"] != "/metrics"), rep["calls"]
    assert [c["path"] for c in rep["calls"]].count("/generate") == 4
    assert rep["latency"]["generate"]["n"] == 4
    with urllib.request.urlopen(str(URL).rstrip("/") + "/server_info", timeout=30) as resp:
        info = json.loads(resp.read())
    if info.get("speculative_algorithm"):
        # SGLang's own counters: tokens per verify pass above the floor, and equal to what the answers say.
        assert rep["speculative_algorithm"] == str(info["speculative_algorithm"]).upper()
        assert rep["accept_length"] is not None and rep["accept_length"] >= floor
        assert rep["accept_length"] == pytest.approx(rep["completion_tokens"] / rep["spec_verify_ct"])
    # A threshold the server cannot reach makes the same run fail, with check's exit code.
    code, rep = smoke("--timeout", timeout, "--requests", "1", "--fail-below", "1000")
    if info.get("speculative_algorithm"):
        assert code == 1 and rep["status"] == "fail" and "does not match the target" in rep["summary"]
    else:
        assert code == 0
