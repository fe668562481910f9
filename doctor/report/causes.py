"""One root line per cause: which result explains which, and what is said once at the top.

Checks name the check whose failure explains theirs (``Result.cause``: "gpu.driver judges that", a
dependency that failed); the runner does the same for dependency skips. Here, after a run:

* ``settle``: a ``skip`` whose cause did not fail in this run (not selected, or it passed) was not
  explained by anything: it is a check not judged for want of facts (``unjudged``).
* ``root_of``: follows causes to the first result that is a cause of its own, so the text report can
  list the dependents under that one line instead of repeating the same sentence.
* ``interpreter_notice``: ``--python`` was not given and the doctor's own interpreter has no SGLang:
  the checks judged the wrong environment. Said once, at the top, with the config line to set;
  the per-check fixes that would install torch or SGLang into the doctor's environment are replaced
  by a pointer to it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from doctor.core.result import Remediation, Result, Status

PYTHON_NOTICE = "doctor.python"
INSTALL_AREAS = ("stack.", "torch.", "sglang.", "triton.")  # checks of what is installed in the service's venv


@dataclass
class Notice:
    """Something said once at the top of a report, which results may name as their cause."""

    id: str
    summary: str
    remediation: Remediation
    dependents: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "summary": self.summary, "remediation": self.remediation.to_dict(),
                "dependents": list(self.dependents)}


def explains(res: Result | None) -> bool:
    """Whether ``res`` is a cause that explains a dependent: it failed, errored, warned (an ignored
    failure) or could not be judged itself."""
    return res is not None and (res.status in (Status.FAIL, Status.ERROR, Status.WARN) or res.unjudged)


def settle(results: list[Result], notices: list[Notice] | None = None) -> None:
    """Mark the skips that nothing in this run explains as not judged for want of facts, and the skips whose
    cause was itself not judged (``python.venv`` not recorded: nothing that needs the interpreter is judged)."""
    by = {r.id: r for r in results}
    noticed = {n.id for n in notices or []}
    _unexplained(results, by, noticed)
    changed = True
    while changed:  # through chains, whatever order the results come in
        changed = False
        for res in results:
            cause = by.get(res.cause or "")
            if res.status is Status.SKIP and not res.unjudged and cause is not None and cause.unjudged:
                res.unjudged = changed = True


def _unexplained(results: list[Result], by: dict[str, Result], noticed: set[str]) -> None:
    for res in results:
        if res.status is not Status.SKIP or res.unjudged or not res.cause or res.cause in noticed:
            continue
        cause = by.get(res.cause)
        if cause is None or cause.status is Status.PASS:
            res.unjudged = True
            res.summary += f" ({res.cause} " + ("was not run" if cause is None else "passed") + ")"
            if res.remediation is None:
                res.remediation = Remediation(f"Run {res.cause} with it: it judges the cause.",
                                              [shlex.join(["k26-doctor", "check", "--only", res.cause,
                                                           "--only", res.id])])


def root_of(res: Result, by: dict[str, Result], noticed: set[str]) -> str | None:
    """The id of the result (or notice) that explains ``res`` in the end, or None when it stands alone."""
    seen = {res.id}
    cur = res
    root = None
    while cur.cause and cur.cause not in seen:
        if cur.cause in noticed:
            return cur.cause
        nxt = by.get(cur.cause)
        if not explains(nxt):
            break
        assert nxt is not None
        root = nxt.id
        seen.add(nxt.id)
        cur = nxt
    return root


def roots(results: list[Result], notices: list[Notice] | None = None) -> dict[str, str]:
    """result id -> the id of its root cause, for every result that has one in this run."""
    by = {r.id: r for r in results}
    noticed = {n.id for n in notices or []}
    out = {}
    for res in results:
        root = root_of(res, by, noticed)
        if root is not None and root != res.id:
            out[res.id] = root
    return out


def interpreter_notice(settings: Any, facts: Any, results: list[Result]) -> Notice | None:
    """The notice when the checks judged the doctor's own interpreter and it has no SGLang.

    Only from facts this run already collected (``stack``): asking would start a probe."""
    if settings.python_given or "stack" not in facts.collected():
        return None
    try:
        stack = facts.get("stack")
    except Exception:  # a stack fact that failed is judged by its checks
        return None
    from doctor.stack.judging import has_sglang

    if has_sglang(stack) is not False:
        return None
    python = str(settings.python)
    config = settings.config_path or "/etc/k26-doctor/config.toml"
    notice = Notice(
        PYTHON_NOTICE,
        f"--python is not set: the checks judged the doctor's own interpreter {python}, which has no SGLang. "
        f"Set the service's once: [doctor] python = \"/path/to/service/venv/bin/python\" in {config} (or pass "
        "--python).",
        Remediation(f"In {config}, under [doctor]: python = \"/path/to/service/venv/bin/python\"; to try it first:",
                    ["k26-doctor check --python /path/to/service/venv/bin/python"]))
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
    return notice
