#!/usr/bin/env python3
"""Real SGLang servers on a GPU host, judged: DDTree's losslessness, acceptance and round cost.

A *plan* (``plans/*.json``) names servers (no speculation, DFLASH, DDTREE at a budget, a control) and
phases (requests at a concurrency and sampling setting, sent to some of the servers). The commands:

``up``       start every server of the plan in its own process session (it outlives this command, so a
             later command on the same host measures it), the ``wave`` 0 servers first (they compile the
             JIT and Triton caches the others reuse), wait for ``/health``; state in ``--state``;
``measure``  run the phases: a non-exclusive phase goes to all its servers at once (correctness phases:
             the GPU is shared, so their timings are not reported as speeds); an ``exclusive`` phase runs
             on one server at a time while every other server of the state is stopped (SIGSTOP: no CPU or
             GPU use) -- the speed, accept-length and round-cost figures come from these. Then, for each
             greedy request whose output differs from its baseline's, the baseline server's own top-k
             log-probabilities at the first divergent position (``tie probes``), and for DDTREE servers the
             requests it must refuse (each must get an error answer and leave the server healthy);
``down``     stop the servers, scan their logs (tracebacks, CUDA errors, SGLang's idle leak check), keep the
             lines that carry figures (CUDA-graph memory, start-up timings, DDTREE phase profiles);
``compare``  judge a results file: the greedy criterion (identical to the baseline on >= 99.5% of
             requests; every divergence a near-tie of the baseline's own distribution, |delta logprob| <
             0.1; never more divergences than DFLASH on the same requests), the sampled criterion (a
             two-sample chi-square per generated position between a speculative server and its baseline,
             p-values family-wise corrected; controls -- a deliberately biased acceptance rule -- must
             fail it), accept lengths per budget, tokens/s and the cost of one round;
``run``      up + measure + down in one command.

Prompts come from a JSON file of the plan (``{"greedy": [[ids]...], "sampled": [[ids]...]}``: the trained
pair's language, ``make_trained.py --prompts``) or, for the random pair, random token ids (``"random"``).
Results are written after every phase, so a command cut short by its deadline keeps what finished.

The criteria themselves (the thresholds, the chi-square test and its Bonferroni level, the near-tie rule, the
request kinds DDTREE must refuse) are the product's: ``doctor.sglang.validation.criteria``, the one
implementation ``k26-doctor validate`` judges with; this harness adds the plan's phases, controls and twins.

Usage (on the GPU host, the payload on PYTHONPATH):
    python bench/ddtree/serve_check.py up      --plan PLAN.json --state state.json
    python bench/ddtree/serve_check.py measure --plan PLAN.json --state state.json --out results.json
    python bench/ddtree/serve_check.py down    --state state.json --out results.json
    python bench/ddtree/serve_check.py compare results.json [--json verdicts.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

LOG_ERRORS = re.compile(r"Traceback \(most recent call last\)|memory leak|leak detected|CUDA error|"
                        r"RuntimeError|AssertionError|out of memory|illegal memory access", re.I)
LOG_FIGURES = re.compile(r"Capture .* CUDA graph end|KV Cache is allocated|Engine startup timings|"
                         r"DDTREE (phase|profile)|K26 phase profile|sampling pre-warm|max_total_num_tokens=|"
                         r"Memory pool end|DDTREE worker|DDTREE verify|Load weight end")
TREE_HASH = re.compile(r"DDTREE tree hash tp_rank=(\d+) step=(\d+) ([0-9a-f]+)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: the product's criteria
from doctor.sglang.validation import criteria  # noqa: E402
from doctor.sglang.validation.criteria import (  # noqa: E402
    FAMILY_ALPHA,
    GREEDY_SAME_MIN,
    MIN_SAMPLED_N,
    NEAR_TIE,
    chi2_sf,
    chi2_two_sample,
)

__all__ = ["FAMILY_ALPHA", "GREEDY_SAME_MIN", "MIN_SAMPLED_N", "NEAR_TIE", "chi2_sf", "chi2_two_sample"]


# --------------------------------------------------------------------------- plan


def expand(value: Any, env: dict[str, str]) -> Any:
    """``$NAME`` / ``${NAME}`` in strings replaced from ``env`` (paths of the pair built on the host)."""
    if isinstance(value, str):
        return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [expand(v, env) for v in value]
    if isinstance(value, dict):
        return {k: expand(v, env) for k, v in value.items()}
    return value


def load_plan(path: str) -> dict:
    plan = expand(json.loads(Path(path).read_text()), dict(os.environ))
    defaults = plan.get("defaults", {})
    servers = []
    for i, s in enumerate(plan["servers"]):
        merged = {**defaults, **s}
        merged["args"] = list(defaults.get("args", [])) + list(s.get("args", []))
        merged["env"] = {**defaults.get("env", {}), **s.get("env", {})}
        merged.setdefault("port", plan.get("base_port", 31000) + i)
        servers.append(merged)
    plan["servers"] = servers
    names = [s["name"] for s in servers]
    if len(set(names)) != len(names):
        raise SystemExit(f"plan: duplicate server names in {names}")
    for ph in plan.get("phases", []):
        wanted = ph.get("servers", "*")
        # in the order of the phase's patterns (an exclusive phase runs its servers in that order)
        ph["servers"] = names if wanted == "*" else list(dict.fromkeys(
            n for w in wanted for n in names if re.fullmatch(w, n)))
    return plan


def server_argv(s: dict) -> list[str]:
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", s["model"], "--host", "127.0.0.1",
            "--port", str(s["port"]), "--skip-tokenizer-init", "--attention-backend", "triton",
            "--sampling-backend", "pytorch", "--dtype", "bfloat16",
            "--mem-fraction-static", str(s.get("mem_fraction", 0.88)),
            "--max-running-requests", str(s.get("max_running", 64)), "--tp", str(s.get("tp", 1)),
            "--random-seed", str(s.get("seed", 7)), "--log-level", "info"]
    if s.get("max_total_tokens"):
        argv += ["--max-total-tokens", str(s["max_total_tokens"])]
    algo = s.get("algo", "none")
    if algo != "none":
        argv += ["--speculative-algorithm", algo, "--speculative-draft-model-path", s["draft"]]
        if algo == "DDTREE":
            argv += ["--speculative-ddtree-budget", str(s.get("budget", 16))]
    return argv + [str(a) for a in s.get("args", [])]


# --------------------------------------------------------------------------- prompts


def random_prompts(n: int, seed: int, lo: int = 3, hi: int = 62) -> list[list[int]]:
    """The random pair's prompts: ``n`` prompts of 4..160 token ids in [lo, hi)."""
    rng = random.Random(seed)
    return [[rng.randrange(lo, hi) for _ in range(rng.randrange(4, 160))] for _ in range(n)]


def phase_prompts(plan: dict, ph: dict) -> list[list[int]]:
    """The phase's ``n`` prompts: random ids, or the plan's prompt file's ``kind`` list from ``offset`` on
    (cycled); ``repeat_prompt``: the first of them ``n`` times (a sampled test of one context)."""
    kind = ph.get("prompts", "random")
    n = int(ph["n"])
    if kind == "random":
        pool = random_prompts(n, ph.get("seed", 0))
    else:
        pool = json.loads(Path(plan["prompts"]).read_text()).get(kind) or []
        if not pool:
            raise SystemExit(f"plan: no {kind!r} prompts in {plan['prompts']}")
    start = int(ph.get("offset", 0))
    if ph.get("repeat_prompt"):
        return [pool[start % len(pool)]] * n
    return [pool[(start + i) % len(pool)] for i in range(n)]


def sampling_params(ph: dict) -> dict:
    sp = {"max_new_tokens": ph.get("max_new_tokens", 32), "temperature": ph.get("temperature", 0.0),
          "ignore_eos": True}
    for key in ("top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
        if ph.get(key) is not None:
            sp[key] = ph[key]
    return sp


# --------------------------------------------------------------------------- HTTP


def post(url: str, payload: dict, timeout: float = 120) -> tuple[int, Any]:
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
    except (urllib.error.URLError, OSError, ValueError) as e:
        return 0, {"error": f"{type(e).__name__}: {e}"}


def get(url: str, timeout: float = 5) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


def generate_all(base: str, items: list[list[int]], sampling: dict, concurrency: int,
                 extra: dict | None = None) -> tuple[list[dict], float]:
    def one(ids: list[int]) -> dict:
        t0 = time.perf_counter()
        code, body = post(base + "/generate", {"input_ids": ids, "sampling_params": sampling, **(extra or {})})
        meta = body.get("meta_info", {}) if isinstance(body, dict) else {}
        return {"code": code, "output_ids": body.get("output_ids") if isinstance(body, dict) else None,
                "completion_tokens": meta.get("completion_tokens"), "spec_verify_ct": meta.get("spec_verify_ct"),
                "meta": {k: meta[k] for k in ("output_top_logprobs", "output_token_logprobs") if k in meta},
                "error": None if code == 200 else body, "latency_s": time.perf_counter() - t0}

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(one, items))
    return results, time.perf_counter() - t0


# --------------------------------------------------------------------------- up / down


def cpu_list(spec: str) -> set[int]:
    """``"2-9,12"`` -> {2, ..., 9, 12} (taskset's list form)."""
    cpus: set[int] = set()
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise SystemExit(f"plan: bad CPU list {spec!r}")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def launch_argv(s: dict) -> list[str]:
    """The server's command line, pinned to the plan's ``cpus`` when it names some (``taskset -c``: every
    process of the server inherits it, so one server's scheduler never shares a core with the client)."""
    argv = server_argv(s)
    if s.get("cpus"):
        cpus = ",".join(str(c) for c in sorted(cpu_list(s["cpus"])))
        taskset = shutil.which("taskset")
        if taskset is None:  # a host without util-linux: the server runs unpinned, and says so
            print(f"  {s['name']}: no taskset on this host: not pinned to CPUs {cpus}", flush=True)
            return argv
        argv = [taskset, "-c", cpus, *argv]
    return argv


def start(s: dict, logdir: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in s.get("env", {}).items()})
    log = logdir / f"{s['name']}.log"
    fh = log.open("w")
    return subprocess.Popen(launch_argv(s), stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process counts as gone
        pid_done, _ = os.waitpid(pid, os.WNOHANG)
        return pid_done == 0
    except ChildProcessError:
        return True


def wait_healthy(servers: list[dict], procs: dict[str, subprocess.Popen], state: dict, deadline: float) -> None:
    pending = {s["name"]: s for s in servers}
    t0 = time.perf_counter()
    while pending:
        for name, s in list(pending.items()):
            rec = state[name]
            if procs[name].poll() is not None:
                rec["start_error"] = f"server exited with {procs[name].returncode} before /health"
            elif get(f"http://127.0.0.1:{s['port']}/health") == 200:
                rec["start_s"] = round(time.perf_counter() - rec.pop("_t0", t0), 1)
                rec["healthy"] = True
            elif time.time() > deadline:
                rec["start_error"] = "no /health 200 before the deadline"
            else:
                continue
            said = f"up in {rec['start_s']:.1f} s" if rec.get("healthy") else rec["start_error"]
            print(f"  {name}: {said}", flush=True)
            del pending[name]
        if pending:
            time.sleep(1)


def cmd_up(args) -> int:
    plan = load_plan(args.plan)
    logdir = Path(args.logs)
    logdir.mkdir(parents=True, exist_ok=True)
    state_path = Path(args.state[0])
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    deadline = time.time() + args.budget_s
    chosen = [s for s in plan["servers"] if (not args.only or s["name"] in args.only)
              and (args.wave is None or int(s.get("wave", 1)) in args.wave)]
    waves = sorted({int(s.get("wave", 1)) for s in chosen})
    for wave in waves:
        group = [s for s in chosen if int(s.get("wave", 1)) == wave and not state.get(s["name"], {}).get("healthy")]
        if not group:
            continue
        print(f"== wave {wave}: {' '.join(s['name'] for s in group)}", flush=True)
        procs = {}
        for s in group:
            procs[s["name"]] = start(s, logdir)
            state[s["name"]] = {"pid": procs[s["name"]].pid, "port": s["port"], "log": str(logdir / f"{s['name']}.log"),
                                "argv": server_argv(s), "config": s, "_t0": time.perf_counter()}
            time.sleep(args.stagger_s)
        wait_healthy(group, procs, state, deadline)
        state_path.write_text(json.dumps(state, indent=1))
    bad = [n for n, r in state.items() if not r.get("healthy")]
    return 1 if bad else 0


def stop_pid(pid: int, grace: float = 30) -> None:
    try:
        os.killpg(pid, signal.SIGCONT)
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    t0 = time.time()
    while time.time() - t0 < grace and alive(pid):
        time.sleep(0.5)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def scan_log(path: Path) -> dict:
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = text.splitlines()
    return {"log_errors": [ln[:300] for ln in lines if LOG_ERRORS.search(ln)][:30],
            "log_figures": [ln[:400] for ln in lines if LOG_FIGURES.search(ln)][:200],
            "log_tail": [ln[:300] for ln in lines[-15:]],
            "tree_hashes": TREE_HASH.findall(text)[:20000]}


def read_state(paths: list[str]) -> dict:
    """The servers of one or more state files (``up`` commands run side by side write one each)."""
    state: dict = {}
    for path in paths:
        if Path(path).exists():
            state.update(json.loads(Path(path).read_text()))
    return state


def cmd_down(args) -> int:
    state = read_state(args.state)
    results = read_results(args.out)
    for rec in state.values():  # every server told at once, then waited for
        if rec.get("pid"):
            rec["alive_at_end"] = alive(rec["pid"])
            try:
                os.killpg(rec["pid"], signal.SIGCONT)
                os.killpg(rec["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
    for rec in state.values():
        if rec.get("pid"):
            stop_pid(rec["pid"])
    for name, rec in state.items():
        results["servers"].setdefault(name, {}).update(
            {k: v for k, v in rec.items() if not k.startswith("_")}, **scan_log(Path(rec["log"])))
        print(f"{name}: alive_at_end={rec.get('alive_at_end')} errors={len(results['servers'][name]['log_errors'])}",
              flush=True)
    write_results(args.out, results)
    return 0


# --------------------------------------------------------------------------- measure


def read_results(path: str) -> dict:
    p = Path(path)
    res = json.loads(p.read_text()) if p.exists() else {}
    res.setdefault("servers", {})
    res.setdefault("phases", [])
    return res


_write_lock = threading.Lock()


def write_results(path: str, results: dict) -> None:
    with _write_lock:
        tmp = Path(path + ".tmp")
        tmp.write_text(json.dumps(results))
        os.replace(tmp, path)


def pause_others(state: dict, keep: str, sig: int) -> None:
    for name, rec in state.items():
        if name != keep and rec.get("healthy") and rec.get("pid"):
            try:
                os.killpg(rec["pid"], sig)
            except ProcessLookupError:
                pass


@contextlib.contextmanager
def alone(state: dict, name: str):
    """``name`` runs alone: every other server of the state stopped (SIGSTOP) meanwhile, resumed after."""
    pause_others(state, name, signal.SIGSTOP)
    try:
        yield
    finally:
        pause_others(state, name, signal.SIGCONT)


def start_torch_profile(base: str, ph: dict, name: str) -> tuple[Path | None, str | None]:
    """``torch_profile`` phases: SGLang's own profiler (``POST /start_profile``) over the phase's first
    ``num_steps`` scheduler steps, CPU and GPU activities; the trace lands in ``$WORK/aux/traces/``."""
    prof = ph.get("torch_profile")
    if not prof:
        return None, None
    out = Path(os.environ.get("WORK", "/tmp/k26-gpu")) / "aux" / "traces" / f"{ph['name']}-{name}"
    out.mkdir(parents=True, exist_ok=True)
    body = {"output_dir": str(out), "num_steps": int(prof.get("num_steps", 12)), "activities": ["CPU", "GPU"],
            "with_stack": bool(prof.get("with_stack", False)), "record_shapes": False,
            "profile_prefix": name}
    code, answer = post(base + "/start_profile", body, timeout=30)
    return out, None if code == 200 else f"/start_profile answered {code}: {str(answer)[:200]}"


def wait_trace(out: Path, timeout: float = 90) -> list[str]:
    """The trace files the profiler wrote into ``out`` (it writes them after its last step)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        found = sorted(out.glob("*.trace.json*"))
        if found and all(f.stat().st_size > 0 for f in found):
            time.sleep(1)  # the writer closes the file after its last write
            return [f.name for f in found]
        time.sleep(1)
    return []


def run_phase_on(plan: dict, ph: dict, name: str, rec: dict) -> dict:
    items = phase_prompts(plan, ph)
    sampling = sampling_params(ph)
    base = f"http://127.0.0.1:{rec['port']}"
    trace_dir, trace_error = start_torch_profile(base, ph, name)
    res, wall = generate_all(base, items, sampling, ph.get("concurrency", 1))
    traces = wait_trace(trace_dir) if trace_dir is not None and not trace_error else []
    toks = sum(r["completion_tokens"] or 0 for r in res)
    verify = sum(r["spec_verify_ct"] or 0 for r in res)
    conc = ph.get("concurrency", 1)
    return {"phase": ph["name"], "server": name, "n": len(items), "concurrency": conc, "sampling": sampling,
            "exclusive": bool(ph.get("exclusive")), "prompts": ph.get("prompts", "random"),
            "offset": ph.get("offset", 0), "repeat_prompt": bool(ph.get("repeat_prompt")),
            "wall_s": round(wall, 3), "tokens": toks,
            "tok_per_s": round(toks / wall, 1) if wall else None, "verify_ct": verify,
            "accept_len": round(toks / verify, 4) if verify else None,
            # time per verify round of one batch slot: with every slot busy, the cost of one round
            "round_ms": round(1000 * wall * conc / verify, 4) if verify else None,
            "errors": [r["error"] for r in res if r["code"] != 200][:5],
            "n_errors": sum(r["code"] != 200 for r in res),
            "inputs_digest": hash_ids(items), "outputs": [r["output_ids"] for r in res],
            **({"traces": traces, "trace_error": trace_error} if trace_dir is not None else {}),
            **({"slope_of": ph["slope_of"]} if ph.get("slope_of") else {})}


def pass_share_end(phases: list[dict], i: int, now: float, deadline: float) -> float:
    """When interleaved phase ``phases[i]`` must stop starting passes: its share of the time left before the
    deadline (less the reserve the phases after it keep), by planned passes among it and the interleaved phases
    after it. Without it the first phase took every pass the budget allowed and the next got none (the c32
    passes of two calls)."""
    mine = int(phases[i]["passes"])
    planned = sum(int(p["passes"]) for p in phases[i:] if p.get("passes"))
    left = deadline - max(p.get("reserve_s", 15) for p in phases[i:]) - now  # phases[i:] holds phase i
    return now + max(0.0, left) * mine / planned


def run_interleaved(plan: dict, ph: dict, targets: list[str], state: dict, deadline: float,
                    until: float | None = None) -> list[dict]:
    """A speed phase in ``passes`` short passes, each running every server once (alone: the others stopped),
    the order rotated from pass to pass. A host whose speed drifts (CPU placement, frequency, neighbours:
    one to two second phases moved 5-35 % between calls) then moves every server of a pass alike, and the
    per-pass ratios against the rival, taken seconds apart, keep what a single long phase per server
    loses. Each server first answers one short request after it is resumed (not timed). With
    ``slope_tokens`` each pass runs the prompts at that length too, right before the full length: the
    difference is the decode rounds alone. Records are named ``<phase>#<pass>`` (``group``: the phase). With
    ``until`` (``pass_share_end``), no pass starts that would end past it, judged by the longest pass so far."""
    outs: list[dict] = []
    passes = int(ph["passes"])
    warm = {**ph, "n": 1, "max_new_tokens": 8}
    longest = 0.0
    for i in range(passes):
        now = time.time()
        if now > deadline - ph.get("reserve_s", 15) or (until is not None and i and now + longest > until):
            print(f"  {ph['name']}: {i} of {passes} passes (time)", flush=True)
            break
        full = {**ph, "name": f"{ph['name']}#{i}"}
        runs = [(full, ph["name"])]
        if ph.get("slope_tokens"):
            short = {**ph, "name": f"{ph['name']}-short#{i}", "max_new_tokens": int(ph["slope_tokens"])}
            full["slope_of"] = short["name"]
            runs.insert(0, (short, f"{ph['name']}-short"))
        k = i % len(targets)
        for name in targets[k:] + targets[:k]:
            with alone(state, name):
                run_phase_on(plan, warm, name, state[name])
                outs += [{**run_phase_on(plan, run, name, state[name]), "group": group, "pass": i, "exclusive": True}
                         for run, group in runs]
        longest = max(longest, time.time() - now)
    return outs


def hash_ids(items: list[list[int]]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def cmd_measure(args) -> int:
    plan = load_plan(args.plan)
    state = read_state(args.state)
    results = read_results(args.out)
    results["plan"] = {k: plan.get(k) for k in ("name", "note", "prompts")}
    results["servers"].update({n: {k: v for k, v in r.items() if not k.startswith("_")} for n, r in state.items()})
    deadline = time.time() + args.budget_s
    healthy = {n for n, r in state.items() if r.get("healthy")}
    if plan.get("client_cpus") and hasattr(os, "sched_setaffinity"):
        # the load generator's threads off the servers' cores (``cpus`` of the servers)
        os.sched_setaffinity(0, cpu_list(plan["client_cpus"]) & os.sched_getaffinity(0) or os.sched_getaffinity(0))
    phases = [ph for ph in plan.get("phases", []) if not args.only or ph["name"] in args.only]
    for i, ph in enumerate(phases):
        targets = [n for n in ph["servers"] if n in healthy]
        if not targets:
            continue
        if time.time() > deadline - ph.get("reserve_s", 15):
            print(f"skip {ph['name']}: time", flush=True)
            results["phases"].append({"phase": ph["name"], "skipped": "time"})
            continue
        t0 = time.time()
        if ph.get("passes"):
            outs = run_interleaved(plan, ph, targets, state, deadline, pass_share_end(phases, i, t0, deadline))
        elif ph.get("exclusive"):
            outs = []
            for name in targets:
                with alone(state, name):
                    outs.append(run_phase_on(plan, ph, name, state[name]))
        else:
            with ThreadPoolExecutor(max_workers=len(targets)) as pool:
                outs = list(pool.map(lambda n, ph=ph: run_phase_on(plan, ph, n, state[n]), targets))
        for o in outs:
            results["phases"].append(o)
            print(f"  {ph['name']:>18} {o['server']:<22} n={o['n']:<5} err={o['n_errors']} tok/s={o['tok_per_s']} "
                  f"accept={o['accept_len']} round_ms={o['round_ms']}", flush=True)
        print(f"== {ph['name']}: {time.time() - t0:.1f} s", flush=True)
        write_results(args.out, results)
    if plan.get("tie_probes", True):
        tie_probes(plan, state, results)
        write_results(args.out, results)
    refusals(plan, state, results)
    write_results(args.out, results)
    return 0


def baseline_of(results: dict, server: str) -> str | None:
    return (results["servers"].get(server, {}).get("config") or {}).get("baseline")


def tie_probes(plan: dict, state: dict, results: dict, topn: int = 10) -> None:
    """At the first position where a greedy output leaves its baseline's, ask the baseline server for its own
    top-``topn`` log-probabilities after a prefill of prompt + the common prefix."""
    probes = []
    for ph in [p for p in results["phases"] if "outputs" in p and p["sampling"]["temperature"] == 0]:
        base = baseline_of(results, ph["server"])
        bph = find_phase(results, ph["phase"], base)
        if not bph or base not in state or not state[base].get("healthy"):
            continue
        items = phase_prompts(plan, next(p for p in plan["phases"] if p["name"] == ph["phase"]))
        for i, (a, b) in enumerate(zip(ph["outputs"], bph["outputs"], strict=False)):
            if a is None or b is None or a == b:
                continue
            k = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            probes.append((ph, i, k, items[i] + b[:k], b[k] if k < len(b) else None, a[k] if k < len(a) else None))
    port = None
    for ph, i, k, ids, base_tok, spec_tok in probes:
        base = baseline_of(results, ph["server"])
        port = state[base]["port"]
        code, body = post(f"http://127.0.0.1:{port}/generate",
                          {"input_ids": ids, "return_logprob": True, "top_logprobs_num": topn,
                           "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
        top = {}
        if code == 200 and isinstance(body, dict):
            rows = body.get("meta_info", {}).get("output_top_logprobs") or []
            for entry in (rows[0] if rows else []) or []:
                if entry and len(entry) >= 2:
                    top[int(entry[1])] = float(entry[0])
        _, delta = criteria.near_tie(top, base_tok, spec_tok)
        ph.setdefault("divergences", []).append(
            {"request": i, "position": k, "baseline_token": base_tok, "spec_token": spec_tok,
             "baseline_top": sorted(((v, t) for t, v in top.items()), reverse=True)[:5], "delta_logprob": delta,
             "probe_code": code})
    print(f"== tie probes: {len(probes)}", flush=True)


REFUSALS = list(criteria.REFUSALS)  # (name, request fields, sampling parameters): the product's list


def refusals(plan: dict, state: dict, results: dict) -> None:
    """Requests a DDTREE server cannot serve exactly: each must be answered with an error, and the server must
    stay healthy and keep serving."""
    for name, rec in state.items():
        if not rec.get("healthy") or (rec.get("config") or {}).get("algo") != "DDTREE":
            continue
        out = []
        base = f"http://127.0.0.1:{rec['port']}"
        for what, extra, sp in REFUSALS:
            code, body = post(base + "/generate", {"input_ids": [5, 6, 7, 8], **extra,
                                                   "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, **sp}})
            out.append({"what": what, "code": code, "body": str(body)[:300], "health_after": get(base + "/health")})
        code, body = post(base + "/generate", {"input_ids": [5, 6, 7, 8],
                                               "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}})
        results["servers"].setdefault(name, {})["refusals"] = out
        results["servers"][name]["served_after_refusals"] = code == 200
    print("== refusals probed", flush=True)


def find_phase(results: dict, phase: str, server: str | None) -> dict | None:
    return next((p for p in results["phases"] if p.get("phase") == phase and p.get("server") == server
                 and "outputs" in p), None)


# --------------------------------------------------------------------------- statistics


# --------------------------------------------------------------------------- compare


def speed_slope(results: dict, ph: dict) -> dict | None:
    """A long phase minus its short twin (``slope_of``, the same server, prompts and concurrency): the time of
    the extra decode rounds alone, without the per-request costs (HTTP, scheduling, prefill) that both
    phases pay alike -- at a fixed number of requests, those costs weigh more per round on the server that
    needs fewer rounds, so a plain ratio of whole phases under-states a higher-acceptance server."""
    short = find_phase(results, ph.get("slope_of") or "", ph["server"]) if ph.get("slope_of") else None
    if not short or short.get("concurrency") != ph.get("concurrency"):
        return None
    d_wall, d_verify = ph["wall_s"] - short["wall_s"], ph["verify_ct"] - short["verify_ct"]
    d_tokens = ph["tokens"] - short["tokens"]
    if d_wall <= 0 or d_verify <= 0:
        return None
    return {"slope_round_ms": round(1000 * d_wall * ph["concurrency"] / d_verify, 4),
            "slope_tok_per_s": round(d_tokens / d_wall, 1), "slope_accept_len": round(d_tokens / d_verify, 4)}


def cmd_compare(args) -> int:
    results = read_results(args.results)
    verdicts = compare(results)
    for line in verdicts["lines"]:
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(verdicts, indent=1) + "\n")
    return 0 if verdicts["ok"] else 1


def compare(results: dict) -> dict:
    """Every judgement of a results file, as lines and as data."""
    lines: list[str] = []
    ok = True
    servers = results["servers"]
    out: dict[str, Any] = {"greedy": [], "sampled": [], "speed": [], "servers": {}}

    for name, s in sorted(servers.items()):
        cfg = s.get("config") or {}
        bad_refusals = [r["what"] for r in s.get("refusals", []) if r["code"] == 200 or r["health_after"] != 200]
        healthy = s.get("healthy") and s.get("alive_at_end", True) is not False
        good = bool(healthy) and not s.get("log_errors") and not bad_refusals and s.get("served_after_refusals", True)
        out["servers"][name] = {"algo": cfg.get("algo"), "budget": cfg.get("budget"), "start_s": s.get("start_s"),
                                "healthy": healthy, "log_errors": len(s.get("log_errors", [])),
                                "refusals_not_refused": bad_refusals}
        ok = ok and good
        lines.append(f"{'PASS' if good else 'FAIL'} server {name}: start {s.get('start_s')} s, "
                     f"log errors {len(s.get('log_errors', []))}, refusals not refused {bad_refusals or 'none'}"
                     + (f", {s.get('start_error')}" if s.get("start_error") else ""))

    # greedy: identical to the baseline; divergences are near-ties; never more than DFLASH's
    greedy = [p for p in results["phases"] if "outputs" in p and p["sampling"]["temperature"] == 0]
    by_server: dict[str, dict] = {}
    for ph in greedy:
        base = baseline_of(results, ph["server"])
        bph = find_phase(results, ph["phase"], base)
        if not bph or bph["inputs_digest"] != ph["inputs_digest"]:
            continue
        pairs = list(zip(ph["outputs"], bph["outputs"], strict=False))
        diverged = [i for i, (a, b) in enumerate(pairs) if a != b or a is None]
        agg = by_server.setdefault(ph["server"], {"n": 0, "same": 0, "divergences": [], "errors": 0})
        agg["n"] += len(pairs)
        agg["same"] += len(pairs) - len(diverged)
        agg["errors"] += ph["n_errors"]
        agg["divergences"] += [dict(d, phase=ph["phase"]) for d in ph.get("divergences", [])]
        agg.setdefault("diverged", {})[ph["phase"]] = diverged
        agg["baseline"] = base
    for name, agg in sorted(by_server.items()):
        cfg = servers[name].get("config") or {}
        if cfg.get("expect_fail"):
            continue
        share = agg["same"] / agg["n"] if agg["n"] else 0.0
        not_ties = [d for d in agg["divergences"] if d["delta_logprob"] is None or d["delta_logprob"] >= NEAR_TIE]
        n_div = agg["n"] - agg["same"]
        unprobed = n_div - len(agg["divergences"])
        rival = cfg.get("greedy_rival")  # the DFLASH server of the same mode
        more_than_rival = None
        if rival and rival in by_server:
            mine = sum(len(v) for v in agg["diverged"].values())
            theirs = sum(len(by_server[rival]["diverged"].get(k, [])) for k in agg["diverged"])
            more_than_rival = mine > theirs
        verdict = (share >= GREEDY_SAME_MIN and not not_ties and unprobed == 0 and agg["errors"] == 0
                   and not more_than_rival)
        ok = ok and verdict
        rec = {"server": name, "baseline": agg["baseline"], "n": agg["n"], "identical": agg["same"],
               "share": round(share, 5), "divergences": agg["divergences"], "not_near_ties": len(not_ties),
               "unprobed": unprobed, "rival": rival, "more_divergences_than_rival": more_than_rival,
               "errors": agg["errors"], "pass": verdict}
        out["greedy"].append(rec)
        lines.append(f"{'PASS' if verdict else 'FAIL'} greedy {name} vs {agg['baseline']}: identical "
                     f"{agg['same']}/{agg['n']} ({100 * share:.2f}%), divergences {n_div} (near-ties "
                     f"{n_div - len(not_ties) - unprobed}, not {len(not_ties)}, unprobed {unprobed})"
                     + (f", vs {rival}: {'more' if more_than_rival else 'not more'}" if rival else "")
                     + (f", errors {agg['errors']}" if agg["errors"] else ""))

    # twins: the same algorithm at another parallel size -- greedy outputs identical within the near-tie rule
    # (probed on the baseline), accept length within a tolerance
    for name, s in sorted(servers.items()):
        cfg = s.get("config") or {}
        twin = cfg.get("greedy_twin")
        if not twin or twin not in servers:
            continue
        same = n = 0
        accepts = []
        for ph in [p for p in greedy if p["server"] == name]:
            tph = find_phase(results, ph["phase"], twin)
            if not tph or tph["inputs_digest"] != ph["inputs_digest"]:
                continue
            pairs = list(zip(ph["outputs"], tph["outputs"], strict=False))
            n += len(pairs)
            same += sum(1 for a, b in pairs if a == b and a is not None)
            if ph.get("accept_len") and tph.get("accept_len"):
                accepts.append(ph["accept_len"] / tph["accept_len"])
        agg = by_server.get(name, {})
        twin_div = sum(len(v) for v in by_server.get(twin, {}).get("diverged", {}).values())
        own_div = sum(len(v) for v in agg.get("diverged", {}).values())
        tol = float(cfg.get("accept_tolerance", 0.02))
        accept_ok = bool(accepts) and all(abs(r - 1) <= tol for r in accepts)
        verdict = n > 0 and same / n >= GREEDY_SAME_MIN and own_div <= twin_div + (n - same) and accept_ok
        ok = ok and verdict
        out.setdefault("twins", []).append({"server": name, "twin": twin, "n": n, "identical": same,
                                            "accept_ratios": accepts, "pass": verdict})
        lines.append(f"{'PASS' if verdict else 'FAIL'} twin {name} vs {twin}: identical {same}/{n}, accept length "
                     f"ratios {[round(r, 4) for r in accepts]} (within {tol:.0%})")

    # tree hashes: every rank built the same tree at every step
    for name, s in sorted(servers.items()):
        hashes = s.get("tree_hashes") or []
        if not hashes:
            continue
        steps: dict[str, set] = {}
        ranks = set()
        for rank, step, digest in hashes:
            steps.setdefault(step, set()).add(digest)
            ranks.add(rank)
        split = [st for st, d in steps.items() if len(d) > 1]
        verdict = len(ranks) > 1 and not split
        ok = ok and verdict
        out.setdefault("tree_hashes", []).append({"server": name, "ranks": sorted(ranks), "steps": len(steps),
                                                  "steps_that_differ": len(split), "pass": verdict})
        lines.append(f"{'PASS' if verdict else 'FAIL'} tree hashes {name}: {len(steps)} steps over ranks "
                     f"{sorted(ranks)}, {len(split)} steps differ between ranks")

    # sampled: per position chi-square vs the baseline, Bonferroni over all tests
    # (a sampled test reads one context n times: a phase of different prompts at T > 0, e.g. a speed phase, is none)
    sampled = [p for p in results["phases"] if "outputs" in p and p["sampling"]["temperature"] > 0
               and p.get("repeat_prompt", True)]
    tests = []
    for ph in sampled:
        base = baseline_of(results, ph["server"])
        bph = find_phase(results, ph["phase"], base)
        if not bph or bph["inputs_digest"] != ph["inputs_digest"]:
            continue
        positions = int(ph["sampling"]["max_new_tokens"])
        # every generated position and the joint of the first three (what a per-position test cannot see)
        for t in criteria.position_tests(ph["outputs"], bph["outputs"], positions):
            tests.append((ph, base, t["position"], t["chi2"], t["df"], t["n"], t["n_baseline"]))
    n_tests = max(1, sum(1 for t in tests if t[4] > 0))
    alpha = FAMILY_ALPHA / n_tests
    cells: dict[tuple, dict] = {}
    for ph, base, k, stat, df, na, nb in tests:
        p = chi2_sf(stat, df) if df > 0 else 1.0
        cell = cells.setdefault((ph["server"], ph["phase"]), {"server": ph["server"], "phase": ph["phase"],
                                                              "baseline": base, "sampling": ph["sampling"],
                                                              "n": na, "n_baseline": nb, "positions": [],
                                                              "accept_len": ph.get("accept_len")})
        cell["positions"].append({"position": k, "chi2": round(stat, 2), "df": df, "p": p,
                                  "informative": df > 0})
    for cell in cells.values():
        cfg = servers[cell["server"]].get("config") or {}
        expect_fail = bool(cfg.get("expect_fail"))
        informative = [x for x in cell["positions"] if x["informative"]]
        rejected = [x for x in informative if x["p"] < alpha]
        enough = cell["n"] >= MIN_SAMPLED_N and cell["n_baseline"] >= MIN_SAMPLED_N and len(informative) >= 3
        consistent = not rejected
        passed = enough and (consistent != expect_fail)
        cell.update(alpha=alpha, rejected=len(rejected), informative=len(informative), expect_fail=expect_fail,
                    enough=enough, pass_=passed)
        ok = ok and passed
        worst = min((x["p"] for x in informative), default=1.0)
        lines.append(f"{'PASS' if passed else 'FAIL'} sampled {cell['server']}/{cell['phase']} vs {cell['baseline']}:"
                     f" n {cell['n']}/{cell['n_baseline']}, {len(informative)} informative tests, "
                     f"{len(rejected)} rejected at alpha {alpha:.2e} (min p {worst:.3g})"
                     + (" (control: must be rejected)" if expect_fail else "")
                     + ("" if enough else " [too few samples or positions]"))
        out["sampled"].append(cell)

    # speed: exclusive phases -- tok/s, accept length, round cost vs the plan's speed baselines
    speed = [p for p in results["phases"] if p.get("exclusive") and "outputs" in p]
    for ph in speed:
        cfg = servers[ph["server"]].get("config") or {}
        ref = find_phase(results, ph["phase"], cfg.get("speed_rival"))
        rec = {"phase": ph["phase"], "server": ph["server"], "algo": cfg.get("algo"), "budget": cfg.get("budget"),
               "tok_per_s": ph["tok_per_s"], "accept_len": ph["accept_len"], "round_ms": ph["round_ms"],
               "concurrency": ph["concurrency"], "temperature": ph["sampling"]["temperature"]}
        if ref:
            rec["rival"] = ref["server"]
            rec["round_cost_vs_rival"] = (round(ph["round_ms"] / ref["round_ms"], 3)
                                          if ph["round_ms"] and ref["round_ms"] else None)
            rec["tok_per_s_vs_rival"] = (round(ph["tok_per_s"] / ref["tok_per_s"], 3)
                                         if ph["tok_per_s"] and ref["tok_per_s"] else None)
            rec["accept_vs_rival"] = (round(ph["accept_len"] / ref["accept_len"], 3)
                                      if ph["accept_len"] and ref["accept_len"] else None)
        slope = speed_slope(results, ph)
        if slope:
            rec.update(slope)
            ref_slope = speed_slope(results, ref) if ref else None
            if ref_slope and ref_slope["slope_round_ms"] and slope["slope_round_ms"]:
                rec["slope_round_cost_vs_rival"] = round(slope["slope_round_ms"] / ref_slope["slope_round_ms"], 3)
                rec["slope_tok_per_s_vs_rival"] = round(slope["slope_tok_per_s"] / ref_slope["slope_tok_per_s"], 3)
        if ph.get("group"):
            rec.update(group=ph["group"], **{"pass": ph.get("pass")})
        out["speed"].append(rec)
        if ph.get("group"):
            continue  # one summary per group and server below
        lines.append(f"INFO speed {ph['phase']} {ph['server']}: {ph['tok_per_s']} tok/s, accept {ph['accept_len']}, "
                     f"round {ph['round_ms']} ms"
                     + (f"; vs {rec['rival']}: round cost x{rec['round_cost_vs_rival']}, tok/s "
                        f"x{rec['tok_per_s_vs_rival']}, accept x{rec['accept_vs_rival']}" if ref else ""))
        if slope:
            lines.append(f"INFO speed {ph['phase']} {ph['server']} minus {ph['slope_of']} (decode rounds only): "
                         f"round {slope['slope_round_ms']} ms, {slope['slope_tok_per_s']} tok/s"
                         + (f"; vs {rec['rival']}: round cost x{rec['slope_round_cost_vs_rival']}, tok/s "
                            f"x{rec['slope_tok_per_s_vs_rival']}" if "slope_round_cost_vs_rival" in rec else ""))
    out["speed_groups"] = speed_groups(out["speed"])
    lines += [speed_line(g) for g in out["speed_groups"]]
    out["ok"] = ok
    out["lines"] = lines
    return out


def median_interval(xs: list[float], coverage: float = 0.9) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median of ``xs``: the ``k``-th smallest and largest values, for
    the largest ``k`` whose coverage (1 - 2 P(Binomial(n, 1/2) < k)) is still at least ``coverage``; returns
    (low, high, its coverage), or None for too few values to reach it."""
    n = len(xs)
    best = None
    for k in range(1, n // 2 + 1):
        cov = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
        if cov >= coverage:
            best = (k, cov)
    if best is None:
        return None
    k, cov = best
    v = sorted(xs)
    return v[k - 1], v[n - k], cov


def speed_groups(records: list[dict]) -> list[dict]:
    """The passes of each interleaved phase, per server: the median (and range) of every figure and of every
    ratio against the rival taken within one pass."""
    by: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r.get("group") and not r["group"].endswith("-short"):
            by.setdefault((r["group"], r["server"]), []).append(r)
    out = []
    for (group, server), recs in by.items():
        g: dict[str, Any] = {"group": group, "server": server, "passes": len(recs), "rival": recs[0].get("rival"),
                             "algo": recs[0].get("algo"), "budget": recs[0].get("budget"),
                             "concurrency": recs[0].get("concurrency")}
        for key in ("round_ms", "tok_per_s", "accept_len", "round_cost_vs_rival", "tok_per_s_vs_rival",
                    "slope_round_ms", "slope_tok_per_s", "slope_round_cost_vs_rival", "slope_tok_per_s_vs_rival"):
            vals = [r[key] for r in recs if r.get(key) is not None]
            if vals:
                g[key] = {"median": round(statistics.median(vals), 4), "min": round(min(vals), 4),
                          "max": round(max(vals), 4)}
                ci = median_interval(vals)
                if ci:
                    g[key]["ci"] = [round(ci[0], 4), round(ci[1], 4)]
                    g[key]["ci_coverage"] = round(ci[2], 3)
        out.append(g)
    return out


def with_interval(v: dict, then: str) -> str:
    """``x<median> (<coverage> x<low>-x<high>, <then>)``: a ratio's median and its interval (``speed_groups``,
    ``judge``), with what follows them in the same brackets."""
    return f"x{v['median']} ({v['ci_coverage']:.0%} x{v['ci'][0]}-x{v['ci'][1]}, {then})"


def speed_line(g: dict) -> str:
    """One group's SPEED line: its medians, and each ratio's median with its interval and range."""
    def span(key: str) -> str:
        v = g.get(key)
        if not v:
            return "n/a"
        if "ci" in v:
            return with_interval(v, f"all x{v['min']}-x{v['max']}")
        return f"x{v['median']} (x{v['min']}-x{v['max']})"
    return (f"SPEED {g['group']} {g['server']} ({g['passes']} passes): round {g['round_ms']['median']} ms, "
            f"{g['tok_per_s']['median']} tok/s, accept {g['accept_len']['median']}"
            + (f"; vs {g['rival']}: round cost {span('round_cost_vs_rival')}, "
               f"tok/s {span('tok_per_s_vs_rival')}" if g.get("rival") else "")
            + (f"; decode rounds alone: round {g['slope_round_ms']['median']} ms"
               + (f", vs {g['rival']} round cost {span('slope_round_cost_vs_rival')}, tok/s "
                  f"{span('slope_tok_per_s_vs_rival')}" if g.get("slope_round_cost_vs_rival") else "")
               if g.get("slope_round_ms") else ""))


def judge(groups: list[dict], criteria: list[dict]) -> list[dict]:
    """Each criterion against the pooled groups: ``met`` when the median's whole interval lies on the good side
    of the threshold, ``missed`` when it lies wholly on the other, ``undecided`` when it holds the threshold,
    ``no data`` when no group or interval matches. A criterion: ``{"what", "group", "server", "metric",
    "at_most" | "at_least", "decides"}`` (``server`` a regular expression, matched whole; ``decides`` false for one
    judged beside the deciding ones, default true)."""
    out = []
    for c in criteria:
        bound, good_low = (c["at_most"], True) if "at_most" in c else (c["at_least"], False)
        g = next((g for g in groups if g["group"] == c["group"] and re.fullmatch(c["server"], g["server"])), None)
        v = (g or {}).get(c["metric"]) or {}
        if "ci" not in v:
            verdict = "no data"
        else:
            lo, hi = v["ci"]
            inside = hi <= bound if good_low else lo >= bound
            outside = lo > bound if good_low else hi < bound
            verdict = "met" if inside else "missed" if outside else "undecided"
        out.append({**c, "verdict": verdict, "passes": (g or {}).get("passes"), "server_found": (g or {}).get("server"),
                    "median": v.get("median"), "ci": v.get("ci"), "ci_coverage": v.get("ci_coverage")})
    return out


def pool(verdicts: list[dict], criteria: list[dict] | None = None) -> dict:
    """The interleaved passes of several sessions' verdicts taken as one sample per group and server (the same
    plan's phases run again: a ratio within a pass does not depend on the session), and the criteria judged
    on them."""
    records = [r for v in verdicts for r in v.get("speed", [])]
    groups = speed_groups(records)
    out: dict[str, Any] = {"sessions": len(verdicts), "speed_groups": groups, "lines": [speed_line(g) for g in groups]}
    if criteria:
        out["criteria"] = judge(groups, criteria)
        for c in out["criteria"]:
            side = f"<= {c['at_most']}" if "at_most" in c else f">= {c['at_least']}"
            got = with_interval(c, f"{c['passes']} passes, {c['server_found']}") if c["ci"] else "no interval"
            beside = "" if c.get("decides", True) else " [beside: does not decide]"
            out["lines"].append(f"{c['verdict'].upper()} {c['what']}: {c['metric']} {got}, target {side}{beside}")
        deciding = [c for c in out["criteria"] if c.get("decides", True)]
        out["ok"] = bool(deciding) and all(c["verdict"] == "met" for c in deciding)
    return out


def cmd_pool(args) -> int:
    verdicts = [json.loads(Path(f).read_text()) for f in args.verdicts]
    criteria = json.loads(Path(args.criteria).read_text())["criteria"] if args.criteria else None
    out = pool(verdicts, criteria)
    for line in out["lines"]:
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if out.get("ok", True) else 1


# --------------------------------------------------------------------------- main


def cmd_run(args) -> int:
    rc = cmd_up(args)
    try:
        cmd_measure(args)
    finally:
        cmd_down(args)
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("up", "measure", "down", "run"):
        p = sub.add_parser(name)
        p.add_argument("--plan")
        p.add_argument("--state", required=True, action="append", help="state file (repeatable: merged)")
        p.add_argument("--out", default="results.json")
        p.add_argument("--logs", default="logs")
        p.add_argument("--budget-s", type=float, default=480)
        p.add_argument("--stagger-s", type=float, default=1.0)
        p.add_argument("--only", nargs="*")
        p.add_argument("--wave", type=int, nargs="*", help="up: only the servers of these waves")
    c = sub.add_parser("compare")
    c.add_argument("results")
    c.add_argument("--json")
    po = sub.add_parser("pool", help="several sessions' verdicts (compare --json) pooled, criteria judged")
    po.add_argument("verdicts", nargs="+")
    po.add_argument("--criteria", help="a JSON file: {\"criteria\": [...]} (see judge)")
    po.add_argument("--json")
    args = ap.parse_args()
    commands = {"up": cmd_up, "measure": cmd_measure, "down": cmd_down, "run": cmd_run, "compare": cmd_compare,
                "pool": cmd_pool}
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
