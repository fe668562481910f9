"""A module loaded from its file: the scripts, probes, fixtures and patched sources the tests exercise have no
package to import them from (or must not be imported through one: the patched SGLang files, whose package
would pull the whole server). Plain Python, no pytest: the GPU harness imports it too."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file(path: Path, name: str, *, register: bool = True) -> ModuleType:
    """The module at ``path``, named ``name``; ``register``: also ``sys.modules[name]`` (before it runs, as an
    import would: what its dataclasses, pickles and relative lookups find it by)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
