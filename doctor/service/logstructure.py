"""The structure of a failed start's log: which process wrote a line, the traceback a line belongs to (its frames,
the line that names its cause), the phase a process was in. The layout is data (doctor/data/log_structure.toml).

Why: the same error means different causes depending on where it was raised. CUDA error 802 from the driver's
first call is the NVSwitch fabric; the same 802 raised inside a symmetric-memory rendezvous, after CUDA worked, is
multicast. "no kernel image" while the draft model's CUDA graphs are captured is the draft's attention backend.
A remote-code prompt printed by a benchmark client is the client's tokenizer load, not the server's flags. A
multi-process server interleaves its processes in one log (vLLM's "(Worker_TP1 pid=417)" tags, torch's
"[rank3]:"), so a traceback is read along the lines of its own process.

Everything here is computed lazily and once per log: a 50 MB journal without a structural signature's candidate
pays nothing; the scans above a line are bounded.
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

from doctor.core.datafile import load_toml

LAYOUT_FILE = Path(__file__).resolve().parents[1] / "data" / "log_structure.toml"
MAX_MESSAGE_LINES = 8  # an exception message may wrap over this many lines below its first one
# An exception line as Python prints it: "RuntimeError: ...", "torch.OutOfMemoryError: ...", "pkg.mod.NcclError: ...".
_EXCEPTION = re.compile(r"^\s*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b\s*(?::|$)")
SCAN_FACTOR = 4  # a traceback's process may be interleaved with others: scan this many times its lines


@dataclass(frozen=True)
class Layout:
    tags: tuple[re.Pattern[str], ...]
    prefixes: tuple[re.Pattern[str], ...]
    header: re.Pattern[str]
    frame: re.Pattern[str]
    chain: tuple[re.Pattern[str], ...]
    max_lines: int
    phases: re.Pattern[str]
    phase_lines: int


@functools.lru_cache(maxsize=1)
def layout() -> Layout:
    data = load_toml(LAYOUT_FILE)
    tb = data["traceback"]
    return Layout(tuple(re.compile(p) for p in data["process"]["tags"]),
                  (re.compile("|".join(f"(?:{p})" for p in data["process"]["prefixes"])),),  # one match a step
                  re.compile(tb["header"]), re.compile(tb["frame"]), tuple(re.compile(p) for p in tb["chain"]),
                  int(tb["max_lines"]), re.compile("|".join(f"(?:{p})" for p in data["phase"]["markers"])),
                  int(data["phase"]["max_lines"]))


def split_line(line: str, lay: Layout | None = None) -> tuple[str, str]:
    """(process, message): the last process tag at the start of ``line`` ('' for the main process) and the line
    without its tags and logger prefixes."""
    lay = lay or layout()
    proc, rest = "", line.lstrip("\ufeff")
    moved = True
    while moved:
        moved = False
        for rx in lay.tags:
            m = rx.match(rest)
            if m:
                proc, rest, moved = m.group("proc"), rest[m.end():], True
        for rx in lay.prefixes:
            m = rx.match(rest)
            if m and m.end():
                rest, moved = rest[m.end():], True
    return proc, rest


# The matcher's prefilter for a pattern: the literals every match contains (None: none usable) and whether they
# are lower-cased (the pattern ignores case). Handed in by doctor.service.diagnose.
LiteralPlan = Callable[[re.Pattern[str]], tuple["frozenset[str] | None", bool]]


@dataclass(frozen=True)
class Traceback:
    """One Python traceback in a log: 0-based line indices, its frames as ``path:function``."""

    proc: str
    start: int
    cause: int  # the exception line; the last frame when the log cuts the traceback off
    frames: tuple[str, ...]
    cut: bool


class LogShape:
    """The structure of one log's (cleaned) lines, computed on demand and only around the lines asked about: a
    line's process and message are split when first needed; a traceback is read along the lines of its process
    by a bounded scan (other processes' lines are skipped, at most ``SCAN_FACTOR`` times as many)."""

    def __init__(self, lines: list[str], text: str | None = None, literals: LiteralPlan | None = None,
                 known: dict[re.Pattern[str], list[int] | None] | None = None):
        self.lines = lines
        self._text = text
        self._literals = literals
        # candidate lines the caller already found for some patterns (the matcher's one grep pass): a pattern
        # found there is searched on those lines only, not by another scan of the whole text
        self.known = known if known is not None else {}
        self._lower: str | None = None
        self._split: dict[int, tuple[str, str]] = {}
        self._starts: list[int] | None = None
        self._tracebacks: list[Traceback] | None = None
        self._matching: dict[str, list[int]] = {}
        self.lay = layout()

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = "\n".join(self.lines)
        return self._text

    def _parts(self, idx: int) -> tuple[str, str]:
        parts = self._split.get(idx)
        if parts is None:
            parts = self._split[idx] = split_line(self.lines[idx], self.lay)
        return parts

    def proc(self, idx: int) -> str:
        return self._parts(idx)[0]

    def message(self, idx: int) -> str:
        return self._parts(idx)[1]

    def _same_proc(self, idx: int, step: int, most: int | None = None) -> Iterator[int]:
        """The lines of ``idx``'s process from ``idx`` on (``step`` -1: upwards), at most ``most`` of them
        (default ``[traceback] max_lines``)."""
        proc, n, taken = self.proc(idx), len(self.lines), 0
        most = most or self.lay.max_lines
        stop = idx + step * SCAN_FACTOR * most
        for i in range(idx, max(-1, stop) if step < 0 else min(n, stop), step):
            if self.proc(i) == proc:
                yield i
                taken += 1
                if taken >= most:
                    return

    def _frame(self, idx: int) -> str | None:
        m = self.lay.frame.search(self.message(idx))
        return f"{m.group('path')}:{m.group('func')}" if m else None

    def _shape(self, idx: int) -> str:
        """What line ``idx`` is inside a traceback: header, chain, frame, code (indented or blank), message."""
        msg = self.message(idx)
        if self.lay.header.search(msg):
            return "header"
        if any(rx.search(msg) for rx in self.lay.chain):
            return "chain"
        if self.lay.frame.search(msg):
            return "frame"
        if not msg.strip() or msg[:1].isspace() or set(msg.strip()) <= set("^~"):
            return "code"
        return "message"

    def frames_at(self, idx: int) -> tuple[str, ...]:
        """The frames of the traceback line ``idx`` belongs to (its exception message, a frame or a code line)
        and of the tracebacks chained before it ("The above exception was the direct cause..."); () when it
        belongs to none. Read upwards along the lines of its own process."""
        frames: list[str] = []
        state, messages = "message", 0  # message: the exception's own lines; frames; between: a chained one's
        above = list(self._same_proc(idx, -1))
        for j, i in enumerate(above):
            shape = self._shape(i)
            if shape == "frame":
                frames.append(self._frame(i) or "")
                state = "frames"
            elif shape == "header":
                if not self._chained_above(above[j + 1:j + 4]):
                    break
                state, messages = "between", 0
            elif shape == "message":
                if state == "frames":
                    break  # an earlier record of this process: the traceback started below it
                messages += 1
                if messages > MAX_MESSAGE_LINES:
                    break
        return tuple(frames)

    def raised(self, idx: int) -> bool:
        """Whether line ``idx`` is the exception a traceback raised: an exception line ("RuntimeError: ...") right
        below that traceback's frames (code lines between them skipped, and one unindented code line, as SGLang's
        scheduler writes them). A line that only co-occurs with a traceback (a warning above it, a shutdown message
        below it) is not."""
        if not _EXCEPTION.match(self.message(idx)):
            return False
        unindented = 0
        for i in self._same_proc(idx, -1, 3 * MAX_MESSAGE_LINES):
            if i == idx:
                continue
            shape = self._shape(i)
            if shape == "frame":
                return True
            if shape == "code":
                continue
            if shape == "message" and unindented == 0 and not _EXCEPTION.match(self.message(i)):
                unindented += 1
                continue
            return False
        return False

    def _chained_above(self, lines: list[int]) -> bool:
        """Whether a chain line ("The above exception...") comes first among ``lines`` (upwards; blank and
        indented lines skipped): the traceback below it is a consequence of the one above."""
        for i in lines:
            shape = self._shape(i)
            if shape == "chain":
                return True
            if shape != "code":
                return False
        return False

    def _line_of(self, offset: int) -> int:
        if self._starts is None:
            self._starts = list(accumulate(map((1).__add__, map(len, self.lines)), initial=0))[:-1]
        return _upper(self._starts, offset) - 1

    def tracebacks(self) -> list[Traceback]:
        """Every traceback that starts with its header, with the line naming its cause: its exception line, or
        its last frame when the log cuts it off."""
        if self._tracebacks is not None:
            return self._tracebacks
        out: list[Traceback] = []
        for start in self.matching(self.lay.header):
            frames: list[str] = []
            last_frame = cause = None
            for i in self._same_proc(start, 1):
                if i == start:
                    continue
                shape = self._shape(i)
                if shape == "frame":
                    frames.append(self._frame(i) or "")
                    last_frame = i
                elif shape in ("header", "chain"):
                    break
                elif shape == "message" and frames:
                    cause = i
                    break
            if last_frame is not None:
                out.append(Traceback(self.proc(start), start, last_frame if cause is None else cause,
                                     tuple(frames), cause is None))
        self._tracebacks = out
        return out

    def matching(self, pattern: re.Pattern[str]) -> list[int]:
        """The lines (0-based, ascending) on which ``pattern`` matches, found once per pattern: through the
        literals every match contains (``literals``, the matcher's prefilter) when it has some, else by one scan
        of the whole text."""
        key = pattern.pattern
        if key in self._matching:
            return self._matching[key]
        known = self.known.get(pattern)
        lits, fold = self._literals(pattern) if self._literals and known is None else (None, False)
        found: list[int] = []
        if known is not None:
            found = [i for i in known if pattern.search(self.lines[i])]
        elif lits:
            if fold and self._lower is None:
                self._lower = self.text.lower()
            hay = self._lower if fold else self.text
            candidates: set[int] = set()
            for lit in lits:
                pos = hay.find(lit)
                while pos != -1:
                    candidates.add(self._line_of(pos))
                    pos = hay.find(lit, pos + 1)
            found = [i for i in sorted(candidates) if pattern.search(self.lines[i])]
        else:
            for m in pattern.finditer(self.text):
                line = self._line_of(m.start())
                if not found or found[-1] != line:
                    found.append(line)
        self._matching[key] = found
        return found

    def phase_at(self, idx: int) -> str | None:
        """The nearest progress line (``[phase] markers``) above line ``idx`` (or on it) of the same process,
        looked for in at most ``[phase] max_lines`` lines of that process."""
        for i in self._same_proc(idx, -1, self.lay.phase_lines):
            if self.lay.phases.search(self.lines[i]):
                return self.lines[i]
        return None

    def proc_has(self, idx: int, patterns: tuple[re.Pattern[str], ...]) -> bool:
        """Whether any line of the process that wrote line ``idx`` matches one of ``patterns``."""
        proc = self.proc(idx)
        return any(self.proc(i) == proc for p in patterns for i in self.matching(p))


def _index(sorted_ints: list[int], value: int) -> int:
    return bisect_left(sorted_ints, value)


def _upper(sorted_ints: list[int], value: int) -> int:
    return bisect_right(sorted_ints, value)
