"""The shape of a fact, declared next to its collector (``@collector(name, shape=...)``) and checked by
the fact store before any check sees the value: a hand-edited or corrupt snapshot, or a collector
from another version, gives one clear ``fail`` naming the fact (``MalformedFact``) in every area,
while a genuine bug in a check stays an ``error`` with its traceback.

A spec is a Python type (or tuple of types; a tuple holding other specs: any one of them),
``opt(spec)`` (``None`` allowed), a dict ``{key: spec}`` (keys optional, other keys allowed) or a
one-element list ``[spec]`` (a list of such items).
"""

from __future__ import annotations

from typing import Any

NUM = (int, float)


class Opt:
    def __init__(self, spec: Any) -> None:
        self.spec = spec


def opt(spec: Any) -> Opt:
    """``spec`` or ``None``."""
    return Opt(spec)


def problem(value: Any, spec: Any, path: str = "") -> str | None:
    """Where ``value`` does not have the shape ``spec`` (e.g. ``devices[2].memory.total: str, not int``)."""
    where = path or "the value"
    if isinstance(spec, Opt):
        return None if value is None else problem(value, spec.spec, path)
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{where}: {type(value).__name__}, not an object"
        for key, sub in spec.items():
            if key in value:
                bad = problem(value[key], sub, f"{path}.{key}" if path else key)
                if bad:
                    return bad
        return None
    if isinstance(spec, list):
        if not isinstance(value, list):
            return f"{where}: {type(value).__name__}, not a list"
        for i, item in enumerate(value):
            bad = problem(item, spec[0], f"{path}[{i}]")
            if bad:
                return bad
        return None
    if isinstance(spec, tuple) and not all(isinstance(t, type) for t in spec):  # alternatives
        found = [problem(value, alt, path) for alt in spec]
        return None if any(f is None for f in found) else found[0]
    types = spec if isinstance(spec, tuple) else (spec,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types and NUM[0] in types):
        want = " or ".join(t.__name__ for t in types)
        return f"{where}: {type(value).__name__}, not {want}"
    return None
