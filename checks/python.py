"""The service's Python environment judged from outside: interpreter, pyvenv.cfg, shebangs, site-packages (the
``venv`` fact of ``doctor/python/facts.py``, judged by ``doctor/python/venv.py``).
"""

from __future__ import annotations

from doctor.core.context import Context
from doctor.core.registry import check
from doctor.core.result import Result
from doctor.python.venv import judge_venv


@check("python.venv", "The service's environment is whole: interpreter, pyvenv.cfg, scripts' shebangs",
       needs=("venv",), fixer="python.venv.shebangs")
def python_venv(ctx: Context) -> Result:
    """Reads the environment from outside (so it works even when its interpreter cannot start): the
    interpreter path resolves and starts; ``pyvenv.cfg``'s ``home`` exists and its version matches the
    interpreter; every console script's shebang points into this environment (a venv copied from
    another machine keeps that machine's paths: the scripts then fail with "bad interpreter" or run
    another environment's Python); site-packages is readable. Fix by hand: recreate the venv on this
    machine (``python3 -m venv`` + reinstall), or rewrite the shebangs (the fixer does this, with backups).
    """
    return Result.of(judge_venv(ctx.fact("venv")))
