"""The stack area's part in a run beyond its checks: after them, the notice said once at the top when the checks
judged the doctor's own interpreter and it has no SGLang (``--python`` not given).

Then every per-check fix that would install torch or SGLang into the doctor's environment is the wrong fix: those
results name the notice as their cause (``doctor.python``) and point at it, and the report says it once, with the
config line to set.
"""

from __future__ import annotations

import shlex

from doctor.core.causes import roots
from doctor.core.context import Context
from doctor.core.registry import hook
from doctor.core.result import Notice, Remediation, Result, Status
from doctor.stack.distributions import has_sglang

PYTHON_NOTICE = "doctor.python"
INSTALL_AREAS = ("stack.", "torch.", "sglang.", "triton.")  # checks of what is installed in the service's venv


@hook("notice")
def interpreter_notice(ctx: Context, results: list[Result]) -> Notice | None:
    """The notice when the checks judged the doctor's own interpreter and it has no SGLang.

    Only from facts this run already collected (``stack``): asking would start a probe."""
    settings, facts = ctx.settings, ctx.facts
    if settings.python_given or "stack" not in facts.collected():
        return None
    try:
        stack = facts.get("stack")
    except Exception:  # a stack fact that failed is judged by its checks
        return None
    if has_sglang(stack) is not False:
        return None
    python = str(settings.python)
    config = settings.config_path or "/etc/k26-doctor/config.toml"
    notice = Notice(
        PYTHON_NOTICE,
        f"--python is not set: the checks judged the doctor's own interpreter {python}, which has no SGLang; "
        f"set [doctor] python = \"PYTHON\" in {config} (or --python PYTHON)",
        Remediation(f"In {config}, under [doctor]: python = \"PYTHON\"; to try it first:",
                    ["k26-doctor check --python PYTHON"]))
    point_at(notice, results, python)
    return notice


def point_at(notice: Notice, results: list[Result], python: str) -> None:
    """Results whose fix would install into the doctor's own environment name the notice as their cause."""
    markers = {f"{shlex.quote(python)} -m pip", f"{python} -m pip"}
    for res in results:
        rem = res.remediation
        if res.status is Status.PASS or rem is None:
            continue
        installs = any(m in c for c in rem.commands for m in markers) or (
            res.id.startswith(INSTALL_AREAS) and rem.text.startswith("Install"))
        if installs:
            res.cause = PYTHON_NOTICE  # a fix that would install into the doctor's own environment
    root = roots(results, [notice])
    for res in results:
        if root.get(res.id) == PYTHON_NOTICE or res.cause == PYTHON_NOTICE:
            if res.status is not Status.SKIP:
                res.remediation = Remediation("The checks judged the doctor's own interpreter: set --python "
                                              "first (the note at the top).", [])
            notice.dependents.append(res.id)
