"""One root line per cause: which result explains which.

Checks name the check whose failure explains theirs (``Result.cause``: "gpu.driver judges that", a
dependency that failed); the runner does the same for dependency skips; an area's notice hook can name a
notice said once at the top (``doctor.core.result.Notice``). Here, after a run:

* ``mark_unexplained``: a ``skip`` whose cause did not fail in this run (not selected, or it passed) was
  not explained by anything: it is a check not judged for want of facts (``unjudged``); so is a ``skip`` whose
  cause was itself not judged.
* ``root_of``: follows causes to the first result that is a cause of its own, so the text report can
  list the dependents under that one line instead of repeating the same sentence.
"""

from __future__ import annotations

import shlex

from doctor.core.result import Notice, Remediation, Result, Status


def explains(res: Result | None) -> bool:
    """Whether ``res`` is a cause that explains a dependent: it failed, errored, warned (an ignored
    failure) or could not be judged itself."""
    return res is not None and (res.status in (Status.FAIL, Status.ERROR, Status.WARN) or res.unjudged)


def mark_unexplained(results: list[Result], notices: list[Notice] | None = None) -> None:
    """Mark the skips that nothing in this run explains as not judged for want of facts, and the skips whose
    cause was itself not judged (``python.venv`` not recorded: nothing that needs the interpreter is judged)."""
    by = {r.id: r for r in results}
    noticed = {n.id for n in notices or []}
    unexplained(results, by, noticed)
    changed = True
    while changed:  # through chains, whatever order the results come in
        changed = False
        for res in results:
            cause = by.get(res.cause or "")
            if res.status is Status.SKIP and not res.unjudged and cause is not None and cause.unjudged:
                res.unjudged = changed = True


def unexplained(results: list[Result], by: dict[str, Result], noticed: set[str]) -> None:
    """A skip whose cause did not fail in this run (not run, or passed): not judged, and how to judge it."""
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
