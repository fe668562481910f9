"""What is installed in the service's interpreter, as the ``stack`` fact records it: distributions by normalised
name, their versions and requirements as pip reads them, and the pip command that installs a component at the
profile's pin. Shared by the stack, triton and sglang judgements and the interpreter notice."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from doctor.core.settings import Settings
from doctor.stack import compat

if TYPE_CHECKING:  # packaging is imported where it is used: `k26-doctor list` and --help never need it
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version


def norm(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name or "").lower()


def installed_dist(stack: dict[str, Any], component: str) -> dict[str, Any] | None:
    """The installed distribution of a component (``sglang_kernel``: sglang-kernel or sgl-kernel), or None."""
    dists = stack.get("distributions") or {}
    for name in compat.distribution_names().get(component, [component]):
        if norm(name) in dists:
            return dists[norm(name)]
    return None


def has_sglang(stack: Any) -> bool | None:
    """Whether the service's interpreter has SGLang (its distribution, or its package on the path), or None
    when the ``stack`` reading failed (the interpreter could not be asked)."""
    if not isinstance(stack, dict) or not stack.get("ok"):
        return None
    if installed_dist(stack, "sglang") is not None:
        return True
    return bool(((stack.get("packages") or {}).get("sglang") or {}).get("found"))


def parse_version(text: Any) -> Version | None:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(str(text))
    except (InvalidVersion, TypeError):
        return None


def parse_spec(text: Any) -> SpecifierSet | None:
    if text in (None, ""):
        return None
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(str(text))
    except InvalidSpecifier:
        return None


def pip_install(settings: Settings, component: str, dist: str) -> str:
    """``PYTHON -m pip install DIST<the profile's pin>`` for the service's interpreter."""
    spec = getattr(settings.stack, component) or ""
    return shlex.join([str(settings.python), "-m", "pip", "install", f"{dist}{spec}"])


def is_under(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([os.path.abspath(path), os.path.abspath(root)]) == os.path.abspath(root)
    except ValueError:
        return False


def applicable_requirements(stack: dict[str, Any], requires: Any) -> Iterator[Requirement]:
    """A distribution's Requires-Dist entries that apply to the service's interpreter, as ``pip check``
    reads them: markers evaluated with the stack fact's marker environment (no extra selected); an entry
    that does not parse is passed over, and one whose marker cannot be evaluated (an unknown variable) is
    judged anyway. One reading for every check that compares requirements with what is installed."""
    from packaging.requirements import InvalidRequirement, Requirement

    env = dict((stack.get("python") or {}).get("markers") or {})
    env["extra"] = ""
    for text in requires or []:
        try:
            req = Requirement(str(text))
        except InvalidRequirement:
            continue
        try:
            if req.marker is not None and not req.marker.evaluate(env):
                continue
        except Exception:  # an unknown marker variable: judge the requirement anyway
            pass
        yield req
