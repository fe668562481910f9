"""``launch``'s part in the start plan: the prewarm started before the checks, the plan said before the server
starts, and with ``--wait`` the server's log read as it runs and the start recorded against the plan.

The command calls four methods, one line each (``doctor/commands/launch.py``): ``before_gate`` (shows the
prewarm's plan and starts it), ``before_start`` (says how the prewarm went, or that it goes on beside the server,
and shows the start plan), ``popen_args``/``tee`` (the server's output passes through, unchanged, while its
landmark lines are kept), ``after_ready`` (the actual parts against the plan, printed and recorded in
``<state_dir>/start/``). None of them raises: a failure here is said and the start goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import IO, Any

from doctor.service import prewarm as pw
from doctor.service import startlog, startplan

MAX_KEPT_LINES = 200_000  # the start's lines kept for reading its parts (the rest only passes through)


class StartWatch:
    def __init__(self, settings: Any, say: Callable[[str], None], *, prewarm: bool = True,
                 deadline_s: float | None = None) -> None:
        """``deadline_s``: the start's own deadline (``--wait-timeout``), which the prewarm never outlives."""
        self.settings = settings
        self.deadline_s = deadline_s or pw.DEFAULT_WAIT_S
        self.say = say
        self.want_prewarm = prewarm
        self.prewarm: pw.Prewarm | None = None
        self.inputs: dict[str, Any] | None = None
        self.plan: startplan.StartPlan | None = None
        self.lines: list[str] = []
        self.started_wall: datetime | None = None
        self.started = 0.0
        self.ready = threading.Event()
        self.prewarm_outcome: pw.PrewarmOutcome | None = None
        self.building: dict[str, Any] | None = None  # a prewarm left running beside the server

    # -- before the checks: the prewarm ------------------------------------------------------------------------
    def before_gate(self, launch_plan: Any) -> None:
        try:
            self._start_prewarm(launch_plan)
        except Exception as exc:  # never stands in a start's way
            self.say(f"prewarm not started: {type(exc).__name__}: {exc}")

    def _start_prewarm(self, launch_plan: Any) -> None:
        if not self.want_prewarm:
            return
        env = dict(launch_plan.env)
        state = server_caches(launch_plan)
        cache = state["flashinfer"]["cache"]
        cc = gpu_capability()
        algorithm = startplan.arg_value(launch_plan.server_args, "--speculative-algorithm")
        inputs = {"algorithm": algorithm, "compute_capability": cc, "sglang_jit": state["sglang_jit"],
                  "vocab_size": startplan.target_vocab(launch_plan.server_args),
                  "flashinfer": {"compiled": state["flashinfer"]["compiled"], "version": None}}
        table = startplan.constants()
        missing = startplan.missing_modules(inputs, table) + sglang_prewarm_names(
            startplan.missing_sglang_modules(inputs, table) or [], launch_plan.server_args)
        plan = pw.plan_prewarm(launch_plan.argv[0], env, missing, cache, cc, self.deadline_s)
        if plan is None:
            if missing:
                self.say(f"prewarm: not started (the GPU's architecture is not known): the server compiles "
                         f"{', '.join(missing)} itself")
            return
        for line in plan.describe():
            self.say(line)
        self.prewarm = pw.Prewarm(plan).start()

    def abandon(self) -> None:
        """The checks refused the start: a prewarm still running is stopped."""
        if self.prewarm is not None and self.prewarm.child is not None and self.prewarm.child.poll() is None:
            self.prewarm.finish(0.0)
            self.say("prewarm: stopped (no start)")

    # -- after the checks: the prewarm's outcome and the plan ----------------------------------------------------
    def before_start(self, ctx: Any, launch_plan: Any) -> None:
        try:
            self._finish_prewarm()
            self._show_plan(ctx, launch_plan)
        except Exception as exc:
            self.say(f"start plan not made: {type(exc).__name__}: {exc}")

    def _finish_prewarm(self) -> None:
        """Done: say how it went. Still compiling: it goes on beside the server (never waited for: the server's
        own start-up overlaps it, and FlashInfer's lock makes the server wait for a module being built)."""
        if self.prewarm is None:
            return
        out = self.prewarm.outcome_if_done()
        if out is not None:
            self._said(out)
            return
        self.prewarm.detach()
        elapsed = time.monotonic() - self.prewarm.started
        self.building = {"modules": self.prewarm.plan.modules, "elapsed_s": round(elapsed, 1)}
        self.say(f"prewarm: still compiling {', '.join(self.prewarm.plan.modules)} ({elapsed:.0f} s so far): it goes "
                 f"on beside the server, which waits on FlashInfer's lock for a module being built "
                 f"(log: {self.prewarm.log})")

    def _said(self, out: pw.PrewarmOutcome) -> None:
        self.prewarm_outcome = out
        self.say(f"prewarm: {out.reason}" if out.ok else f"warning: prewarm: {out.reason}; the start goes on")

    def _show_plan(self, ctx: Any, launch_plan: Any) -> None:
        from doctor.app import make_context

        ctx = ctx or make_context(self.settings)
        get = startplan.fact_reader(ctx, also=("nvml",))  # which GPU: the constants of its kind
        # the caches as they are now (after the prewarm's work so far), where the server will look: its environment
        self.inputs = startplan.start_inputs(get, launch_plan.server_args, tp=self.settings.tp,
                                             caches=server_caches(launch_plan))
        if self.building:
            self.inputs["flashinfer"]["building"] = self.building
            if isinstance(self.inputs.get("sglang_jit"), dict):
                self.inputs["sglang_jit"]["building"] = self.building
        if self.prewarm_outcome is not None and self.prewarm_outcome.absent:
            self.inputs["flashinfer"]["installed"] = False
        self.plan = startplan.predict(self.inputs, startplan.constants())
        for line in startplan.render(self.plan):
            self.say(line)

    # -- the server's output -------------------------------------------------------------------------------------
    def popen_args(self) -> dict[str, Any]:
        self.started_wall, self.started = datetime.now(), time.monotonic()
        return {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}

    def tee(self, child: Any, sink: IO[str] | None = None) -> threading.Thread:
        """Copy the child's output to ``sink`` (stderr) line by line, keeping the start's lines."""
        out = sink or sys.stderr

        def pump() -> None:
            for raw in iter(child.stdout.readline, b""):
                text = raw.decode("utf-8", "replace")
                try:
                    out.write(text)
                    out.flush()
                except (OSError, ValueError):
                    pass
                if not self.ready.is_set() and len(self.lines) < MAX_KEPT_LINES:
                    self.lines.append(text.rstrip("\n"))

        thread = threading.Thread(target=pump, name="server-output", daemon=True)
        thread.start()
        return thread

    # -- after /health 200: actual against predicted -------------------------------------------------------------
    def after_ready(self, elapsed_s: float) -> dict[str, Any] | None:
        self.ready.set()
        try:
            return self._record(elapsed_s)
        except Exception as exc:
            self.say(f"start not recorded: {type(exc).__name__}: {exc}")
            return None

    def _record(self, elapsed_s: float) -> dict[str, Any] | None:
        if self.building and self.prewarm is not None and self.prewarm_outcome is None:
            out = self.prewarm.outcome_if_done()  # it went on beside the server: how did it end?
            if out is not None:
                self._said(out)
        if self.plan is None:
            return None
        actual = startlog.read_start(list(self.lines))
        first = startlog.first_stamp(self.lines)
        if first is not None and self.started_wall is not None:
            actual["parts"]["interpreter"] = max(0.0, (first - self.started_wall).total_seconds())
        rows = startplan.compare(self.plan.to_dict(), actual, launched_to_ready_s=elapsed_s)
        for line in startplan.render_comparison(rows):
            self.say(line)
        entry = {"kind": "k26-doctor-start", "schema_version": 1, "at": time.time(), "inputs": self.inputs,
                 "plan": self.plan.to_dict(), "actual": actual, "ready_after_s": round(elapsed_s, 1),
                 "comparison": rows,
                 "prewarm": None if self.prewarm_outcome is None else vars(self.prewarm_outcome)}
        path = startplan.record(self.settings.state_dir, entry)
        self.say(f"start recorded in {path}")
        return entry


def sglang_prewarm_names(missing: list[str], server_args: list[str]) -> list[str]:
    """The prewarm's names of SGLang's missing JIT modules: ``sglang.speculative_tree``, and
    ``sglang.speculative_sampling.<vec_size>`` (its instance for the target's vocabulary, gcd(4, vocab_size) as
    the server computes it) only when the target's config.json gives the vocabulary."""
    import math

    out = []
    for m in missing:
        if m == "speculative_sampling":
            vocab = startplan.target_vocab(server_args)
            if vocab:
                out.append(f"sglang.{m}.{math.gcd(4, vocab)}")
        else:
            out.append(f"sglang.{m}")
    return out


def server_caches(launch_plan: Any) -> dict[str, Any]:
    """``startplan.cache_state`` of the environment the server is exec'd with (its HOME, else the doctor's)."""
    env = dict(launch_plan.env)
    return startplan.cache_state(env, env.get("HOME") or os.path.expanduser("~"))


def gpu_capability() -> str | None:
    """The first GPU's compute capability ("9.0") from nvidia-smi (no CUDA context), None if not to be had."""
    from doctor.core.proc import run

    res = run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], 10)
    if not res.ok:
        return None
    first = (res.stdout.strip().splitlines() or [""])[0].strip()
    return first if pw.arch_list(first) else None
