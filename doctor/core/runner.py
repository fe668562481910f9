"""The concurrent runner: every check in its own thread, under its own deadline.

Why threads and not a pool: a check past its deadline is abandoned (its thread is a daemon and is
never joined), so one hung probe cannot hold up the run or the exit. Anything that can block in C
(NVML, compilers, the service's interpreter) runs in a child process that ``doctor.core.proc`` kills at
the deadline, so abandoned threads are only ever waiting on something already being torn down.

Dependencies: a check whose dependency failed, errored or was skipped is ``skip`` with the reason.
Ignores (``--ignore``, config): a failure is reported as ``warn`` with ``ignored`` set, never hidden.
Ctrl-C: the run stops at once; unfinished checks become ``error`` ("interrupted", ``details.interrupted``: the
report folds them into one line) in a partial report,
and the run's deadline expires (``doctor.core.deadline``) so nothing after it waits for what is still running.
The run's deadline (``--timeout``) also bounds every check: one that starts late gets what is left, and one
that would start after it is not run.
"""

from __future__ import annotations

import fnmatch
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from doctor.core import deadline, interrupt
from doctor.core.context import Context, FactUnavailable, MalformedFact, UndeclaredFact
from doctor.core.registry import DEFAULT_TIMEOUT_S, Check
from doctor.core.result import NotJudged, Remediation, Result, Status


@dataclass
class RunOutcome:
    results: list[Result]
    duration_s: float
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    interrupted_by: str = "Ctrl-C"  # or "SIGTERM" (doctor.core.interrupt): what the report names


def matches(check_id: str, patterns: Iterable[str]) -> bool:
    """Glob match on ids; ``gpu`` also selects ``gpu.*`` (a prefix is an area)."""
    for pat in patterns:
        if fnmatch.fnmatchcase(check_id, pat) or (check_id.startswith(pat.rstrip(".") + ".") and "*" not in pat):
            return True
    return False


def select(checks: Iterable[Check], only: list[str], skip: list[str], deep: bool) -> list[Check]:
    """``--only``/``--skip`` globs; deep checks only with ``--deep`` (or when named by ``--only``)."""
    chosen = []
    for chk in checks:
        if only and not matches(chk.id, only):
            continue
        if skip and matches(chk.id, skip):
            continue
        if chk.deep and not deep and not (only and any(p == chk.id for p in only)):
            continue
        chosen.append(chk)
    return chosen


def deadline_for(chk: Check, flag_timeout: float | None) -> float:
    if flag_timeout is not None:
        return flag_timeout
    return chk.timeout if chk.timeout is not None else DEFAULT_TIMEOUT_S


def execute(chk: Check, ctx: Context) -> Result:
    """Run one check in the current thread, in its own view of the run (the facts it declares), turning every
    way it can go wrong into a result."""
    start = time.monotonic()
    try:
        res = _run_applicable(chk, ctx)
        if not isinstance(res, Result):
            res = Result.errored(f"check returned {type(res).__name__}, not a Result")
    except NotJudged as exc:  # an area function that cannot judge says why
        res = exc.result()
    except UndeclaredFact as exc:  # a bug in the check: its declaration is the contract
        res = Result.errored(f"check {exc}")
        res.traceback = traceback.format_exc()
    except MalformedFact as exc:  # one rule for every area: a value of the wrong shape is a clear fail
        res = Result.failed(f"the fact {exc.name!r} is malformed: {exc.reason}",
                            Remediation("Record the host again with `k26-doctor snapshot`, or check live."),
                            fact=exc.name, malformed=True)
    except FactUnavailable as exc:
        status = Status.SKIP if exc.status == "skip" else Status.ERROR
        res = Result(status, f"cannot judge: {exc.reason} (fact {exc.name!r})", {"fact": exc.name})
        res.unjudged = status is Status.SKIP  # for want of facts: never a pass for the gate
    except Exception as exc:  # a crash becomes a result, flutter-doctor style
        tb = traceback.format_exc()
        res = Result.errored(f"check crashed: {type(exc).__name__}: {_one_line(str(exc))}")
        res.traceback = tb
    res.duration_s = time.monotonic() - start
    return _stamp(res, chk)


def _run_applicable(chk: Check, ctx: Context) -> Result:
    """The check's run, unless its declared ``applies_if`` says the profile is not one it applies to: then it is
    "not applicable" with the declared reason before it reads a fact (so facts only it reads are not collected),
    as the judgement itself would have said it with ``NotJudged.inapplicable``. Asked after its dependencies (a
    failed one still skips it first, as before the declaration)."""
    why = _refusal(chk, ctx) if chk.applies_if is not None else None
    if why is not None:
        raise NotJudged.inapplicable(why)
    return chk.run(ctx.view(chk.needs))


def _refusal(chk: Check, ctx: Context) -> str | None:
    """``chk.applies_if``'s refusal, failing closed: settings whose values are not of their kind (a ``tp`` of
    "eight", a ``[parallel]`` that is a list) or a predicate that raises make the check not judged, naming why,
    never "not applicable" and never a crash."""
    assert chk.applies_if is not None
    problem = ctx.settings.value_problem()
    if problem is None:
        try:
            return chk.applies_if.refusal(ctx.settings)
        except NotJudged:
            raise
        except Exception as exc:  # a predicate's bug is this check's verdict, not the run's crash
            problem = f"{type(exc).__name__}: {_one_line(str(exc), 200)}"
    raise NotJudged.missing(
        f"cannot judge: whether this check applies to the profile could not be decided ({problem})",
        Remediation("Give the profile's values their kinds (doctor/data/config_schema.toml); `k26-doctor check` "
                    "with the same profile and config names the key."), applies_if_error=problem)


def _stamp(res: Result, chk: Check) -> Result:
    res.id = chk.id
    res.title = chk.title
    res.failure = chk.failure or res.failure
    res.fixer = chk.fixer if res.status in (Status.FAIL, Status.WARN, Status.ERROR) else None
    return res


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def apply_ignores(res: Result, ignore: list[str]) -> Result:
    """A failure (or a check not judged for want of facts) of an ignored check becomes ``warn``."""
    if (res.status.failed or res.unjudged) and ignore and matches(res.id, ignore):
        res.ignored = res.status
        res.status = Status.WARN
        label = "not judged" if res.unjudged else res.ignored.value
        res.unjudged = False
        res.summary = f"[ignored {label}] {res.summary}"
    return res


def _abandoned(limit: float, by_run: bool, waiting: list) -> Result:
    """The result of a check that ran past its limit (``by_run``: the run's deadline set it), naming the fact it
    was still waiting for: kept apart from ``run_all`` so the scheduler loop stays readable."""
    on = f" while it waited for the fact {waiting[-1]!r}" if waiting else ""
    if by_run:
        res = Result.errored(f"{deadline.ended()}{on or ' before it finished'} (abandoned)", timeout_s=limit)
    else:
        res = Result.errored(f"timed out after {limit:g}s{on} (abandoned; raise with --timeout if the host is "
                             "slow)", timeout_s=limit)
    res.remediation = Remediation(
        (f"The fact {waiting[-1]!r} did not arrive in time: its probe (the service's interpreter), a driver "
         "call or a stuck filesystem did not answer." if waiting else "The check did not finish in time.")
        + " Look at `nvidia-smi` and `dmesg`, or run this check alone with -v.")
    res.duration_s = limit
    return res


class _Run:
    """One run's scheduling state and its steps: which checks wait, which run (with the moment each is
    abandoned), which are done. Kept as one object so ``run_all``'s loop reads as its steps: start what is
    ready, settle a cycle, collect a result or a check past its limit."""

    def __init__(self, checks: list[Check], ctx: Context, on_result: Callable[[Result], None] | None) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.on_result = on_result
        self.by_id = {c.id: c for c in checks}
        ctx.selected = frozenset(self.by_id)
        self.pending = list(checks)
        self.done: dict[str, Result] = {}
        self.running: dict[str, float] = {}  # id -> deadline (monotonic)
        self.results_q: queue.Queue[Result] = queue.Queue()
        self.threads: dict[str, threading.Thread] = {}
        # id -> (seconds it was given, whether the run's deadline set it)
        self.limits: dict[str, tuple[float, bool]] = {}

    def finish(self, res: Result) -> None:
        """A check's last word: ignores applied, recorded for the checks that depend on it, passed on."""
        apply_ignores(res, self.settings.ignore)
        self.done[res.id] = res
        self.ctx.results[res.id] = res
        if self.on_result is not None:
            self.on_result(res)

    def _worker(self, chk: Check) -> None:
        self.results_q.put(execute(chk, self.ctx))

    def _late(self, cid: str) -> Result:
        limit, by_run = self.limits[cid]
        waiting = self.ctx.facts.collecting(self.threads[cid].ident) if cid in self.threads else []
        return _stamp(_abandoned(limit, by_run, waiting), self.by_id[cid])

    def _blocked_by(self, chk: Check) -> tuple[bool, list[str]]:
        """(whether a dependency of the run is still unfinished, the finished ones that did not pass)."""
        deps = [d for d in chk.depends if d in self.by_id]
        if any(d not in self.done for d in deps):
            return True, []
        bad = [d for d in deps if self.done[d].status in (Status.FAIL, Status.ERROR, Status.SKIP)
               or self.done[d].ignored is not None]
        return False, bad

    def step(self) -> None:
        """One turn of the scheduler: start what is ready; with nothing running, settle what can never start;
        else wait (at most a quarter second) for a result and abandon the checks past their limit."""
        self._start_ready()
        if not self.running:
            self._settle_cycle()
            return
        self._collect()

    def _start_ready(self) -> None:
        for chk in list(self.pending):
            waiting, bad = self._blocked_by(chk)
            if waiting:
                continue
            self.pending.remove(chk)
            if bad:
                why = ", ".join(f"{d} ({(self.done[d].ignored or self.done[d].status).value})" for d in bad)
                self.finish(_stamp(Result.blocked(f"skipped: depends on {why}", bad[0], depends_on=bad), chk))
                continue
            self._start(chk)

    def _start(self, chk: Check) -> None:
        """Start one check in its own thread, under its limit or what is left of the run's deadline (none
        left: not run)."""
        limit = deadline_for(chk, self.settings.timeout)
        left = deadline.remaining()
        if left is not None and left <= 0:
            self.finish(_stamp(Result.errored(f"not run: {deadline.ended()}"), chk))
            return
        self.limits[chk.id] = (min(limit, left), True) if left is not None and left < limit else (limit, False)
        self.running[chk.id] = time.monotonic() + self.limits[chk.id][0]
        thread = threading.Thread(target=self._worker, args=(chk,), name=f"check:{chk.id}", daemon=True)
        self.threads[chk.id] = thread
        thread.start()

    def _settle_cycle(self) -> None:
        """Nothing runs and every pending check still waits: a cycle or a missing dependency, an error each."""
        if self.pending and all(self._blocked_by(c)[0] for c in self.pending):
            for chk in self.pending:
                self.finish(_stamp(Result.errored("dependency cycle among: " +
                                                  ", ".join(c.id for c in self.pending)), chk))
            self.pending.clear()

    def _collect(self) -> None:
        wait = max(0.0, min(self.running.values()) - time.monotonic())
        try:
            res = self.results_q.get(timeout=min(wait, 0.25) if wait > 0 else 0.001)
        except queue.Empty:
            res = None
        if res is not None and res.id in self.running:
            self.running.pop(res.id)
            self.finish(res)
        now = time.monotonic()
        for cid, dl in list(self.running.items()):
            if now >= dl:
                self.running.pop(cid)
                self.finish(self._late(cid))

    def interrupt(self) -> None:
        """Ctrl-C: the run's deadline expires and every unfinished check is an ``error`` saying so."""
        deadline.expire(f"the run was interrupted ({interrupt.cause()})")
        for cid in list(self.running) + [c.id for c in self.pending]:
            if cid not in self.done:
                res = Result.errored(f"interrupted ({interrupt.cause()}) before it finished", interrupted=True)
                self.finish(_stamp(res, self.by_id[cid]))


def run_all(
    checks: list[Check],
    ctx: Context,
    *,
    on_result: Callable[[Result], None] | None = None,
) -> RunOutcome:
    """Run ``checks`` concurrently, respecting dependencies and deadlines; never raises."""
    started = time.monotonic()
    run = _Run(checks, ctx, on_result)
    interrupted = False
    try:
        while run.pending or run.running:
            run.step()
    except KeyboardInterrupt:
        interrupted = True
        run.interrupt()
    ordered = [run.done[c.id] for c in checks if c.id in run.done]
    one_root_per_malformed_fact(ordered, run.by_id)
    return RunOutcome(ordered, time.monotonic() - started, interrupted, interrupted_by=interrupt.cause())


def one_root_per_malformed_fact(results: list[Result], by_id: dict[str, Check]) -> None:
    """Checks that failed on the same malformed fact tell one cause: the first of them (the one the others
    depend on, directly or through another, if there is one) is its root, the others name it as their cause and
    are folded under it, instead of the same "the fact 'model' is malformed" line once per check."""
    by_fact: dict[str, list[Result]] = {}
    for res in results:
        if res.status is Status.FAIL and res.details.get("malformed") and res.cause is None:
            by_fact.setdefault(str(res.details.get("fact")), []).append(res)

    def upstream(cid: str) -> set[str]:
        seen: set[str] = set()
        todo = list(by_id[cid].depends) if cid in by_id else []
        while todo:
            dep = todo.pop()
            if dep not in seen:
                seen.add(dep)
                todo.extend(by_id[dep].depends if dep in by_id else ())
        return seen

    for same in by_fact.values():
        if len(same) < 2:
            continue
        root = next((r for r in same if all(r.id in upstream(o.id) for o in same if o is not r)), same[0])
        for res in same:
            if res is not root:
                res.cause = root.id
