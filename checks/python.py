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
from doctor.python.interpreter import describe

# -- python.venv ---------------------------------------------------------------------------------

@check("python.venv", "The service's environment is whole: interpreter, pyvenv.cfg, scripts' shebangs",
       needs=("venv",))
def python_venv(ctx: Any) -> Result:
    """Reads the environment from outside (so it works even when its interpreter cannot start): the
    interpreter path exists, is a Python interpreter and starts; ``pyvenv.cfg``'s ``home`` exists and its
    version matches the interpreter; site-packages is readable. Every check of what is installed runs a probe
    under this interpreter and depends on this check: a wrong ``--python`` (absent, not executable, another
    program) is said here once, with what the path is, and those checks are blocked by it. The console scripts'
    shebangs are ``python.venv.scripts``. Fix by hand: point ``--python`` (``[doctor] python``) at the service
    venv's ``bin/python``; recreate a venv that belongs to another machine (``python3 -m venv`` + reinstall).
    """
    v = ctx.fact("venv")
    if not isinstance(v, dict):
        return Result.failed("no environment reading recorded")
    py = v.get("python")
    wrong = describe(v) if not v.get("exists") or not (v.get("is_venv") or v.get("starts")) else None
    if wrong:
        return Result.failed(wrong, Remediation(
            "pass the SGLang venv's bin/python as --python",
            [shlex.join(["k26-doctor", "check", "--python", "/path/to/service/venv/bin/python"])]), **v)
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
        sps = v.get("site_packages") or []
        if not sps:
            problems.append(f"no lib/python3.X/site-packages under {v.get('root')}")
        for sp in sps:
            if not sp.get("readable"):
                problems.append(f"{sp['path']} is not readable ({sp.get('error') or 'permission'})")
    if not v.get("starts"):
        problems.append(f"the interpreter does not start: {v.get('start_error')}")
    details = {k: v.get(k) for k in ("python", "resolved", "root", "is_venv", "home", "home_exists", "cfg_version",
                                     "runtime", "start_error", "site_packages")}
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
            "The environment does not belong to this machine as it stands: recreate it here, or repair it.",
            home_cmd), **details)
    kind = "venv" if v.get("is_venv") else "interpreter (not a venv)"
    rt = v.get("runtime") or {}
    summary = f"{kind} {v.get('root') or py} is whole: Python {'.'.join(map(str, rt.get('version_info') or []))}"
    scripts = v.get("scripts") or []
    if v.get("is_venv") and all(sc.get("exists") and sc.get("inside") for sc in scripts):
        summary += f", {len(scripts)} scripts point into it"  # python.venv.scripts judges them
    if warnings:
        return Result.warned(summary + "; " + "; ".join(warnings), **details)
    return Result.passed(summary, **details)


@check("python.venv.scripts", "The environment's console scripts run its own interpreter (shebangs)",
       needs=("venv",), depends=("python.venv",), fixer="python.venv.shebangs")
def python_venv_scripts(ctx: Any) -> Result:
    """Every console script in the venv's ``bin/`` whose shebang names a Python must name one that exists and
    lies inside this environment: a venv copied from another machine keeps that machine's paths, and its scripts
    then fail with "bad interpreter" (FlashInfer's JIT runs the venv's ``ninja``) or run another environment's
    Python. Fix by hand: recreate the venv, or rewrite the shebangs (the fixer does this, with backups).
    """
    v = ctx.fact("venv")
    if not isinstance(v, dict):
        return Result.failed("no environment reading recorded")
    if not v.get("is_venv"):
        return Result.skipped(f"{v.get('root') or v.get('python')} is not a venv: no console scripts of its own")
    scripts = v.get("scripts") or []
    broken = [s for s in scripts if not s.get("exists") or not s.get("inside")]
    details = {"bin": v.get("bin"), "scanned": v.get("scanned"), "broken_scripts": broken}
    problems: list[str] = []
    missing = [s for s in broken if not s.get("exists")]
    outside = [s for s in broken if s.get("exists")]
    if missing:
        problems.append(f"{len(missing)} script(s) in {v.get('bin')} name an interpreter that does not exist "
                        f"(e.g. {missing[0]['name']}: #!{missing[0]['interpreter']})")
    if outside:
        problems.append(f"{len(outside)} script(s) run an interpreter outside this environment "
                        f"(e.g. {outside[0]['name']}: #!{outside[0]['interpreter']})")
    if problems:
        return Result.failed("; ".join(problems), Remediation(
            "`k26-doctor fix --apply` rewrites these shebangs to this environment's interpreter (with backups); "
            "or recreate the venv on this machine."), **details)
    summary = f"{len(scripts)} script(s) in {v.get('bin')} point into the environment"
    if v.get("truncated"):
        return Result.warned(summary + f"; only the first {v.get('scanned')} files of bin/ were read", **details)
    return Result.passed(summary, **details)
