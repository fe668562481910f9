"""The service's Python environment judged from outside: interpreter, pyvenv.cfg, site-packages, and the console
scripts' shebangs (the ``venv`` fact of ``doctor/python/facts.py``, judged by ``doctor/python/venv.py``).
"""

from __future__ import annotations

from doctor.core.context import Context
from doctor.core.registry import check
from doctor.core.result import Result
from doctor.python.venv import judge_scripts, judge_venv


@check("python.venv", "The service's environment is whole: the interpreter exists and is Python, pyvenv.cfg, "
       "site-packages; every check of what is installed depends on it", needs=("venv",), failure="deployment")
def python_venv(ctx: Context) -> Result:
    """Reads the environment from outside (so it works even when its interpreter cannot start): the
    interpreter path exists, is a Python interpreter and starts; ``pyvenv.cfg``'s ``home`` exists and its
    version matches the interpreter; site-packages is readable. Every check of what is installed runs a probe
    under this interpreter and depends on this check: a wrong ``--python`` (absent, not executable, another
    program) is said here once, with what the path is, and those checks are blocked by it. The console scripts'
    shebangs are ``python.venv.scripts``. Fix by hand: point ``--python`` (``[doctor] python``) at the service
    venv's ``bin/python``; recreate a venv that belongs to another machine (``python3 -m venv`` + reinstall).
    """
    return Result.of(judge_venv(ctx.fact("venv")))


@check("python.venv.scripts", "The venv's console scripts run its own interpreter (shebangs)",
       needs=("venv",), depends=("python.venv",), fixer="python.venv.shebangs", failure="deployment")
def python_venv_scripts(ctx: Context) -> Result:
    """Every console script in the venv's ``bin/`` whose shebang names a Python must name one that exists and
    lies inside this environment: a venv copied from another machine keeps that machine's paths, and its scripts
    then fail with "bad interpreter" (FlashInfer's JIT runs the venv's ``ninja``) or run another environment's
    Python. Fix by hand: recreate the venv, or rewrite the shebangs (the fixer does this, with backups).
    """
    return Result.of(judge_scripts(ctx.fact("venv")))
