"""Diagnosis of a failed start: known log signatures -> the check that catches it, and its fix.

The signatures are data (``doctor/data/failure_signatures.toml``, its schema documented at its top; a
site adds its own file with ``--signatures``). Every signature found is reported once, with its first
line, how often it occurred and a little context.

Ranking: a failed start prints its cause once and its consequences many times (other ranks' NCCL
errors, "Received sigquit", "RPCServer process died", wrappers that re-raise with advice). Signatures
flagged ``consequence`` therefore never outrank a cause found in the same log; causes are ranked by
first occurrence (``rank`` only breaks ties on one line); consequences follow, those that point at a
check first. A line two signatures read differently is settled by ``suppresses`` (the specific reading
wins) and ``context`` (a reading that needs nearby evidence, such as TCPStore next to EADDRINUSE).

Speed: a 50 MB journal must not cost a minute. From each pattern the matcher derives literals that any
match must contain (``required_literals``); one pass finds the lines holding any of them (``grep -F``
when the host has it, which scans for all of them at once; else ``str.find`` per literal), and the
regular expressions then run on those lines only. A pattern with no usable literal is searched over the
whole text (bench/bench_diagnose.py measures both).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

from doctor.core.datafile import DataFileError, read_toml
from doctor.core.fileio import read_pipe_or_file
from doctor.core.printable import printable
from doctor.service.logstructure import LogShape
from doctor.service.oom_accounting import held_elsewhere

if sys.version_info >= (3, 11):
    import re._parser as _sre_parse
else:  # pragma: no cover - py310
    import sre_parse as _sre_parse

SIGNATURES_FILE = Path(__file__).resolve().parents[1] / "data" / "failure_signatures.toml"
MAX_LINE = 8192  # a pathological line (a tensor dump) is cut, not matched for minutes
MIN_LITERAL = 8  # shorter literals select too many lines and slow grep's multi-string scan down
GREP_TIMEOUT_S = 120
LOG_READ_S = 120.0  # a pipe's writer (journalctl) has this long to finish
MAX_LOG_BYTES = 1 << 30
# A signatures file is tens of KiB (the built-in one about 70): a larger one, or one with thousands of entries or
# page-long patterns, is refused before its parse and compile take minutes.
MAX_SIGNATURE_FILE_BYTES = 1 << 20
MAX_SIGNATURES = 2000
MAX_PATTERNS = 200
MAX_PATTERN_CHARS = 4096
MAX_PATTERN_TOTAL = 32 << 10  # characters of regular expression in one file (the built-in: about 9,400)
REGEX_KEYS = ("patterns", "unless", "context", "context_skip", "frames", "phase", "process", "absent", "blame_if")
STRENGTHS = ("strong", "weak")
GREP_MIN_CHARS = 1 << 20  # below this, starting grep costs more than searching in Python
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_SAFE_VALUE = re.compile(r"[\w.:/@-]{1,64}")  # what a value read from a log may be to enter a command
SIGNATURE_KEYS = {"id", "title", "patterns", "check", "fix", "commands", "explain", "rank", "consequence", "unless",
               "context", "context_before", "context_after", "context_skip", "suppresses", "defaults",
               "frames", "traceback_cause", "phase", "process", "fallback", "absent", "sources", "single_source",
               "unsupported", "strength", "blame_if", "blame_if_raised", "held_elsewhere"}


class SignatureError(Exception):
    """A signatures file that cannot be used (invocation error: exit 2)."""


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    patterns: tuple[re.Pattern[str], ...]
    check: str | None
    fix: str = ""
    commands: tuple[str, ...] = ()
    explain: str = ""
    rank: int = 50
    consequence: bool = False
    unless: tuple[re.Pattern[str], ...] = ()
    context: tuple[re.Pattern[str], ...] = ()
    context_before: int = 20
    context_after: int = 3
    context_skip: tuple[re.Pattern[str], ...] = ()
    suppresses: tuple[str, ...] = ()
    defaults: tuple[tuple[str, str], ...] = ()
    # structural conditions (doctor/service/logstructure.py): the traceback the hit belongs to has a frame
    # matching `frames`; `traceback_cause`: the cause line of every traceback with such a frame is a hit; the
    # nearest progress line above the hit matches `phase`; the process that wrote it printed a line matching
    # `process`; `fallback`: only when the log has no other cause; `absent`: none of these anywhere in the log
    frames: tuple[re.Pattern[str], ...] = ()
    traceback_cause: bool = False
    phase: tuple[re.Pattern[str], ...] = ()
    process: tuple[re.Pattern[str], ...] = ()
    fallback: bool = False
    absent: tuple[re.Pattern[str], ...] = ()
    # provenance (not used for matching): the threads whose logs support it; a built-in signature with none says why
    sources: tuple[str, ...] = ()
    # blame (``judge_blame``): a weak signature names its check only beside a strong finding of the same check; a
    # consequence names its check only when the log shows that check's cause: a line matching `blame_if` anywhere,
    # or (`blame_if_raised`) a hit that is the exception a traceback raised on this process
    strength: str = "strong"
    blame_if: tuple[re.Pattern[str], ...] = ()
    blame_if_raised: bool = False
    # a share of the GPU (0-1): the hit counts only when the out-of-memory message on its line shows at least this
    # much of the GPU held by other processes (``oom_accounting.held_elsewhere``)
    held_elsewhere: float = 0.0

    @property
    def weak(self) -> bool:
        return self.strength == "weak"

    @property
    def structural(self) -> bool:
        return bool(self.frames or self.phase or self.process)


@dataclass
class LogMatch:
    """A failure signature found in a start's log: where first, how often, the lines around it."""

    signature: Signature
    line_no: int  # 1-based, first occurrence
    line: str
    count: int = 1
    context: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)  # named groups of the first hit
    host: dict[str, str] = field(default_factory=dict)  # read from this host (``host_values``)
    # why the check this signature names is not blamed (``judge_blame``); the signature then names no check and
    # ``withheld_check`` keeps the one it would have named
    withheld: str = ""
    withheld_check: str | None = None

    def withhold(self, why: str) -> None:
        """Name no check for this finding (it is still shown, with ``why``)."""
        if self.signature.check is not None:
            self.withheld, self.withheld_check = why, self.signature.check
            self.signature = dataclasses.replace(self.signature, check=None)

    def _fill(self, text: str) -> str:
        known = dict(self.signature.defaults)
        known.update(self.host)
        known.update(self.values)
        return _PLACEHOLDER.sub(lambda m: known.get(m.group(1), m.group(0)), text)

    @property
    def fix(self) -> str:
        return self._fill(self.signature.fix)

    @property
    def commands(self) -> list[str]:
        return [c for c in (self._fill(c) for c in self.signature.commands) if c.strip()]

    def to_dict(self) -> dict[str, Any]:
        s = self.signature
        out = {"id": s.id, "title": s.title, "check": s.check, "consequence": s.consequence,
               "line": self.line_no, "text": self.line, "count": self.count, "context": self.context,
               "explain": s.explain, "remediation": {"text": self.fix, "commands": self.commands}}
        if self.withheld:
            out["withheld"] = {"check": self.withheld_check, "why": self.withheld}
        return out


def _signature_entries(path: Path) -> list[Any]:
    """The ``[[signature]]`` entries of one file, refused (SignatureError) before any pattern is compiled when the
    file is too large, not a table list, or holds too many entries or pattern characters: a hostile file must not
    stall the matcher."""
    try:
        size = os.stat(path).st_size if os.path.isfile(path) else 0
    except OSError:
        size = 0  # read_toml names the reason
    if size > MAX_SIGNATURE_FILE_BYTES:
        raise SignatureError(f"cannot read signatures file {path}: {size} bytes, larger than "
                             f"{MAX_SIGNATURE_FILE_BYTES >> 20} MiB: not a signatures file")
    try:
        data = read_toml(path, "signatures file")
    except DataFileError as exc:
        raise SignatureError(str(exc)) from None
    entries = data.get("signature")
    if not isinstance(entries, list):
        raise SignatureError(f"{path}: expected [[signature]] tables")
    if len(entries) > MAX_SIGNATURES:
        raise SignatureError(f"{path}: {len(entries)} signatures, more than {MAX_SIGNATURES}: "
                             "not a signatures file")
    total = sum(len(p) for e in entries if isinstance(e, dict) for k in REGEX_KEYS
                for p in (e[k] if isinstance(e.get(k), list) else [e.get(k)]) if isinstance(p, str))
    if total > MAX_PATTERN_TOTAL:
        raise SignatureError(f"{path}: {total} characters of patterns, more than {MAX_PATTERN_TOTAL}: compiling "
                             "them would take too long")
    return entries


def load_signatures(paths: list[Path] | None = None, builtin: Path = SIGNATURES_FILE) -> list[Signature]:
    """The built-in signatures plus any site files; later ids replace earlier ones. ``builtin``: another built-in
    table (a bench compares the previous release's)."""
    by_id: dict[str, Signature] = {}
    for path in [builtin, *(paths or [])]:
        entries = _signature_entries(path)
        for i, entry in enumerate(entries):
            sig = _signature(entry, f"{path} signature #{i + 1}")
            by_id[sig.id] = sig
    for sig in by_id.values():
        unknown = [s for s in sig.suppresses if s not in by_id]
        if unknown:
            raise SignatureError(f"signature {sig.id}: suppresses unknown signature(s) {', '.join(unknown)}")
    return list(by_id.values())


def _patterns(value: Any, where: str, key: str) -> tuple[re.Pattern[str], ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise SignatureError(f"{where}: {key} must be a list of regular expressions")
    if len(value) > MAX_PATTERNS:
        raise SignatureError(f"{where}: {len(value)} {key}, more than {MAX_PATTERNS}")
    compiled = []
    for pat in value:
        if len(pat) > MAX_PATTERN_CHARS:
            raise SignatureError(f"{where}: a pattern of {len(pat)} characters, longer than {MAX_PATTERN_CHARS}")
        try:
            rx = re.compile(pat)
        except (re.error, RecursionError, OverflowError) as exc:
            raise SignatureError(f"{where}: bad pattern {pat!r}: {exc}") from None
        nested = nested_repeat(rx)
        if nested:
            raise SignatureError(f"{where}: pattern {pat!r} repeats a repeat ({nested}): on a line that almost "
                                 "matches it takes exponential time (catastrophic backtracking); write the inner "
                                 "repeat once (e.g. 'a+' for '(a+)+')")
        compiled.append(rx)
    return tuple(compiled)


def nested_repeat(pattern: re.Pattern[str]) -> str | None:
    """The part of ``pattern`` that repeats nothing but an unbounded repeat (``(a+)+``, ``(?:\\w*)*``,
    ``(.+)+``), or None. Such a pattern means the same as its inner repeat, and backtracks exponentially on
    a near miss; refused when signatures are loaded. (Other slow patterns are bounded by the matcher's
    deadline: ``match_bounded``.)"""
    try:
        parsed = _sre_parse.parse(pattern.pattern, pattern.flags)
    except Exception:  # a parser change across Python versions: the deadline still bounds it
        return None
    unbounded = getattr(_sre_parse, "MAXREPEAT", None)

    def body(items: list[Any]) -> list[Any]:
        while len(items) == 1 and str(items[0][0]) == "SUBPATTERN":
            items = list(items[0][1][-1])
        return items

    def walk(items: list[Any]) -> str | None:
        for op, av in items:
            name = str(op)
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                inner = body(list(av[2]))
                if (name != "POSSESSIVE_REPEAT" and av[1] == unbounded and len(inner) == 1
                        and str(inner[0][0]) in ("MAX_REPEAT", "MIN_REPEAT") and inner[0][1][1] == unbounded):
                    return "a group of an unbounded repeat, itself repeated without bound"
                found = walk(list(av[2]))
            elif name == "SUBPATTERN":
                found = walk(list(av[-1]))
            elif name == "BRANCH":
                found = next((f for f in (walk(list(alt)) for alt in av[1]) if f), None)
            else:
                found = None
            if found:
                return found
        return None

    return walk(list(parsed))


def _int(entry: dict[str, Any], key: str, default: int, where: str) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SignatureError(f"{where}: {key} must be an integer")
    return value


def _signature(entry: Any, where: str) -> Signature:
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or \
            not (entry.get("patterns") or entry.get("traceback_cause")):
        raise SignatureError(f"{where}: needs id and patterns (or traceback_cause with frames)")
    where = f"{where} ({entry['id']})"
    unknown = sorted(set(entry) - SIGNATURE_KEYS)
    if unknown:
        raise SignatureError(f"{where}: unknown key(s) {', '.join(unknown)}")
    _check_tables(entry, where)
    _check_scalars(entry, where)
    return _build_signature(entry, where)


def _check_tables(entry: dict[str, Any], where: str) -> None:
    """The list and table keys (commands, suppresses, defaults) have their shapes, else SignatureError: a site file
    is read before anything is matched, so a wrong shape is named here and never a traceback later."""
    commands = entry.get("commands") or []
    if not isinstance(commands, list):
        raise SignatureError(f"{where}: commands must be a list")
    suppresses = entry.get("suppresses") or []
    if not isinstance(suppresses, list) or not all(isinstance(s, str) for s in suppresses):
        raise SignatureError(f"{where}: suppresses must be a list of signature ids")
    defaults = entry.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SignatureError(f"{where}: defaults must be a table")


def _check_scalars(entry: dict[str, Any], where: str) -> None:
    """The remaining keys (check, sources, unsupported, strength, the flags, frames) have their types, else
    SignatureError, in the order a reader meets them."""
    check = entry.get("check")
    if check is not None and not isinstance(check, str):
        raise SignatureError(f"{where}: check must be a check id")
    sources = entry.get("sources") or []
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise SignatureError(f"{where}: sources must be a list of URLs")
    if not isinstance(entry.get("unsupported", ""), str):
        raise SignatureError(f"{where}: unsupported must be a sentence")
    if entry.get("strength", "strong") not in STRENGTHS:
        raise SignatureError(f"{where}: strength must be one of {', '.join(STRENGTHS)}")
    for key in ("traceback_cause", "fallback", "single_source", "blame_if_raised"):
        if not isinstance(entry.get(key, False), bool):
            raise SignatureError(f"{where}: {key} must be true or false")
    if entry.get("traceback_cause") and not entry.get("frames"):
        raise SignatureError(f"{where}: traceback_cause needs frames (which tracebacks)")
    share = entry.get("held_elsewhere", 0.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise SignatureError(f"{where}: held_elsewhere must be a share of the GPU between 0 and 1")


def _build_signature(entry: dict[str, Any], where: str) -> Signature:
    """The Signature of a checked entry (its patterns compiled, numbers read): apart from the checks above so that
    each stays readable."""
    check = entry.get("check")
    commands = entry.get("commands") or []
    suppresses = entry.get("suppresses") or []
    defaults = entry.get("defaults") or {}
    sources = entry.get("sources") or []
    return Signature(
        entry["id"], str(entry.get("title", entry["id"])), _patterns(entry.get("patterns"), where, "patterns"),
        check, str(entry.get("fix", "")), tuple(str(c) for c in commands), str(entry.get("explain", "")),
        _int(entry, "rank", 50, where), bool(entry.get("consequence", False)),
        _patterns(entry.get("unless"), where, "unless"), _patterns(entry.get("context"), where, "context"),
        _int(entry, "context_before", 20, where), _int(entry, "context_after", 3, where),
        _patterns(entry.get("context_skip"), where, "context_skip"), tuple(suppresses),
        tuple((str(k), str(v)) for k, v in defaults.items()),
        _patterns(entry.get("frames"), where, "frames"), bool(entry.get("traceback_cause", False)),
        _patterns(entry.get("phase"), where, "phase"), _patterns(entry.get("process"), where, "process"),
        bool(entry.get("fallback", False)), _patterns(entry.get("absent"), where, "absent"), tuple(sources),
        str(entry.get("strength", "strong")), _patterns(entry.get("blame_if"), where, "blame_if"),
        bool(entry.get("blame_if_raised", False)), float(entry.get("held_elsewhere", 0.0)))


@functools.lru_cache(maxsize=4096)
def required_literals(pattern: re.Pattern[str]) -> frozenset[str] | None:
    """Strings of which every match of ``pattern`` contains at least one (lower-cased when the pattern
    ignores case), or None when the pattern has none of at least ``MIN_LITERAL`` characters.

    Read from the parsed pattern: a run of literal characters in the top-level sequence (or in a group,
    or a repeat of at least one) is required; an alternation is required as the set of one literal per
    branch, when every branch has one. The best candidate is the set whose shortest member is longest."""
    try:
        parsed = _sre_parse.parse(pattern.pattern, pattern.flags)
    except Exception:  # a parser change across Python versions: fall back to a full scan
        return None
    found = _best_literals(list(parsed))
    if found is None or min(len(x) for x in found) < MIN_LITERAL:
        return None
    if _folds(pattern):
        found = frozenset(x.lower() for x in found)
    return found


def _folds(pattern: re.Pattern[str]) -> bool:
    """Whether any part of ``pattern`` ignores case: its literals are then searched lower-cased in the
    lower-cased text (a superset of its matches, so nothing is lost)."""
    return bool(pattern.flags & re.IGNORECASE) or "(?i" in pattern.pattern


def _best_literals(items: list[Any]) -> frozenset[str] | None:
    options: list[frozenset[str]] = []
    run = ""
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            run += chr(av)
            continue
        if run:
            options.append(frozenset([run]))
            run = ""
        if name == "SUBPATTERN":
            sub = _best_literals(list(av[-1]))
            if sub:
                options.append(sub)
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and av[0] >= 1:
            sub = _best_literals(list(av[2]))
            if sub:
                options.append(sub)
        elif name == "BRANCH":
            alts = [_best_literals(list(alt)) for alt in av[1]]
            if all(alts):
                options.append(frozenset().union(*alts))  # type: ignore[arg-type]
    if run:
        options.append(frozenset([run]))
    return max(options, key=lambda o: min(len(x) for x in o), default=None)


def literal_plan(pattern: re.Pattern[str]) -> tuple[frozenset[str] | None, bool]:
    """``required_literals`` and whether they are lower-cased: the prefilter the log's structure uses too."""
    return required_literals(pattern), _folds(pattern)


def _line_index(starts: list[int], pos: int) -> int:
    return bisect_right(starts, pos) - 1


def _candidates_by_find(text: str, starts: list[int], literals: set[str], fold: bool) -> set[int]:
    hay = text.lower() if fold else text
    lines: set[int] = set()
    for lit in literals:
        pos = hay.find(lit)
        while pos != -1:
            idx = _line_index(starts, pos)
            lines.add(idx)
            nxt = starts[idx + 1] if idx + 1 < len(starts) else len(hay)
            pos = hay.find(lit, nxt)
    return lines


def _candidates_by_grep(data: Path, literals: set[str], fold: bool) -> set[int] | None:
    """0-based indices of the lines holding any literal, via one ``grep -F`` pass over ``data``, the temporary copy
    of the text (a file, not a pipe: feeding 50 MB through a pipe costs more than the scan; written once for both
    passes, case-sensitive and folded); None if grep is absent or fails: the caller then searches in Python."""
    grep = shutil.which("grep")
    if grep is None:
        return None
    if not literals:
        return set()
    try:
        pats = data.with_name("literals-folded" if fold else "literals")
        pats.write_text("\n".join(sorted(literals)) + "\n", encoding="utf-8")
        argv = [grep, "-a", "-n", "-o", "-F", "-f", str(pats), *(["-i"] if fold else []), str(data)]
        res = subprocess.run(argv, capture_output=True, timeout=GREP_TIMEOUT_S, check=False,
                             stdin=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode not in (0, 1):
        return None
    out: set[int] = set()
    for row in res.stdout.split(b"\n"):
        head = row.split(b":", 1)[0]
        if head.isdigit():
            out.add(int(head) - 1)
    return out


def _grep_copy(tmp: str, text: str) -> Path | None:
    """The text written once where grep reads it; None when it cannot be written (a full disk): Python searches."""
    data = Path(tmp) / "log"
    try:
        data.write_bytes(text.encode("utf-8", errors="replace"))
    except OSError:
        return None
    return data


def candidate_lines(text: str, starts: list[int], plan: dict[re.Pattern[str], frozenset[str] | None],
                    use_grep: bool = True) -> dict[re.Pattern[str], list[int] | None]:
    """For each pattern with required literals, the sorted lines that hold one of them (None: scan all)."""
    by_fold: dict[bool, set[str]] = {False: set(), True: set()}
    for pat, lits in plan.items():
        if lits:
            by_fold[_folds(pat)].update(lits)
    hits: dict[bool, list[int]] = {}
    use_grep = use_grep and len(text) >= GREP_MIN_CHARS and shutil.which("grep") is not None
    try:
        scratch = tempfile.TemporaryDirectory(prefix="k26-diagnose-") if use_grep else None
    except OSError:
        scratch = None
    with scratch if scratch is not None else contextlib.nullcontext() as tmp:
        data = _grep_copy(tmp, text) if tmp else None
        for fold, lits in by_fold.items():
            if not lits:
                continue
            lines = _candidates_by_grep(data, lits, fold) if data is not None else None
            if lines is None:
                lines = _candidates_by_find(text, starts, lits, fold)
            hits[fold] = sorted(lines)
    return {pat: (hits[_folds(pat)] if lits else None) for pat, lits in plan.items()}


def _has_context(sig: Signature, clean: list[str], idx: int) -> bool:
    lo, hi = max(0, idx - sig.context_before), min(len(clean), idx + sig.context_after + 1)
    for line in clean[lo:hi]:
        if any(p.search(line) for p in sig.context_skip):
            continue
        if any(p.search(line) for p in sig.context):
            return True
    return False


def _structure_holds(sig: Signature, shape: LogShape, idx: int) -> bool:
    """The structural conditions of ``sig`` for a hit on line ``idx`` (0-based)."""
    if sig.frames and not any(p.search(f) for f in shape.frames_at(idx) for p in sig.frames):
        return False
    if sig.phase:
        phase = shape.phase_at(idx)
        if phase is None or not any(p.search(phase) for p in sig.phase):
            return False
    return not sig.process or shape.proc_has(idx, sig.process)


_EMPTY = re.compile("")


def _hits(sig: Signature, text: str, starts: list[int], clean: list[str],
          candidates: dict[re.Pattern[str], list[int] | None], shape: LogShape) -> dict[int, re.Match[str]]:
    """The lines (0-based) where ``sig`` hits, with the first match on each; one search per line at most."""
    hits: dict[int, re.Match[str]] = {}

    def accept(idx: int, m: re.Match[str]) -> None:
        line = clean[idx]
        if any(p.search(line) for p in sig.unless):
            return
        if sig.context and not _has_context(sig, clean, idx):
            return
        if sig.structural and not _structure_holds(sig, shape, idx):
            return
        if sig.held_elsewhere and not held_elsewhere(line, sig.held_elsewhere):
            return
        hits[idx] = m

    for pat in sig.patterns:
        lines = candidates.get(pat)
        if lines is not None:  # only the lines that hold a literal every match needs
            for idx in lines:
                if idx not in hits and (m := pat.search(clean[idx])):
                    accept(idx, m)
            continue
        pos = 0
        while (m := pat.search(text, pos)) is not None:
            idx = _line_index(starts, m.start())
            pos = starts[idx + 1] if idx + 1 < len(starts) else len(text) + 1
            if idx not in hits:
                accept(idx, m)
    if sig.traceback_cause:
        for tb in shape.tracebacks():
            if tb.cause not in hits and any(p.search(f) for f in tb.frames for p in sig.frames):
                if not any(p.search(clean[tb.cause]) for p in sig.unless):
                    hits[tb.cause] = _EMPTY.match(clean[tb.cause])  # type: ignore[assignment]
    return hits


def order(matches: list[LogMatch]) -> list[LogMatch]:
    """Causes by first occurrence (rank breaks ties on a line), then consequences and findings whose blame was
    withheld: those naming a check first, then by rank and line."""
    causes = sorted((f for f in matches if not f.signature.consequence and not f.withheld),
                    key=lambda f: (f.line_no, f.signature.rank))
    echoes = sorted((f for f in matches if f.signature.consequence or f.withheld),
                    key=lambda f: (f.signature.check is None, f.signature.rank, f.line_no))
    return causes + echoes


def names_a_cause(matches: list[LogMatch]) -> bool:
    """Whether a finding is a cause that is blamed (not a consequence, not withheld): else the report shows the
    lines that look like the failure."""
    return any(not f.signature.consequence and not f.withheld for f in matches)


def judge_blame(found: list[LogMatch], hit_lines: dict[str, list[int]], shape: LogShape,
                candidates: dict[re.Pattern[str], list[int] | None] | None = None) -> None:
    """Withhold the blame of findings the log does not support (precision before recall: a wrong blame sends an
    operator to fix the wrong thing; "nothing found, here are the lines" does not):
    - a consequence (a peer died, a watchdog fired, a child failed) names its check only on the log's own causal
      evidence: a ``blame_if`` line anywhere, or, with ``blame_if_raised``, a hit that is the exception a traceback
      raised (``LogShape.raised``), not one that co-occurs;
    - a weak signature (a generic message whose threads name more than one cause) names its check only beside a
      strong finding of the same check;
    - two causes of different checks read from the same line (comparable evidence, neither suppressing the other)
      name neither.
    ``candidates``: the lines the matcher's one prefilter pass found for each ``blame_if`` pattern (no second scan
    of a large log)."""
    _withhold_unshown_consequences(found, hit_lines, shape, candidates)
    _withhold_lone_weak(found)
    _withhold_shared_lines(found)


def _withhold_unshown_consequences(found: list[LogMatch], hit_lines: dict[str, list[int]], shape: LogShape,
                                   candidates: dict[re.Pattern[str], list[int] | None] | None) -> None:
    """A consequence keeps its check only on the log's own causal evidence (a ``blame_if`` line, or a raised hit
    with ``blame_if_raised``): see ``judge_blame``."""
    def present(p: re.Pattern[str]) -> bool:
        lines = (candidates or {}).get(p)
        if lines is None:
            return bool(shape.matching(p))
        return any(p.search(shape.lines[i]) for i in lines)

    for f in found:
        s = f.signature
        if s.check is not None and s.consequence and not (
                any(present(p) for p in s.blame_if)
                or (s.blame_if_raised and any(shape.raised(i) for i in hit_lines.get(s.id, ())))):
            f.withhold(f"a consequence: nothing in the log shows the cause {s.check} checks")


def _withhold_lone_weak(found: list[LogMatch]) -> None:
    """A weak signature keeps its check only beside a strong finding of the same check: see ``judge_blame``."""
    strong = {f.signature.check for f in found if f.signature.check is not None and not f.signature.weak}
    for f in found:
        if f.signature.check is not None and f.signature.weak and f.signature.check not in strong:
            f.withhold("weak evidence: a generic message that threads resolved as more than one cause")


def _withhold_shared_lines(found: list[LogMatch]) -> None:
    """Causes of different checks read from the same line name neither: see ``judge_blame``."""
    on_line: dict[int, list[LogMatch]] = {}
    for f in found:
        if f.signature.check is not None and not f.signature.consequence:
            on_line.setdefault(f.line_no, []).append(f)
    for line_no, same in on_line.items():
        checks = sorted({f.signature.check for f in same if f.signature.check})
        if len(checks) > 1:
            for f in same:
                f.withhold(f"line {line_no} reads as more than one cause ({', '.join(checks)})")


def _cleaned(clean: list[str]) -> tuple[list[str], str]:
    """The lines without line ends, ANSI colours and overlong tails, and their joined text: each clean-up runs only
    when the text needs it (a 50 MB log has 500k lines)."""
    text = "\n".join(clean)  # the per-line clean-ups below run only when needed: a 50 MB log has 500k lines
    if "\r" in text or text.count("\n") != len(clean) - 1:
        clean = [ln.rstrip("\r\n") for ln in clean]
        text = "\n".join(clean)
    if max(map(len, clean)) > MAX_LINE or "\x1b" in text:
        clean = [_ANSI.sub("", ln[:MAX_LINE]) for ln in clean]
        text = "\n".join(clean)
    return clean, text


def _first_matches(per_line: dict[int, dict[str, re.Match[str]]], by_id: dict[str, Signature], clean: list[str],
                   context: int, hit_lines: dict[str, list[int]]) -> dict[str, LogMatch]:
    """Each signature's first unsuppressed hit (later ones counted, every hit's line recorded in ``hit_lines``):
    a signature another one on the same line explains is not a finding of that line."""
    found: dict[str, LogMatch] = {}
    for idx in sorted(per_line):
        ids = per_line[idx]
        explained = {s for sid in ids for s in by_id[sid].suppresses}
        for sid, m in ids.items():
            if sid in explained:
                continue
            hit_lines.setdefault(sid, []).append(idx)
            if sid in found:
                found[sid].count += 1
                continue
            values = {k: v for k, v in m.groupdict().items() if v is not None and _SAFE_VALUE.fullmatch(v)}
            lo, hi = max(0, idx - context), min(len(clean), idx + 1 + context)
            found[sid] = LogMatch(by_id[sid], idx + 1, clean[idx].strip(), 1, clean[lo:hi], values)
    return found


def diagnose_lines(lines: list[str], signatures: list[Signature], context: int = 2,
                   use_grep: bool = True, on_signature: Any = None, host: Any = None) -> list[LogMatch]:
    """Every signature that occurs in ``lines``, the likely root cause first (see ``order``).

    ``use_grep=False`` keeps the search in Python (the fallback when the host has no grep);
    ``on_signature(id)`` is called before each signature is matched (the bounded matcher's progress); ``host``: a
    callable ``lines -> dict`` of this host's values (``host_values``), asked only when a found signature uses one."""
    clean = list(lines)
    if not clean:
        return []
    clean, text = _cleaned(clean)
    starts = list(accumulate(map((1).__add__, map(len, clean)), initial=0))[:-1]
    shape = LogShape(clean, text, literal_plan)
    # the patterns the log's structure searches the whole log for (a process's lines, lines that must be absent, the
    # traceback header) join the one literal pass, so that the structure does not scan the text again for each
    plan = {pat: required_literals(pat) for sig in signatures
            for pat in (*sig.patterns, *sig.blame_if, *sig.process, *sig.absent)}
    plan[shape.lay.header] = required_literals(shape.lay.header)
    candidates = candidate_lines(text, starts, plan, use_grep)
    shape.known = candidates
    per_line: dict[int, dict[str, re.Match[str]]] = {}
    hit_lines: dict[str, list[int]] = {}
    for sig in signatures:
        if on_signature is not None:
            on_signature(sig.id)
        for idx, m in _hits(sig, text, starts, clean, candidates, shape).items():
            per_line.setdefault(idx, {})[sig.id] = m
    found = _first_matches(per_line, {s.id: s for s in signatures}, clean, context, hit_lines)
    found = {k: f for k, f in found.items() if not any(shape.matching(p) for p in f.signature.absent)}
    if any(not f.signature.consequence and not f.signature.fallback for f in found.values()):
        found = {k: f for k, f in found.items() if not f.signature.fallback}  # a cause was found: no fallback
    judge_blame(list(found.values()), hit_lines, shape, candidates)
    return with_host_values(order(list(found.values())), host, clean)


_TELLING = re.compile(r"(?:^|[\s:|\]>])(?:[A-Za-z_][\w.]*(?:Error|Exception|Fault)\b|Traceback \(most recent|"
                      r"(?:fatal|FATAL|ERROR|error)\b\s*[:\]]|Segmentation fault|Aborted|CUDA error\b|"
                      r"returned non-zero exit status|[Nn]o such file or directory)")
_TELLING_SKIP = re.compile(r"^\s*(?:File \"|\^+$|~+)|server_args=|ServerArgs\(|non-default args")
TELLING_LINES = 6


def telling_lines(lines: list[str], limit: int = TELLING_LINES) -> list[tuple[int, str]]:
    """The lines a reader should look at when no signature names a cause: the last distinct lines that look like an
    error being raised (an exception's name, "fatal", "error:", a CUDA error, a failed command), newest last, as
    (1-based line number, text). Shown by `diagnose` under "nothing matched", never blamed on a check."""
    seen: set[str] = set()
    out: list[tuple[int, str]] = []
    for idx in range(len(lines) - 1, -1, -1):
        text = _ANSI.sub("", lines[idx][:MAX_LINE]).strip()
        if not text or _TELLING_SKIP.search(text) or not _TELLING.search(text):
            continue
        key = re.sub(r"\d+", "#", text)[-200:]
        if key in seen:
            continue
        seen.add(key)
        out.append((idx + 1, text))
        if len(out) >= limit:
            break
    return out[::-1]


HOST_PLACEHOLDERS = ("python_headers", "python_headers_install")
_INCLUDE = re.compile(r"(?:-I|\s|'|\")(?P<inc>/[^\s'\",]*?/include/python\d+\.\d+)")


def uses_host_values(matches: list[LogMatch]) -> bool:
    return any("{" + name + "}" in text for f in matches
               for text in (f.signature.fix, *f.signature.commands) for name in HOST_PLACEHOLDERS)


def with_host_values(matches: list[LogMatch], host: Any, lines: list[str]) -> list[LogMatch]:
    """``matches`` with this host's values (``host(lines)``, asked once and only when a signature uses one)."""
    if host is not None and uses_host_values(matches):
        values = host(lines)
        for f in matches:
            f.host = values
    return matches


def host_values(lines: list[str], python: str | None = None,
                os_release: dict[str, str] | None = None) -> dict[str, str]:
    """What a fix needs from this host: the package that holds ``Python.h`` for the service's interpreter
    (``--python``, else the include directory the log's compiler command names) on this distribution."""
    from doctor.python.headers import from_include, headers_advice
    from doctor.triton.facts import read_os_release

    release = os_release if os_release is not None else read_os_release()
    base = mm = version = ""
    conda = False
    if python:
        from doctor.core.proc import run_probe

        data, _ = run_probe(python, "stack", timeout=60)
        py = (data or {}).get("python") or {}
        if py.get("include"):
            base, mm = str(py.get("base_prefix") or ""), ".".join(str(py.get("version", "")).split(".")[:2])
            version, conda = str(py.get("version") or ""), bool(py.get("base_is_conda"))
    if not mm:
        for line in lines:
            m = _INCLUDE.search(line)
            found = from_include(m.group("inc")) if m else None
            if found:
                base, mm = found
                break
    if not mm:
        return {"python_headers": "Install the development headers (Python.h) of the service's interpreter: "
                                  "`k26-doctor check --only triton.jit --python PATH` names the package for it.",
                "python_headers_install": ""}
    advice = headers_advice(release, mm, base, version, conda=conda)
    return {"python_headers": advice.text, "python_headers_install": advice.commands[-1] if advice.commands else ""}


MATCH_TIMEOUT_S = 60.0


def match_bounded(lines: list[str], paths: list[Path], timeout: float = MATCH_TIMEOUT_S) -> list[LogMatch]:
    """``diagnose_lines`` with the built-in and the site's signatures (``paths``), in a child process killed
    after ``timeout`` seconds: a site's pattern that backtracks catastrophically on this log (one the load-time
    refusal of ``nested_repeat`` does not catch, e.g. ``(a|aa)+$``) ends the matching with ``SignatureError``
    naming the signature, never a hang. The built-in signatures alone are matched in-process (they are tested
    against a corpus)."""
    import json

    from doctor.core.proc import run
    from doctor.facts.isolation import worker_env

    signatures = load_signatures(paths)
    with tempfile.TemporaryDirectory(prefix="k26-diagnose-") as tmp:
        log = Path(tmp) / "log"
        log.write_text("\n".join(lines), encoding="utf-8", errors="replace")
        request = json.dumps({"log": str(log), "signatures": [str(p) for p in paths]})
        res = run([sys.executable, "-m", "doctor.service.diagnose_worker"], timeout, input=request, env=worker_env())
    if res.timed_out:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        raise SignatureError(f"matching the signatures did not finish within {timeout:g}s: signature {last!r} was "
                             "being matched (a pattern that backtracks catastrophically on this log?); fix that "
                             "pattern, or leave its file out")
    try:
        found = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SignatureError(f"matching the signatures failed: {res.why()}") from None
    by_id = {s.id: s for s in signatures}
    out = []
    for f in found:
        if f.get("id") in by_id:
            match = LogMatch(by_id[f["id"]], f["line_no"], f["line"], f["count"], f["context"], f["values"])
            if f.get("withheld"):
                match.withhold(str(f["withheld"]))
            out.append(match)
    return order(out)


def read_log(path: str, deadline_s: float = LOG_READ_S) -> list[str]:
    """A log file's lines; ``-`` is stdin. Undecodable bytes are replaced, never fatal. A pipe
    (``<(journalctl ...)``) is read until its writer is done, within ``deadline_s``; a device, a directory or a
    FIFO nobody writes never blocks (``doctor.core.fileio.read_pipe_or_file``)."""
    if path == "-":
        return sys.stdin.read().splitlines()
    return read_pipe_or_file(path, MAX_LOG_BYTES, "a log", deadline_s).decode("utf-8", "replace").splitlines()


def journal_argv(unit: str, invocation: str | None = None, lines: int = 20000) -> list[str]:
    """journalctl for the unit's last start (``_SYSTEMD_INVOCATION_ID`` when known)."""
    argv = ["journalctl", "--no-pager", "-o", "cat"]
    if invocation:
        return [*argv, f"_SYSTEMD_INVOCATION_ID={invocation}"]
    return [*argv, "-u", unit, "-b", "-n", str(lines)]


def _telling_text(lines: list[str] | None) -> list[str]:
    shown = telling_lines(lines or [])
    if not shown:
        return []
    return ["", "Lines that look like the failure (no check is blamed for them):",
            *(f"   line {n}: {text[:300]}" for n, text in shown)]


def render_text(matches: list[LogMatch], source: str, lines: list[str] | None = None) -> str:
    """The report; ``lines`` (the log) lets a report that names no cause show the lines that look like the failure."""
    if not matches:
        return printable("\n".join([f"{source}: no known failure signature found. Run `k26-doctor check` to judge "
                                    "the host, or add a signature (--signatures FILE).", *_telling_text(lines)]),
                         lines=True) + "\n"
    if not names_a_cause(matches) and all(f.signature.consequence for f in matches):
        head = (f"{source}: {len(matches)} known failure signature(s), all of them consequences of a failure "
                "whose own message no signature knows; the most telling first.")
    elif not names_a_cause(matches):
        head = (f"{source}: {len(matches)} known failure signature(s), none of them blamed: each is a consequence "
                "or evidence too weak to name a check; the most telling first.")
    else:
        head = f"{source}: {len(matches)} known failure signature(s); the likely root cause first."
    out = [head, ""]
    for n, f in enumerate(matches, 1):
        s = f.signature
        label = "   (a consequence: it follows a failure elsewhere)" if s.consequence else ""
        out.append(f"{n}. {s.title}  [{s.id}]" + (f"  -> check {s.check}" if s.check else "") + label)
        if f.withheld:
            out.append(f"   not blamed on {f.withheld_check}: {f.withheld}")
        out.append(f"   line {f.line_no}" + (f" (and {f.count - 1} more)" if f.count > 1 else "")
                   + f": {printable(f.line[:300])}")
        if s.explain:
            out.append(f"   why: {s.explain}")
        if f.fix:
            out.append(f"   fix: {f.fix}")
        for cmd in f.commands:
            out.append(f"     $ {cmd}")
        out.append("")
    if not names_a_cause(matches):
        out.extend(_telling_text(lines)[1:])
    return printable("\n".join(out), lines=True)
