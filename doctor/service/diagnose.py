"""Diagnosis of a failed start: known log signatures -> the check that catches it, and its fix.

The signatures are data (``doctor/data/failure_signatures.toml``; a site adds its own file with
``--signatures``). A log is scanned line by line; every signature found is reported once, with its
first line and a little context, ordered by ``rank`` (likely root causes first) and position.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - py310
    import tomli as tomllib

SIGNATURES_FILE = Path(__file__).resolve().parents[1] / "data" / "failure_signatures.toml"
MAX_LINE = 8192  # a pathological line (a tensor dump) is cut, not matched for minutes
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


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


@dataclass
class Finding:
    signature: Signature
    line_no: int  # 1-based, first occurrence
    line: str
    count: int = 1
    context: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        s = self.signature
        return {"id": s.id, "title": s.title, "check": s.check, "line": self.line_no, "text": self.line,
                "count": self.count, "context": self.context, "explain": s.explain,
                "remediation": {"text": s.fix, "commands": list(s.commands)}}


def load_signatures(paths: list[Path] | None = None) -> list[Signature]:
    """The built-in signatures plus any site files; later ids replace earlier ones."""
    by_id: dict[str, Signature] = {}
    for path in [SIGNATURES_FILE, *(paths or [])]:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise SignatureError(f"cannot read signatures {path}: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise SignatureError(f"signatures {path} are not valid TOML: {exc}") from None
        entries = data.get("signature")
        if not isinstance(entries, list):
            raise SignatureError(f"{path}: expected [[signature]] tables")
        for i, entry in enumerate(entries):
            sig = _signature(entry, f"{path} signature #{i + 1}")
            by_id[sig.id] = sig
    return list(by_id.values())


def _signature(entry: Any, where: str) -> Signature:
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry.get("patterns"):
        raise SignatureError(f"{where}: needs id and patterns")
    pats = entry["patterns"]
    if isinstance(pats, str):
        pats = [pats]
    compiled = []
    for pat in pats:
        try:
            compiled.append(re.compile(str(pat)))
        except re.error as exc:
            raise SignatureError(f"{where} ({entry['id']}): bad pattern {pat!r}: {exc}") from None
    commands = entry.get("commands") or []
    if not isinstance(commands, list):
        raise SignatureError(f"{where} ({entry['id']}): commands must be a list")
    try:
        rank = int(entry.get("rank", 50))
    except (TypeError, ValueError):
        raise SignatureError(f"{where} ({entry['id']}): rank must be an integer") from None
    return Signature(entry["id"], str(entry.get("title", entry["id"])), tuple(compiled),
                     entry.get("check"), str(entry.get("fix", "")), tuple(str(c) for c in commands),
                     str(entry.get("explain", "")), rank)


def diagnose_lines(lines: list[str], signatures: list[Signature], context: int = 2) -> list[Finding]:
    """Every signature that occurs in ``lines``: root-cause-first (rank), then by first line."""
    found: dict[str, Finding] = {}
    clean = [_ANSI.sub("", ln.rstrip("\r\n"))[:MAX_LINE] for ln in lines]
    for no, line in enumerate(clean, 1):
        for sig in signatures:
            if any(p.search(line) for p in sig.patterns):
                if sig.id in found:
                    found[sig.id].count += 1
                else:
                    lo, hi = max(0, no - 1 - context), min(len(clean), no + context)
                    found[sig.id] = Finding(sig, no, line.strip(), 1, clean[lo:hi])
    return sorted(found.values(), key=lambda f: (f.signature.rank, f.line_no))


def read_log(path: str) -> list[str]:
    """A log file's lines; ``-`` is stdin. Undecodable bytes are replaced, never fatal."""
    if path == "-":
        return sys.stdin.read().splitlines()
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read().splitlines()


def journal_argv(unit: str, invocation: str | None = None, lines: int = 20000) -> list[str]:
    """journalctl for the unit's last start (``_SYSTEMD_INVOCATION_ID`` when known)."""
    argv = ["journalctl", "--no-pager", "-o", "cat"]
    if invocation:
        return [*argv, f"_SYSTEMD_INVOCATION_ID={invocation}"]
    return [*argv, "-u", unit, "-b", "-n", str(lines)]


def render_text(findings: list[Finding], source: str) -> str:
    if not findings:
        return (f"{source}: no known failure signature found. Run `k26-doctor check` to judge the host, "
                "or add a signature (--signatures FILE).\n")
    out = [f"{source}: {len(findings)} known failure signature(s); the likely root cause first.", ""]
    for n, f in enumerate(findings, 1):
        s = f.signature
        out.append(f"{n}. {s.title}  [{s.id}]" + (f"  -> check {s.check}" if s.check else ""))
        out.append(f"   line {f.line_no}" + (f" (and {f.count - 1} more)" if f.count > 1 else "") + f": {f.line[:300]}")
        if s.explain:
            out.append(f"   why: {s.explain}")
        if s.fix:
            out.append(f"   fix: {s.fix}")
        for cmd in s.commands:
            out.append(f"     $ {cmd}")
        out.append("")
    return "\n".join(out)
