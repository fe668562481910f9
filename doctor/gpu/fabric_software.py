"""The software that brings up the NVSwitch fabric: the fabric manager and, on NVLink 5, NVLSM.

* The fabric manager (``nv-fabricmanager``, unit ``nvidia-fabricmanager``) refuses to start when its
  version differs from the loaded driver's ("the FM service checks the currently loaded kernel driver
  stack version for compatibility, and ... aborts"): its version is read from the binary
  (``nv-fabricmanager --version``) and from the package database (``dpkg-query`` / ``rpm -qa``), the
  driver's from NVML, and the package to align is named with the exact command.
* On NVLink 5 systems (HGX B200/B300) the fabric manager also needs NVLSM, the NVLink subnet manager
  (package ``nvlsm``, ``/opt/nvidia/nvlsm/sbin/nvlsm``), which programs the NVSwitches through their
  InfiniBand management ports (kernel module ``ib_umad``). The fabric manager's start script runs it
  as a child; some builds ship a unit of its own (``nvlsm`` / ``nvidia-nvlsm``). Without it the
  fabric manager fails with ``NV_WARN_NOTHING_TO_DO``, the GPUs stay "In Progress" and CUDA says
  ``CUDA_ERROR_SYSTEM_NOT_READY``.

Everything here is read-only and each command runs under a deadline (``doctor.core.proc.run``):
``systemctl show`` (never start/stop), ``dpkg-query``/``rpm -qa``, ``nv-fabricmanager --version``,
and ``/proc/*/comm`` for the processes. Functions that build fix commands are shared by the checks
and fixers.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from typing import Any

from doctor.core.fileio import open_regular

FM_UNIT = "nvidia-fabricmanager.service"
NVLSM_UNITS = ("nvlsm.service", "nvidia-nvlsm.service")
FM_BINARY = "nv-fabricmanager"
FM_BINARY_PATHS = ("/usr/bin/nv-fabricmanager", "/usr/sbin/nv-fabricmanager", "/usr/local/bin/nv-fabricmanager")
NVLSM_BINARY = "/opt/nvidia/nvlsm/sbin/nvlsm"
FM_START_SCRIPT = "/usr/bin/nvidia-fabricmanager-start.sh"
FM_COMM = "nv-fabricmanage"  # /proc/PID/comm keeps 15 characters
NVLSM_COMM = "nvlsm"
IB_UMAD = "ib_umad"
CMD_TIMEOUT_S = 5.0
MAX_PIDS = 100_000
# Package names: CUDA repository and distributions (Debian/Ubuntu nvidia-fabricmanager-<branch>,
# RHEL nvidia-fabric-manager / nvidia-fabricmanager).
FM_PACKAGE_RE = re.compile(r"^(cuda-drivers-fabricmanager|nvidia-fabric-?manager)(-\d+)?$")
NVLSM_PACKAGE = "nvlsm"
DPKG_PATTERNS = ("nvidia-fabricmanager*", "nvidia-fabric-manager*", "cuda-drivers-fabricmanager*", NVLSM_PACKAGE)
RPM_PATTERNS = ("nvidia-fabric*manager*", "cuda-drivers-fabricmanager*", NVLSM_PACKAGE)
VERSION_RE = re.compile(r"\b(\d+\.\d+(?:\.\d+)*)\b")

Runner = Callable[..., Any]


def _default_run() -> Runner:
    from doctor.core.proc import run

    return run


def version_in(text: str) -> str | None:
    """The first dotted version in ``Fabric Manager version is : 580.159.04``."""
    m = VERSION_RE.search(text or "")
    return m.group(1) if m else None


def upstream(version: str | None) -> str | None:
    """``580.159.04`` of a package version ``580.159.04-1`` / ``1:580.159.04-0ubuntu1`` / ``580.159.04``."""
    if not version:
        return None
    text = version.split(":", 1)[-1]
    return text.rsplit("-", 1)[0] if "-" in text else text


def parse_dpkg(text: str) -> list[dict[str, str]]:
    """``ii \\tname\\tversion`` lines of ``dpkg-query -W -f '${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'``:
    the installed packages only."""
    out = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0].strip().startswith("ii") and parts[1].strip():
            out.append({"name": parts[1].strip(), "version": parts[2].strip(),
                        "upstream": upstream(parts[2].strip()) or ""})
    return out


def parse_rpm(text: str) -> list[dict[str, str]]:
    """``name\\tversion\\trelease`` lines of ``rpm -qa --qf '%{NAME}\\t%{VERSION}\\t%{RELEASE}\\n'``."""
    out = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0].strip():
            out.append({"name": parts[0].strip(), "version": f"{parts[1].strip()}-{parts[2].strip()}",
                        "upstream": parts[1].strip()})
    return out


def parse_systemctl_show(text: str) -> dict[str, dict[str, str]]:
    """``systemctl show -p Id,LoadState,...`` of several units: blocks of KEY=VALUE separated by blank lines."""
    units: dict[str, dict[str, str]] = {}
    block: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if block.get("Id"):
                units[block["Id"]] = block
            block = {}
            continue
        key, _, value = line.partition("=")
        block[key.strip()] = value.strip()
    return units


def processes(proc_root: str, names: tuple[str, ...]) -> dict[str, Any]:
    """PIDs whose ``comm`` is one of ``names``, and whether this /proc shows the host (PID 1 is init)."""
    found: dict[str, list[int]] = {n: [] for n in names}
    try:
        entries = os.listdir(proc_root)
    except OSError as exc:
        return {"readable": False, "error": exc.strerror or str(exc), "pids": found, "pid1": None}
    count = 0
    for entry in entries:
        if not entry.isdigit():
            continue
        count += 1
        if count > MAX_PIDS:
            break
        try:
            with open_regular(os.path.join(proc_root, entry, "comm")) as fh:
                comm = fh.read(64).decode("utf-8", "replace").strip()
        except OSError:
            continue
        if comm in found:
            found[comm].append(int(entry))
    try:
        with open_regular(os.path.join(proc_root, "1", "comm")) as fh:
            pid1: str | None = fh.read(64).decode("utf-8", "replace").strip()
    except OSError:
        pid1 = None
    return {"readable": True, "error": None, "pids": {k: sorted(v) for k, v in found.items()}, "pid1": pid1}


def _which(name: str, paths: tuple[str, ...] = ()) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for p in paths:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def read_packages(run: Runner) -> dict[str, Any]:
    """The fabric manager and NVLSM packages the package database says are installed."""
    if shutil.which("dpkg-query"):
        res = run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${Package}\t${Version}\n", *DPKG_PATTERNS],
                  CMD_TIMEOUT_S)
        # rc 1 only means some pattern matched nothing; what did match is still printed.
        ok = res.start_error is None and not res.timed_out and res.returncode in (0, 1)
        return {"manager": "dpkg", "packages": parse_dpkg(res.stdout) if ok else [],
                "error": None if ok else res.why()}
    if shutil.which("rpm"):
        res = run(["rpm", "-qa", "--qf", "%{NAME}\t%{VERSION}\t%{RELEASE}\n", *RPM_PATTERNS], CMD_TIMEOUT_S)
        return {"manager": "rpm", "packages": parse_rpm(res.stdout) if res.ok else [],
                "error": None if res.ok else res.why()}
    return {"manager": None, "packages": [], "error": "neither dpkg-query nor rpm is on PATH"}


def read_fabric_software(run: Runner | None = None, proc_root: str = "/proc", sys_root: str = "/sys",
                         nvlsm_binary: str = NVLSM_BINARY) -> dict[str, Any]:
    """Fabric manager (binary version, package, unit, process) and NVLSM (package, binary, unit, process,
    ib_umad). JSON; every failure is recorded as data."""
    run = run or _default_run()
    out: dict[str, Any] = {"package_manager": None, "packages_error": None}
    pkgs = read_packages(run)
    out["package_manager"], out["packages_error"] = pkgs["manager"], pkgs["error"]
    fm_pkgs = [p for p in pkgs["packages"] if FM_PACKAGE_RE.match(p["name"])]
    nvlsm_pkgs = [p for p in pkgs["packages"] if p["name"] == NVLSM_PACKAGE]

    binary = _which(FM_BINARY, FM_BINARY_PATHS)
    fm: dict[str, Any] = {"binary": binary, "binary_version": None, "binary_error": None, "packages": fm_pkgs}
    if binary:
        res = run([binary, "--version"], CMD_TIMEOUT_S)
        fm["binary_version"] = version_in(res.stdout + "\n" + res.stderr) if res.start_error is None else None
        if fm["binary_version"] is None:
            fm["binary_error"] = res.why() if not res.ok else "no version in its output"

    units: dict[str, dict[str, str]] = {}
    unit_error = None
    if shutil.which("systemctl"):
        res = run(["systemctl", "show", "-p", "Id,LoadState,ActiveState,SubState,UnitFileState", FM_UNIT,
                   *NVLSM_UNITS], CMD_TIMEOUT_S)
        if res.ok:
            units = parse_systemctl_show(res.stdout)
        else:
            unit_error = res.why()
    else:
        unit_error = "systemctl is not on PATH"
    procs = processes(proc_root, (FM_COMM, NVLSM_COMM))
    fm.update(unit=units.get(FM_UNIT), pids=procs["pids"].get(FM_COMM, []))
    out["fabric_manager"] = fm
    out["nvlsm"] = {"packages": nvlsm_pkgs, "binary": nvlsm_binary if os.path.exists(nvlsm_binary) else None,
                    "units": {u: units[u] for u in NVLSM_UNITS if u in units},
                    "pids": procs["pids"].get(NVLSM_COMM, []),
                    "ib_umad_loaded": os.path.isdir(os.path.join(sys_root, "module", IB_UMAD)),
                    "start_script": FM_START_SCRIPT if os.path.exists(FM_START_SCRIPT) else None}
    out["systemd"] = {"error": unit_error}
    out["proc"] = {"readable": procs["readable"], "error": procs["error"], "pid1": procs["pid1"]}
    return out


# -- shared by the checks and fixers -------------------------------------------------------------------

def unit_loaded(unit: Any) -> bool:
    return isinstance(unit, dict) and unit.get("LoadState") == "loaded"


def unit_active(unit: Any) -> bool | None:
    """True/False when systemd answered for a loaded unit; None when it could not say."""
    if not isinstance(unit, dict) or not unit.get("ActiveState"):
        return None
    return unit.get("ActiveState") in ("active", "activating", "reloading")


def fm_versions(fm: dict[str, Any]) -> dict[str, str]:
    """Where the fabric manager's version was read -> the version (``binary``, ``package <name>``)."""
    out: dict[str, str] = {}
    if isinstance(fm.get("binary_version"), str):
        out["binary"] = fm["binary_version"]
    for p in fm.get("packages") or []:
        if isinstance(p, dict) and p.get("upstream") and p.get("name") and not str(p["name"]).startswith("cuda-"):
            out[f"package {p['name']}"] = str(p["upstream"])
    return out


def version_mismatch(versions: dict[str, str], driver: Any) -> str | None:
    """``binary is 580.126.09`` when a fabric manager version read differs from the driver's, else None."""
    if not isinstance(driver, str) or not driver:
        return None
    wrong = [f"{where} is {v}" for where, v in versions.items() if v != driver]
    return ", ".join(wrong) or None


def branch(driver: str) -> str:
    return driver.split(".", 1)[0]


def align_commands(manager: str | None, packages: list[dict[str, Any]], driver: str) -> list[str]:
    """The exact command that installs the fabric manager of the driver's version, for this package manager."""
    names = [p["name"] for p in packages if isinstance(p, dict) and p.get("name")
             and not str(p["name"]).startswith("cuda-")]
    if manager == "rpm":
        name = names[0] if names else "nvidia-fabricmanager"
        return [f"sudo dnf install {name}-{driver}"]
    if manager == "dpkg" or manager is None:
        name = names[0] if names else f"nvidia-fabricmanager-{branch(driver)}"
        cmds = [f"sudo apt-get install --allow-downgrades {name}='{driver}-*'"]
        if manager is None:
            cmds.append(f"sudo dnf install nvidia-fabricmanager-{driver}")
        return cmds
    return []


def install_nvlsm_commands(manager: str | None) -> list[str]:
    if manager == "rpm":
        return ["sudo dnf install nvlsm infiniband-diags"]
    if manager == "dpkg":
        return ["sudo apt-get install nvlsm infiniband-diags"]
    return ["sudo apt-get install nvlsm infiniband-diags   # or: sudo dnf install nvlsm infiniband-diags"]


def nvlsm_start_plan(nvlsm: dict[str, Any], fm: dict[str, Any]) -> list[list[str]]:
    """The commands (argv) that get NVLSM running: ``ib_umad`` loaded, then its own unit when this build
    ships one, else the fabric manager (whose start script runs NVLSM) enabled and (re)started."""
    steps: list[list[str]] = []
    if not nvlsm.get("ib_umad_loaded"):
        steps.append(["modprobe", IB_UMAD])
    own = [u for u, info in (nvlsm.get("units") or {}).items() if unit_loaded(info)]
    if own:
        steps.append(["systemctl", "enable", "--now", own[0]])
    elif unit_active(fm.get("unit")):
        steps.append(["systemctl", "restart", FM_UNIT])
    else:
        steps.append(["systemctl", "enable", "--now", FM_UNIT])
    return steps
