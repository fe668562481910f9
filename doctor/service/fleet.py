"""The doctor on a node of a fleet: what a periodic run beside a running server leaves out, and the defaults the
systemd timer, the Slurm health check and the Kubernetes manifests share (``doctor/data/fleet.toml``).

A fleet already has its engines (Prometheus, Slurm, Kubernetes); the doctor plugs into them and keeps no
aggregator of its own. Before a start (ExecStartPre, the init container, the Slurm prolog) every check of the
profile runs. Beside a running server (the timer, the DaemonSet, a health check on an allocated node) the checks
that judge a host *before* a start would only see the server itself: its GPU memory, its port. ``--while-serving``
leaves those out, and the report says which and why. Which they are is each check's own declaration
(``@check(applies=...)``, ``doctor.core.registry.PLACES``): ``--while-serving`` leaves out what does not apply
``serving``, ``--node-pod`` (the DaemonSet, a pod of its own) also what does not apply ``node-pod``; the data file
holds only the reasons said in the report.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from doctor.core.causes import roots
from doctor.core.datafile import load_toml
from doctor.core.registry import Check

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "fleet.toml"


def fleet_data() -> dict[str, Any]:
    """The parsed ``doctor/data/fleet.toml`` (cached by the one TOML reader)."""
    return load_toml(DATA_FILE)


def serving_table() -> dict[str, Any]:
    return fleet_data()["serving"]


def place_of(settings: Any) -> str:
    """Where this run judges (``doctor.core.registry.PLACES``): ``node-pod`` (``--node-pod``: the DaemonSet),
    ``serving`` (``--while-serving``: beside the running server), else ``start``."""
    if getattr(settings, "node_pod", False):
        return "node-pod"
    return "serving" if settings.while_serving else "start"


def serving_skips(checks: Iterable[Check], place: str = "serving") -> list[str]:
    """The ids of the registered checks that do not apply at ``place`` (their ``applies=``), by id. A pod beside
    the server's is also beside the running server: ``node-pod`` leaves out what ``serving`` does too."""
    places = {"serving": ("serving",), "node-pod": ("serving", "node-pod")}.get(place, ())
    return sorted(c.id for c in checks if any(p not in c.applies for p in places))


def why_left_out(cid: str, place: str) -> str | None:
    """``doctor/data/fleet.toml``'s reason a check does not apply at ``place`` (``[serving.why]``,
    ``[kubernetes.daemonset.why]``)."""
    data = fleet_data()
    tables = [data["serving"].get("why", {})]
    if place == "node-pod":
        tables.insert(0, data["kubernetes"]["daemonset"].get("why", {}))
    return next((t[cid] for t in tables if cid in t), None)


def serving_note(skipped: list[str], place: str = "serving") -> str:
    """The report's note for ``--while-serving``/``--node-pod``: which checks were left out and why."""
    parts = [f"{cid} ({why})" if (why := why_left_out(cid, place)) else cid for cid in skipped]
    flag = "--node-pod" if place == "node-pod" else "--while-serving"
    return f"{flag}: left out " + (", ".join(parts) if parts else "nothing") + "; the gate before a start judges them"


def root_causes(report: Any, failing: list[Any]) -> list[tuple[str, str]]:
    """(id, summary) of what explains the failing results in the end, each once, in report order."""
    root = roots(report.results, report.notices)
    notices = {n.id: n.summary for n in report.notices}
    summaries = {r.id: r.summary for r in report.results}
    out: dict[str, str] = {}
    for res in failing:
        cid = root.get(res.id, res.id)
        out.setdefault(cid, notices.get(cid) or summaries.get(cid, res.summary))
    return list(out.items())


def split_by_failure(report: Any, failing: list[Any]) -> tuple[list[Any], list[Any]]:
    """``failing`` as (node failures, deployment failures): by what the check whose failure explains each one
    (its root) declares; a result explained by a notice counts as its own check's."""
    root = roots(report.results, report.notices)
    by_id = {r.id: r for r in report.results}
    node, deployment = [], []
    for res in failing:
        owner = by_id.get(root.get(res.id, res.id), res)
        (deployment if owner.failure == "deployment" else node).append(res)
    return node, deployment
