"""JUnit XML: one testcase per check, for CI dashboards (Jenkins, GitLab, GitHub annotations)."""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from typing import Any

from doctor.core.result import Status


def to_junit(report: Any) -> str:
    counts = report.counts()
    suite = ET.Element("testsuite", {
        "name": f"k26-doctor.{report.settings.profile_name}",
        "tests": str(len(report.results)),
        "failures": str(counts["fail"]),
        "errors": str(counts["error"]),
        "skipped": str(counts["skip"]),
        "time": f"{report.outcome.duration_s:.3f}",
        "hostname": socket.gethostname(),
    })
    for res in report.results:
        case = ET.SubElement(suite, "testcase", {
            "classname": f"k26doctor.{res.id.split('.')[0]}",
            "name": res.id,
            "time": f"{res.duration_s:.3f}",
        })
        body = _body(res)
        if res.status is Status.FAIL:
            ET.SubElement(case, "failure", {"message": res.summary, "type": "fail"}).text = body
        elif res.status is Status.ERROR:
            ET.SubElement(case, "error", {"message": res.summary, "type": "error"}).text = body
        elif res.status is Status.SKIP:
            ET.SubElement(case, "skipped", {"message": res.summary})
        else:
            ET.SubElement(case, "system-out").text = f"{res.status.value.upper()}: {res.summary}\n{body}"
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


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
