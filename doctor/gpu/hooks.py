"""The GPU area's part in a run beyond its checks: before the checks of a live run, wait (bounded) for the
NVSwitch fabric when the run asks for it (``--wait-fabric SECONDS``; ``launch``: the profile's fabric_wait_s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from doctor.core.context import Context
from doctor.core.registry import Check, hook
from doctor.gpu.fabric import wait_before_checks


@hook("before_checks")
def wait_for_the_fabric(ctx: Context, checks: list[Check], say: Callable[[str], None]) -> Any:
    """Only for a live run with a wait asked and a check that reads the GPUs: the last reading becomes the run's
    ``nvml`` fact and the wait's outcome its ``fabric_wait`` fact."""
    if ctx.settings.wait_fabric and not ctx.facts.replaying and any("nvml" in c.needs for c in checks):
        return wait_before_checks(ctx, ctx.facts.collectors, say)
    return None
