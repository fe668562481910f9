"""The judgements of bench/ddtree/serve_check.py: what makes a DDTREE server lossless in the GPU validation.

The servers only run on a GPU host; what is decided from their answers is decided here, on results built from
known distributions, so that a criterion that cannot fail (or that fails a correct server) is caught before
it is trusted: the chi-square tail against textbook quantiles, the two-sample test's size and power, the
greedy near-tie rule, and the controls that must be rejected.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest
from file_modules import load_file

ROOT = Path(__file__).resolve().parents[1]


sc = load_file(ROOT / "bench" / "ddtree" / "serve_check.py", "k26_serve_check")


@pytest.mark.parametrize(("x", "df", "p"), [(3.841, 1, 0.05), (6.635, 1, 0.01), (18.307, 10, 0.05),
                                            (23.209, 10, 0.01), (124.342, 100, 0.05), (0.0158, 1, 0.9)])
def test_chi2_tail_matches_the_tables(x: float, df: int, p: float) -> None:
    assert sc.chi2_sf(x, df) == pytest.approx(p, rel=2e-3)


def _draw(rng: random.Random, weights: list[float], n: int) -> list[int]:
    return rng.choices(range(len(weights)), weights=weights, k=n)


def test_two_sample_test_keeps_its_size_and_has_power() -> None:
    rng = random.Random(5)
    w, shift = [0.55, 0.3, 0.15], [0.65, 0.23, 0.12]
    same = [sc.chi2_sf(*sc.chi2_two_sample(_draw(rng, w, 2000), _draw(rng, w, 2000))) for _ in range(200)]
    # under the null the p-values are uniform: about 1 % below 0.01
    assert sum(p < 0.01 for p in same) <= 8
    shifted = [sc.chi2_sf(*sc.chi2_two_sample(_draw(rng, w, 2000), _draw(rng, shift, 2000))) for _ in range(50)]
    assert all(p < 1e-3 for p in shifted)


def test_rare_categories_are_pooled_not_dropped() -> None:
    a = [0] * 1990 + list(range(1, 11))
    b = [0] * 1990 + list(range(11, 21))
    stat, df = sc.chi2_two_sample(a, b)
    assert df == 1 and stat == pytest.approx(0.0)


def _results(servers: dict, phases: list) -> dict:
    return {"servers": servers, "phases": phases}


def _server(algo: str, **cfg) -> dict:
    return {"healthy": True, "alive_at_end": True, "log_errors": [], "config": {"algo": algo, **cfg}}


def _phase(server: str, outputs: list, temperature: float = 0.0, name: str = "g", **extra) -> dict:
    return {"phase": name, "server": server, "outputs": outputs, "inputs_digest": "d", "n_errors": 0,
            "sampling": {"temperature": temperature, "max_new_tokens": len(outputs[0])}, **extra}


def test_greedy_criterion_passes_near_ties_and_fails_real_divergences() -> None:
    base = [[i, i + 1, i + 2] for i in range(400)]
    spec = [list(o) for o in base]
    spec[7][2] = 99
    servers = {"base": _server("none"), "dd": _server("DDTREE", baseline="base")}
    tie = {"request": 7, "position": 2, "delta_logprob": 0.03}
    ok = sc.compare(_results(servers, [_phase("base", base), _phase("dd", spec, divergences=[tie])]))
    assert ok["ok"] and ok["greedy"][0]["share"] == pytest.approx(399 / 400)
    not_tie = dict(tie, delta_logprob=0.8)
    bad = sc.compare(_results(servers, [_phase("base", base), _phase("dd", spec, divergences=[not_tie])]))
    assert not bad["ok"] and bad["greedy"][0]["not_near_ties"] == 1
    unprobed = sc.compare(_results(servers, [_phase("base", base), _phase("dd", spec)]))
    assert not unprobed["ok"] and unprobed["greedy"][0]["unprobed"] == 1
    # 3 near-ties in 400 requests: 99.25 % identical, below the 99.5 % floor
    for i in (8, 9):
        spec[i][1] = 98
    many = [dict(tie, request=r) for r in (7, 8, 9)]
    low = sc.compare(_results(servers, [_phase("base", base), _phase("dd", spec, divergences=many)]))
    assert not low["ok"] and low["greedy"][0]["share"] < sc.GREEDY_SAME_MIN


def test_greedy_criterion_never_more_divergences_than_the_rival() -> None:
    base = [[i, i + 1] for i in range(400)]
    spec = [list(o) for o in base]
    spec[3][1] = 77
    tie = [{"request": 3, "position": 1, "delta_logprob": 0.01}]
    servers = {"base": _server("none"), "df": _server("DFLASH", baseline="base"),
               "dd": _server("DDTREE", baseline="base", greedy_rival="df")}
    phases = [_phase("base", base), _phase("df", base), _phase("dd", spec, divergences=tie)]
    worse = sc.compare(_results(servers, phases))
    assert not worse["ok"]
    assert next(g for g in worse["greedy"] if g["server"] == "dd")["more_divergences_than_rival"] is True
    even = sc.compare(_results(servers, [_phase("base", base), _phase("df", spec, divergences=tie),
                                         _phase("dd", spec, divergences=tie)]))
    assert even["ok"]


def _sampled(rng: random.Random, weights: list[list[float]], n: int) -> list[list[int]]:
    cols = [_draw(rng, w, n) for w in weights]
    return [list(t) for t in zip(*cols, strict=True)]


def test_sampled_criterion_accepts_the_same_distribution_and_rejects_a_biased_control() -> None:
    rng = random.Random(11)
    w = [[0.55, 0.3, 0.15], [0.5, 0.5], [0.6, 0.25, 0.15], [0.7, 0.3]]
    biased = [[0.65, 0.25, 0.1], [0.5, 0.5], [0.6, 0.25, 0.15], [0.7, 0.3]]
    servers = {"base": _server("none"), "dd": _server("DDTREE", baseline="base"),
               "ctl": _server("DDTREE", baseline="base", expect_fail=True)}
    phases = [_phase("base", _sampled(rng, w, 2400), 1.0, "s"), _phase("dd", _sampled(rng, w, 2400), 1.0, "s"),
              _phase("ctl", _sampled(rng, biased, 2400), 1.0, "s")]
    v = sc.compare(_results(servers, phases))
    cells = {c["server"]: c for c in v["sampled"]}
    assert cells["dd"]["rejected"] == 0 and cells["dd"]["pass_"]
    assert cells["ctl"]["rejected"] >= 1 and cells["ctl"]["pass_"]
    assert v["ok"]
    # the same biased server judged as a real one fails: the criterion can fail
    servers["ctl"]["config"]["expect_fail"] = False
    assert not sc.compare(_results(servers, phases))["ok"]


def test_sampled_criterion_refuses_too_few_samples() -> None:
    rng = random.Random(3)
    w = [[0.55, 0.3, 0.15]] * 4
    servers = {"base": _server("none"), "dd": _server("DDTREE", baseline="base")}
    v = sc.compare(_results(servers, [_phase("base", _sampled(rng, w, 500), 1.0, "s"),
                                      _phase("dd", _sampled(rng, w, 500), 1.0, "s")]))
    assert not v["ok"] and not v["sampled"][0]["enough"]


def test_a_phase_of_different_prompts_at_a_temperature_is_no_sampled_test() -> None:
    """A speed phase at T = 1 sends a different prompt each time: its few samples per context are not a cell
    of the sampled criterion (which would fail it for too few), while a repeated prompt is."""
    rng = random.Random(5)
    w = [[0.55, 0.3, 0.15]] * 4
    servers = {"base": _server("none"), "dd": _server("DDTREE", baseline="base")}
    phases = [_phase("base", _sampled(rng, w, 96), 1.0, "speed"), _phase("dd", _sampled(rng, w, 96), 1.0, "speed")]
    for ph in phases:
        ph["repeat_prompt"] = False
    assert sc.compare(_results(servers, phases))["sampled"] == []
    for ph in phases:
        ph["repeat_prompt"] = True
    assert not sc.compare(_results(servers, phases))["sampled"][0]["enough"]


def test_a_server_that_serves_what_it_must_refuse_fails() -> None:
    servers = {"dd": dict(_server("DDTREE"), refusals=[{"what": "min_p", "code": 200, "health_after": 200}])}
    v = sc.compare(_results(servers, []))
    assert not v["ok"] and v["servers"]["dd"]["refusals_not_refused"] == ["min_p"]


def test_plan_expansion_and_server_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAIR", "/p")
    plan = tmp_path / "plan.json"
    plan.write_text('{"defaults": {"model": "$PAIR/target", "draft": "${PAIR}/drafter", "args": ["--a"]},'
                    ' "servers": [{"name": "dd", "algo": "DDTREE", "budget": 32, "args": ["--b"]},'
                    ' {"name": "base", "algo": "none"}],'
                    ' "phases": [{"name": "x", "servers": ["d.*"], "n": 1}]}')
    p = sc.load_plan(str(plan))
    argv = sc.server_argv(p["servers"][0])
    assert argv[argv.index("--model-path") + 1] == "/p/target"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "/p/drafter"
    assert argv[argv.index("--speculative-ddtree-budget") + 1] == "32"
    assert argv[-2:] == ["--a", "--b"]
    assert p["phases"][0]["servers"] == ["dd"]
    assert sc.launch_argv(p["servers"][0]) == argv  # no cpus: not pinned
    pinned = sc.launch_argv({**p["servers"][0], "cpus": "2-4,9"})
    assert Path(pinned[0]).name == "taskset" and pinned[1:3] == ["-c", "2,3,4,9"] and pinned[3:] == argv
    monkeypatch.setenv("PATH", str(tmp_path))  # no taskset: unpinned, not a server that cannot start
    assert sc.launch_argv({**p["servers"][0], "cpus": "2-4"}) == argv
    assert sc.cpu_list("0-1, 5") == {0, 1, 5}
    for bad in ("3-1", "a", "1-b"):
        with pytest.raises(SystemExit):
            sc.cpu_list(bad)


def test_twin_and_tree_hash_criteria() -> None:
    base = [[i, i + 1] for i in range(400)]
    servers = {"tp1": _server("DDTREE"), "tp2": _server("DDTREE", greedy_twin="tp1")}
    phases = [_phase("tp1", base, accept_len=3.0), _phase("tp2", base, accept_len=2.97)]
    v = sc.compare(_results(servers, phases))
    assert v["ok"] and v["twins"][0]["pass"]
    phases[1]["accept_len"] = 2.8  # 6.7 % below TP1's
    assert not sc.compare(_results(servers, phases))["ok"]
    phases[1]["accept_len"] = 3.0
    servers["tp2"]["tree_hashes"] = [("0", "0", "aa"), ("1", "0", "aa"), ("0", "1", "bb"), ("1", "1", "bb")]
    assert sc.compare(_results(servers, phases))["tree_hashes"][0]["pass"]
    servers["tp2"]["tree_hashes"][3] = ("1", "1", "cc")
    v = sc.compare(_results(servers, phases))
    assert not v["ok"] and v["tree_hashes"][0]["steps_that_differ"] == 1


def _speed(server: str, name: str, wall: float, verify: int, tokens: int, conc: int = 1, **extra) -> dict:
    return _phase(server, [[1]], name=name, exclusive=True, wall_s=wall, verify_ct=verify, tokens=tokens,
                  concurrency=conc, tok_per_s=round(tokens / wall, 1), accept_len=round(tokens / verify, 4),
                  round_ms=round(1000 * wall * conc / verify, 4), **extra)


def test_round_cost_of_the_decode_rounds_alone_removes_the_per_request_cost() -> None:
    """Two servers whose rounds cost the same (5 ms) and whose requests cost 60 ms each besides: the one with
    the higher acceptance needs fewer rounds, so its whole-phase round cost reads higher; the long phase minus
    its short twin reads the rounds alone, 1.0x."""
    servers = {"dflash": _server("DFLASH"), "ddtree": _server("DDTREE", budget=16, speed_rival="dflash")}
    phases = []
    for name, accept in (("dflash", 6.0), ("ddtree", 8.0)):
        for phase, tokens in (("short", 64 * 10), ("long", 320 * 10)):
            verify = round(tokens / accept)
            wall = 10 * 0.060 + verify * 0.005
            extra = {"slope_of": "short"} if phase == "long" else {}
            phases.append(_speed(name, phase, wall, verify, tokens, **extra))
    out = sc.compare(_results(servers, phases))
    long = next(r for r in out["speed"] if r["server"] == "ddtree" and r["phase"] == "long")
    assert long["round_cost_vs_rival"] > 1.05  # the whole phase, per-request costs included
    assert long["slope_round_cost_vs_rival"] == pytest.approx(1.0, abs=0.01)
    assert long["slope_tok_per_s_vs_rival"] == pytest.approx(8.0 / 6.0, rel=0.01)
    assert long["slope_round_ms"] == pytest.approx(5.0, rel=0.01)
    assert not any("slope_round_ms" in r for r in out["speed"] if r["phase"] == "short")


def test_torch_profile_phase_asks_sglang_for_a_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``torch_profile`` phase posts SGLang's /start_profile with the trace directory under $WORK/aux/traces,
    then waits for the trace file; a server that refuses the request is named, never waited on."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen: list = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            if self.path == "/start_profile" and body["profile_prefix"] == "refuses":
                self.send_response(400)
                self.end_headers()
                self.wfile.write(b'{"error": "Profiling is already in progress"}')
                return
            if self.path == "/start_profile":
                Path(body["output_dir"], "x-TP-0.trace.json.gz").write_bytes(b"gz")
                answer = {"success": True}
            else:
                answer = {"output_ids": [1, 2], "meta_info": {"completion_tokens": 2, "spec_verify_ct": 1}}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    monkeypatch.setenv("WORK", str(tmp_path))
    try:
        ph = {"name": "trace_c1", "n": 2, "prompts": "random", "torch_profile": {"num_steps": 7, "with_stack": True}}
        rec = {"port": httpd.server_address[1]}
        out = sc.run_phase_on({}, ph, "srv", rec)
        assert out["traces"] == ["x-TP-0.trace.json.gz"] and out["trace_error"] is None
        path, body = seen[0]
        assert path == "/start_profile" and body["num_steps"] == 7 and body["with_stack"] is True
        assert body["output_dir"] == str(tmp_path / "aux" / "traces" / "trace_c1-srv")
        bad = sc.run_phase_on({}, ph, "refuses", rec)
        assert bad["traces"] == [] and "400" in bad["trace_error"]
    finally:
        httpd.shutdown()


def _fake_server(round_s: float, accept: float, request_s: float, log: list):
    """An HTTP server that answers /generate as a speculative server whose round costs ``round_s``."""
    import json
    import math
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            tokens = body["sampling_params"]["max_new_tokens"]
            verify = math.ceil(tokens / accept)
            log.append((self.server.server_address[1], tokens))
            time.sleep(request_s + verify * round_s)
            data = json.dumps({"output_ids": [5] * tokens,
                               "meta_info": {"completion_tokens": tokens, "spec_verify_ct": verify}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    import time

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_interleaved_passes_rotate_and_give_per_pass_ratios() -> None:
    """``passes``: every pass runs each server once, the order rotated, after one untimed warm request; the
    group's figures are medians over the passes of ratios taken within a pass, and ``slope_tokens`` gives the
    decode rounds alone (the per-request cost cancels). What is asserted is the structure (the order, the requests,
    each group figure the median of its passes' ratios): the ratios' values are wall-clock and move with the
    machine's load, so they are not asserted here."""
    import time

    log: list = []
    rival = _fake_server(0.002, 4.0, 0.03, log)
    tree = _fake_server(0.002, 6.0, 0.03, log)
    try:
        servers = {"dflash": _server("DFLASH"), "ddtree": _server("DDTREE", budget=16, speed_rival="dflash")}
        state = {"dflash": {"port": rival.server_address[1], "healthy": True},
                 "ddtree": {"port": tree.server_address[1], "healthy": True}}
        ph = {"name": "speed_c1", "passes": 3, "n": 2, "concurrency": 1, "max_new_tokens": 96, "slope_tokens": 24,
              "prompts": "random"}
        outs = sc.run_interleaved({}, ph, ["dflash", "ddtree"], state, time.time() + 60)
        order = [o["server"] for o in outs if o["phase"].startswith("speed_c1#")]
        assert order == ["dflash", "ddtree", "ddtree", "dflash", "dflash", "ddtree"]
        first = [tokens for port, tokens in log[:5]]
        assert first == [8, 24, 24, 96, 96]  # warm, short x2, long x2
        assert {o["group"] for o in outs} == {"speed_c1", "speed_c1-short"}
        cmp = sc.compare(_results(servers, outs))
        g = next(x for x in cmp["speed_groups"] if x["server"] == "ddtree")
        assert g["passes"] == 3 and g["rival"] == "dflash"
        per_pass = [r for r in cmp["speed"] if r.get("group") == "speed_c1" and r["server"] == "ddtree"]
        assert len(per_pass) == 3
        for key in ("round_cost_vs_rival", "tok_per_s_vs_rival", "slope_round_cost_vs_rival",
                    "slope_tok_per_s_vs_rival"):
            vals = [r[key] for r in per_pass]
            assert all(v > 0 for v in vals), (key, vals)
            assert g[key]["median"] == pytest.approx(statistics.median(vals), abs=1e-3), (key, g[key], vals)
            assert g[key]["min"] <= g[key]["median"] <= g[key]["max"]
    finally:
        rival.shutdown()
        tree.shutdown()


def test_median_interval_has_its_coverage() -> None:
    """The interval for the median from order statistics: at n 8 the 2nd and 7th values (93 %), at n 5 the
    1st and 5th (94 %), none for n 3 at 90 % (the widest, min-max, covers 75 %); and over draws from a known
    distribution it holds the true median at least as often as it says."""
    lo, hi, cov = sc.median_interval([8, 1, 7, 2, 6, 3, 5, 4])
    assert (lo, hi) == (2, 7) and cov == pytest.approx(0.9297, abs=1e-3)
    assert sc.median_interval([5, 1, 4, 2, 3])[:2] == (1, 5)
    assert sc.median_interval([1, 2, 3]) is None
    rng = random.Random(3)
    hits = 0
    for _ in range(400):
        xs = [rng.gauss(1.0, 0.3) for _ in range(8)]
        lo, hi, cov = sc.median_interval(xs)
        hits += lo <= 1.0 <= hi
    assert hits / 400 >= 0.90


def _pass_record(server: str, p: int, cost: float, slope_cost: float) -> dict:
    return {"group": "speed_c1", "server": server, "pass": p, "rival": "dflash", "algo": "DDTREE", "budget": 16,
            "concurrency": 1, "round_ms": 4.0 * cost, "tok_per_s": 1000.0, "accept_len": 7.0,
            "round_cost_vs_rival": cost, "slope_round_cost_vs_rival": slope_cost}


def test_pooled_sessions_decide_what_one_session_cannot() -> None:
    crit = [{"what": "b16 round", "group": "speed_c1", "server": "ddtree-b16.*", "metric": "slope_round_cost_vs_rival",
             "at_most": 1.15},
            {"what": "beside", "group": "speed_c1", "server": "ddtree-b16.*", "metric": "round_cost_vs_rival",
             "at_most": 1.0, "decides": False}]
    # one session's eight passes: the median 1.11, but its 93 % interval (2nd to 7th value) reaches 1.25
    spread = [0.95, 1.0, 1.05, 1.1, 1.12, 1.2, 1.25, 1.3]

    def session() -> dict:
        return {"speed": [_pass_record("ddtree-b16-graph", p, 1.2, x) for p, x in enumerate(spread)]}

    one = sc.pool([session()], crit)
    assert [c["verdict"] for c in one["criteria"]] == ["undecided", "missed"]
    assert not one["ok"]
    many = sc.pool([session() for _ in range(15)], crit)
    assert many["speed_groups"][0]["passes"] == 120
    # the deciding criterion is met; the one beside it is missed and does not decide
    assert [c["verdict"] for c in many["criteria"]] == ["met", "missed"]
    assert many["ok"]
    assert any(line.startswith("MET b16 round") for line in many["lines"])
    assert any("[beside: does not decide]" in line for line in many["lines"])


def test_judge_each_side_and_no_data() -> None:
    groups = [{"group": "g", "server": "s1", "passes": 9,
               "m": {"median": 1.25, "ci": [1.21, 1.3], "ci_coverage": 0.96}}]
    verdicts = [c["verdict"] for c in sc.judge(groups, [
        {"what": "a", "group": "g", "server": "s1", "metric": "m", "at_least": 1.2},
        {"what": "b", "group": "g", "server": "s1", "metric": "m", "at_least": 1.25},
        {"what": "c", "group": "g", "server": "s1", "metric": "m", "at_most": 1.2},
        {"what": "d", "group": "g", "server": "s.", "metric": "m", "at_least": 1.4},
        {"what": "e", "group": "g", "server": "s", "metric": "m", "at_least": 1.0},
        {"what": "f", "group": "g", "server": "s1", "metric": "other", "at_least": 1.0}])]
    assert verdicts == ["met", "undecided", "missed", "missed", "no data", "no data"]
    assert not sc.pool([{"speed": []}], [{"what": "x", "group": "g", "server": "s", "metric": "m",
                                          "at_most": 1}])["ok"]


def test_pool_command_exit_status(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys
    v = tmp_path / "v.json"
    v.write_text(json.dumps({"speed": [_pass_record("ddtree-b16-graph", p, 1.05, 1.0 + 0.001 * p)
                                       for p in range(20)]}))
    for bound, rc in ((1.15, 0), (1.0, 1)):
        c = tmp_path / f"c{rc}.json"
        c.write_text(json.dumps({"criteria": [{"what": "w", "group": "speed_c1", "server": "ddtree-b16-graph",
                                               "metric": "slope_round_cost_vs_rival", "at_most": bound}]}))
        out = subprocess.run([sys.executable, str(ROOT / "bench" / "ddtree" / "serve_check.py"), "pool", str(v),
                              "--criteria", str(c), "--json", str(tmp_path / "o.json")],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == rc, out.stderr
        assert ("MET w" if rc == 0 else "MISSED w") in out.stdout
        assert json.loads((tmp_path / "o.json").read_text())["ok"] is (rc == 0)


def test_interleaved_phases_share_the_time_left_by_their_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two interleaved phases of 20 planned passes each and time for 24 (on a clock that only the runs move):
    the first stops at its share, so the second gets passes too (before, the first took every pass the budget
    allowed and the second none)."""
    clock = [1000.0]

    class Clock:
        @staticmethod
        def time() -> float:
            return clock[0]

    def fake_run(plan: dict, ph: dict, name: str, rec: dict) -> dict:
        clock[0] += 0.25 if ph["max_new_tokens"] == 8 else 1.0  # the warm request, then the timed run (exact sums)
        return {"phase": ph["name"], "server": name}

    monkeypatch.setattr(sc, "run_phase_on", fake_run)
    monkeypatch.setattr(sc, "time", Clock)
    state = {"a": {"port": 1, "healthy": True}}
    phases = [{"name": "c1", "passes": 20, "max_new_tokens": 64, "reserve_s": 5},
              {"name": "c32", "passes": 20, "max_new_tokens": 64, "reserve_s": 5}]
    deadline = clock[0] + 5 + 24 * 1.25
    end = sc.pass_share_end(phases, 0, clock[0], deadline)
    assert end == clock[0] + 12 * 1.25
    first = sc.run_interleaved({}, phases[0], ["a"], state, deadline, end)
    assert len(first) == 12 and clock[0] <= end
    second = sc.run_interleaved({}, phases[1], ["a"], state, deadline,
                                sc.pass_share_end(phases, 1, clock[0], deadline))
    assert len(second) == 12
    # the last interleaved phase may use all that is left before the reserve; without a share the first
    # phase would have run 20 passes and left the second 4
    assert sc.pass_share_end(phases, 1, 1000.0, deadline) == pytest.approx(deadline - 5)
    clock[0] = 1000.0
    assert len(sc.run_interleaved({}, phases[0], ["a"], state, deadline)) == 20
