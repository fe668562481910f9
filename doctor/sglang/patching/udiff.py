"""A strict unified-diff parser and applier in pure Python (bytes in, bytes out, no fuzz).

Why not shell out to ``patch``: the engine must compute every new file in memory and check it
against the manifest's hash before anything is written, and it must not depend on which ``patch``
the host has. Strict means every context and removed line must match byte for byte where the hunk
says (``allow_offset`` lets a hunk move, never lets a line differ: it is only used by
``--force`` on a drifted file). The tests cross-check this applier against GNU ``patch``.

Understood: ``diff -u`` and ``git diff`` output (``diff --git``/``index``/mode lines are skipped),
``/dev/null`` for created and deleted files, ``\\ No newline at end of file``. Not understood, and
refused: binary patches, renames and copies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
DEV_NULL = "/dev/null"


class PatchFormatError(Exception):
    """The diff itself is malformed or uses something this applier refuses."""


class HunkMismatch(Exception):
    """A hunk does not apply to the given content; says which hunk, where and the first differing line."""


@dataclass
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[tuple[str, bytes]] = field(default_factory=list)  # (' ' | '-' | '+', line with its EOL)
    header_line: int = 0  # 1-based line of the @@ header in the diff

    def old_lines(self) -> list[bytes]:
        return [text for op, text in self.lines if op in " -"]

    def new_lines(self) -> list[bytes]:
        return [text for op, text in self.lines if op in " +"]

    def reversed(self) -> Hunk:
        swap = {" ": " ", "-": "+", "+": "-"}
        return Hunk(self.new_start, self.new_count, self.old_start, self.old_count,
                    [(swap[op], text) for op, text in self.lines], self.header_line)


@dataclass
class FilePatch:
    old_path: str  # as written, with any a/ prefix; "/dev/null" for a created file
    new_path: str
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def creates(self) -> bool:
        return self.old_path == DEV_NULL

    @property
    def deletes(self) -> bool:
        return self.new_path == DEV_NULL

    @property
    def path(self) -> str:
        """The path this section is about (the new one unless the file is deleted)."""
        return self.old_path if self.deletes else self.new_path

    def reversed(self) -> FilePatch:
        return FilePatch(self.new_path, self.old_path, [h.reversed() for h in self.hunks])


def split_lines(data: bytes) -> list[bytes]:
    """Lines split on b"\\n" only, each keeping its end (a lone CR is content, as for patch(1))."""
    parts = data.split(b"\n")
    out = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _header_path(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="surrogateescape").rstrip("\r\n")
    # "--- a/x.py\t2024-01-01 ..." : a tab ends the name; quoted names are git's escapes
    text = text.split("\t", 1)[0]
    if text.startswith('"') and text.endswith('"'):
        raise PatchFormatError(f"quoted file name {text} (unusual characters) is not supported")
    return text.strip()


def parse(data: bytes) -> list[FilePatch]:
    """Parse a unified diff into its file sections; ``PatchFormatError`` with the line number."""
    lines = split_lines(data)
    files: list[FilePatch] = []
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        if line.startswith(b"GIT binary patch") or line.startswith(b"Binary files "):
            raise PatchFormatError(f"line {i + 1}: binary patches are not supported")
        if line.startswith((b"rename from ", b"rename to ", b"copy from ", b"copy to ")):
            raise PatchFormatError(f"line {i + 1}: renames and copies are not supported; write them as "
                                   "a deletion and a creation")
        if line.startswith(b"--- ") and i + 1 < n and lines[i + 1].startswith(b"+++ "):
            fp = FilePatch(_header_path(line[4:]), _header_path(lines[i + 1][4:]))
            i += 2
            while i < n and lines[i].startswith(b"@@"):
                hunk, i = _parse_hunk(lines, i)
                fp.hunks.append(hunk)
                nxt = lines[i] if i < n else b""
                header_next = nxt.startswith(b"--- ") and i + 1 < n and lines[i + 1].startswith(b"+++ ")
                if nxt[:1] in (b" ", b"+", b"-") and not header_next and nxt != b"-- \n":
                    raise PatchFormatError(f"line {i + 1}: more lines than the hunk header at line "
                                           f"{hunk.header_line} says")
            if not fp.hunks:
                raise PatchFormatError(f"line {i}: file section {fp.path} has no hunks")
            files.append(fp)
            continue
        if line.startswith(b"@@"):
            raise PatchFormatError(f"line {i + 1}: hunk without a '--- '/'+++ ' file header")
        i += 1  # commentary, "diff --git", "index", mode lines
    if not files:
        raise PatchFormatError("no file sections ('--- '/'+++ ' headers) in the diff")
    return files


def _parse_hunk(lines: list[bytes], i: int) -> tuple[Hunk, int]:
    m = HUNK_RE.match(lines[i])
    if not m:
        raise PatchFormatError(f"line {i + 1}: malformed hunk header {lines[i][:80]!r}")
    old_start, new_start = int(m.group(1)), int(m.group(3))
    old_count = int(m.group(2)) if m.group(2) is not None else 1
    new_count = int(m.group(4)) if m.group(4) is not None else 1
    hunk = Hunk(old_start, old_count, new_start, new_count, header_line=i + 1)
    i += 1
    seen_old = seen_new = 0
    while seen_old < old_count or seen_new < new_count:
        if i >= len(lines):
            raise PatchFormatError(f"line {hunk.header_line}: hunk ends early (diff truncated?)")
        line = lines[i]
        op = line[:1]
        if line in (b"\n", b"\r\n"):  # a context line whose single space an editor stripped
            op, line = b" ", b" " + line
        if op == b" ":
            seen_old += 1
            seen_new += 1
        elif op == b"-":
            seen_old += 1
        elif op == b"+":
            seen_new += 1
        elif op == b"\\":
            _strip_eol(hunk, i)
            i += 1
            continue
        else:
            raise PatchFormatError(f"line {i + 1}: hunk body line must start with ' ', '-', '+' or '\\'")
        if seen_old > old_count or seen_new > new_count:
            raise PatchFormatError(f"line {i + 1}: more lines than the hunk header at line {hunk.header_line} says")
        hunk.lines.append((op.decode(), line[1:]))
        i += 1
    if i < len(lines) and lines[i].startswith(b"\\"):
        _strip_eol(hunk, i)
        i += 1
    return hunk, i


def _strip_eol(hunk: Hunk, i: int) -> None:
    if not hunk.lines:
        raise PatchFormatError(f"line {i + 1}: '\\ No newline' before any line")
    op, text = hunk.lines[-1]
    if text.endswith(b"\r\n"):
        text = text[:-2]
    elif text.endswith(b"\n"):
        text = text[:-1]
    hunk.lines[-1] = (op, text)


def apply(content: bytes | None, fp: FilePatch, *, allow_offset: bool = False) -> bytes | None:
    """Apply one file section to ``content`` (None: the file does not exist). Returns the new bytes,
    or None when the section deletes the file. Raises ``HunkMismatch``."""
    if fp.creates:
        if content is not None and content != b"":
            raise HunkMismatch(f"{fp.path}: the diff creates this file, but it already exists")
        content = b""
    elif content is None:
        raise HunkMismatch(f"{fp.path}: the file does not exist")
    src = split_lines(content)
    out: list[bytes] = []
    pos = 0  # next unconsumed index in src
    shift = 0  # offset at which the previous hunk applied (patch(1) carries it forward too)
    for k, hunk in enumerate(fp.hunks, 1):
        old = hunk.old_lines()
        want = hunk.old_start - 1 if hunk.old_count else hunk.old_start  # 0-count: insert after old_start
        at = _locate(src, old, want + shift, pos, allow_offset)
        if at is None:
            raise HunkMismatch(_mismatch(fp, k, hunk, src, want + shift))
        shift = at - want
        out.extend(src[pos:at])
        out.extend(hunk.new_lines())
        pos = at + len(old)
    out.extend(src[pos:])
    result = b"".join(out)
    if fp.deletes:
        if result:
            raise HunkMismatch(f"{fp.path}: the diff deletes this file, but content would remain")
        return None
    return result


def _locate(src: list[bytes], old: list[bytes], want: int, floor: int, allow_offset: bool) -> int | None:
    def fits(at: int) -> bool:
        return floor <= at and at + len(old) <= len(src) and src[at:at + len(old)] == old

    if fits(want):
        return want
    if not allow_offset:
        return None
    for delta in range(1, len(src) + 1):  # nearest first, later before earlier, like patch(1); never fuzz
        for at in (want + delta, want - delta):
            if fits(at):
                return at
        if want - delta < floor and want + delta > len(src):
            break
    return None


def _mismatch(fp: FilePatch, k: int, hunk: Hunk, src: list[bytes], want: int) -> str:
    old = hunk.old_lines()
    for j, expected in enumerate(old):
        got = src[want + j] if 0 <= want + j < len(src) else None
        if got != expected:
            shown = "end of file" if got is None else repr(got.decode("utf-8", "replace").rstrip("\n")[:100])
            return (f"{fp.path}: hunk {k} (@@ -{hunk.old_start},{hunk.old_count}) does not apply: "
                    f"line {want + j + 1} is {shown}, the diff expects "
                    f"{expected.decode('utf-8', 'replace').rstrip(chr(10))[:100]!r}")
    return f"{fp.path}: hunk {k} (@@ -{hunk.old_start},{hunk.old_count}) does not apply (overlaps the previous hunk)"


def strip_prefix(path: str) -> str:
    """``a/x`` / ``b/x`` -> ``x`` (git's prefixes); other paths unchanged."""
    if path.startswith(("a/", "b/")):
        return path[2:]
    return path


def match_section(sections: list[FilePatch], target: str) -> FilePatch | None:
    """The section of a diff that is about ``target`` (a path relative to site-packages).

    A section's path matches when, without git's a/ b/ prefix, it equals ``target`` or ends with
    ``/target`` (diffs made in the SGLang repository say ``python/sglang/...``).
    """
    exact = [s for s in sections if strip_prefix(s.path) == target or s.path == target]
    if exact:
        return exact[0]
    suffix = [s for s in sections if s.path.endswith("/" + target)]
    return suffix[0] if len(suffix) == 1 else None


def make_diff(path: str, old: bytes | None, new: bytes | None, context: int = 3) -> bytes:
    """A git-style unified diff of one file (``a/path`` -> ``b/path``) that this module parses back;
    with ``\\ No newline at end of file`` markers, which ``difflib`` alone does not write."""
    import difflib

    a = split_lines(old or b"")
    b = split_lines(new or b"")
    head = [f"diff --git a/{path} b/{path}\n".encode()]
    if old is None:
        head.append(b"new file mode 100644\n")
    if new is None:
        head.append(b"deleted file mode 100644\n")
    head.append(f"--- {'a/' + path if old is not None else DEV_NULL}\n".encode())
    head.append(f"+++ {'b/' + path if new is not None else DEV_NULL}\n".encode())
    body: list[bytes] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        body.append(f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@\n".encode())
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                body.extend(_marked(b" ", a[x1:x2]))
                continue
            if tag in ("replace", "delete"):
                body.extend(_marked(b"-", a[x1:x2]))
            if tag in ("replace", "insert"):
                body.extend(_marked(b"+", b[y1:y2]))
    if not body:
        return b""
    return b"".join(head + body)


def _range(start: int, count: int) -> str:
    first = start + 1 if count else start
    return f"{first}" if count == 1 else f"{first},{count}"


def _marked(op: bytes, lines: list[bytes]) -> list[bytes]:
    out = []
    for line in lines:
        if line.endswith(b"\n"):
            out.append(op + line)
        else:
            out.append(op + line + b"\n\\ No newline at end of file\n")
    return out
