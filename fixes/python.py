"""Fixers of the python area: console scripts' shebangs pointed at this environment's interpreter.

Plans only (``doctor.core.actions``): one atomic rewrite per broken script, each backed up. A venv
whose base interpreter is gone gets an empty plan: the check's remediation says what to do by hand.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from doctor.core.actions import Action, Plan, WriteFile
from doctor.core.context import Context
from doctor.core.fileio import read_text
from doctor.core.registry import fixer
from doctor.core.result import Result
from doctor.python.venv import BROKEN_SHEBANGS, broken_scripts

SCRIPT_LIMIT = 1 << 20  # a console script is a few hundred bytes


def rewrite_shebang(text: str, new_interp: str) -> str | None:
    """The script with its Python interpreter replaced (plain ``#!`` or pip's ``/bin/sh`` exec form)."""
    lines = text.split("\n")
    if not lines or not lines[0].startswith("#!"):
        return None
    first = lines[0][2:].strip()
    if first in ("/bin/sh", "/usr/bin/sh") and len(lines) > 1:
        m = re.match(r"^'''exec' (\"[^\"]+\"|\S+)(.*)$", lines[1])
        if not m:
            return None
        lines[1] = f"'''exec' \"{new_interp}\"{m.group(2)}"
        return "\n".join(lines)
    parts = first.split(None, 1)
    if not parts:
        return None
    lines[0] = "#!" + new_interp + (" " + parts[1] if len(parts) > 1 else "")
    return "\n".join(lines)


@fixer("python.venv.shebangs", "Rewrite console scripts' shebangs to this environment's interpreter")
def fix_venv_shebangs(ctx: Context, result: Result) -> Plan:
    """When python.venv.scripts found scripts with a broken shebang: one atomic rewrite per script, each backed up; the
    interpreter is <venv>/bin/python."""
    v = ctx.fact("venv")
    if not result.has(*BROKEN_SHEBANGS) or not v.get("root"):
        return Plan()
    root = Path(v["root"])
    new_interp = next((str(root / "bin" / n) for n in ("python", "python3") if (root / "bin" / n).exists()), None)
    if new_interp is None:
        return Plan()
    actions: list[Action] = []
    for s in broken_scripts(v):
        path = root / "bin" / s["name"]
        try:
            text = read_text(path, SCRIPT_LIMIT, "a script")
        except (OSError, UnicodeDecodeError):
            continue
        new = rewrite_shebang(text, new_interp)
        if new is None or new == text:
            continue
        actions.append(WriteFile(f"{s['name']}: #!{s['interpreter']} -> #!{new_interp}",
                                 needs_root=not os.access(path.parent, os.W_OK), path=str(path), new_text=new))
    return Plan(actions)


