"""The doctor on a node of a fleet: what a periodic run beside a running server leaves out, and the defaults the
systemd timer, the Slurm health check and the Kubernetes manifests share (``doctor/data/fleet.toml``).

A fleet already has its engines (Prometheus, Slurm, Kubernetes); the doctor plugs into them and keeps no
aggregator of its own. Before a start (ExecStartPre, the init container, the Slurm prolog) every check of the
profile runs. Beside a running server (the timer, the DaemonSet, a health check on an allocated node) the checks
that judge a host *before* a start would only see the server itself: its GPU memory, its port. ``--while-serving``
leaves those out, by name, and the report says which and why.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "fleet.toml"


def fleet_data() -> dict[str, Any]:
    """The parsed ``doctor/data/fleet.toml`` (cached by the one TOML reader)."""
    return load_toml(DATA_FILE)


def serving_table() -> dict[str, Any]:
    return fleet_data()["serving"]


def serving_skips(registered: Iterable[str]) -> list[str]:
    """The ``[serving] skip`` ids that are registered here, in the data file's order.

    An id the data names but this doctor does not register (a check of a later release) is left out rather than
    turned into ``--skip`` of nothing, which is an invalid invocation."""
    have = set(registered)
    return [cid for cid in serving_table()["skip"] if cid in have]


def serving_note(skipped: list[str]) -> str:
    """The report's note for ``--while-serving``: which checks were left out and why."""
    why = serving_table().get("why", {})
    parts = [f"{cid} ({why[cid]})" if cid in why else cid for cid in skipped]
    return "--while-serving: left out " + (", ".join(parts) if parts else "nothing") + \
        "; the gate before a start judges them"
