"""What ``.ci/run`` installs beside ``.[test]`` (``.ci/sglang-test-requirements.txt``: torch, triton, SGLang's
import-time dependencies), for the tests that need it.

Without it (``pip install -e '.[test]'`` alone, the README's command) such a test skips, and the reason says
exactly which modules are missing from which interpreter and how to get them. Under CI (``$CI`` set), where
``.ci/run`` installs them, it fails instead: a missing install must not pass as green.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

REQUIREMENTS = Path(__file__).resolve().parents[1] / ".ci" / "sglang-test-requirements.txt"
HOW = f"`bash .ci/run` installs {{}} (pip install -r {REQUIREMENTS.parent.name}/{REQUIREMENTS.name})"


def missing(modules: tuple[str, ...], python: str | None = None) -> list[str]:
    """The top-level ``modules`` that ``python`` (default: this interpreter) cannot find; nothing imported."""
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        return [m for m in modules if importlib.util.find_spec(m) is None]
    code = ("import importlib.util, sys\n"
            "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
    res = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        return list(modules)
    return res.stdout.split()


def reason(absent: list[str], python: str | None = None, needed_for: str = "") -> str:
    what = ", ".join(absent)
    verb = "is" if len(absent) == 1 else "are"
    for_what = f" (needed {needed_for})" if needed_for else ""
    return f"{what} {verb} not installed in {python or sys.executable}{for_what}: " + HOW.format(
        "it" if len(absent) == 1 else "them")


def require(*modules: str, python: str | None = None, needed_for: str = "") -> None:
    """Skip (fail under CI) unless ``python`` has every one of ``modules``."""
    absent = missing(modules, python)
    if absent:
        unavailable(reason(absent, python, needed_for))


def unavailable(why: str) -> NoReturn:
    """The test cannot run without what ``.ci/run`` installs: skip, saying ``why``; under CI, fail."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"under CI, where .ci/run installs it: {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def importorskip(module: str, needed_for: str = ""):
    """``pytest.importorskip`` with the reason above."""
    require(module.split(".")[0], needed_for=needed_for)
    return importlib.import_module(module)
