"""The host area's part in a run beyond its checks: with ``-v``, the start plan said once at the top of the report
(``doctor.service.startplan``): how long the server would take to become healthy on this host now, and which
minutes are avoidable. A notice, never a verdict: it changes no status and no exit code.

It reads the facts the run collected, and two that only read: ``jit_caches`` (stat and listdir) and
``weights_resident`` (``mincore(2)``: no page is read or evicted). Nothing is compiled or started.
"""

from __future__ import annotations

from typing import Any

from doctor.core.context import Context
from doctor.core.registry import hook
from doctor.core.result import Notice, Remediation, Result

START_PLAN_NOTICE = "doctor.start_plan"
READ_ONLY_FACTS = ("jit_caches", "weights_resident")  # collected for the plan if no check did


def fact_reader(ctx: Context, also: tuple[str, ...] = ()) -> Any:
    """``get(name)``: the run's fact, or None when it cannot be had (a snapshot without it, a failed collector).
    Facts that a probe would collect are read only when the run already has them (or they are named in ``also``:
    ``launch`` reads the GPUs when no check did)."""
    def get(name: str) -> Any:
        if name not in ctx.facts.collected() and name not in READ_ONLY_FACTS + also:
            return None
        try:
            return ctx.facts.get(name)
        except Exception:  # FactUnavailable, MalformedFact: the plan reckons without it
            return None
    return get


@hook("notice")
def start_plan_notice(ctx: Context, results: list[Result]) -> Notice | None:
    """With -v: the start plan, from this run's facts."""
    settings = ctx.settings
    if not settings.verbose or settings.from_snapshot or settings.while_serving:  # a plan for a start to come
        return None
    from doctor.service.launcher import planned_args
    from doctor.service.startplan import constants, predict, render, render_compact, start_inputs

    args, _problem = planned_args(settings)
    plan = predict(start_inputs(fact_reader(ctx), args, tp=settings.tp), constants())
    return Notice(START_PLAN_NOTICE, render(plan)[0], Remediation(render_compact(plan), []))
