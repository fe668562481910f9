"""Reading a systemd unit as systemd does, for the tests of the units the doctor writes."""

from __future__ import annotations

import shlex


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """INI as systemd reads it: sections, repeated keys kept in order, comments dropped."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, {})
            continue
        assert section is not None and "=" in line, raw
        key, value = line.split("=", 1)
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


def command(value: str) -> list[str]:
    """An Exec line's argv: strip systemd prefixes, undo %% and $$ escaping."""
    value = value.lstrip("-@:+!")
    return [a.replace("%%", "%").replace("$$", "$") for a in shlex.split(value)]
