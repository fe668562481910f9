"""The report for people: a glyph, the id and one line per check; remediation under each failure;
details with ``-v``; a footer with counts, time and what fixes or ignores what.

Color only on a terminal, never when NO_COLOR is set (https://no-color.org).
"""

from __future__ import annotations

import json
import os
import shlex
from typing import IO, Any

from doctor.core.result import Status

GLYPHS = {Status.PASS: "✔", Status.WARN: "!", Status.FAIL: "✘", Status.SKIP: "-", Status.ERROR: "‼"}
ASCII_GLYPHS = {Status.PASS: "ok", Status.WARN: "!!", Status.FAIL: "XX", Status.SKIP: "--", Status.ERROR: "EE"}
COLORS = {Status.PASS: "32", Status.WARN: "33", Status.FAIL: "31", Status.SKIP: "2", Status.ERROR: "35"}


def use_color(stream: IO[str] | None) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


def _paint(text: str, code: str, color: bool) -> str:
    return f"\033[{code}m{text}\033[0m" if color else text


def glyph(status: Status, stream: IO[str] | None) -> str:
    enc = (getattr(stream, "encoding", None) or "").lower()
    return GLYPHS[status] if "utf" in enc else ASCII_GLYPHS[status]


def render_result_line(res: Any, width: int, color: bool, stream: IO[str] | None) -> str:
    mark = _paint(glyph(res.status, stream), COLORS[res.status], color)
    return f"{mark} {res.id.ljust(width)}  {res.summary}"


def _details_lines(details: dict[str, Any], indent: str) -> list[str]:
    lines: list[str] = []
    for key, value in details.items():
        if isinstance(value, str) and "\n" in value:
            lines.append(f"{indent}{key}:")
            lines.extend(f"{indent}  {ln}" for ln in value.splitlines())
        elif isinstance(value, (dict, list)):
            text = json.dumps(value, default=str, ensure_ascii=False)
            if len(text) > 160:
                text = json.dumps(value, default=str, ensure_ascii=False, indent=2)
                lines.append(f"{indent}{key}:")
                lines.extend(f"{indent}  {ln}" for ln in text.splitlines()[:200])
            else:
                lines.append(f"{indent}{key}: {text}")
        else:
            lines.append(f"{indent}{key}: {value}")
    return lines


def render_text(report: Any, verbose: int = 0, color: bool | None = None, stream: IO[str] | None = None) -> str:
    color = use_color(stream) if color is None else color
    s = report.settings
    out: list[str] = []
    where = f" · snapshot {s.from_snapshot}" if s.from_snapshot else ""
    out.append(_paint(f"k26-doctor · profile {s.profile_name} · TP{s.tp} · python {s.python}{where}", "1", color))
    width = max((len(r.id) for r in report.results), default=10)
    for res in report.results:
        out.append(render_result_line(res, width, color, stream))
        pad = " " * (width + 4)
        show_fix = res.status in (Status.FAIL, Status.ERROR, Status.WARN)
        if show_fix and res.remediation and (res.remediation.text or res.remediation.commands):
            if res.remediation.text:
                out.append(f"{pad}fix: {res.remediation.text}")
            out.extend(f"{pad}  $ {c}" for c in res.remediation.commands)
        if verbose and res.details:
            out.extend(_details_lines(res.details, pad))
        if verbose and res.traceback:
            out.extend(pad + ln for ln in res.traceback.rstrip().splitlines())
    for note in report.notes:
        out.append(_paint(f"note: {note}", "2", color))
    out.extend(footer(report, color))
    return "\n".join(out) + "\n"


def footer(report: Any, color: bool) -> list[str]:
    c = report.counts()
    parts = [f"{c['pass']} passed", f"{c['warn']} warnings", f"{c['fail']} failed", f"{c['skip']} skipped",
             f"{c['error']} errors"]
    status = report.status
    lines = ["", _paint(f"{status.value.upper()}: " + ", ".join(parts) + f" in {report.outcome.duration_s:.2f}s",
                        COLORS.get(status, "1"), color)]
    if report.outcome.interrupted:
        lines.append("interrupted: this report is partial")
    failing = [r for r in report.results if r.status.failed]
    fixable = [r.id for r in report.results if r.fixer and (r.status.failed or r.status is Status.WARN)]
    if fixable:
        lines.append("plan fixes:   k26-doctor fix " + " ".join(f"--only {shlex.quote(i)}" for i in fixable)
                     + "   (then add --apply)")
    if failing:
        lines.append("ignore:       " + " ".join(f"--ignore {shlex.quote(r.id)}" for r in failing)
                     + "   (reported as warn, never hidden)")
        lines.append("explain:      k26-doctor explain " + failing[0].id)
    return lines
