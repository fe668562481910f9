"""The report for people: a glyph, the id and one line per check; remediation under each failure;
details with ``-v``; a footer with counts, time and what fixes or ignores what.

One root line per cause: a result whose cause failed (``doctor.core.causes``) says "same cause as X"
instead of repeating X's sentence; ``-q``/``--problems`` shows only what is not a pass, with the
dependents listed under their root. Something said once (the service interpreter not set) comes first.

Color only on a terminal, never when NO_COLOR is set (https://no-color.org). A stream that cannot
encode UTF-8 (``PYTHONIOENCODING=ascii``, a C locale) gets ASCII glyphs and punctuation.
"""

from __future__ import annotations

import codecs
import json
import os
import shlex
from typing import IO, Any

from doctor.core.causes import roots
from doctor.core.result import Status
from doctor.facts.redaction import redact_text

GLYPHS = {Status.PASS: "✔", Status.WARN: "!", Status.FAIL: "✘", Status.SKIP: "-", Status.ERROR: "‼"}
ASCII_GLYPHS = {Status.PASS: "ok", Status.WARN: "!!", Status.FAIL: "XX", Status.SKIP: "--", Status.ERROR: "EE"}
COLORS = {Status.PASS: "32", Status.WARN: "33", Status.FAIL: "31", Status.SKIP: "2", Status.ERROR: "35"}
ASCII_PUNCTUATION = str.maketrans({"·": "|", "…": "...", "—": "-", "–": "-", "→": "->", "≥": ">=", "≤": "<=",
                                   "×": "x", "‘": "'", "’": "'", "“": '"', "”": '"', "✔": "ok", "✘": "XX", "‼": "EE"})


def use_color(stream: IO[str] | None) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


def utf8_capable(stream: IO[str] | None) -> bool:
    """Whether ``stream`` encodes UTF-8 (a file object without an encoding, e.g. StringIO, counts as yes)."""
    enc = getattr(stream, "encoding", None)
    if not enc:
        return stream is not None
    try:
        return codecs.lookup(enc).name.startswith("utf")
    except LookupError:
        return False


def _paint(text: str, code: str, color: bool) -> str:
    return f"\033[{code}m{text}\033[0m" if color else text


def glyph(status: Status, stream: IO[str] | None) -> str:
    return GLYPHS[status] if utf8_capable(stream) else ASCII_GLYPHS[status]


def render_result_line(res: Any, width: int, color: bool, stream: IO[str] | None, summary: str | None = None) -> str:
    mark = _paint(glyph(res.status, stream), COLORS[res.status], color)
    return f"{mark} {res.id.ljust(width)}  {res.summary if summary is None else summary}"


def _details_lines(details: dict[str, Any], indent: str, skip_lines: list[str] | None = None) -> list[str]:
    lines: list[str] = []
    for key, value in details.items():
        if skip_lines and isinstance(value, list) and [str(v) for v in value] == skip_lines:
            continue  # already shown as the result's exhibit
        if skip_lines and isinstance(value, str) and value.splitlines() == skip_lines:
            continue
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


def _fix_lines(res: Any, pad: str) -> list[str]:
    rem = res.remediation
    if not rem or not (rem.text or rem.commands):
        return []
    out = [f"{pad}fix: {rem.text}"] if rem.text else []
    out.extend(f"{pad}  $ {c}" for c in rem.commands)
    return out


def render_text(report: Any, verbose: int = 0, color: bool | None = None, stream: IO[str] | None = None,
                problems: bool = False) -> str:
    color = use_color(stream) if color is None else color
    s = report.settings
    out: list[str] = []
    where = f" · snapshot {s.from_snapshot}" if s.from_snapshot else ""
    out.append(_paint(f"k26-doctor · profile {s.profile_name} · TP{s.tp} · python {s.python}{where}", "1", color))
    notices = list(getattr(report, "notices", []) or [])
    for notice in notices:
        out.append(_paint(f"{glyph(Status.WARN, stream)} note: {notice.summary}", COLORS[Status.WARN], color))
        out.extend(_fix_lines(notice, "    "))
        if notice.dependents:
            out.append(f"    concerns: {', '.join(notice.dependents)}")
    results = report.results
    root = roots(results, notices)
    under: dict[str, list[str]] = {}
    for rid, cause in root.items():
        under.setdefault(cause, []).append(rid)
    shown = [r for r in results if not problems or _is_problem(r, root)]
    width = max((len(r.id) for r in shown), default=10)
    pad = " " * (width + 4)
    not_applicable = []
    for res in results:
        cause = root.get(res.id)
        if problems and not _is_problem(res, root):
            if res.status is Status.SKIP and not res.unjudged and cause is None:
                not_applicable.append(res.id)
            continue
        summary = None
        if cause is not None and not cause.startswith("doctor.") and not verbose:
            summary = f"same cause as {cause}" + (" (not judged)" if res.status is Status.SKIP else "")
        elif res.unjudged:
            summary = f"not judged: {res.summary}"
        out.append(render_result_line(res, width, color, stream, summary))
        if cause is None:
            if res.status in (Status.FAIL, Status.ERROR, Status.WARN) or res.unjudged:
                out.extend(_fix_lines(res, pad))
                if res.exhibit and not verbose:
                    out.extend(pad + ln for ln in res.exhibit.splitlines())
        if problems and under.get(res.id):
            deps = under[res.id]
            out.append(f"{pad}also not judged or failing for the same cause ({len(deps)}): {', '.join(deps)}")
        if verbose and res.exhibit:
            out.extend(pad + ln for ln in res.exhibit.splitlines())
        if verbose and res.details:
            out.extend(_details_lines(res.details, pad, res.exhibit.splitlines() if res.exhibit else None))
        if verbose and res.traceback:
            out.extend(pad + ln for ln in res.traceback.rstrip().splitlines())
    if not_applicable:
        out.append(f"  ({len(not_applicable)} not applicable here: {', '.join(not_applicable)})")
    for note in report.notes:
        out.append(_paint(f"note: {note}", "2", color))
    out.extend(footer(report, color, root))
    text = redact_text("\n".join(out) + "\n")
    if not utf8_capable(stream):
        text = text.translate(ASCII_PUNCTUATION)
    return text


def _is_problem(res: Any, root: dict[str, str]) -> bool:
    """What ``--problems`` shows on a line of its own: not a pass, not merely not applicable, not a
    dependent of a cause shown elsewhere (a notice's dependents are shown: their summaries differ)."""
    cause = root.get(res.id)
    if cause is not None and not cause.startswith("doctor."):
        return False
    if res.status is Status.PASS:
        return False
    return not (res.status is Status.SKIP and not res.unjudged)


def footer(report: Any, color: bool, root: dict[str, str] | None = None) -> list[str]:
    root = root or {}
    c = report.counts()
    unjudged = [r.id for r in report.results if r.status is Status.SKIP and r.unjudged]
    parts = [f"{c['pass']} passed", f"{c['warn']} warnings", f"{c['fail']} failed",
             f"{c['skip']} skipped" + (f" ({len(unjudged)} not judged)" if unjudged else ""), f"{c['error']} errors"]
    status = report.decision().status
    lines = ["", _paint(f"{status.value.upper()}: " + ", ".join(parts) + f" in {report.outcome.duration_s:.2f}s",
                        COLORS.get(status, "1"), color)]
    if report.outcome.interrupted:
        lines.append("interrupted: this report is partial")
    if unjudged:
        lines.append("not judged:   " + ", ".join(unjudged) + "   (want of facts: `launch` refuses, --strict fails)")
    failing = [r for r in report.results if r.status.failed]
    fixable = report.fixable()
    if fixable:
        lines.append("plan fixes:   k26-doctor fix " + " ".join(f"--only {shlex.quote(i)}" for i in fixable)
                     + "   (then add --apply)")
    registered = [r.id for r in failing if not r.id.startswith("doctor.")]
    if registered:
        lines.append("ignore:       " + " ".join(f"--ignore {shlex.quote(i)}" for i in registered)
                     + "   (reported as warn, never hidden)")
    roots_first = [r for r in failing if r.id not in root] or failing
    if roots_first and not roots_first[0].id.startswith("doctor."):
        lines.append("explain:      k26-doctor explain " + roots_first[0].id)
    return lines
