"""A validation's sequence: the servers one after another (or side by side with ``parallel``), each started,
waited healthy, measured and stopped; its state kept after each server so that a validation stopped after the
base phase resumes without repeating it; the time budget honoured; then the criteria judged per budget.

State: ``<state_dir>/ddtree/validate/<run key>.json`` (atomic), the run key being the sha256 of what the
measurements depend on -- each server's argv and the profile's environment, the prompts, the phase plan and the
configuration being validated; a changed configuration starts afresh (the old state is left as it is, named
in the progress). Server logs: ``<state_dir>/ddtree/validate/<run key>/<role>.log``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from doctor.core.fileio import atomic_write, read_or_none
from doctor.core.settings import Settings
from doctor.service.validation import client
from doctor.service.validation.servers import Role, Server, role_plan, roles, start_server
from doctor.sglang.validation import criteria, prompts
from doctor.sglang.validation.record import canonical

TOP_LOGPROBS = 10
START_FIXED_S = 90.0  # interpreter, imports, CUDA graphs, warm-up: what a start costs beyond the weights
LOAD_GIB_PER_S = 1.5  # weights read from a local NVMe into GPU memory
MEASURE_S_PER_ROLE = 90.0


@dataclass
class Options:
    """What a validation measures (each a ``k26-doctor validate`` flag or one of its defaults)."""

    budgets: list[int]
    concurrency: int = 32
    time_budget_s: float | None = None
    parallel: bool = False
    resume: bool = True
    port_base: int = 30100
    start_timeout_s: float = 1800.0
    request_timeout_s: float = 600.0
    max_new_tokens: int = 128
    greedy: dict[str, int] = field(default_factory=lambda: {"c1": 16, "c8": 64, "c32": 128})
    speed_requests: int = 4  # per slot of the concurrency (c1: three times as many)
    samples: int = criteria.MIN_SAMPLED_N
    sampled_tokens: int = 4
    temperature: float = 0.7
    control_temperature: float = 1.0
    extra_args: list[str] = field(default_factory=list)


Progress = Callable[[str], None]


def start_estimate_s(settings: Settings) -> float:
    """The expected seconds of one server start: the weights' load (model + drafter at ``LOAD_GIB_PER_S``) and
    ``START_FIXED_S``. The one place a start is predicted (a better predictor replaces this function)."""
    size = 0
    for path in (settings.model_path, settings.draft_model_path):
        if not path:
            continue
        try:
            for entry in os.scandir(path):
                if entry.name.endswith(".safetensors") and entry.is_file():
                    size += entry.stat().st_size
        except OSError:
            continue
    return START_FIXED_S + size / (LOAD_GIB_PER_S * (1 << 30))


def expected_duration_s(settings: Settings, to_run: list[Role], opts: Options) -> float:
    """Server starts (side by side they overlap: the slowest counts) plus their measurements."""
    if not to_run:
        return 0.0
    starts = start_estimate_s(settings) * (1 if opts.parallel else len(to_run))
    return starts + MEASURE_S_PER_ROLE * len(to_run)


def concurrency_key(opts: Options) -> str:
    return f"c{opts.concurrency}"


def speed_phases(opts: Options) -> dict[str, int]:
    """The exclusive speed phases: c1 and the profile's concurrency (name -> concurrency)."""
    out = {"c1": 1}
    out[concurrency_key(opts)] = opts.concurrency
    return out


def run_key(settings: Settings, opts: Options, prompt_set: Mapping[str, Any],
            configurations: Mapping[int, Mapping[str, Any]]) -> str:
    """What the measurements depend on, hashed: a change to any of it starts the validation afresh."""
    plans = {}
    for role in roles(opts.budgets):
        plan = role_plan(settings, role, 1, opts.extra_args, environ={})
        plans[role.name] = {"argv": plan.argv, "env": {k: v for k, v in sorted(plan.env.items())
                                                       if k.startswith(("SGLANG", "CUDA", "NCCL", "TORCH"))}}
    plan_opts = {k: v for k, v in asdict(opts).items() if k not in ("time_budget_s", "parallel", "resume",
                                                                      "port_base", "start_timeout_s")}
    return hashlib.sha256(canonical({"servers": plans, "prompts": prompt_set["digest"], "options": plan_opts,
                                     "configurations": {str(k): v for k, v in configurations.items()}})
                          ).hexdigest()[:16]


class Stopped(Exception):
    """The time budget ran out: the validation stops cleanly (servers stopped, state kept), undecided."""


class Validation:
    """One validation of a profile: ``measure()`` (resumable), then ``judge()``."""

    def __init__(self, settings: Settings, opts: Options, prompt_set: dict[str, Any], key: str,
                 progress: Progress, *, launcher: Callable[[Server], None] | None = None,
                 log_stream: IO[str] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings, self.opts, self.prompts, self.key = settings, opts, prompt_set, key
        self.say, self.launcher, self.log_stream, self.clock = progress, launcher, log_stream, clock
        self.dir = Path(settings.state_dir) / "ddtree" / "validate"
        self.state_path = self.dir / f"{key}.json"
        self.log_dir = self.dir / key
        self.began = clock()
        self.state: dict[str, Any] = {"key": key, "roles": {}}
        self.live: list[Server] = []
        self.timing = {"starts_s": 0.0, "requests_s": 0.0, "stops_s": 0.0}

    # -------------------------------------------------------------------------------------------- state

    def load_state(self) -> None:
        if not self.opts.resume:
            return
        data = read_or_none(self.state_path, 512 << 20)
        if data is None:
            others = sorted(p.name for p in self.dir.glob("*.json")) if self.dir.is_dir() else []
            if others:
                self.say(f"no state for this configuration (run key {self.key}); earlier runs of other "
                         f"configurations are not reused: {', '.join(others[:3])}")
            return
        try:
            state = json.loads(data)
        except ValueError:
            self.say(f"the state {self.state_path} is not JSON: starting afresh")
            return
        if isinstance(state, dict) and state.get("key") == self.key and isinstance(state.get("roles"), dict):
            self.state = state
            done = [n for n, r in state["roles"].items() if r.get("done")]
            if done:
                self.say(f"resuming {self.state_path}: already measured {', '.join(done)}")

    def save_state(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.state_path, json.dumps(self.state).encode(), 0o600)

    def pending(self) -> list[Role]:
        return [r for r in roles(self.opts.budgets) if not self.state["roles"].get(r.name, {}).get("done")]

    # -------------------------------------------------------------------------------------------- time

    def elapsed(self) -> float:
        return self.clock() - self.began

    def check_time(self, what: str) -> None:
        budget = self.opts.time_budget_s
        if budget is not None and self.elapsed() >= budget:
            raise Stopped(f"the time budget of {budget:.0f} s ran out before {what}")

    # -------------------------------------------------------------------------------------------- servers

    def port_of(self, role: Role) -> int:
        return self.opts.port_base + [r.name for r in roles(self.opts.budgets)].index(role.name)

    def start(self, role: Role) -> Server:
        self.check_time(f"starting {role.name}")
        server = start_server(self.settings, role, self.port_of(role), self.opts.extra_args, self.log_dir,
                              self.launcher)
        self.live.append(server)
        self.say(f"{role.name}: started (pid {server.proc.pid if server.proc else '?'}, port {server.port}, "
                 f"log {server.log_path})")
        return server

    def wait(self, server: Server, rec: dict[str, Any]) -> bool:
        timeout = self.opts.start_timeout_s
        if self.opts.time_budget_s is not None:
            timeout = max(1.0, min(timeout, self.opts.time_budget_s - self.elapsed()))
        outcome = server.wait_healthy(timeout, self.log_stream)
        rec["start_s"] = round(outcome.elapsed_s, 2)
        self.timing["starts_s"] += outcome.elapsed_s
        if not outcome.ready:
            rec["problems"] = [f"{server.role.name} never became healthy: {outcome.reason}"]
            rec["log_tail"] = server.log_tail(2000)
            self.say(f"{server.role.name}: {outcome.reason} (log {server.log_path})")
            if outcome.exit_code is None and self.opts.time_budget_s is not None and \
                    self.elapsed() >= self.opts.time_budget_s:
                raise Stopped(f"the time budget ran out while {server.role.name} was starting")
            return False
        self.say(f"{server.role.name}: healthy after {outcome.elapsed_s:.1f} s")
        return True

    def stop(self, server: Server) -> None:
        t0 = self.clock()
        code = server.stop()
        self.timing["stops_s"] += self.clock() - t0
        if server in self.live:
            self.live.remove(server)
        self.say(f"{server.role.name}: stopped (exit status {code})")

    def stop_all(self) -> None:
        for server in list(self.live):
            self.stop(server)

    # -------------------------------------------------------------------------------------------- measuring

    def measure(self) -> None:
        """Every pending server measured, its state kept after each; ``Stopped`` when the time budget ends."""
        self.load_state()
        try:
            pending = self.pending()
            if self.opts.parallel:
                servers = [self.start(role) for role in pending]
                for server in servers:
                    self.measure_one(server)
            else:
                for role in pending:
                    self.measure_one(self.start(role))
        finally:
            self.stop_all()

    def measure_one(self, server: Server) -> None:
        role = server.role
        rec: dict[str, Any] = {"role": asdict(role), "phases": {}, "problems": []}
        try:
            if self.wait(server, rec):
                self.phases(server, rec)
                if not server.alive():
                    rec["problems"].append(f"{role.name} exited during the measurements (status "
                                           f"{server.proc.returncode if server.proc else '?'})")
        except Stopped:
            self.stop(server)
            raise
        self.stop(server)
        rec["done"] = not rec["problems"]  # a server that failed is judged (fail) and started again on a resume
        self.state["roles"][role.name] = rec
        self.save_state()

    def run_phase(self, server: Server, name: str, items: list[Any], sampling: dict[str, Any], concurrency: int,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
        self.check_time(f"{server.role.name} {name}")
        results, wall = client.generate_all(server.url, items, sampling, concurrency, self.opts.request_timeout_s,
                                            extra)
        self.timing["requests_s"] += wall
        errors = [r for r in results if r["code"] != 200]
        phase = {"outputs": [r["output_ids"] for r in results], "errors": len(errors),
                 "first_error": errors[0].get("error") if errors else None,
                 "speed": criteria.speed(results, wall), "concurrency": concurrency}
        if extra and extra.get("return_logprob"):
            phase["top"] = [[{str(t): lp for t, lp in row.items()} for row in client.top_table(r.get("top_logprobs"))]
                            for r in results]
        self.say(f"{server.role.name}: {name}: {len(items)} requests, {phase['speed']['tok_per_s']} tok/s, accept "
                 f"{phase['speed']['accept_len']}, errors {len(errors)}")
        return phase

    def phases(self, server: Server, rec: dict[str, Any]) -> None:
        o, role, pool = self.opts, server.role, self.prompts
        greedy = {"max_new_tokens": o.max_new_tokens, "temperature": 0.0, "ignore_eos": True}
        warm = dict(greedy, max_new_tokens=16)
        self.run_phase(server, "warm-up", prompts.take(pool["greedy"], 2 + o.concurrency), warm, o.concurrency)
        for name, conc in speed_phases(o).items():
            items = prompts.take(pool["greedy"], o.speed_requests * (3 if conc == 1 else conc), offset=7)
            rec["phases"][f"speed-{name}"] = self.run_phase(server, f"speed {name}", items, greedy, conc)
        if role.algorithm == "DFLASH":
            return
        logprobs = {"return_logprob": True, "top_logprobs_num": TOP_LOGPROBS} if role.algorithm is None else None
        for name, n in o.greedy.items():
            conc = int(name[1:])
            rec["phases"][f"greedy-{name}"] = self.run_phase(server, f"greedy {name}", prompts.take(pool["greedy"], n),
                                                             greedy, conc, logprobs)
        sampled = {"max_new_tokens": o.sampled_tokens, "temperature": o.temperature, "top_p": 1.0,
                   "ignore_eos": True}
        context = [pool["sampled"][0]] * o.samples
        conc = max(o.concurrency, 32)
        rec["phases"]["sampled"] = self.run_phase(server, f"sampled T {o.temperature}", context, sampled, conc)
        if role.algorithm is None:
            control = dict(sampled, temperature=o.control_temperature)
            rec["phases"]["control"] = self.run_phase(server, f"control T {o.control_temperature}", context,
                                                      control, conc)
        if role.is_ddtree:
            rec["refusals"] = self.refusals(server)

    def refusals(self, server: Server) -> dict[str, Any]:
        self.check_time(f"{server.role.name} refusals")
        prompt = self.prompts["greedy"][0]
        answers = []
        for what, extra, sp in criteria.REFUSALS:
            code, body = client.post(server.url + "/generate", client.payload(
                prompt, {"max_new_tokens": 4, "temperature": 0.0, **sp}, extra), self.opts.request_timeout_s)
            answers.append({"what": what, "code": code, "body": str(body)[:200],
                            "health_after": client.health(server.url)})
        after = client.generate(server.url, prompt, {"max_new_tokens": 4, "temperature": 0.0},
                                self.opts.request_timeout_s)
        self.say(f"{server.role.name}: refusals: {sum(1 for a in answers if a['code'] not in (0, 200))} of "
                 f"{len(answers)} refused, serving after: {after['code'] == 200}")
        return {"answers": answers, "served_after": after["code"] == 200}

    # -------------------------------------------------------------------------------------------- judging

    def judge(self) -> dict[str, Any]:
        return judge_state(self.state, self.opts)


def _probes(phase_name: str, spec: dict[str, Any], base: dict[str, Any]) -> dict[tuple[str, int], dict[int, float]]:
    out: dict[tuple[str, int], dict[int, float]] = {}
    tops = base.get("top") or []
    for d in criteria.divergences(spec["outputs"], base["outputs"]):
        k = d["position"]
        rows = tops[d["request"]] if d["request"] < len(tops) else []
        if k is not None and k < len(rows) and rows[k]:
            out[(phase_name, d["request"])] = {int(t): float(v) for t, v in rows[k].items()}
    return out


def problems_of(rec: dict[str, Any] | None, name: str) -> list[str]:
    if rec is None:
        return [f"{name} was not measured"]
    return list(rec.get("problems") or [])


def judge_state(state: Mapping[str, Any], opts: Options) -> dict[str, Any]:
    """The criteria per budget from the measured state: ``{"budgets": {b: {...outcome...}}, "outcome", "best"}``."""
    recs = state.get("roles") or {}
    ckey = concurrency_key(opts)
    budgets: dict[str, Any] = {}
    for budget in opts.budgets:
        budgets[str(budget)] = _judge_budget(budget, recs, opts, ckey)
    order = [criteria.FAIL, criteria.UNDECIDED, criteria.NOT_FASTER, criteria.PASS]
    overall = min((b["outcome"] for b in budgets.values()), key=order.index, default=criteria.UNDECIDED)
    good = [(b, v) for b, v in budgets.items() if v["outcome"] in (criteria.PASS, criteria.NOT_FASTER)]
    best = max(good, key=lambda bv: bv[1]["worth"]["phases"].get(ckey, {}).get("tok_per_s") or 0.0)[0] if good \
        else None
    return {"budgets": budgets, "outcome": overall, "best_budget": int(best) if best else None, "concurrency": ckey}


def _speeds(rec: Mapping[str, Any] | None) -> dict[str, Any]:
    """A role's speed phases by their concurrency key (``speed-c8`` -> ``c8``)."""
    phases = (rec or {}).get("phases") or {}
    return {k[len("speed-"):]: v["speed"] for k, v in phases.items() if k.startswith("speed-")}


def _judge_budget(budget: int, recs: Mapping[str, Any], opts: Options, ckey: str) -> dict[str, Any]:
    """One budget's verdict against the base and DFLASH: a role not measured leaves it undecided unless it
    already failed, so a partial run never passes."""
    base, dflash = recs.get("base"), recs.get("dflash")
    name = f"ddtree-{budget}"
    rec = recs.get(name)
    problems = problems_of(base, "base") + problems_of(rec, name)
    phases = (rec or {}).get("phases") or {}
    bph = (base or {}).get("phases") or {}
    greedy = _judge_greedy(phases, bph, opts)
    problems += _phase_errors((("base", bph), (name, phases)), opts)
    sampled = _judge_sampled(name, phases, bph, opts)
    ref = (rec or {}).get("refusals")
    refusals = (criteria.judge_refusals(ref["answers"], ref["served_after"]) if ref else
                {"outcome": criteria.UNDECIDED, "why": "the refusals were not probed"})
    worth = criteria.judge_worth(_speeds(rec), _speeds(dflash), _speeds(base), ckey)
    if dflash is not None and dflash.get("problems"):
        problems += [f"dflash: {p}" for p in dflash["problems"]]
    verdict = criteria.outcome(greedy, sampled, refusals, worth, problems if rec and base else [])
    if (rec is None or base is None) and verdict["outcome"] != criteria.FAIL:
        verdict = {"outcome": criteria.UNDECIDED, "why": problems}
    return {**verdict, "greedy": _brief(greedy), "sampled": _brief_sampled(sampled),
            "refusals": {k: refusals[k] for k in ("outcome", "why")}, "worth": worth}


def _judge_greedy(phases: Mapping[str, Any], bph: Mapping[str, Any], opts: Options) -> dict[str, Any]:
    """Greedy token identity over the phases both roles measured, each divergence with its near-tie probes."""
    greedy_phases, probes = [], {}
    for g in opts.greedy:
        mine, theirs = phases.get(f"greedy-{g}"), bph.get(f"greedy-{g}")
        if mine is None or theirs is None:
            continue
        greedy_phases.append({"name": g, "outputs": mine["outputs"], "baseline": theirs["outputs"],
                              "errors": mine["errors"] + theirs["errors"]})
        probes.update(_probes(g, mine, theirs))
    return criteria.judge_greedy(greedy_phases, probes, opts.max_new_tokens)


def _phase_errors(roles: tuple[tuple[str, Mapping[str, Any]], ...], opts: Options) -> list[str]:
    """Each sampled, control or speed phase whose requests failed, per role: a failed request is a problem of the
    run, never a silent gap in the figures."""
    problems: list[str] = []
    for label, ph in roles:
        for pname in ("sampled", "control", *(f"speed-{k}" for k in speed_phases(opts))):
            if (ph.get(pname) or {}).get("errors"):
                problems.append(f"{label}: {ph[pname]['errors']} request(s) of {pname} failed "
                                f"({ph[pname].get('first_error')})")
    return problems


def _judge_sampled(name: str, phases: Mapping[str, Any], bph: Mapping[str, Any], opts: Options) -> dict[str, Any]:
    """The sampled distribution against the base's, with the control that proves the test's power; undecided
    when a phase was not measured."""
    if "sampled" in phases and "sampled" in bph and "control" in bph:
        subject = {"name": f"{name} T {opts.temperature}",
                   "tests": criteria.position_tests(phases["sampled"]["outputs"], bph["sampled"]["outputs"],
                                                    opts.sampled_tokens)}
        control = {"name": f"base T {opts.control_temperature} (control)",
                   "tests": criteria.position_tests(bph["control"]["outputs"], bph["sampled"]["outputs"],
                                                    opts.sampled_tokens)}
        return criteria.judge_sampled(subject, control, min_n=min(opts.samples, criteria.MIN_SAMPLED_N))
    return {"outcome": criteria.UNDECIDED, "why": "the sampled phases were not measured"}


def _brief(greedy: Mapping[str, Any]) -> dict[str, Any]:
    return {k: greedy[k] for k in ("outcome", "why", "n", "identical", "share", "not_near_ties", "errors")} | {
        "divergences": list(greedy["divergences"])[:20]}


def _brief_sampled(sampled: Mapping[str, Any]) -> dict[str, Any]:
    out = {"outcome": sampled["outcome"], "why": sampled["why"]}
    for part in ("subject", "control"):
        cell = sampled.get(part)
        if cell:
            out[part] = {k: cell[k] for k in ("name", "n", "n_baseline", "informative", "rejected", "min_p", "alpha")}
    return out
