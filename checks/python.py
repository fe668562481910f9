"""The service's Python environment judged from outside: interpreter, pyvenv.cfg, shebangs, site-packages.

The B300 venv was streamed from another machine: paths in ``pyvenv.cfg`` and in the console scripts'
shebangs belonged to that machine. Read from the ``venv`` fact, which is collected without running
the environment's interpreter, so this check still speaks when that interpreter cannot start.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from doctor.core.registry import check
from doctor.core.result import Remediation, Result

# -- python.venv ---------------------------------------------------------------------------------

@check("python.venv", "The service's environment is whole: interpreter, pyvenv.cfg, scripts' shebangs",
       needs=("venv",), fixer="python.venv.shebangs")
def python_venv(ctx: Any) -> Result:
    """Reads the environment from outside (so it works even when its interpreter cannot start): the
    interpreter path resolves and starts; ``pyvenv.cfg``'s ``home`` exists and its version matches the
    interpreter; every console script's shebang points into this environment (a venv copied from
    another machine keeps that machine's paths: the scripts then fail with "bad interpreter" or run
    another environment's Python); site-packages is readable. Fix by hand: recreate the venv on this
    machine (``python3 -m venv`` + reinstall), or rewrite the shebangs (the fixer does this, with backups).
    """
    v = ctx.fact("venv")
    if not isinstance(v, dict):
        return Result.failed("no environment reading recorded")
    py = v.get("python")
    if not v.get("exists"):
        return Result.failed(f"{py} does not exist", Remediation(
            "Point --python (or [doctor] python) at the service's interpreter, or create the venv there."), **v)
    problems: list[str] = []
    warnings: list[str] = []
    if not v.get("resolves"):
        chain = " -> ".join(v.get("link_chain") or [])
        problems.append(f"{py} is a dangling symlink ({chain})")
    if v.get("is_venv"):
        home = v.get("home")
        if not home:
            problems.append("pyvenv.cfg has no 'home' key")
        elif not v.get("home_exists"):
            problems.append(f"pyvenv.cfg home {home} does not exist on this machine (copied from another?)")
        cfg_v = str(v.get("cfg_version") or "")
        run_v = ".".join(str(x) for x in ((v.get("runtime") or {}).get("version_info") or []))
        real = os.path.basename(str(v.get("resolved") or ""))
        m = re.match(r"python(\d+\.\d+)", real)
        if cfg_v and run_v and cfg_v.split(".")[:2] != run_v.split(".")[:2]:
            problems.append(f"pyvenv.cfg says Python {cfg_v} but the interpreter is {run_v}")
        elif cfg_v and not run_v and m and cfg_v.split(".")[:2] != m.group(1).split("."):
            problems.append(f"pyvenv.cfg says Python {cfg_v} but bin/python resolves to {real}")
        elif cfg_v and run_v and cfg_v != run_v:
            warnings.append(f"venv made with Python {cfg_v}, base interpreter is now {run_v}")
        broken = [s for s in v.get("scripts") or [] if not s.get("exists") or not s.get("inside")]
        if broken:
            missing = [s for s in broken if not s.get("exists")]
            outside = [s for s in broken if s.get("exists")]
            if missing:
                problems.append(f"{len(missing)} script(s) in {v.get('bin')} name an interpreter that does not exist "
                                f"(e.g. {missing[0]['name']}: #!{missing[0]['interpreter']})")
            if outside:
                problems.append(f"{len(outside)} script(s) run an interpreter outside this environment "
                                f"(e.g. {outside[0]['name']}: #!{outside[0]['interpreter']})")
        if v.get("truncated"):
            warnings.append(f"only the first {v.get('scanned')} files of bin/ were read")
        sps = v.get("site_packages") or []
        if not sps:
            problems.append(f"no lib/python3.X/site-packages under {v.get('root')}")
        for sp in sps:
            if not sp.get("readable"):
                problems.append(f"{sp['path']} is not readable ({sp.get('error') or 'permission'})")
    if not v.get("starts"):
        problems.append(f"the interpreter does not start: {v.get('start_error')}")
    details = {k: v.get(k) for k in ("python", "resolved", "root", "is_venv", "home", "home_exists", "cfg_version",
                                     "runtime", "start_error", "site_packages", "scanned")}
    details["broken_scripts"] = [s for s in v.get("scripts") or [] if not s.get("exists") or not s.get("inside")]
    if problems:
        root = v.get("root") or "<venv>"
        home_cmd = []
        if v.get("is_venv") and not v.get("home_exists"):
            q = shlex.quote(str(root))
            pip = shlex.quote(f"{root}/bin/pip")
            home_cmd = [f"# recreate on this machine: python3.X -m venv --clear {q} && {pip} install -r "
                        "requirements.txt", f"# or set 'home' in {shlex.quote(f'{root}/pyvenv.cfg')} to this machine's "
                        "python3.X bin dir"]
        return Result.failed("; ".join(problems), Remediation(
            "The environment does not belong to this machine as it stands. Recreate it here, or repair it: "
            "`k26-doctor fix --apply` rewrites broken shebangs (with backups).", home_cmd), **details)
    kind = "venv" if v.get("is_venv") else "interpreter (not a venv)"
    rt = v.get("runtime") or {}
    summary = (f"{kind} {v.get('root') or py} is whole: Python {'.'.join(map(str, rt.get('version_info') or []))}"
               + (f", {len(v.get('scripts') or [])} scripts point into it" if v.get("is_venv") else ""))
    if warnings:
        return Result.warned(summary + "; " + "; ".join(warnings), **details)
    return Result.passed(summary, **details)
