"""SIGTERM as an interruption of the run, like Ctrl-C: what finished is reported, nothing is left half-done.

systemd stops an ``ExecStartPre=k26-doctor launch`` that outlives ``TimeoutStartSec`` with SIGTERM, and Slurm and
Kubernetes stop a health check the same way. Left at its default, SIGTERM ends the doctor in the middle of a
check with no line in the journal and exit -15: the operator cannot tell which check was still running. Here it
raises ``Terminated`` (a ``KeyboardInterrupt``) in the main thread, so the one interruption path that Ctrl-C
takes (the runner marks unfinished checks interrupted, the report says what finished, children are ended, a
fleet verdict changes nothing on the node) runs for it too; the exit status is 143 (128 + SIGTERM), as a shell
reports a process SIGTERM ended. A SIGTERM that the caller set to be ignored stays ignored.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_received: list[str] = []


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the run ends as it ends on Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _received.append("SIGTERM")
    raise Terminated()


def install() -> None:
    """Route SIGTERM into the interruption path (main thread only; an ignored SIGTERM is left ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def cause() -> str:
    """What interrupted this process: ``SIGTERM`` once one arrived, else ``Ctrl-C``."""
    return "SIGTERM" if _received else "Ctrl-C"


def terminated() -> bool:
    """Whether a SIGTERM arrived."""
    return bool(_received)
