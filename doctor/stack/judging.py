"""What the stack, triton and sglang checks share when they judge the service's Python stack (public helpers)."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from doctor.core.result import Remediation, Result
from doctor.facts.store import FactUnavailable
from doctor.stack import compat
from doctor.stack.cuda_arch import cc_str, parse_cc


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def service_python(ctx: Any) -> str:
    return str(ctx.settings.python)


def probe_failed(ctx: Any, fact: dict[str, Any], what: str) -> Result:
    """A probe that could not run under the service interpreter: that is itself the finding."""
    return Result.failed(
        f"cannot {what} with {service_python(ctx)}: {fact.get('error') or 'the probe failed'}",
        Remediation("The service's interpreter must start and run a stdlib script; see python.venv.",
                    [shlex.join([service_python(ctx), "-c", "import sys; print(sys.version)"])]),
        python=service_python(ctx), probe=fact)


def stack_fact(ctx: Any) -> tuple[dict[str, Any] | None, Result | None]:
    fact = ctx.fact("stack")
    if not isinstance(fact, dict) or not fact.get("ok"):
        return None, probe_failed(ctx, fact if isinstance(fact, dict) else {}, "read the installed packages")
    return fact, None


def installed_dist(stack: dict[str, Any], component: str) -> dict[str, Any] | None:
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


def gpu_ccs(ctx: Any) -> tuple[list[tuple[int, int]], str, dict[str, Any]]:
    """The compute capabilities to judge: every GPU NVML sees, else the profile's (and say which)."""
    nvml: Any = None
    why = ""
    try:
        nvml = ctx.fact("nvml")
    except FactUnavailable as exc:
        why = exc.reason
    if isinstance(nvml, dict) and nvml.get("available") and nvml.get("devices"):
        ccs = [parse_cc(d.get("compute_capability")) for d in nvml["devices"] if isinstance(d, dict)]
        names = sorted({str(d.get("name")) for d in nvml["devices"] if isinstance(d, dict)})
        ccs_ok = [c for c in ccs if c is not None]
        if ccs_ok:
            return sorted(set(ccs_ok)), f"{len(nvml['devices'])}x {', '.join(names)}", {"source": "nvml"}
    if isinstance(nvml, dict) and not why:
        why = nvml.get("error") or "NVML sees no GPU"
    cc = parse_cc(ctx.expect("gpu.compute_capability"))
    if cc is None:
        return [], "", {"source": None, "nvml": why}
    return [cc], f"the profile's GPU ({cc_str(cc)})", {"source": "profile", "nvml": why}


def parse_version(text: Any) -> Version | None:
    try:
        return Version(str(text))
    except (InvalidVersion, TypeError):
        return None


def parse_spec(text: Any) -> SpecifierSet | None:
    if text in (None, ""):
        return None
    try:
        return SpecifierSet(str(text))
    except InvalidSpecifier:
        return None


def pip_install(ctx: Any, component: str, dist: str) -> str:
    spec = ctx.expect(f"stack.{component}") or ""
    return shlex.join([service_python(ctx), "-m", "pip", "install", f"{dist}{spec}"])


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
