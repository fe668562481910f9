"""Fixers of the triton area: Python headers and a C compiler for Triton's JIT, Triton's ptxas.

Each only plans (``doctor.core.actions``); ``k26-doctor fix --apply`` applies, with backups of every
file, and re-runs the check. What cannot be repaired safely from here (a pyenv/uv/conda interpreter
without headers, gets an empty plan: the check's remediation
says what to do by hand.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from doctor.core.actions import Action, Plan, RunCommand, WriteFile
from doctor.core.context import Context
from doctor.core.fileio import read_text
from doctor.core.registry import fixer
from doctor.core.result import Result
from doctor.host.facts import parse_env_file, writable_ancestor
from doctor.python.headers import family, headers_advice
from doctor.stack.cuda_arch import judged_ccs
from doctor.triton.jit import NO_HEADERS_OR_COMPILER
from doctor.triton.ptxas import REJECTS_ARCH
from doctor.triton.toolchain import good_ptxas, interpreter_kind, ptxas_choice, triton_arch

# -- triton.jit: headers and compiler ------------------------------------------------------------


def package_plan(os_release: dict[str, str], major_minor: str, need_headers: bool, need_cc: bool,
                 which: Any = shutil.which) -> list[Action]:
    """The package-manager commands that install a system Python's headers and/or a C compiler: the packages
    that exist on this distribution release (``doctor.python.headers``); nothing when none does."""
    fam_name, fam = family(os_release)
    if not fam:
        return []
    if need_headers:
        advice = headers_advice(os_release, major_minor, "/usr", compiler=need_cc)
        pkgs = advice.packages
    else:
        pkgs = [fam["compiler"]] if need_cc else []
    if not pkgs:
        return []
    if fam_name == "debian":
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        return [RunCommand("refresh the apt package lists", needs_root=True, argv=["apt-get", "update"], env=env),
                RunCommand(f"install {' '.join(pkgs)}", needs_root=True,
                           argv=["apt-get", "install", "-y", "--no-install-recommends", *pkgs], env=env)]
    tool = fam["install"][0] if which(fam["install"][0]) else "yum"
    return [RunCommand(f"install {' '.join(pkgs)}", needs_root=True, argv=[tool, *fam["install"][1:], *pkgs])]


@fixer("triton.jit.headers", "Install the system Python's headers and a C compiler", needs_root=True)
def fix_triton_jit(ctx: Context, result: Result) -> Plan:
    """When triton.jit found no C compiler or no ``Python.h``: apt-get/dnf/yum (from /etc/os-release) for a system
    interpreter; nothing for pyenv/uv/conda (their headers belong in their own prefix)."""
    if not result.has(*NO_HEADERS_OR_COMPILER):  # libcuda or a load problem: not a package this fixer knows
        return Plan()
    build = ctx.fact("triton_build")
    need_cc = not build.get("cc_path")
    need_headers = not build.get("python_h")
    kind = interpreter_kind(ctx.optional("stack"), build)
    if need_headers and kind["kind"] != "system":
        return Plan()  # the headers belong in that interpreter's own prefix: see the remediation
    return Plan(package_plan(build.get("os_release") or {}, kind["major_minor"], need_headers, need_cc))


# -- triton.ptxas: point Triton at a ptxas that knows the GPU ------------------------------------

def read_env_file(path: Path) -> str | None:
    """An environment file's text ("" when it does not exist yet); None when it cannot be read (then nothing can be
    planned into it safely)."""
    try:
        return read_text(path, 1 << 20, "an environment file")
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError):
        return None


def env_file_writes(path: Path, text: str, what: str) -> list[Action]:
    """The environment file written with ``text``: its folder created first when missing, then one atomic write
    (a temporary file beside the target, then a rename: the write needs the directory)."""
    actions: list[Action] = []
    if not path.parent.is_dir():
        actions.append(RunCommand(f"create {path.parent}", needs_root=not writable_ancestor(path.parent)[1],
                                  argv=["mkdir", "-p", str(path.parent)]))
    actions.append(WriteFile(what, needs_root=not writable_ancestor(path.parent)[1], path=str(path), new_text=text))
    return actions


def set_env_line(text: str, key: str, value: str) -> str:
    """``text`` with ``key=value`` set: the existing assignment replaced in place, else appended."""
    lines = text.splitlines()
    out, done = [], False
    pattern = re.compile(rf"^\s*(export\s+)?{re.escape(key)}\s*=")
    for line in lines:
        if pattern.match(line):
            if not done:
                out.append(f"{key}={value}")
                done = True
            continue  # a second assignment of the same key would win in systemd: drop it
        out.append(line)
    if not done:
        out.append(f"{key}={value}")
    return "\n".join(out) + "\n"


@fixer("triton.ptxas.env", "Point Triton at a ptxas that knows the GPU, in the service's environment file")
def fix_triton_ptxas(ctx: Context, result: Result) -> Plan:
    """When triton.ptxas found a ptxas that rejects the GPU: write TRITON_PTXAS_PATH (or
    TRITON_PTXAS_BLACKWELL_PATH) into the profile's server.env_file."""
    env_file = ctx.settings.server.env_file
    if not result.has(REJECTS_ARCH) or not env_file:
        return Plan()
    fact = ctx.fact("ptxas")
    ccs, _, _ = judged_ccs(lambda: ctx.fact("nvml"), ctx.settings)
    if not ccs:
        return Plan()
    good = good_ptxas(fact, [triton_arch(cc) for cc in ccs])
    if not good:
        return Plan()
    path = Path(os.path.expanduser(str(env_file)))
    old = read_env_file(path)
    if old is None:
        return Plan()  # unreadable: nothing can be planned safely
    text = old
    changed = []
    for var in sorted({ptxas_choice(fact, cc)["var"] for cc in ccs}):
        if parse_env_file(text).get(var) != good[0]:
            text = set_env_line(text, var, good[0])
            changed.append(var)
    if not changed:
        return Plan()
    return Plan(env_file_writes(path, text, f"set {', '.join(changed)}={good[0]} in {path}"))
