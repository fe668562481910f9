#!/usr/bin/env python3
"""Run real SGLang servers on a GPU host and compare what they serve: DDTree's validation matrix.

Each *run* starts ``python -m sglang.launch_server`` with one configuration (no speculation, DFLASH or
DDTREE over a tiny target from make_tiny.py), waits for ``/health``, sends HTTP ``/generate`` requests
with ``input_ids`` at the asked concurrencies, records every output and the speculative counters, sends
one request DDTREE cannot serve (it must get an error response while the server stays up), stops the
server and scans its log (tracebacks, SGLang's idle KV-leak check). Results are written after every run,
so a run cut short by a time limit keeps what finished.

``compare`` then judges the runs: greedy outputs token-identical to the non-speculative run, sampled
next-token frequencies in chi-square bounds (with a control that must fail), accept lengths, time per
round, tokens per second.

Usage (on the GPU host, the payload on PYTHONPATH):
    python bench/ddtree/serve_check.py run --plan PLAN.json --out results.json
    python bench/ddtree/serve_check.py compare results.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VOCAB_LO, VOCAB_HI = 3, 62  # prompt tokens: not pad/bos/eos, not the drafter's mask token (63)
LOG_ERRORS = re.compile(r"Traceback \(most recent call last\)|memory leak|leak detected|CUDA error|"
                        r"RuntimeError|AssertionError|out of memory", re.I)


def prompts(n: int, seed: int, shared_prefix: int = 0) -> list[list[int]]:
    """``n`` prompts of 4..160 tokens; with ``shared_prefix``, groups of 8 share that many first tokens
    (radix-cache hits)."""
    rng = random.Random(seed)
    out, prefix = [], []
    for i in range(n):
        if shared_prefix and i % 8 == 0:
            prefix = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(shared_prefix)]
        body = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(rng.randrange(4, 160))]
        out.append((prefix + body) if shared_prefix else body)
    return out


def post(url: str, payload: dict, timeout: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body or b"{}")
        except ValueError:
            return e.code, {"raw": body.decode(errors="replace")[:500]}


def get(url: str, timeout: float = 5) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


def server_argv(run: dict, port: int) -> list[str]:
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", run["model"], "--host", "127.0.0.1",
            "--port", str(port), "--skip-tokenizer-init", "--attention-backend", "triton",
            "--sampling-backend", "pytorch", "--dtype", "bfloat16", "--mem-fraction-static",
            str(run.get("mem_fraction", 0.35)), "--max-running-requests", str(run.get("max_running", 48)),
            "--tp", str(run.get("tp", 1)), "--random-seed", "7", "--log-level", "info"]
    algo = run.get("algo", "none")
    if algo != "none":
        argv += ["--speculative-algorithm", algo, "--speculative-draft-model-path", run["draft"]]
        if algo == "DDTREE":
            argv += ["--speculative-ddtree-budget", str(run.get("budget", 16))]
    return argv + [str(a) for a in run.get("args", [])]


def start(run: dict, port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in run.get("env", {}).items()})
    fh = log.open("w")
    return subprocess.Popen(server_argv(run, port), stdout=fh, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def generate_all(base: str, items: list[list[int]], sampling: dict, concurrency: int) -> tuple[list, float]:
    def one(ids):
        t0 = time.perf_counter()
        code, body = post(base + "/generate", {"input_ids": ids, "sampling_params": sampling})
        meta = body.get("meta_info", {}) if isinstance(body, dict) else {}
        return {"code": code, "output_ids": body.get("output_ids") if isinstance(body, dict) else None,
                "completion_tokens": meta.get("completion_tokens"), "spec_verify_ct": meta.get("spec_verify_ct"),
                "error": None if code == 200 else body, "latency_s": time.perf_counter() - t0}

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, items))
    return results, time.perf_counter() - t0


def do_run(run: dict, port: int, outdir: Path, deadline: float) -> dict:
    log = outdir / f"{run['name']}.log"
    rec: dict = {"name": run["name"], "config": run, "argv": server_argv(run, port), "log": log.name}
    proc = start(run, port, log)
    base = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    try:
        while True:
            if proc.poll() is not None:
                rec["start_error"] = f"server exited with {proc.returncode} before /health"
                return rec
            if get(base + "/health") == 200:
                break
            if time.time() > deadline or time.perf_counter() - t0 > run.get("start_timeout", 420):
                rec["start_error"] = "no /health 200 in time"
                return rec
            time.sleep(1)
        rec["start_s"] = round(time.perf_counter() - t0, 1)
        rec["phases"] = []
        for ph in run["phases"]:
            if time.time() > deadline - 20:
                rec["phases"].append({"name": ph["name"], "skipped": "time"})
                continue
            items = prompts(ph["n"], ph.get("seed", 0), ph.get("shared_prefix", 0))
            if ph.get("repeat_prompt"):
                items = [items[0]] * ph["n"]
            sampling = {"max_new_tokens": ph.get("max_new_tokens", 32), "temperature": ph.get("temperature", 0.0),
                        "ignore_eos": True}
            if ph.get("top_p") is not None:
                sampling["top_p"] = ph["top_p"]
            res, wall = generate_all(base, items, sampling, ph.get("concurrency", 1))
            toks = sum(r["completion_tokens"] or 0 for r in res)
            verify = sum(r["spec_verify_ct"] or 0 for r in res)
            rec["phases"].append({
                "name": ph["name"], "n": ph["n"], "concurrency": ph.get("concurrency", 1), "sampling": sampling,
                "wall_s": round(wall, 3), "tokens": toks, "tok_per_s": round(toks / wall, 1) if wall else None,
                "verify_ct": verify, "accept_len": round(toks / verify, 3) if verify else None,
                "errors": [r["error"] for r in res if r["code"] != 200][:5],
                "n_errors": sum(r["code"] != 200 for r in res),
                "outputs": [r["output_ids"] for r in res],
            })
            (outdir / f"{run['name']}.partial.json").write_text(json.dumps(rec))
        if run.get("algo") == "DDTREE":
            code, body = post(base + "/generate", {"input_ids": [5, 6, 7], "return_logprob": True,
                                                   "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
            rec["unsupported_request"] = {"code": code, "body": str(body)[:400], "health_after": get(base + "/health")}
        time.sleep(run.get("idle_s", 3))  # let the scheduler's idle memory check run
        rec["alive_at_end"] = proc.poll() is None
    finally:
        stop(proc)
        text = log.read_text(errors="replace") if log.exists() else ""
        rec["log_errors"] = [ln[:300] for ln in text.splitlines() if LOG_ERRORS.search(ln)][:20]
        rec["log_tail"] = text.splitlines()[-15:]
        rec["tree_hashes"] = re.findall(r"DDTREE tree hash tp_rank=(\d+) step=(\d+) ([0-9a-f]+)", text)[:20000]
    return rec


def cmd_run(args) -> int:
    plan = json.loads(Path(args.plan).read_text())
    out = Path(args.out)
    outdir = out.parent
    outdir.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget_s
    results = json.loads(out.read_text()) if out.exists() else {"runs": []}
    for i, run in enumerate(plan["runs"]):
        if args.only and run["name"] not in args.only:
            continue
        if time.time() > deadline - 60:
            print(f"skip {run['name']}: time", flush=True)
            continue
        print(f"== {run['name']}", flush=True)
        rec = do_run(run, args.port + i, outdir, deadline)
        summary = {k: rec.get(k) for k in ("start_s", "start_error", "alive_at_end", "unsupported_request")}
        summary["phases"] = [{k: p.get(k) for k in ("name", "tok_per_s", "accept_len", "n_errors", "skipped")}
                             for p in rec.get("phases", [])]
        print(json.dumps(summary), flush=True)
        for e in rec.get("log_errors", [])[:6]:
            print("   log:", e, flush=True)
        results["runs"] = [r for r in results["runs"] if r["name"] != rec["name"]] + [rec]
        out.write_text(json.dumps(results))
    return 0


def chi2_two_sample(a: list[int], b: list[int]) -> tuple[float, int]:
    """Two-sample chi-square over the categories seen (cells with a small pooled count merged)."""
    cats = sorted(set(a) | set(b))
    ca = {c: a.count(c) for c in cats}
    cb = {c: b.count(c) for c in cats}
    na, nb = len(a), len(b)
    stat, df, rest_a, rest_b = 0.0, -1, 0, 0
    for c in cats:
        if ca[c] + cb[c] < 10:
            rest_a, rest_b = rest_a + ca[c], rest_b + cb[c]
            continue
        stat += _cell(ca[c], cb[c], na, nb)
        df += 1
    if rest_a + rest_b:
        stat += _cell(rest_a, rest_b, na, nb)
        df += 1
    return stat, max(df, 1)


def _cell(x: int, y: int, na: int, nb: int) -> float:
    tot = x + y
    ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
    return (x - ea) ** 2 / ea + (y - eb) ** 2 / eb


def cmd_compare(args) -> int:
    res = {r["name"]: r for r in json.loads(Path(args.results).read_text())["runs"]}
    ok = True
    for name, r in res.items():
        base_name = r["config"].get("baseline")
        if not base_name or base_name not in res:
            continue
        base = res[base_name]
        for ph in r.get("phases", []):
            bph = next((p for p in base.get("phases", []) if p["name"] == ph["name"]), None)
            if bph is None or "outputs" not in ph or "outputs" not in bph:
                continue
            line = f"{name}/{ph['name']} vs {base_name}: "
            if ph["sampling"]["temperature"] == 0:
                same = sum(1 for x, y in zip(ph["outputs"], bph["outputs"], strict=False) if x == y and x is not None)
                verdict = same == len(bph["outputs"]) and ph["n_errors"] == 0
                line += f"greedy identical {same}/{len(bph['outputs'])}"
            else:
                verdict = True
                parts = []
                for k in range(min(len(ph["outputs"][0] or []), 3)):
                    a = [o[k] for o in ph["outputs"] if o]
                    b = [o[k] for o in bph["outputs"] if o]
                    stat, df = chi2_two_sample(a, b)
                    bound = df + 5 * math.sqrt(2 * df)
                    parts.append(f"pos{k} chi2/df {stat:.1f}/{df} (bound {bound:.1f})")
                    verdict = verdict and stat <= bound
                line += ", ".join(parts)
            expect_fail = r["config"].get("expect_fail", False)
            passed = verdict != expect_fail
            ok = ok and passed
            line += f", accept_len {ph.get('accept_len')}, {ph.get('tok_per_s')} tok/s vs {bph.get('tok_per_s')}"
            print(("PASS " if passed else "FAIL ") + line + (" (control: must fail)" if expect_fail else ""))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--plan", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--port", type=int, default=31000)
    r.add_argument("--budget-s", type=float, default=540)
    r.add_argument("--only", nargs="*")
    c = sub.add_parser("compare")
    c.add_argument("results")
    args = ap.parse_args()
    return cmd_run(args) if args.cmd == "run" else cmd_compare(args)


if __name__ == "__main__":
    sys.exit(main())
