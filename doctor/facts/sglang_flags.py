"""Fact ``sglang_flags``: every flag the service's SGLang accepts, read from its sources.

A probe under the service's interpreter (``--python``) only locates the ``sglang`` package
(``find_spec``, nothing imported); the doctor then parses the parser definition with ``ast``
(``doctor.sglang_flags``). The table is part of the fact, so a snapshot replays it.
"""

from __future__ import annotations

from typing import Any

from doctor.facts import CollectOptions
from doctor.proc import run_probe
from doctor.registry import collector
from doctor.sglang_flags import FlagSourceError, read_flags

PROBE_TIMEOUT_S = 20.0


def locate_sglang(python: str, env: dict[str, str] | None = None, timeout: float = PROBE_TIMEOUT_S
                  ) -> dict[str, Any]:
    """The probe's answer: ``found``, ``package_dir``, ``version``; ``error`` when it could not run."""
    data, res = run_probe(python, "sglang_source", timeout=timeout, env=env)
    if data is None:
        return {"found": False, "probe_failed": True, "error": res.why(), "python": python}
    return data


def flags_fact(python: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    where = locate_sglang(python, env)
    out: dict[str, Any] = {"python": python, "found": bool(where.get("found")), "version": where.get("version"),
                           "package_dir": where.get("package_dir")}
    if where.get("probe_failed"):
        out["probe_error"] = where.get("error")
        return out
    if not where.get("found"):
        out["error"] = where.get("error") or f"sglang is not importable from {python}"
        return out
    try:
        table = read_flags(where["package_dir"], where.get("version"))
    except FlagSourceError as exc:
        out["error"] = str(exc)
        return out
    except Exception as exc:  # sources shaped in a way this reader does not expect: say so, don't crash
        out["error"] = f"reading the flag definitions failed: {type(exc).__name__}: {exc}"
        return out
    out["table"] = table.to_dict()
    return out


@collector("sglang_flags", timeout=45)
def collect_sglang_flags(opts: CollectOptions) -> dict[str, Any]:
    """The server flags the service interpreter's SGLang accepts (from its sources, not imported)."""
    return flags_fact(opts.python, opts.env)
