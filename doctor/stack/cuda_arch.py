"""CUDA binary compatibility: which compiled targets run on which GPU.

torch, sgl-kernel and flashinfer ship cubins for a list of targets; a GPU runs a kernel only if one
of them is compatible with its compute capability. The rules (CUDA C Programming Guide, "Binary
Compatibility" and "Feature Availability"):

* ``sm_XY`` (a cubin) runs on every GPU of the same major X with minor >= Y: ``sm_100`` runs on 10.0
  and on 10.3 (B300), never on 12.0 (a different major).
* ``sm_XYa`` (architecture-specific) runs only on exactly X.Y: ``sm_100a`` does not run on 10.3.
* ``sm_XYf`` (family-specific, CUDA >= 12.9) runs on the same major with minor >= Y.
* ``compute_XY`` (PTX) is JIT-compiled by the driver for any GPU with capability >= X.Y (slow first
  start, needs a driver whose JIT knows that PTX); ``compute_XYa``/``compute_XYf`` as above.

Kept free of I/O: checks and tests call it with plain strings and tuples.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from doctor.core.context import FactUnavailable, MalformedFact

_TARGET = re.compile(r"^(sm|compute|lto)_(\d+)([af]?)$")


@dataclass(frozen=True)
class Target:
    """One compiled target, e.g. ``sm_100`` or ``compute_90a``."""

    kind: str  # "sm" (cubin), "compute" (PTX) or "lto" (link-time IR, not runnable by itself)
    major: int
    minor: int
    suffix: str  # "", "a" (arch-specific) or "f" (family-specific)

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.major}{self.minor}{self.suffix}"

    def runs_on(self, cc: tuple[int, int]) -> bool:
        """True if this target can execute on a GPU of compute capability ``cc``."""
        major, minor = cc
        if self.kind == "lto":
            return False
        if self.suffix == "a":
            return (major, minor) == (self.major, self.minor)
        if self.kind == "sm" or self.suffix == "f":
            return major == self.major and minor >= self.minor
        return (major, minor) >= (self.major, self.minor)  # plain PTX: JIT forward


def parse_target(text: str) -> Target | None:
    """``"sm_100"`` -> Target; anything unrecognised -> None."""
    m = _TARGET.match(text.strip().lower())
    if not m:
        return None
    digits = m.group(2)
    if len(digits) < 2:
        return None
    return Target(m.group(1), int(digits[:-1]), int(digits[-1]), m.group(3))


def parse_cc(value: object) -> tuple[int, int] | None:
    """A compute capability from ``[10, 3]``, ``(10, 3)``, ``"10.3"``, ``"sm_103"`` or ``103``."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        try:
            return int(value[0]), int(value[1])
        except (TypeError, ValueError):
            return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return (value // 10, value % 10) if value >= 10 else None
    if isinstance(value, str):
        text = value.strip().lower()
        m = re.fullmatch(r"(\d+)\.(\d)", text)
        if m:
            return int(m.group(1)), int(m.group(2))
        t = parse_target(text)
        if t is not None:
            return t.major, t.minor
        if text.isdigit() and len(text) >= 2:
            return int(text[:-1]), int(text[-1])
    return None


def cc_str(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


@dataclass(frozen=True)
class Match:
    """How a GPU gets its kernels from a list of targets."""

    how: str  # "exact" | "cubin" (binary compatible) | "ptx" (driver JIT) | "none"
    target: str | None  # the target used
    note: str

    @property
    def ok(self) -> bool:
        return self.how != "none"


def _runnable(parsed: list[Target], cc: tuple[int, int], kind: str) -> list[Target]:
    """The targets of one kind ("sm" cubins, "compute" PTX) that run on ``cc``."""
    return [t for t in parsed if t.kind == kind and t.runs_on(cc)]


def _newest_cubin(parsed: list[Target], cc: tuple[int, int]) -> Target | None:
    """The compatible cubin the CUDA runtime picks: the newest minor of the major (``f`` after plain)."""
    cubins = sorted(_runnable(parsed, cc, "sm"), key=lambda t: (t.minor, t.suffix))
    return cubins[-1] if cubins else None


def _newest_ptx(parsed: list[Target], cc: tuple[int, int]) -> Target | None:
    """The PTX the driver would JIT-compile for ``cc``: the newest that runs on it."""
    ptx = sorted(_runnable(parsed, cc, "compute"), key=lambda t: (t.major, t.minor))
    return ptx[-1] if ptx else None


def _no_match(parsed: list[Target], cc: tuple[int, int]) -> Match:
    """No target runs: naming the arch-specific ones of the same major, which look right but run only on their
    exact GPU."""
    arch_specific = [t.name for t in parsed if t.suffix == "a" and t.major == cc[0]]
    extra = f" ({', '.join(arch_specific)} are arch-specific and run only on their exact GPU)" if arch_specific else ""
    return Match("none", None, f"no target runs on {cc_str(cc)}{extra}")


def best_match(targets: list[str], cc: tuple[int, int]) -> Match:
    """The target a GPU of capability ``cc`` would use, by preference: exact cubin, compatible cubin, PTX.

    Among compatible cubins the newest wins (what the CUDA runtime picks); PTX only when no cubin runs.
    """
    parsed = [t for t in (parse_target(x) for x in targets) if t is not None]
    exact = [t for t in _runnable(parsed, cc, "sm") if (t.major, t.minor) == cc]
    if exact:
        return Match("exact", exact[0].name, f"has {exact[0].name} for {cc_str(cc)}")
    cubin = _newest_cubin(parsed, cc)
    if cubin is not None:
        return Match("cubin", cubin.name, f"no sm_{cc[0]}{cc[1]}; {cc_str(cc)} runs the {cubin.name} cubins "
                                          f"(binary compatible within major {cc[0]})")
    ptx = _newest_ptx(parsed, cc)
    if ptx is not None:
        return Match("ptx", ptx.name, f"no cubin runs on {cc_str(cc)}; the driver JIT-compiles {ptx.name} PTX "
                                      "(slow first start, every kernel recompiled)")
    return _no_match(parsed, cc)


def judged_ccs(read_nvml: Callable[[], Any], settings: Any) -> tuple[list[tuple[int, int]], str, dict[str, Any]]:
    """The compute capabilities to judge: every GPU NVML sees (``read_nvml()``, the ``nvml`` fact), else the
    profile's; with the words that say which and, for the profile's, why NVML did not answer."""
    nvml: Any = None
    why = ""
    try:
        nvml = read_nvml()
    except MalformedFact:
        raise
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
    cc = parse_cc(settings.gpu.compute_capability)
    if cc is None:
        return [], "", {"source": None, "nvml": why}
    return [cc], f"the profile's GPU ({cc_str(cc)})", {"source": "profile", "nvml": why}
