"""The run's deadline: one clock that every check, probe, fact collection and fix plan of a run shares.

``--timeout T`` bounds each check to ``T`` seconds and the whole run to ``T``: a check that starts late
(after its dependencies) gets what is left, every child process (``doctor.core.proc``) gets at most what is
left, fix planning after the checks gets what is left (none: the footer says so instead of planning), and
waiting for a fact another check is still collecting stops there too. Without ``--timeout`` the run's
deadline is the longest deadline of its checks (``app.run`` sets it), so nothing after the checks (planning,
a probe it starts) can outlast the run. Ctrl-C expires it at once (``expire``): whatever is still running or
about to start ends now, and ``doctor.core.proc.kill_all`` leaves no child behind.

Module state, one run at a time per process (the CLI runs one; ``fix --apply`` starts a new run for its
verification). ``clock`` is monotonic.
"""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_end: float | None = None
_why = ""
_interrupted = False


def start(seconds: float | None, why: str = "") -> None:
    """A new run's deadline ``seconds`` from now (None: none); ``why`` says what set it, for messages."""
    global _end, _why, _interrupted
    with _lock:
        _end = None if seconds is None else time.monotonic() + max(0.0, seconds)
        _why = why or (f"the run's deadline ({seconds:g}s)" if seconds is not None else "")
        _interrupted = False


def clear() -> None:
    """No run deadline (after a run whose deadline must not bound what follows, e.g. ``launch``'s exec)."""
    start(None)


def expire(why: str) -> None:
    """End the run now (Ctrl-C; ``why`` a clause, "the run was interrupted (Ctrl-C)"): every ``remaining()``
    is 0 from here on."""
    global _end, _why, _interrupted
    with _lock:
        _end = time.monotonic()
        _why, _interrupted = why, True


def remaining() -> float | None:
    """Seconds left in the run (never negative), or None when the run has no deadline."""
    with _lock:
        end = _end
    return None if end is None else max(0.0, end - time.monotonic())


def expired() -> bool:
    left = remaining()
    return left is not None and left <= 0


def clip(timeout: float) -> float:
    """``timeout`` bounded by what is left of the run."""
    left = remaining()
    return timeout if left is None else min(timeout, left)


def ended() -> str:
    """What ended the run, as a clause: "the run's deadline (--timeout 10s) passed", "the run was interrupted
    (Ctrl-C)"."""
    with _lock:
        why, interrupted = _why or "the run's deadline", _interrupted
    return why if interrupted else f"{why} passed"
