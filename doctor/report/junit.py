"""JUnit XML: one testcase per check, for CI dashboards (Jenkins, GitLab, GitHub annotations)."""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from typing import Any

from doctor.core.result import Status


def to_junit(report: Any) -> str:
    """One testcase per check. A check not judged for want of facts is ``skipped`` with that reason, and a
    ``failure`` under ``--strict`` (the run fails on it); a run with no result at all is an error case,
    never ``tests="0"`` (which CI dashboards show as green). The story is the text report's
    (``doctor.report.story``): a result folded under a root cause says so first ("[same cause as gpu.driver]"),
    and the suite's properties carry the root causes in order and the next step."""
    from doctor.report.story import story

    st = story(report)
    counts = report.counts()
    strict = bool(getattr(report.settings, "strict", False))
    unjudged = report.unjudged
    failures = counts["fail"] + (len(unjudged) if strict else 0) + (counts["warn"] if strict else 0)
    skipped = counts["skip"] - (len(unjudged) if strict else 0)
    suite = ET.Element("testsuite", {
        "name": f"k26-doctor.{report.settings.profile_name}",
        "tests": str(max(1, len(report.results))),
        "failures": str(failures),
        "errors": str(counts["error"] + (0 if report.results else 1)),
        "skipped": str(skipped),
        "time": f"{report.outcome.duration_s:.3f}",
        "hostname": socket.gethostname(),
    })
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", {"name": "roots", "value": " ".join(st.order)})
    ET.SubElement(props, "property", {"name": "next_step", "value": st.next_step or ""})
    for kind in ("node", "deployment"):  # what a failure means: the node broken, or the deployment's configuration
        ET.SubElement(props, "property", {"name": f"{kind}_failures", "value": " ".join(
            r.id for r in report.results if r.status.failed and r.failure == kind)})
    for res in report.results:
        _testcase(suite, res, st.root_of.get(res.id), strict)
    if not report.results:
        case = ET.SubElement(suite, "testcase", {"classname": "k26doctor.doctor", "name": "doctor.selection",
                                                 "time": "0.000"})
        ET.SubElement(case, "error", {"message": "no check ran: nothing was judged", "type": "error"})
    ET.indent(suite)
    from doctor.facts.redaction import redact_text

    return redact_text('<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n")


def _testcase(suite: ET.Element, res: Any, root: str | None, strict: bool) -> None:
    """One check's testcase: its status as JUnit says it (a failure, an error, skipped, or passed with output),
    with the failure class as a property and, folded under a root cause, that cause named first."""
    label = f"[same cause as {root}] " if root else ""
    case = ET.SubElement(suite, "testcase", {
        "classname": f"k26doctor.{res.id.split('.')[0]}",
        "name": res.id,
        "time": f"{res.duration_s:.3f}",
    })
    ET.SubElement(ET.SubElement(case, "properties"), "property", {"name": "failure", "value": res.failure})
    body = _body(res)
    if res.status is Status.FAIL:
        ET.SubElement(case, "failure", {"message": label + res.summary, "type": "fail"}).text = body
    elif res.status is Status.ERROR:
        ET.SubElement(case, "error", {"message": label + res.summary, "type": "error"}).text = body
    elif res.status is Status.SKIP and res.unjudged and strict:
        ET.SubElement(case, "failure", {"message": f"not judged: {label}{res.summary}",
                                        "type": "unjudged"}).text = body
    elif res.status is Status.SKIP:
        ET.SubElement(case, "skipped", {"message": ("not judged: " if res.unjudged else "") + label + res.summary})
    elif res.status is Status.WARN and strict:
        ET.SubElement(case, "failure", {"message": label + res.summary, "type": "warn"}).text = body
    else:
        ET.SubElement(case, "system-out").text = f"{res.status.value.upper()}: {res.summary}\n{body}"


def _body(res: Any) -> str:
    parts: list[str] = []
    if res.remediation:
        parts.append("Fix: " + res.remediation.text)
        parts.extend("$ " + c for c in res.remediation.commands)
    if res.details:
        parts.append(json.dumps(res.details, indent=1, default=str)[:20000])
    if res.traceback:
        parts.append(res.traceback)
    return "\n".join(parts)
