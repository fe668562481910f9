"""The benches' one timing loop: a callable run ``repeat`` times, its best and median wall time.

Every bench reports a ratio against a baseline timed in the same run with the same loop, so the loop
itself (``time.perf_counter`` around each call, nothing else) must be the same for both sides and for
every bench; this is it. Imported by the benches as ``from timing import measure`` (a script's own
folder is first on ``sys.path``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple


class Timing(NamedTuple):
    """Seconds per call: ``best`` (least disturbed by other load) and ``median`` (typical)."""

    best: float
    median: float


def measure(fn: Callable[[], Any], repeat: int) -> Timing:
    """``fn()`` called ``repeat`` times (at least once), each call timed on its own."""
    runs = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return Timing(min(runs), statistics.median(runs))


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    """The median of ``measure``: for benches whose rows compare typical calls, not the luckiest one."""
    return measure(fn, repeat).median
