"""``k26-doctor smoke``: the failures judged against real HTTP servers -- a closed port, and a stand-in
(tests/sglang_api_stand_in.py) for what a real SGLang cannot be made to do here: a drafter that never
matches, HTTP 500, a server that stops answering, one still warming up. The passing path runs against a
real SGLang server in tests/test_smoke_gpu.py. The parsers are checked on SGLang 0.5.23's answer shapes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from sglang_api_stand_in import ApiStandIn

from doctor.service.smoke import (
    Call,
    SmokeOptions,
    accept_length,
    metrics_accept_length,
    run_smoke,
    speculative_algorithm,
)

ROOT = Path(__file__).resolve().parents[1]


def doctor(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    env.pop("K26_DOCTOR_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "doctor", "smoke", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_drafter_that_never_matches_fails_with_exit_1():
    with ApiStandIn("mismatch") as srv:
        out = doctor("--url", srv.url, "--format", "json", "--max-tokens", "32")
    assert out.returncode == 1, out.stdout + out.stderr
    rep = json.loads(out.stdout)
    assert rep["status"] == "fail" and rep["speculative_algorithm"] == "DDTREE"
    assert rep["accept_length"] == 32 * 3 / (31 * 3) and "does not match the target" in rep["summary"]
    assert rep["accept_length_metrics"] == 1.0
    paths = [c["path"] for c in rep["calls"]]
    assert paths[:3] == ["/health", "/server_info", "/v1/models"]
    assert "/v1/chat/completions" in paths and "/v1/completions" in paths and paths.count("/generate") == 3


def test_a_lower_threshold_lets_it_pass_and_warn_below_warns():
    with ApiStandIn("mismatch") as srv:
        ok = run_smoke(SmokeOptions(srv.url, fail_below=1.0, max_tokens=16))
        warn = run_smoke(SmokeOptions(srv.url, fail_below=1.0, warn_below=2.0, max_tokens=16))
    assert ok.status == "pass" and "accept length 1.07 (DDTREE)" in ok.summary, ok.summary
    assert warn.status == "warn" and "below the expected 2" in warn.summary


def test_a_warning_exits_0_and_1_under_strict_with_the_status_shown_unchanged():
    """The exit code is the run's one table's (doctor.core.decision): a warning fails only under --strict, and the
    status the report shows stays "warn" either way."""
    with ApiStandIn("mismatch") as srv:
        runs = {strict: doctor("--url", srv.url, "--format", "json", "--max-tokens", "16", "--fail-below", "1.0",
                               "--warn-below", "2.0", *(["--strict"] if strict else []))
                for strict in (False, True)}
    assert [runs[False].returncode, runs[True].returncode] == [0, 1], runs[True].stdout + runs[True].stderr
    assert {json.loads(out.stdout)["status"] for out in runs.values()} == {"warn"}


def test_http_500_fails():
    with ApiStandIn("error500") as srv:
        out = doctor("--url", srv.url)
    assert out.returncode == 1
    assert "FAIL" in out.stdout and "POST /generate: HTTP 500: Internal Server Error" in out.stdout


def test_a_server_that_stops_answering_is_bounded_by_the_timeout():
    with ApiStandIn("slow", delay_s=30) as srv:
        t0 = time.monotonic()
        out = doctor("--url", srv.url, "--timeout", "3", "--format", "json")
        took = time.monotonic() - t0
    assert out.returncode == 1 and took < 15, (took, out.stdout)
    rep = json.loads(out.stdout)
    assert "timed out" in rep["summary"] and rep["duration_s"] < 5
    assert [c["path"] for c in rep["calls"]].count("/generate") == 1  # no point waiting again


def test_warming_up_and_closed_port_fail():
    with ApiStandIn("starting") as srv:
        rep = run_smoke(SmokeOptions(srv.url, timeout_s=5))
    assert rep.status == "fail" and "not ready" in rep.summary and "HTTP 503" in rep.summary
    out = doctor("--url", f"http://127.0.0.1:{closed_port()}", "--timeout", "5")
    assert out.returncode == 1 and "connection refused" in out.stdout


def test_skip_tokenizer_init_sends_input_ids_and_no_openai_requests():
    with ApiStandIn("mismatch", skip_tokenizer_init=True, metrics=False) as srv:
        rep = run_smoke(SmokeOptions(srv.url, fail_below=1.0, max_tokens=8, input_ids=(3, 4, 5)))
        sent = [b for m, p, b in srv.seen if p == "/generate"]
    assert rep.status == "pass", rep.summary
    assert all("input_ids" in b and "text" not in b for b in sent) and sent[1]["input_ids"] == [4, 5, 3]
    assert not [c for c in rep.calls if c.path.startswith("/v1/chat")]
    assert any("skip-tokenizer-init" in n for n in rep.notes) and any("/metrics" in n for n in rep.notes)


def test_a_server_without_speculation_is_not_judged_on_accept_length():
    with ApiStandIn("mismatch", algorithm=None) as srv:
        rep = run_smoke(SmokeOptions(srv.url, max_tokens=8))
    assert rep.status == "pass" and rep.accept_length is None and rep.speculative is None


def test_cli_usage_errors_exit_2():
    assert doctor("--url", "127.0.0.1:1").returncode == 2
    assert doctor("--url", "http://127.0.0.1:1", "--input-ids", "a,b").returncode == 2
    assert doctor("--requests", "0").returncode == 2


# -- the parsers, on SGLang 0.5.23's answers -------------------------------------------------------

def test_accept_length_is_sglang_s_own_ratio():
    """tokenizer_manager: meta_info["spec_accept_length"] = completion_tokens / spec_verify_ct."""
    def gen(ct, vc):
        c = Call("POST", "/generate", 200)
        c.body = {"text": "", "meta_info": {"completion_tokens": ct, "spec_verify_ct": vc}}
        return c

    bad = Call("POST", "/generate", 500)
    bad.body = "Internal Server Error"
    assert accept_length([gen(64, 16), gen(64, 20), bad]) == (128 / 36, 128, 36)
    assert accept_length([gen(64, 0)]) == (None, 0, 0)


def test_metrics_and_server_info_parsers():
    text = ("# TYPE sglang:spec_accept_length gauge\n"
            'sglang:spec_accept_length{model_name="k26",engine_type="unified"} 3.25\n'
            "sglang:spec_accept_rate 0.4\n")
    assert metrics_accept_length(text) == 3.25
    assert metrics_accept_length("sglang:spec_accept_length NaN\n") is None and metrics_accept_length("") is None
    assert speculative_algorithm({"speculative_algorithm": "ddtree"}) == "DDTREE"
    assert speculative_algorithm({"speculative_algorithm": None}) is None and speculative_algorithm("x") is None


def test_systemd_unit_runs_the_smoke_after_ready():
    from doctor.core.settings import resolve
    from doctor.service.systemd import render_unit

    settings = resolve({"profile": "h200-tp8", "model_path": "/m", "draft_model_path": "/d"}, environ={})
    plain = render_unit(settings, config=None, doctor=["k26-doctor"])
    unit = render_unit(settings, config="/etc/k26-doctor/config.toml", doctor=["k26-doctor"], smoke=True)
    assert "ExecStartPost" not in plain
    post = [ln for ln in unit.splitlines() if ln.startswith("ExecStartPost=")]
    assert post == ["ExecStartPost=k26-doctor smoke --config /etc/k26-doctor/config.toml --profile h200-tp8 "
                    "--timeout 120"]
    def wait(text):
        return int(text.split("--wait-timeout ", 1)[1].split()[0])

    assert wait(plain) - wait(unit) == 120  # the smoke's deadline comes off the readiness wait
