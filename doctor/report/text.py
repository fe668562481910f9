"""The report for people, first screen first: what is wrong, in the order to fix it, and the next step.

The story (``doctor.report.story``): something said once (the service interpreter not set) at the top; then
each root cause on its line with its fix, and the checks it explains folded under it ("same cause (3): ...")
instead of each repeating it; then the warnings; the passes and what does not apply here, one line each; the
counts; and last the one command that resolves the first root cause. ``-q``/``--problems`` leaves out the
passes and what does not apply; ``-v`` adds every dependent's own line and every result's details.

Lines are wrapped to the terminal (``COLUMNS``, else the terminal's width, else 80 columns for a file or a
pipe); commands wrap at word boundaries with a shell continuation, so they still paste.

Color only on a terminal, never when NO_COLOR is set (https://no-color.org). A stream that cannot
encode UTF-8 (``PYTHONIOENCODING=ascii``, a C locale) gets ASCII glyphs and punctuation.
"""

from __future__ import annotations

import codecs
import json
import os
import shlex
import textwrap
from typing import IO, Any

from doctor.core.printable import printable
from doctor.core.result import Status
from doctor.facts.redaction import redact_text
from doctor.report.story import Root, Story, story

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


DEFAULT_WIDTH = 80  # a file, a pipe, a terminal that does not say
MIN_WIDTH = 40


def terminal_width(stream: IO[str] | None) -> int:
    """``COLUMNS`` when set, else the width of the terminal ``stream`` is, else 80."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return max(MIN_WIDTH, int(env))
    try:
        if stream is not None and stream.isatty():
            return max(MIN_WIDTH, os.get_terminal_size(stream.fileno()).columns)
    except (AttributeError, OSError, ValueError):
        pass
    return DEFAULT_WIDTH


def wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    """``text`` wrapped at word boundaries (never inside a path or an id) after ``first``, then ``rest``; a word too
    long for the indented line (a Python module path in an error) is moved left on a line of its own, not cut."""
    text = printable(text, lines=True)  # a file name or a value from the host: shown, never obeyed
    lines = textwrap.wrap(text, width=max(width, len(rest) + 20), initial_indent=first, subsequent_indent=rest,
                          break_long_words=False, break_on_hyphens=False) or [first.rstrip()]
    for i, line in enumerate(lines[1:], 1):
        word = line[len(rest):]
        if len(line) > width and line.startswith(rest) and " " not in word:
            lines[i] = " " * max(2, width - len(word)) + word
    return lines


def wrap_command(cmd: str, width: int, pad: str) -> list[str]:
    """``$ cmd``, continued with `` \\`` at word boundaries when it is wider than the terminal (it still pastes);
    a comment (``# ...``) or a pipeline is wrapped as prose would be, without continuation marks."""
    first = f"{pad}$ "
    cmd = printable(cmd)  # a path from the host: its control characters shown, never sent to the terminal
    if len(first) + len(cmd) <= width:
        return [first + cmd]
    if cmd.lstrip().startswith("#") or any(c in cmd for c in "|;&<>"):
        return wrap(cmd, width, first, pad + "    ")
    words = cmd.split(" ")
    lines, cur = [], first
    for w in words:
        if cur.strip() and len(cur) + len(w) + 3 > width:
            lines.append(cur.rstrip() + " \\")
            cur = pad + "    "
        cur += w + " "
    lines.append(cur.rstrip())
    return lines


def render_result_line(res: Any, width: int, color: bool, stream: IO[str] | None, summary: str | None = None,
                       columns: int = 10_000) -> list[str]:
    """The result's line(s): glyph, id padded to ``width``, its summary wrapped under itself."""
    mark = glyph(res.status, stream)
    first = f"{mark} {res.id.ljust(width)}  "
    lines = wrap(res.summary if summary is None else summary, columns, first, " " * len(first))
    lines[0] = _paint(mark, COLORS[res.status], color) + lines[0][len(mark):]
    return lines


def _details_lines(details: dict[str, Any], indent: str, skip_lines: list[str] | None = None) -> list[str]:
    lines: list[str] = []
    for key, value in details.items():
        if skip_lines and isinstance(value, list) and [str(v) for v in value] == skip_lines:
            continue  # already shown as the result's exhibit
        if skip_lines and isinstance(value, str) and value.splitlines() == skip_lines:
            continue
        if isinstance(value, str) and "\n" in value:
            lines.append(f"{indent}{key}:")
            lines.extend(f"{indent}  {printable(ln)}" for ln in value.splitlines())
        elif isinstance(value, (dict, list)):
            text = json.dumps(value, default=str, ensure_ascii=False)
            if len(text) > 160:
                text = json.dumps(value, default=str, ensure_ascii=False, indent=2)
                lines.append(f"{indent}{key}:")
                lines.extend(f"{indent}  {ln}" for ln in text.splitlines()[:200])
            else:
                lines.append(f"{indent}{key}: {text}")
        else:
            lines.append(f"{indent}{key}: {printable(str(value))}")
    return lines


def _fix_lines(rem: Any, pad: str, columns: int, said_last: str | None = None) -> list[str]:
    """``fix: text`` and its commands. A fix whose one command is the step the report ends with (``said_last``)
    is that step: not said twice."""
    if not rem or not (rem.text or rem.commands):
        return []
    said = said_last.split("   (", 1)[0] if said_last else None  # the step without what its placeholders mean
    commands = [c for c in rem.commands if c != said]
    if rem.commands and not commands:
        return []
    out = wrap(f"fix: {rem.text}", columns, pad, pad + "  ") if rem.text else []
    for c in commands:
        out.extend(wrap_command(c, columns, pad + "  "))
    return out


def fold_ids(ids: list[str]) -> str:
    """``cuda.{compat, libcuda}, model.fit``: ids of one area folded (in their order), so that a cause with a dozen
    dependents stays on a line or two; ``-v`` and the JSON report list each one."""
    groups: dict[str, list[str]] = {}
    for i in ids:
        area, _, rest = i.partition(".")
        groups.setdefault(area, []).append(rest if rest else "")
    parts = []
    for area, rests in groups.items():
        if len(rests) > 1 and all(rests):
            parts.append(f"{area}.{{{', '.join(rests)}}}")
        else:
            parts.extend(f"{area}.{r}" if r else area for r in rests)
    return ", ".join(parts)


def unfold_ids(text: str) -> list[str]:
    """``fold_ids`` undone: the ids a folded list names."""
    import re

    out: list[str] = []
    for m in re.finditer(r"([\w.-]+)\.\{([^}]*)\}|([\w.-]+)", text):
        if m.group(1):
            out.extend(f"{m.group(1)}.{r.strip()}" for r in m.group(2).split(","))
        else:
            out.append(m.group(3))
    return out


def _ids_line(label: str, ids: list[str], pad: str, columns: int) -> list[str]:
    return wrap(f"{label} ({len(ids)}): " + fold_ids(ids), columns, pad, pad + "  ")


def render_text(report: Any, verbose: int = 0, color: bool | None = None, stream: IO[str] | None = None,
                problems: bool = False, columns: int | None = None, each: bool = False) -> str:
    """The report as text; ``each``: every pass on a line of its own with its summary (after ``fix --apply``, what
    was verified), ``problems``: only what is not a pass, ``verbose``: every result with its details."""
    color = use_color(stream) if color is None else color
    columns = columns or terminal_width(stream)
    st = story(report)
    s = report.settings
    out: list[str] = []
    out.extend(_paint(ln, "1", color) for ln in wrap(f"k26-doctor · {s.profile_name} · TP{s.tp} · python "
                                                     f"{s.python}", columns, "", "    "))
    width = max((len(r.id) for r in _listed(st, verbose, each)), default=10)
    pad = " " * (width + 4)
    out.extend(_cause_lines(st, width, pad, color, stream, columns, verbose))
    if st.interrupted:
        out.extend(_interrupted_lines(st.interrupted, color, stream, columns))
    out.extend(_pass_lines(st, width, pad, color, stream, columns, verbose, each, problems))
    for note in report.notes:
        out.extend(_paint(ln, "2", color) for ln in wrap(f"note: {note}", columns, "", "  "))
    out.extend(footer(report, color, st, columns))
    text = redact_text("\n".join(out) + "\n")
    if not utf8_capable(stream):
        text = text.translate(ASCII_PUNCTUATION)
    return text


def _listed(st: Any, verbose: int, each: bool) -> list[Any]:
    """The results that get a line of their own (the ids column is as wide as the longest of theirs): the roots,
    the passes too with ``verbose`` or ``each``, and with ``verbose`` every dependent and what does not apply."""
    listed = [r.result for r in st.roots] + (st.passed if verbose or each else [])
    if verbose:
        listed += [d for r in st.roots for d in r.dependents] + [d for _, deps in st.notices for d in deps]
        listed += st.not_applicable
    return listed


def _cause_lines(st: Any, width: int, pad: str, color: bool, stream: IO[str] | None, columns: int,
                 verbose: int) -> list[str]:
    """Every cause in the story's order: a root with its fix (in full when it is the next step, the only root,
    or ``verbose``), a notice with the checks it explains (listed one by one with ``verbose``)."""
    out: list[str] = []
    for cause in st.causes():
        if isinstance(cause, Root):
            full = bool(verbose) or cause.id == st.next_for or len(st.roots) == 1
            out.extend(_root_lines(cause, width, pad, color, stream, columns, verbose, full,
                                   None if verbose else st.next_step))
            continue
        notice, dependents = cause
        out.extend(_notice_lines(notice, dependents, color, stream, columns, bool(verbose)))
        for dep in dependents if verbose else []:
            out.extend(render_result_line(dep, width, color, stream, f"[same cause as {notice.id}] {dep.summary}",
                                          columns))
            out.extend(_verbose_lines(dep, pad, exhibit=True))
    return out


def _pass_lines(st: Any, width: int, pad: str, color: bool, stream: IO[str] | None, columns: int, verbose: int,
                each: bool, problems: bool) -> list[str]:
    """The passes and what does not apply: every one with its details (``verbose``), each pass on a line
    (``each``), one summary line (the default) or nothing (``problems``); kept apart from ``render_text`` so the
    report's order reads at a glance."""
    out: list[str] = []
    if verbose:
        for res in st.passed + st.not_applicable:
            out.extend(render_result_line(res, width, color, stream, columns=columns))
            out.extend(_verbose_lines(res, pad, exhibit=True))
    elif each:
        for res in st.passed:
            out.extend(render_result_line(res, width, color, stream, columns=columns))
    elif not problems:
        parts = []
        if st.passed:
            parts.append(f"{glyph(Status.PASS, stream)} passed ({len(st.passed)}): "
                         + ", ".join(r.id for r in st.passed))
        if st.not_applicable:
            parts.append(f"not applicable here ({len(st.not_applicable)}): "
                         + ", ".join(r.id for r in st.not_applicable))
        if parts:
            out.extend(wrap("; ".join(parts), columns, "", "    "))
    return out


def _notice_lines(notice: Any, dependents: list[Any], color: bool, stream: IO[str] | None, columns: int,
                  full: bool) -> list[str]:
    mark = glyph(Status.WARN, stream)
    lines = wrap(f"note: {notice.summary}", columns, f"{mark} ", "    ")
    lines[0] = _paint(mark, COLORS[Status.WARN], color) + lines[0][len(mark):]
    if full:
        lines.extend(_fix_lines(notice.remediation, "    ", columns))
    if dependents:
        lines.extend(_ids_line("concerns", [d.id for d in dependents], "    ", columns))
    return lines


def _interrupted_lines(stopped: list[Any], color: bool, stream: IO[str] | None, columns: int) -> list[str]:
    """The checks Ctrl-C stopped: one line for all of them (they judged nothing; the JSON lists each)."""
    mark = glyph(Status.ERROR, stream)
    lines = wrap(f"interrupted before they finished ({len(stopped)}): " + fold_ids([r.id for r in stopped]), columns,
                 f"{mark} ", "    ")
    lines[0] = _paint(mark, COLORS[Status.ERROR], color) + lines[0][len(mark):]
    return lines


def _root_lines(root: Root, width: int, pad: str, color: bool, stream: IO[str] | None, columns: int,
                verbose: int, full: bool, said_last: str | None) -> list[str]:
    """A root cause: its line, and (for the first one, or with -v) its fix; its exhibit; its dependents."""
    res = root.result
    summary = f"not judged: {res.summary}" if res.unjudged else None
    lines = render_result_line(res, width, color, stream, summary, columns)
    if full:
        lines.extend(_fix_lines(res.remediation, pad, columns, said_last))
    if res.exhibit:
        lines.extend(_exhibit_lines(res.exhibit, pad, columns))
    if verbose:
        lines.extend(_verbose_lines(res, pad))
        for dep in root.dependents:
            lines.extend(render_result_line(dep, width, color, stream, f"[same cause as {res.id}] {dep.summary}",
                                            columns))
            lines.extend(_verbose_lines(dep, pad, exhibit=True))
    elif root.dependents:
        lines.extend(_ids_line("same cause", [d.id for d in root.dependents], pad, columns))
    return lines


def _exhibit_lines(exhibit: str, pad: str, columns: int) -> list[str]:
    """A block as it was laid out (a matrix keeps its columns); a line of prose wider than the terminal wraps."""
    out: list[str] = []
    for ln in exhibit.splitlines():
        out.extend(wrap(ln, columns, pad, pad + "  ") if len(pad) + len(ln) > columns and " " in ln.strip()
                   else [pad + ln])
    return out


def _verbose_lines(res: Any, pad: str, exhibit: bool = False) -> list[str]:
    """With -v: the exhibit (when not shown already), the details, the traceback."""
    lines: list[str] = []
    if exhibit and res.exhibit:
        lines.extend(_exhibit_lines(res.exhibit, pad, DEFAULT_WIDTH))
    if res.details:
        lines.extend(_details_lines(res.details, pad, res.exhibit.splitlines() if res.exhibit else None))
    if res.traceback:
        lines.extend(pad + ln for ln in res.traceback.rstrip().splitlines())
    return lines


def failure_line(st: Story) -> str | None:
    """What the failures mean for the node, when the deployment's configuration is among them (each check's
    ``failure=``): a fleet drains, taints and pages only for the node's own. Said only where the node's own health
    was judged too (a node failure, or a node check that passed): a run of configuration checks alone has nothing
    to say of the node. ``k26-doctor validate`` is named only where the DDTREE gate is what blocks."""
    failing = st.failing_roots()
    config = [r.id for r in failing if r.result.failure == "deployment"]
    node = [r.id for r in failing if r.result.failure != "deployment"]
    if not config or not (node or any(r.failure == "node" for r in st.passed)):
        return None
    said = (f"configuration, not the node: {', '.join(config)} blocks the launch until the configuration is "
            "changed" + (" or validated (k26-doctor validate)" if "sglang.ddtree" in config else "") + "; ")
    if node:
        return said + f"the node's own failures (drain, taint, page): {', '.join(node)}"
    return said + "the node itself has no failure: nothing to drain, taint or page"


def _count(n: int, one: str, many: str, covered: int) -> str:
    return f"{n} {one if n == 1 else many}" + (f" ({covered} checks)" if covered != n else "")


def tally(st: Story, total: int) -> str:
    """The counts of what the screen shows, each line once: the root causes by status (with the checks each
    explains), the notes, the passes, what does not apply, what Ctrl-C stopped, and every check of the run.
    ``3 root causes failed (20 checks), 1 note (8 checks), 1 warning; 5 passed; 35 checks``: the roots and the
    checks under them add up to the run's checks (the JSON report's ``summary.counts`` counts each check by its
    own status)."""
    groups: dict[str, list[Root]] = {}
    for root in st.roots:
        res = root.result
        key = "fail" if res.status is Status.FAIL else "error" if res.status is Status.ERROR else \
            "unjudged" if res.unjudged else "warn"
        groups.setdefault(key, []).append(root)
    words = {"fail": ("root cause failed", "root causes failed"), "error": ("errored", "errored"),
             "unjudged": ("not judged", "not judged"), "warn": ("warning", "warnings")}
    parts = [_count(len(groups[k]), *words[k], sum(1 + len(r.dependents) for r in groups[k]))
             for k in ("fail", "error") if k in groups]
    notes = [deps for _, deps in st.notices if deps]
    if notes:
        parts.append(_count(len(notes), "note", "notes", sum(len(d) for d in notes)))
    parts += [_count(len(groups[k]), *words[k], sum(1 + len(r.dependents) for r in groups[k]))
              for k in ("unjudged", "warn") if k in groups]
    rest = [f"{len(st.passed)} passed"] if st.passed else []
    if st.not_applicable:
        rest.append(f"{len(st.not_applicable)} not applicable")
    if st.interrupted:
        rest.append(f"{len(st.interrupted)} interrupted")
    return "; ".join(x for x in (", ".join(parts), "; ".join(rest)) if x) + f"; {total} checks"


def footer(report: Any, color: bool, st: Story | None = None, columns: int = DEFAULT_WIDTH) -> list[str]:
    """Counts and time, the fixers that would change something, and last the next step."""
    st = st or story(report)
    unjudged = [r.id for r in report.unjudged]
    status = report.decision().status
    head = f"{status.value.upper()}: "
    if report.outcome.interrupted:
        finished = len(report.results) - len(st.interrupted)
        head = f"INTERRUPTED ({report.outcome.interrupted_by}), a partial report: {finished} of " \
               f"{len(report.results)} checks finished: "
    lines = []
    lines.extend(_paint(ln, COLORS.get(status, "1"), color) if i == 0 else ln for i, ln in enumerate(wrap(
        head + tally(st, len(report.results)) + f" in {report.outcome.duration_s:.2f}s", columns, "", "  ")))
    if unjudged:
        lines.extend(wrap("not judged (want of facts: `launch` refuses, --strict fails): " + ", ".join(unjudged),
                          columns, "", "  "))
    meaning = failure_line(st)
    if meaning:
        lines.extend(wrap(meaning, columns, "", "  "))
    fixable = report.fixable()
    if fixable:
        lines.extend(wrap("plan fixes: k26-doctor fix " + " ".join(f"--only {shlex.quote(i)}" for i in fixable)
                          + "   (then add --apply)", columns, "", "            "))
    unshown = [r for r in st.roots if r.id != st.next_for and r.result.remediation is not None] if len(st.roots) > 1 \
        else []
    if unshown and not report.outcome.interrupted:  # (no fix was planned)
        lines.extend(wrap("each fix: `k26-doctor fix` (plans them, changes nothing); details: -v", columns, "", "  "))
    if st.next_step:
        lines.extend(wrap(f"next: {st.next_step}", columns, "", "      "))
    elif report.outcome.interrupted:
        lines.append("interrupted: the same command again judges the rest")
    return lines
