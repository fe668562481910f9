"""The service's Python environment judged from outside: interpreter, pyvenv.cfg, site-packages (python.venv)
and the console scripts' shebangs (python.venv.scripts). Read from the ``venv`` fact, collected without running
the environment's interpreter, so this still speaks when that interpreter cannot start. The B300 venv was streamed
from another machine: paths in ``pyvenv.cfg`` and in the console scripts' shebangs belonged to that machine."""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation, Severity
from doctor.python.interpreter import describe

BROKEN_SHEBANGS = ("python.venv.scripts.missing", "python.venv.scripts.outside")  # what the shebang fixer rewrites
DETAIL_KEYS = ("python", "resolved", "root", "is_venv", "home", "home_exists", "cfg_version", "runtime",
               "start_error", "site_packages")


def broken_scripts(v: dict[str, Any]) -> list[dict[str, Any]]:
    """Console scripts whose shebang names an interpreter that does not exist or lies outside the environment."""
    return [s for s in v.get("scripts") or [] if not s.get("exists") or not s.get("inside")]


def version_problems(v: dict[str, Any]) -> Findings:
    """pyvenv.cfg's version against the interpreter's (a mismatch fails; another patch release warns)."""
    out = Findings()
    cfg_v = str(v.get("cfg_version") or "")
    run_v = ".".join(str(x) for x in ((v.get("runtime") or {}).get("version_info") or []))
    real = os.path.basename(str(v.get("resolved") or ""))
    m = re.match(r"python(\d+\.\d+)", real)
    if cfg_v and run_v and cfg_v.split(".")[:2] != run_v.split(".")[:2]:
        out.fail("python.venv.version", f"pyvenv.cfg says Python {cfg_v} but the interpreter is {run_v}")
    elif cfg_v and not run_v and m and cfg_v.split(".")[:2] != m.group(1).split("."):
        out.fail("python.venv.version", f"pyvenv.cfg says Python {cfg_v} but bin/python resolves to {real}")
    elif cfg_v and run_v and cfg_v != run_v:
        out.warn("python.venv.patch_release", f"venv made with Python {cfg_v}, base interpreter is now {run_v}")
    return out


def venv_problems(v: dict[str, Any]) -> Findings:
    """What is wrong with a venv (failures) and what is only odd (warnings), in the order found: its home, its
    version, its site-packages (its scripts: ``judge_scripts``)."""
    out = Findings()
    home = v.get("home")
    if not home:
        out.fail("python.venv.no_home", "pyvenv.cfg has no 'home' key")
    elif not v.get("home_exists"):
        out.fail("python.venv.home_gone", f"pyvenv.cfg home {home} does not exist on this machine (copied from "
                 "another?)")
    out += version_problems(v)
    sps = v.get("site_packages") or []
    if not sps:
        out.fail("python.venv.no_site_packages", f"no lib/python3.X/site-packages under {v.get('root')}")
    for sp in sps:
        if not sp.get("readable"):
            out.fail("python.venv.site_packages_unreadable", f"{sp['path']} is not readable "
                     f"({sp.get('error') or 'permission'})")
    return out


def recreate_commands(v: dict[str, Any]) -> list[str]:
    root = v.get("root") or "<venv>"
    if not (v.get("is_venv") and not v.get("home_exists")):
        return []
    q, pip = shlex.quote(str(root)), shlex.quote(f"{root}/bin/pip")
    return [f"# recreate on this machine: python3.X -m venv --clear {q} && {pip} install -r requirements.txt",
            f"# or set 'home' in {shlex.quote(f'{root}/pyvenv.cfg')} to this machine's python3.X bin dir"]


NOT_PYTHON = "python.venv.not_python"  # --python is absent, not executable or another program: the one root cause


def judge_venv(v: dict[str, Any]) -> Findings:
    """The environment as a whole. A ``--python`` that is not a Python interpreter is said once, with what the path
    is (``doctor.python.interpreter.describe``): every check that runs it depends on python.venv and is blocked."""
    py = v.get("python")
    wrong = describe(v) if not v.get("exists") or not (v.get("is_venv") or v.get("starts")) else None
    if wrong:
        return Findings(**v).fail(NOT_PYTHON, wrong, Remediation(
            "pass the SGLang venv's bin/python as --python PYTHON",
            [shlex.join(["k26-doctor", "check", "--python", "PYTHON"])]))
    seen = Findings()
    if not v.get("resolves"):
        seen.fail("python.venv.dangling", f"{py} is a dangling symlink ({' -> '.join(v.get('link_chain') or [])})")
    if v.get("is_venv"):
        seen += venv_problems(v)
    if not v.get("starts"):
        seen.fail("python.venv.does_not_start", f"the interpreter does not start: {v.get('start_error')}")
    out = Findings(**{k: v.get(k) for k in DETAIL_KEYS})
    if seen.failing:
        fix = Remediation("The environment does not belong to this machine as it stands: recreate it here, or repair "
                          "it.", recreate_commands(v))
        for found in seen.of(Severity.FAIL):  # what is only odd is not said beside what is wrong
            out.fail(found.code, found.message, fix)
        return out
    kind = "venv" if v.get("is_venv") else "interpreter (not a venv)"
    rt = v.get("runtime") or {}
    scripts = v.get("scripts") or []
    whole = v.get("is_venv") and not broken_scripts(v)  # python.venv.scripts judges them
    out.info("python.venv.whole", f"{kind} {v.get('root') or py} is whole: Python "
             f"{'.'.join(map(str, rt.get('version_info') or []))}"
             + (f", {len(scripts)} scripts point into it" if whole else ""))
    out += seen.of(Severity.WARN)
    return out


def judge_scripts(v: dict[str, Any]) -> Findings:
    """Every console script in the venv's ``bin/`` whose shebang names a Python names one that exists inside this
    environment (a venv copied from another machine keeps that machine's paths)."""
    if not v.get("is_venv"):
        raise NotJudged.inapplicable(f"{v.get('root') or v.get('python')} is not a venv: no console scripts of its "
                                     "own")
    scripts = v.get("scripts") or []
    broken = broken_scripts(v)
    out = Findings(bin=v.get("bin"), scanned=v.get("scanned"), broken_scripts=broken)
    fix = Remediation("`k26-doctor fix --apply` rewrites these shebangs to this environment's interpreter (with "
                      "backups); or recreate the venv on this machine.")
    missing = [s for s in broken if not s.get("exists")]
    outside = [s for s in broken if s.get("exists")]
    if missing:
        out.fail(BROKEN_SHEBANGS[0], f"{len(missing)} script(s) in {v.get('bin')} name an interpreter that does not "
                 f"exist (e.g. {missing[0]['name']}: #!{missing[0]['interpreter']})", fix)
    if outside:
        out.fail(BROKEN_SHEBANGS[1], f"{len(outside)} script(s) run an interpreter outside this environment "
                 f"(e.g. {outside[0]['name']}: #!{outside[0]['interpreter']})", fix)
    if broken:
        return out
    out.info("python.venv.scripts.inside", f"{len(scripts)} script(s) in {v.get('bin')} point into the environment")
    if v.get("truncated"):
        out.warn("python.venv.scripts.truncated", f"only the first {v.get('scanned')} files of bin/ were read")
    return out
