"""Where an interpreter's ``Python.h`` comes from, and the one command that installs it on this host.

Triton's JIT compiles its C helpers against the service interpreter's headers (the B300 start failed on a
missing ``Python.h``). The package that holds them depends on the distribution *and* on the interpreter: a
system Python gets its release's dev package (``python3-dev`` for the default ``python3``, ``python3.X-dev`` /
``python3.X-devel`` for the others the release packages), and only if the release packages that X.Y at all
(Debian 12 has no ``python3.12-dev``); a pyenv, uv or conda interpreter keeps its headers in its own prefix
(reinstall it there); a source build under ``/usr/local`` or ``/opt`` gets them from its ``make install``.
The distributions are data: ``doctor/data/python_headers.toml``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml

TABLE = Path(__file__).resolve().parents[1] / "data" / "python_headers.toml"


@dataclass
class HeadersAdvice:
    """What to do about a missing ``Python.h``: ``packages`` to install (with ``install``'s argv), or by hand."""

    kind: str  # system, pyenv, uv, conda, other
    text: str
    commands: list[str] = field(default_factory=list)
    manager: list[str] = field(default_factory=list)  # the package manager's install argv (system only)
    packages: list[str] = field(default_factory=list)  # the packages that exist there (system only)


def interpreter_kind(base_prefix: str, conda: bool = False) -> str:
    """Who installed the interpreter whose base prefix is ``base_prefix``: system, pyenv, uv, conda or other."""
    if "/.pyenv/versions/" in base_prefix or "/pyenv/versions/" in base_prefix:
        return "pyenv"
    if "/uv/python/" in base_prefix or re.search(r"/cpython-\d+\.\d+", base_prefix):
        return "uv"
    if conda:
        return "conda"
    if base_prefix.rstrip("/") == "/usr":
        return "system"
    return "other"


def family(os_release: dict[str, str]) -> tuple[str | None, dict[str, Any]]:
    """The package family of the host (``debian``, ``fedora``) and its table, from os-release's ID / ID_LIKE."""
    ids = [os_release.get("ID", "").lower(), *os_release.get("ID_LIKE", "").lower().split()]
    for name, fam in (load_toml(TABLE).get("family") or {}).items():
        if any(i and i in fam.get("ids", []) for i in ids):
            return name, fam
    return None, {}


def release(os_release: dict[str, str]) -> dict[str, Any] | None:
    """The table's entry for this distribution release (ID, or an ID_LIKE parent, and VERSION_ID or its major)."""
    ids = [os_release.get("ID", "").lower(), *os_release.get("ID_LIKE", "").lower().split()]
    version = os_release.get("VERSION_ID", "").strip('"')
    versions = [version, version.split(".")[0]] if version else []
    for rid in ids:
        for rel in load_toml(TABLE).get("release") or []:
            if rel.get("id") == rid and str(rel.get("version")) in versions:
                return rel
    return None


def headers_advice(os_release: dict[str, str], major_minor: str, base_prefix: str, version: str = "",
                   conda: bool = False, compiler: bool = False) -> HeadersAdvice:
    """How to get ``Python.h`` for the Python ``major_minor`` (full ``version`` if known) under ``base_prefix``
    on the host ``os_release`` describes; ``compiler``: a C compiler is missing too."""
    kind = interpreter_kind(base_prefix, conda)
    ver = version or major_minor
    if kind != "system":
        return _own_prefix(kind, base_prefix, major_minor, ver, os_release, compiler)
    fam_name, fam = family(os_release)
    rel = release(os_release)
    where = (rel or {}).get("name") or os_release.get("PRETTY_NAME") or os_release.get("ID") or "this distribution"
    if not fam:
        return HeadersAdvice(kind, f"The system Python {major_minor} needs its development headers (Python.h) and a C "
                             f"compiler; {where} is not a distribution whose packages the doctor knows: install "
                             f"its Python {major_minor} development package.")
    if rel is not None:
        if rel.get("python3") == major_minor:
            pkg = fam["default"]
        else:
            pkg = (rel.get("headers") or {}).get(major_minor)
        if pkg is None:
            packaged = sorted({rel.get("python3"), *(rel.get("headers") or {})} - {None},
                              key=lambda v: [int(x) for x in str(v).split(".")])
            return HeadersAdvice(kind, f"{where} packages Python.h only for Python {', '.join(packaged)} (its "
                                 f"python3 is {rel.get('python3')}: {fam['default']}); this Python {major_minor} under "
                                 f"{base_prefix} did not come from its repositories, so no {fam['manager']} package "
                                 "has its headers. Reinstall it from where it came (with its headers), or run the "
                                 f"service on the release's Python {rel.get('python3')}.")
        check = ""
    else:
        pkg = fam["versioned"].format(mm=major_minor)
        check = shlex.join([*fam["query"], pkg])
    pkgs = [pkg] + ([fam["compiler"]] if compiler else [])
    install = list(fam["install"])
    cmd = shlex.join([*install, *pkgs])
    text = (f"The system Python {major_minor} needs its development headers: {where} has them in {pkg}"
            + (f", and {fam['compiler']} is the C compiler" if compiler else "") + ". `k26-doctor fix --apply` runs "
            "this.")
    if check:
        text = (f"The system Python {major_minor} needs its development headers; {where} is not in the doctor's "
                f"table, so check that {pkg} exists first ({fam_name} naming).")
    return HeadersAdvice(kind, text, ([check] if check else []) + [cmd], install, pkgs)


def _own_prefix(kind: str, base: str, mm: str, ver: str, os_release: dict[str, str], compiler: bool) -> HeadersAdvice:
    extra = ""
    if compiler:
        _, fam = family(os_release)
        extra = f" Also install a C compiler ({fam.get('compiler', 'gcc')})."
    texts = {
        "pyenv": (f"This pyenv interpreter ({base}) keeps its headers in its own prefix ({base}/include/python{mm}); "
                  "no system package helps. Reinstall it (pyenv builds from source and installs the headers), then "
                  "recreate or re-point the venv.", [shlex.join(["pyenv", "install", "--force", ver])]),
        "uv": (f"This uv-managed interpreter ({base}) ships its headers in its own prefix; reinstall it.",
               [shlex.join(["uv", "python", "install", "--reinstall", ver])]),
        "conda": (f"This conda interpreter ({base}) keeps its headers in {base}/include; reinstall python there.",
                  [shlex.join(["conda", "install", "-p", base, "--force-reinstall", f"python={ver}"])]),
        "other": (f"The interpreter at {base or '?'} was installed without its headers; they belong in "
                  f"{base or '<prefix>'}/include/python{mm}. Reinstall it from a full build (make install includes "
                  "them) or copy the include directory of the identical build.", []),
    }
    text, cmds = texts[kind]
    return HeadersAdvice(kind, text + extra, cmds)


def from_include(include: str) -> tuple[str, str] | None:
    """``(base_prefix, major_minor)`` of an include directory such as ``/usr/include/python3.12``."""
    m = re.match(r"^(?P<base>/\S*?)/include/python(?P<mm>\d+\.\d+)", include)
    return (m.group("base") or "/", m.group("mm")) if m else None
