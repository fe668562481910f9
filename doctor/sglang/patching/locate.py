"""Find the service's SGLang install (site-packages, dist-info, package directory) by probe.

The doctor never imports SGLang: a tiny probe (``doctor/probes/site_packages.py``) runs under the
service's interpreter and reports where its ``sys.path`` has the dist-info and the package; the
doctor then reads RECORD and hashes files itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doctor.core import proc
from doctor.sglang.patching.record import Installed, RecordError, load_installed

PROBE_TIMEOUT_S = 20.0


class LocateError(Exception):
    """SGLang's install cannot be found or is inconsistent; the message says how."""


@dataclass
class Located:
    installed: Installed
    package_root: Path  # the directory holding the sglang package (= site-packages for a normal install)
    probe: dict[str, Any]


def probe_install(python: str, dist: str = "sglang", timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """The probe's JSON; ``LocateError`` when the interpreter cannot run it."""
    data, res = proc.run_probe(python, "site_packages", [dist], timeout=timeout)
    if data is None:
        raise LocateError(f"cannot inspect {python}: {res.why()}")
    return data


def from_probe(data: dict[str, Any], dist: str = "sglang") -> Located:
    """Interpret a probe result: the first dist-info on sys.path, cross-checked with the package."""
    infos = data.get("dist_infos") or []
    python = data.get("python") or "the interpreter"
    if not infos:
        raise LocateError(f"{dist} is not installed for {python} (no {dist}-*.dist-info on its sys.path)")
    first = infos[0]
    same_dir = [i for i in infos if i.get("site_packages") == first.get("site_packages")]
    if len(same_dir) > 1:
        raise LocateError(f"{len(same_dir)} {dist} dist-info directories in {first.get('site_packages')} "
                          f"({', '.join(Path(i['path']).name for i in same_dir)}): a half-finished upgrade; reinstall")
    try:
        installed = load_installed(Path(first["path"]), Path(first["site_packages"]))
    except (RecordError, KeyError, TypeError) as exc:
        raise LocateError(str(exc)) from None
    pkg_dirs = data.get("package_dirs") or []
    root = installed.site_packages
    if pkg_dirs:
        pkg_parent = Path(pkg_dirs[0]).parent
        if pkg_parent.resolve() != installed.site_packages.resolve():
            # an editable or shadowing install: the code that runs is not what RECORD describes
            raise LocateError(f"{python} imports {dist} from {pkg_dirs[0]}, but its dist-info is in "
                              f"{installed.site_packages}: an editable or shadowed install; patch the checkout "
                              "with git instead, or remove the shadowing copy")
        root = pkg_parent
    elif data.get("package_origin") is None:
        raise LocateError(f"{python} has {Path(first['path']).name} but no importable {dist} package")
    return Located(installed, root, data)


def locate(python: str, dist: str = "sglang", timeout: float = PROBE_TIMEOUT_S) -> Located:
    return from_probe(probe_install(python, dist, timeout), dist)
