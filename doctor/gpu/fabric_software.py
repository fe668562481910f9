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
from doctor.core.registry import Applicability
from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.gpu import fabric
from doctor.gpu.group import tp_group
from doctor.gpu.nvml_fact import NvmlFact

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


# -- gpu.fabric.manager, gpu.fabric.nvlsm: judged ---------------------------------------------------------

NVLSM_DOWN = "gpu.fabric.nvlsm.stopped"  # the finding the NVLSM fixer acts on (load ib_umad, start it)


def expects_nvswitch(settings: Settings) -> bool:
    """The fabric software is judged only where the profile expects NVSwitch (gpu.nvswitch)."""
    return bool(settings.gpu.nvswitch)


def _no_nvswitch(settings: Settings, what: str) -> str:
    return f"the profile ({settings.profile_name}) expects no NVSwitch: no {what} to judge"


def needs_nvlsm(settings: Settings) -> bool:
    """NVLSM is judged only where the profile is NVLink 5 (B200/B300) and expects NVSwitch."""
    gen = settings.gpu.nvlink_generation
    return isinstance(gen, int) and gen >= 5 and expects_nvswitch(settings)


def _no_nvlsm(settings: Settings) -> str:
    gen = settings.gpu.nvlink_generation
    if not isinstance(gen, int) or gen < 5:
        return (f"NVLSM is needed on NVLink 5 NVSwitch hosts (B200/B300); profile {settings.profile_name} is NVLink "
                f"{gen if gen is not None else '(unset)'}")
    return _no_nvswitch(settings, "NVLSM")


# gpu.fabric.manager's and gpu.fabric.nvlsm's applies_if
MANAGER_APPLIES = Applicability(expects_nvswitch, lambda settings: _no_nvswitch(settings, "fabric manager"))
NVLSM_APPLIES = Applicability(needs_nvlsm, _no_nvlsm)


def fabric_host(nvml: NvmlFact, settings: Settings, what: str) -> NvmlFact:
    """The nvml fact when the GPUs report an NVSwitch fabric (the profile expects one: ``MANAGER_APPLIES``,
    declared on the check); else ``NotJudged`` saying why not."""
    tp_group(nvml, settings.world_size)
    if fabric.readiness(nvml, settings.world_size).outcome == "no_fabric":
        raise NotJudged.inapplicable(f"the GPUs report no NVSwitch fabric (NotSupported): no {what} runs here "
                                     f"(see gpu.fabric)")
    return nvml


def fm_running(fm: dict[str, Any], sw: dict[str, Any]) -> tuple[bool | None, str]:
    """Is the fabric manager running: its unit active or its process seen; None when neither could be read."""
    unit = fm.get("unit")
    if unit_active(unit) or fm.get("pids"):
        return True, "running" + (f" (PID {fm['pids'][0]})" if fm.get("pids") else "")
    proc_seen = (sw.get("proc") or {}).get("readable") and (sw.get("proc") or {}).get("pid1") in ("systemd", "init")
    if unit_loaded(unit):
        return False, f"{FM_UNIT} is {unit.get('ActiveState')} ({unit.get('SubState')})"
    if proc_seen:
        return False, "no nv-fabricmanager process and no loaded nvidia-fabricmanager unit"
    return None, "neither systemd nor the host's processes could be read"


def judge_manager(nvml: NvmlFact, sw: dict[str, Any], settings: Settings) -> Findings:
    """The fabric manager installed at the loaded driver's version, and running (on a host ``fabric_host`` took)."""
    fm = sw.get("fabric_manager") or {}
    driver = nvml.get("driver_version")
    manager = sw.get("package_manager")
    versions = fm_versions(fm)
    out = Findings(driver_version=driver, versions=versions, packages=fm.get("packages"), binary=fm.get("binary"),
                   unit=fm.get("unit"), pids=fm.get("pids"), package_manager=manager)
    if not isinstance(driver, str) or not driver:
        raise NotJudged.blocked("the driver version was not read (see gpu.driver): nothing to compare the fabric "
                                "manager with", "gpu.driver", **out.details)
    align = align_commands(manager, fm.get("packages") or [], driver)
    if not versions:
        if manager and not sw.get("packages_error") and not fm.get("binary"):
            return out.fail("gpu.fabric.manager.missing", f"the fabric manager is not installed (no package, no "
                            f"nv-fabricmanager); this NVSwitch host needs the one of driver {driver}",
                            Remediation(f"Install the fabric manager of driver {driver} and start it.",
                                        [*align, f"sudo systemctl enable --now {FM_UNIT}"]))
        why = fm.get("binary_error") or sw.get("packages_error") or "no binary, no package database"
        raise NotJudged.missing(f"the fabric manager's version could not be read ({why})", **out.details)
    listing = version_mismatch(versions, driver)
    if listing:
        return out.fail(
            "gpu.fabric.manager.version", f"fabric manager version differs from the driver {driver} ({listing}): it "
            f"refuses to start, and the GPUs stay 'In Progress'",
            Remediation(f"Install the fabric manager of the loaded driver, {driver}, then restart it. (If the driver "
                        f"is the one to change, install the driver of the fabric manager's version and reboot "
                        f"instead: both must be the same version.)",
                        [*align, f"sudo systemctl restart {FM_UNIT}", "nvidia-smi -q | grep -i -A3 fabric"]))
    running, how = fm_running(fm, sw)
    out.details["running"] = running
    if running is False:
        return out.fail("gpu.fabric.manager.stopped", f"fabric manager {driver} (the driver's version) is installed "
                        f"but not running: {how}",
                        Remediation("Enable and start it; read its log if it stops again.",
                                    [f"sudo systemctl enable --now {FM_UNIT}", f"journalctl -u {FM_UNIT} -n 100"]))
    if running is None:
        return out.warn("gpu.fabric.manager.unseen", f"fabric manager {driver}, the driver's version; whether it runs "
                        f"is unknown: {how}")
    return out.info("gpu.fabric.manager.running", f"fabric manager {driver}, the driver's version "
                    f"({', '.join(versions)}), {how}")


def nvlsm_host(nvml: NvmlFact, settings: Settings) -> NvmlFact:
    """The nvml fact on an NVLink 5 NVSwitch host (the profile is one: ``NVLSM_APPLIES``, declared on the check),
    where NVLSM is needed; else ``NotJudged`` saying why not."""
    return fabric_host(nvml, settings, "NVLSM")


def _nvlsm_missing(out: Findings, sw: dict[str, Any], start: list[str]) -> Findings:
    """No NVLSM package and no binary: a failure when the package database was read, else ``NotJudged`` (an
    unread database says nothing about what is installed)."""
    manager = sw.get("package_manager")
    if not manager or sw.get("packages_error"):
        raise NotJudged.missing(f"whether NVLSM is installed could not be read ({sw.get('packages_error')})",
                                **out.details)
    return out.fail("gpu.fabric.nvlsm.missing", f"NVLSM is not installed (no {NVLSM_PACKAGE} package, no "
                    f"{NVLSM_BINARY}): on NVLink 5 the fabric manager cannot bring up the NVSwitches and CUDA "
                    f"reports 'system not ready'",
                    Remediation("Install nvlsm, load ib_umad, restart the fabric manager (its start script runs "
                                "NVLSM).", [*install_nvlsm_commands(manager), *start]))


def _nvlsm_running(nv: dict[str, Any], units: dict[str, Any]) -> str | None:
    """How NVLSM is seen running (its PID, or an active unit), or None when it is not seen running."""
    if nv.get("pids"):
        return f"PID {nv['pids'][0]}"
    active_units = [u for u, info in units.items() if unit_active(info)]
    return f"{active_units[0]} active" if active_units else None


def _nvlsm_visible(sw: dict[str, Any], units: dict[str, Any]) -> bool:
    """Whether "not running" can be told from "not visible": the host's processes are in this /proc (a
    container's is not), or a unit of NVLSM is loaded and says its state."""
    proc = sw.get("proc") or {}
    return bool(proc.get("readable") and proc.get("pid1") in ("systemd", "init")) or any(
        unit_loaded(info) for info in units.values())


def _nvlsm_down(out: Findings, nvml: NvmlFact, sw: dict[str, Any], settings: Settings,
                start: list[str]) -> Findings:
    """NVLSM installed but not running, and why (ib_umad, the fabric manager that starts it): a failure while the
    fabric is not up, a warning when it is (only link recovery needs NVLSM then)."""
    nv, fm = sw.get("nvlsm") or {}, sw.get("fabric_manager") or {}
    why = [] if nv.get("ib_umad_loaded") else ["the ib_umad module is not loaded"]
    if not unit_active(fm.get("unit")):
        why.append(f"{FM_UNIT} (which starts it) is {(fm.get('unit') or {}).get('ActiveState') or 'not running'}")
    pending = fabric.readiness(nvml, settings.world_size).outcome in ("pending", "failed")
    summary = "NVLSM is installed but not running" + (f": {'; '.join(why)}" if why else "")
    text = ("Load ib_umad and start NVLSM (through its unit, or the fabric manager whose start script runs it); "
            "`k26-doctor fix --apply` plans exactly these.")
    if version_mismatch(fm_versions(fm), nvml.get("driver_version")):
        text = ("First align the fabric manager with the driver (see gpu.fabric.manager): it refuses to start, and "
                "NVLSM with it. Then load ib_umad and start NVLSM through the fabric manager (or its own unit).")
    if pending:
        return out.fail(NVLSM_DOWN, summary + " (the fabric is not up)", Remediation(text, start))
    return out.warn(NVLSM_DOWN, summary + "; the fabric is up now, but link recovery needs NVLSM",
                    Remediation(text, start))


def judge_nvlsm(nvml: NvmlFact, sw: dict[str, Any], settings: Settings) -> Findings:
    """NVLSM installed and running (on a host ``nvlsm_host`` took)."""
    nv, fm = sw.get("nvlsm") or {}, sw.get("fabric_manager") or {}
    pkgs = nv.get("packages") or []
    units = nv.get("units") or {}
    out = Findings(packages=pkgs, binary=nv.get("binary"), pids=nv.get("pids"), units=units,
                   ib_umad_loaded=nv.get("ib_umad_loaded"), fabric_manager_unit=fm.get("unit"))
    start = ["sudo " + " ".join(step) for step in nvlsm_start_plan(nv, fm)]
    if not pkgs and not nv.get("binary"):
        return _nvlsm_missing(out, sw, start)
    version = pkgs[0].get("version") if pkgs else None
    how = _nvlsm_running(nv, units)
    if how is not None:
        return out.info("gpu.fabric.nvlsm.running", f"NVLSM {version or '(version unknown)'} running ({how})")
    if not _nvlsm_visible(sw, units):
        raise NotJudged.missing("NVLSM is installed; whether it runs cannot be seen from here (this /proc does not "
                                "show the host's processes and no NVLSM unit is loaded)", **out.details)
    return _nvlsm_down(out, nvml, sw, settings, start)
