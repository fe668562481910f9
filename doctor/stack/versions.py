"""The service's Python stack against the supported matrix (stack.versions): torch, triton, sglang, sglang-kernel and
flashinfer-python installed at the versions the profile pins, the pins of the matrix (doctor/data/compat.toml: torch
pins its Triton, SGLang its sglang-kernel and FlashInfer) and the requirements these packages declare on each other,
as ``pip check`` reads them. Mismatched kernels load and then crash or silently miscompute."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from doctor.core.result import Findings, Remediation
from doctor.core.settings import Settings
from doctor.stack import compat
from doctor.stack.distributions import applicable_requirements, installed_dist, norm, parse_spec, parse_version
from doctor.stack.service_probe import probe_failure

if TYPE_CHECKING:  # packaging is imported where it is used: `k26-doctor list` and --help never need it
    from packaging.version import Version

COMPONENTS = ("torch", "triton", "sglang", "sglang_kernel", "flashinfer")
PIP_NAMES = {"torch": "torch", "triton": "triton", "sglang": "sglang", "sglang_kernel": "sglang-kernel",
             "flashinfer": "flashinfer-python"}


def stack_dist_names() -> set[str]:
    return {norm(n) for names in compat.distribution_names().values() for n in names}


def matrix(versions: dict[str, Version | None], problems: list[str], warnings: list[str],
            rows: dict[str, Any]) -> dict[str, str]:
    """The supported matrix's pins (compat.toml) against the installed versions; a pin the profile deliberately
    overrides is a warning, as in ``unmet_requirements``. Returns the components SGLang pins that are missing
    and the profile does not name, with SGLang's pin (named here once)."""

    def judged(comp: str, text: str) -> None:
        row = rows.get(comp) or {}
        if row.get("expected") and row.get("ok"):
            warnings.append(text + " (the profile pins it deliberately)")
        else:
            problems.append(text)

    from packaging.version import Version

    missing: dict[str, str] = {}
    torch_v, triton_v, sglang_v = versions.get("torch"), versions.get("triton"), versions.get("sglang")
    if torch_v is not None and triton_v is not None:
        pinned = compat.triton_for_torch(str(torch_v))
        rows["torch"]["pins_triton"] = pinned
        spec = parse_spec(pinned if pinned and not pinned[0].isdigit() else f"=={pinned}")
        if pinned and spec is not None and not spec.contains(Version(triton_v.base_version), prereleases=True):
            judged("triton", f"torch {torch_v} pins triton {pinned}, installed {triton_v}")
    if sglang_v is not None:
        pins = compat.sglang_pins(str(sglang_v))
        rows["sglang"]["pins"] = pins
        for comp, pinned in pins.items():
            have = versions.get(comp)
            if have is not None and Version(pinned) != have:
                judged(comp, f"sglang {sglang_v} pins {PIP_NAMES.get(comp, comp)} {pinned}, installed {have}")
            elif have is None and not rows.get(comp, {}).get("expected"):  # else already reported as missing
                problems.append(f"sglang {sglang_v} needs {PIP_NAMES.get(comp, comp)} {pinned}, not installed")
                missing[comp] = pinned
    return missing


def unmet_requirements(settings: Settings, stack: dict[str, Any], named_missing: set[str]) -> list[dict[str, Any]]:
    """Requirements among the stack's own packages that the installed versions do not meet (pip check);
    ``named_missing``: components already reported missing by the matrix."""
    dists = stack.get("distributions") or {}
    names = stack_dist_names()
    by_dist = {norm(n): comp for comp, ns in compat.distribution_names().items() for n in ns}
    out = []
    for key in sorted(names):
        dist = dists.get(key)
        if not dist:
            continue
        for req in applicable_requirements(stack, dist.get("requires")):
            target = norm(req.name)
            if target not in names:
                continue
            have = dists.get(target)
            have_v = parse_version(have.get("version")) if have else None
            if have_v is not None and req.specifier.contains(have_v, prereleases=True):
                continue
            comp = by_dist.get(target, target)
            want = parse_spec(getattr(settings.stack, comp))
            if have is None and (want is not None or comp in named_missing):
                continue  # reported once, as "not installed (profile: ...)" or "sglang X needs ..., not installed"
            overridden = have_v is not None and want is not None and want.contains(have_v, prereleases=True)
            text_out = (f"{dist['name']} {dist['version']} requires {req}, installed "
                        f"{have.get('version') if have else 'nothing'}")
            if overridden:
                text_out += " (the profile pins it deliberately)"
            out.append({"dist": dist["name"], "requirement": str(req), "installed": have_v and str(have_v),
                        "overridden_by_profile": overridden, "text": text_out})
    return out


def components(stack: dict[str, Any], settings: Settings, problems: list[str]) -> tuple[dict[str, Any],
                                                                                         dict[str, Version | None]]:
    """Each component's installed version against the profile's pin: the rows of the details, the versions."""
    rows: dict[str, Any] = {}
    versions: dict[str, Version | None] = {}
    for comp in COMPONENTS:
        dist = installed_dist(stack, comp)
        want_text = getattr(settings.stack, comp)
        want = parse_spec(want_text)
        row: dict[str, Any] = {"installed": dist.get("version") if dist else None, "expected": want_text}
        rows[comp] = row
        if want_text and want is None:
            problems.append(f"the profile's stack.{comp} {want_text!r} is not a version specifier")
            continue
        if dist is None:
            versions[comp] = None
            if want is not None:
                problems.append(f"{PIP_NAMES[comp]} is not installed (profile: {want_text})")
            continue
        ver = parse_version(dist.get("version"))
        versions[comp] = ver
        if ver is None:
            problems.append(f"{dist.get('name')} has an invalid version {dist.get('version')!r}")
            continue
        if want is not None and not want.contains(ver, prereleases=True):
            problems.append(f"{dist.get('name')} {ver} does not match the profile's {want_text}")
            row["ok"] = False
        else:
            row["ok"] = True
    return rows, versions


def _install_problems(stack: dict[str, Any], settings: Settings, missing: dict[str, str], problems: list[str],
                      warnings: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Add what the installed packages say beyond the profile's pins to ``problems`` and ``warnings``: SGLang's
    unmet requirements (a warning where the profile overrides one on purpose), unreadable metadata, two copies
    of a stack package on sys.path. Returns (the unmet requirements, the duplicates) for the details."""
    unmet = unmet_requirements(settings, stack, set(missing))
    for item in unmet:
        (warnings if item["overridden_by_profile"] else problems).append(item["text"])
    for err in stack.get("metadata_errors") or []:
        problems.append(f"unreadable package metadata: {err}")
    dups = [d for d in stack.get("duplicates") or [] if norm(d.get("name", "")) in stack_dist_names()]
    for d in dups:
        warnings.append(f"two copies of {d['name']} on sys.path ({d['shadowed_by']} imports, {d['version']} shadowed)")
    return unmet, dups


def _pin_fix(settings: Settings, missing: dict[str, str]) -> Remediation:
    """One pip install of every version the profile pins, and of what the installed SGLang needs unpinned:
    they are tested together, so the fix installs the whole set, not only the one that differs."""
    specs = [f"{PIP_NAMES[c]}{getattr(settings.stack, c)}" for c in COMPONENTS if getattr(settings.stack, c)]
    specs += [f"{PIP_NAMES[c]}=={pin}" for c, pin in missing.items()]
    text = "Install the versions the profile pins (they are tested together)"
    if missing:
        text += " and what the installed SGLang needs that the profile does not pin"
    return Remediation(text + ".", [shlex.join([settings.python, "-m", "pip", "install", *specs])])


def judge_versions(stack: dict[str, Any], settings: Settings) -> Findings:
    """The stack's installed versions against the profile's pins and SGLang's own requirements: every problem
    a failure with one fix, else the overrides as warnings, else the installed set."""
    if not stack.get("ok"):
        return probe_failure(settings.python, stack, "read the installed packages")
    problems: list[str] = []
    warnings: list[str] = []
    rows, versions = components(stack, settings, problems)
    missing = matrix(versions, problems, warnings, rows)
    unmet, dups = _install_problems(stack, settings, missing, problems, warnings)
    out = Findings(components=rows, unmet=unmet, duplicates=dups, python=settings.python,
                   metadata_errors=stack.get("metadata_errors") or [], warnings=warnings)
    installed = ", ".join(f"{PIP_NAMES[c]} {rows[c]['installed']}" for c in COMPONENTS if rows[c]["installed"])
    if problems:
        fix = _pin_fix(settings, missing)
        for problem in problems:
            out.fail("stack.versions.mismatch", problem, fix)
        return out
    if warnings:
        out.info("stack.versions.installed", installed)
        for warning in warnings:
            out.warn("stack.versions.overridden", warning)
        return out
    return out.info("stack.versions.installed", installed or "no stack package installed and none expected")
