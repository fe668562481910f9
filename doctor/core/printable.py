"""Foreign text made safe for a terminal: one renderer for everything the doctor prints that it did not write
itself (a server's body or status line, a log line, a file name, an environment variable's value).

A terminal acts on control characters: ``ESC ] 0 ; title BEL`` retitles the window (OSC; some terminals take
OSC 52 as "set the clipboard"), ``ESC [ 2 J`` clears the screen, ``CR`` and ``BS`` move the cursor back so that
what follows overwrites the FAIL line, C1 codes (``\\x9b`` is CSI) do the same in one byte, and Unicode's
bidirectional overrides reorder what is shown. ``printable`` escapes every one of them visibly (``\\x1b``,
``\\r``, ``\\u202e``), so what a hostile server or file name says is shown, never obeyed; tabs are kept, and
newlines only where the text is a block of lines (``lines=True``).

``terminal_safe`` is the same rule for the doctor's whole output, applied by ``RedactingStream`` to every write
(``doctor.facts.redaction``): only the doctor's own sequences pass, the SGR colours (``ESC [ 1 ; 31 m``) and the
readiness line's rewrite (``CR ESC [ K``), and only when ``keep_own`` (a colour terminal).
"""

from __future__ import annotations

import re

# C0 but TAB and LF, DEL, C1, and the bidirectional embeddings, overrides and isolates.
_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
CONTROL = re.compile(f"[{_CONTROLS}]")
CONTROL_OR_NEWLINE = re.compile(f"[{_CONTROLS}\n]")
OWN_OR_CONTROL = re.compile(f"(?P<own>\x1b\\[[0-9;]*m|\r\x1b\\[K)|[{_CONTROLS}]")
NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    code = ord(char)
    # C0 as \x1b; DEL, C1 and the rest as \u009b: the form a JSON string reads back as the same character, so a
    # JSON report that went through the stream stays valid JSON
    return NAMED.get(char) or (f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}")


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character escaped visibly (see the module docstring); newlines too unless
    ``lines`` (a block of lines: a log excerpt, a traceback). Text without one is returned as it is."""
    pattern = CONTROL if lines else CONTROL_OR_NEWLINE
    if not pattern.search(text):
        return text
    return pattern.sub(lambda m: _escape(m.group(0)), text)


def terminal_safe(text: str, *, keep_own: bool = False) -> str:
    """What may reach a terminal of the doctor's output: newlines and tabs, and with ``keep_own`` the doctor's
    own colour and line-rewrite sequences; every other control character escaped as ``printable`` does."""
    if not CONTROL.search(text):
        return text
    if not keep_own:
        return CONTROL.sub(lambda m: _escape(m.group(0)), text)
    return OWN_OR_CONTROL.sub(lambda m: m.group(0) if m.group("own") else _escape(m.group(0)), text)
