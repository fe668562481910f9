"""The shape of a fact, declared next to its collector (``@collector(name, shape=...)``) and checked by
the fact store before any check sees the value: a hand-edited or corrupt snapshot, or a collector
from another version, gives one clear ``fail`` naming the fact (``MalformedFact``) in every area,
while a genuine bug in a check stays an ``error`` with its traceback.

A spec is one of:

* a Python type (``str``, ``int``, ``bool``, ``dict``, ``list``...) or a tuple of types; ``int`` and ``float``
  accept no ``bool``, ``float`` accepts an ``int`` (JSON has one kind of number), and a number must be finite
  and within 64 bits (a reading, never 1e308 bytes);
* ``opt(spec)``: ``None`` allowed; ``anything``: any JSON value;
* a dict ``{key: spec}``: an object whose listed keys, when present, have their spec (other keys allowed);
  ``required(spec)`` as a value: the key must be there;
* a one-element list ``[spec]``: a list of such items; ``mapping(spec)``: an object whose every value has it;
* a tuple holding other specs: any one of them;
* a ``TypedDict`` class: its annotations are the spec (``str``, ``int``, ``float``, ``bool``, ``X | None``,
  ``list[X]``, ``dict[str, X]``, ``Any``, nested TypedDicts); its required keys (a ``total=True`` base of a
  ``total=False`` class, as Python 3.10 spells it) must be there. One declaration is then both the type the
  area's functions are annotated with and the check at run time.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from functools import cache
from typing import Any

NUM = (int, float)
INT_LIMIT = 2**63


class Opt:
    def __init__(self, spec: Any) -> None:
        self.spec = spec


class Mapping:
    def __init__(self, spec: Any) -> None:
        self.spec = spec


class Required:
    def __init__(self, spec: Any) -> None:
        self.spec = spec


class _Anything:
    def __repr__(self) -> str:
        return "anything"


anything = _Anything()


def opt(spec: Any) -> Opt:
    """``spec`` or ``None``."""
    return Opt(spec)


def mapping(spec: Any) -> Mapping:
    """An object whose every value has ``spec`` (keys are strings, as in JSON)."""
    return Mapping(spec)


def required(spec: Any) -> Required:
    """In a dict spec: the key must be present (and have ``spec``)."""
    return Required(spec)


def problem(value: Any, spec: Any, path: str = "") -> str | None:
    """Where ``value`` does not have the shape ``spec`` (e.g. ``devices[2].memory.total: str, not int``)."""
    where = path or "the value"
    if spec is anything:
        return None
    if isinstance(spec, Opt):
        return None if value is None else problem(value, spec.spec, path)
    if isinstance(spec, Required):
        return problem(value, spec.spec, path)
    if is_typed_dict(spec):
        return problem(value, typed_spec(spec), path)
    if isinstance(spec, dict):
        return _object_problem(value, spec, path, where)
    if isinstance(spec, Mapping):
        return _mapping_problem(value, spec, path, where)
    if isinstance(spec, list):
        return _list_problem(value, spec, path, where)
    if isinstance(spec, tuple) and not all(isinstance(t, type) for t in spec):  # alternatives
        return _alternatives_problem(value, spec, path)
    return _scalar_problem(value, spec if isinstance(spec, tuple) else (spec,), where)


def _object_problem(value: Any, spec: dict[str, Any], path: str, where: str) -> str | None:
    if not isinstance(value, dict):
        return f"{where}: {type(value).__name__}, not an object"
    for key, sub in spec.items():
        at = f"{path}.{key}" if path else key
        if key not in value:
            if isinstance(sub, Required):
                return f"{at}: missing"
            continue
        bad = problem(value[key], sub, at)
        if bad:
            return bad
    return None


def _mapping_problem(value: Any, spec: Mapping, path: str, where: str) -> str | None:
    """An object whose every value must have ``spec.spec``: the first value that does not, by its key."""
    if not isinstance(value, dict):
        return f"{where}: {type(value).__name__}, not an object"
    for key, item in value.items():
        bad = problem(item, spec.spec, f"{path}.{key}" if path else str(key))
        if bad:
            return bad
    return None


def _list_problem(value: Any, spec: list[Any], path: str, where: str) -> str | None:
    """A list whose every item must have ``spec[0]``: the first item that does not, by its index."""
    if not isinstance(value, list):
        return f"{where}: {type(value).__name__}, not a list"
    for i, item in enumerate(value):
        bad = problem(item, spec[0], f"{path}[{i}]")
        if bad:
            return bad
    return None


def _alternatives_problem(value: Any, spec: tuple[Any, ...], path: str) -> str | None:
    """A value that may have any of the shapes in ``spec``: None where one fits, else what the first says."""
    found = [problem(value, alt, path) for alt in spec]
    return None if any(f is None for f in found) else found[0]


def _scalar_problem(value: Any, types: tuple[type, ...], where: str) -> str | None:
    if float in types and int not in types:
        types = (*types, int)
    numeric = any(t in (int, float) for t in types)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types and numeric):
        want = " or ".join(t.__name__ for t in types if not (t is int and float in types))
        return f"{where}: {type(value).__name__}, not {want}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: {value!r} is not a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_LIMIT:
        return f"{where}: {value} is out of range for a reading"
    return None


# -- TypedDict classes as specs ----------------------------------------------------------------------------

def is_typed_dict(spec: Any) -> bool:
    return isinstance(spec, type) and issubclass(spec, dict) and hasattr(spec, "__total__")


@cache
def typed_spec(cls: type) -> dict[str, Any]:
    """The dict spec of a TypedDict class (its keys, each with the spec of its annotation)."""
    module = sys.modules.get(cls.__module__)
    hints = typing.get_type_hints(cls, globalns=vars(module) if module else None, include_extras=True)
    required_keys = getattr(cls, "__required_keys__", frozenset())
    return {key: Required(annotation_spec(hint)) if key in required_keys else annotation_spec(hint)
            for key, hint in hints.items()}


# typing.Required / NotRequired (3.11+): a key's marker, not its type.
_KEY_MARKERS = tuple(m for m in (getattr(typing, "Required", None), getattr(typing, "NotRequired", None)) if m)


def annotation_spec(hint: Any) -> Any:
    """The spec of one type annotation."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return anything
    if origin in _KEY_MARKERS:
        return annotation_spec(args[0])
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        inner = annotation_spec(options[0]) if len(options) == 1 else tuple(annotation_spec(a) for a in options)
        return Opt(inner) if len(options) < len(args) else inner
    if origin is list:
        return [annotation_spec(args[0]) if args else anything]
    if origin is dict:
        return Mapping(annotation_spec(args[1])) if args else dict
    if origin is typing.Literal:
        return tuple({type(a) for a in args})
    if is_typed_dict(hint):
        return hint
    return hint
