"""Why the installed SGLang rejects a flag: the flag history of every release, vLLM's spellings, forks.

argparse says only "unrecognized arguments" (or "ambiguous option"), after seconds to minutes of
imports. This module says what the flag is:

* an underscore spelling of a flag SGLang spells with dashes (``--reasoning_parser``);
* a flag of another SGLang release: added after the installed one ("added in 0.5.20; the installed
  SGLang is 0.5.13.post1"), or removed before it ("removed in 0.5.20"), with the replacement where
  one is known (``doctor/data/sglang_removed_flags.toml``), else the flag that now carries the same
  setting (same argparse ``dest``);
* vLLM's spelling of an SGLang setting (``--max-model-len`` -> ``--context-length``);
* a flag of a fork or companion launcher (ktransformers' ``--kt-*``, sglang-router's ``--router-*``);
* a typo of an accepted flag (did you mean ...).

The history (``doctor/data/sglang_flag_history.json``) lists, for every flag of every release from
0.4.0 on, the runs of releases that accept it; ``scripts/make_flag_history.py`` regenerates it from
the released wheels with the doctor's own source reader. Nothing here imports SGLang.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doctor.core.datafile import load_toml
from doctor.core.fileio import read_text

if TYPE_CHECKING:  # packaging is imported where it is used: `k26-doctor list` and --help never need it
    from packaging.version import Version

DATA = Path(__file__).resolve().parents[1] / "data"
HISTORY_FILE = DATA / "sglang_flag_history.json"
VLLM_FILE = DATA / "vllm_flag_equivalents.toml"
FORKS_FILE = DATA / "sglang_fork_flags.toml"


@dataclass(frozen=True)
class FlagHistory:
    """Every release read (oldest first) and, per flag, the runs of releases that accept it."""

    releases: tuple[str, ...]
    flags: Mapping[str, dict[str, Any]]
    unreadable: Mapping[str, str] = field(default_factory=dict)
    forks: Mapping[str, dict[str, Any]] = field(default_factory=dict)

    def runs(self, flag: str) -> list[tuple[int, int]]:
        entry = self.flags.get(flag) or {}
        return [(int(a), int(b)) for a, b in entry.get("in", [])]

    def known(self, flag: str) -> bool:
        return flag in self.flags

    def position(self, version: str | None) -> float | None:
        """Where ``version`` falls among the releases: its index, or a half index between two;
        ``None`` when it is not a version."""
        from packaging.version import Version

        parsed = _version(version)
        if parsed is None:
            return None
        release = Version(parsed.base_version) if parsed.is_devrelease or parsed.local else parsed
        for i, rel in enumerate(self.releases):
            rv = Version(rel)
            if rv == release:
                return float(i)
            if rv > release:
                return i - 0.5
        return len(self.releases) - 0.5

    def options_at(self, release: str) -> dict[str, str]:
        """Every option string ``release`` accepts, with its argparse ``dest`` ({} for a release not read)."""
        if release not in self.releases:
            return {}
        i = self.releases.index(release)
        return {flag: str((self.flags.get(flag) or {}).get("dest") or "") for flag in self.flags
                if any(a <= i <= b for a, b in self.runs(flag))}

    def fork_of(self, flag: str) -> str | None:
        """The fork (package name) whose recorded release alone has ``flag``."""
        for package, info in self.forks.items():
            if flag in (info.get("flags") or ()):
                return package
        return None


@functools.lru_cache(maxsize=4)
def load_history(path: Path = HISTORY_FILE) -> FlagHistory:
    data = json.loads(read_text(path, 64 << 20, "a flag history"))
    return FlagHistory(tuple(data.get("releases") or ()), dict(data.get("flags") or {}),
                       dict(data.get("unreadable") or {}), dict(data.get("forks") or {}))


def _toml(path: Path) -> dict[str, Any]:
    return load_toml(path)


def vllm_equivalents(path: Path = VLLM_FILE) -> dict[str, dict[str, Any]]:
    """``{"--max-model-len": {"sglang": ["--context-length"], "note": ...}}``."""
    return {str(k): dict(v) for k, v in (_toml(path).get("flags") or {}).items()}


def fork_prefixes(path: Path = FORKS_FILE) -> dict[str, dict[str, Any]]:
    return {str(k): dict(v) for k, v in (_toml(path).get("forks") or {}).items()}


def _version(text: str | None) -> Version | None:
    if not text:
        return None
    from packaging.version import InvalidVersion, Version

    try:
        return Version(str(text))
    except InvalidVersion:
        return None


@dataclass
class Explanation:
    """What a rejected flag is. ``kind``: underscore, added_later, removed, not_in_this_build,
    other_release, vllm, fork, typo, unknown. ``replacement``: the flag (with values) to use."""

    kind: str
    message: str
    replacement: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


def _same_dest(history: FlagHistory, flag: str, options: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The installed option that sets what ``flag`` used to set (its argparse ``dest``)."""
    dest = (history.flags.get(flag) or {}).get("dest")
    if not dest:
        return None
    same = sorted(o for o, spec in options.items() if spec.get("dest") == dest and o.startswith("--")
                  and not o.startswith("--no-"))
    return same[0] if same else None


def _hint(flag: str, history: FlagHistory, options: Mapping[str, Mapping[str, Any]],
          removed: Mapping[str, Mapping[str, Any]]) -> tuple[str, str | None]:
    """(text to append, replacement) for a flag the installed release no longer has."""
    info = removed.get(flag) or {}
    if info:
        repl = str(info.get("replacement") or "") or None
        text = f"; use {repl}" if repl else ""
        if info.get("note"):
            text += f" ({info['note']})"
        return text, repl
    same = _same_dest(history, flag, options)
    if same and same != flag:
        return f"; the installed SGLang sets the same option with {same}", same
    dep = (history.flags.get(flag) or {}).get("deprecated") or {}
    if dep.get("use"):
        return f"; it was deprecated in {dep['since']} for {dep['use']}", str(dep["use"])
    return "", None


def _older_spelling(flag: str, options: Mapping[str, Mapping[str, Any]],
                    removed: Mapping[str, Mapping[str, Any]]) -> str | None:
    """For a flag newer than the installed release: the older flag the removed-flags table says it
    replaced, when the installed release has that one."""
    for old, info in removed.items():
        words = str(info.get("replacement") or "").replace(",", " ").replace("(", " ").replace(")", " ").split()
        if flag in words and old in options:
            return old
    return None


def _explain_history(flag: str, history: FlagHistory, installed: str | None,
                     options: Mapping[str, Mapping[str, Any]], removed: Mapping[str, Mapping[str, Any]]
                     ) -> Explanation | None:
    runs = history.runs(flag)
    if not runs:
        return None
    rel = history.releases
    first, last = rel[runs[0][0]], rel[runs[-1][1]]
    facts: dict[str, Any] = {"first_release": first, "last_release": last,
                             "releases": [[rel[a], rel[b]] for a, b in runs]}
    pos = history.position(installed)
    if pos is None:
        return Explanation("other_release", f"{flag} is a flag of SGLang {first} to {last}; the installed "
                                            f"SGLang's version ({installed or 'unknown'}) cannot be placed", None,
                           facts)
    if any(a <= pos <= b for a, b in runs):
        return Explanation("not_in_this_build", f"SGLang {installed} as released accepts {flag}, this installation "
                           "does not: its sources are modified or from another build "
                           f"(reinstall sglang=={installed})", None, facts)
    before = [(a, b) for a, b in runs if b < pos]
    after = [(a, b) for a, b in runs if a > pos]
    if before:
        end = before[-1][1]
        removed_in = rel[end + 1]
        facts["removed_in"] = removed_in
        text, repl = _hint(flag, history, options, removed)
        msg = f"{flag} was removed in SGLang {removed_in} (last in {rel[end]}); the installed SGLang is {installed}"
        if after:
            msg += f" (it returns in {rel[after[0][0]]})"
        return Explanation("removed", msg + text, repl, facts)
    added_in = rel[after[0][0]]
    facts["added_in"] = added_in
    msg = f"{flag} was added in SGLang {added_in}; the installed SGLang is {installed}"
    older = _older_spelling(flag, options, removed)
    if older:
        msg += f": upgrade SGLang, or use {older}, its spelling in {installed}"
        return Explanation("added_later", msg, older, facts)
    return Explanation("added_later", msg + ": upgrade SGLang or drop the flag", None, facts)


def _explain_vllm(flag: str, options: Mapping[str, Mapping[str, Any]]) -> Explanation | None:
    entry = vllm_equivalents().get(flag)
    if entry is None:
        return None
    note = f" ({entry['note']})" if entry.get("note") else ""
    for cand in entry.get("sglang") or []:
        if str(cand).split()[0] in options:
            return Explanation("vllm", f"{flag} is vLLM's flag; SGLang's is {cand}{note}", str(cand),
                               {"vllm": flag, "sglang": cand})
    return Explanation("vllm", f"{flag} is vLLM's flag; the installed SGLang has no equivalent{note}", None,
                       {"vllm": flag})


def _explain_fork(flag: str, history: FlagHistory) -> Explanation | None:
    package = history.fork_of(flag)
    recorded = f" ({package} {history.forks[package].get('version')} has it)" if package else ""
    for name, info in fork_prefixes().items():
        if any(flag.startswith(p) for p in info.get("prefixes") or ()):
            return Explanation("fork", f"{flag} belongs to {info.get('what', name)}{recorded}; upstream SGLang has "
                                       f"no such flag: {info.get('fix', 'drop the flag')}", None, {"fork": name})
    if package is not None:
        info = history.forks[package]
        return Explanation("fork", f"{flag} belongs to the SGLang fork {info.get('name', package)}{recorded}; "
                                   "upstream SGLang has no such flag", None, {"fork": package})
    return None


def _explain_typo(flag: str, options: Mapping[str, Mapping[str, Any]]) -> Explanation | None:
    names = [o for o in options if o.startswith("--")]
    close = difflib.get_close_matches(flag, names, n=3, cutoff=0.8)
    if not close:
        return None
    if len(close) == 1:
        return Explanation("typo", f"did you mean {close[0]}?", close[0], {"candidates": close})
    return Explanation("typo", f"did you mean one of {', '.join(close)}?", None, {"candidates": close})


def explain_unknown(flag: str, options: Mapping[str, Mapping[str, Any]], installed: str | None, *,
                    removed: Mapping[str, Mapping[str, Any]] | None = None,
                    history: FlagHistory | None = None) -> Explanation:
    """What ``flag``, absent from ``options`` (the installed release's flag table), is."""
    history = load_history() if history is None else history
    removed = {} if removed is None else removed
    head = f"unrecognized argument {flag}: the installed SGLang{' ' + installed if installed else ''} has no such flag"
    if flag.startswith("--") and "_" in flag:
        dashed = "--" + flag[2:].replace("_", "-")
        if dashed in options:
            return Explanation("underscore", f"{head}; SGLang spells it {dashed} (dashes, not underscores)", dashed,
                               {"spelled": dashed})
        found = _explain_history(dashed, history, installed, options, removed)
        if found is not None:
            found.message = f"{head}; {flag} is spelled {dashed}, and {found.message}"
            return found
    found = _explain_history(flag, history, installed, options, removed)
    vllm = _explain_vllm(flag, options)
    if found is not None:
        if found.kind != "removed" and flag not in removed:
            found.message = f"{head}; {found.message}"
        if vllm is not None and found.replacement is None:
            found.message += f" ({vllm.message})"
            found.replacement = vllm.replacement
        return found
    if flag in removed:  # in the removed table but not in the history (another fork's or patched flag)
        text, repl = _hint(flag, history, options, removed)
        when = removed[flag].get("removed_in")
        return Explanation("removed", f"{flag} was removed{' in SGLang ' + str(when) if when else ''}{text}", repl)
    for other in (vllm, _explain_fork(flag, history), _explain_typo(flag, options)):
        if other is not None:
            other.message = f"{head}; {other.message}"
            return other
    span = f", nor did any release from {history.releases[0]} to {history.releases[-1]}" if history.releases else ""
    return Explanation("unknown", head + span, None)


def explain_abbreviation(flag: str, target: str, installed: str | None, *,
                         history: FlagHistory | None = None) -> str | None:
    """When ``flag`` is only an abbreviation of ``target`` today but was a flag of its own in another
    release: say so (argparse silently gives it ``target``'s meaning)."""
    history = load_history() if history is None else history
    found = _explain_history(flag, history, installed, {}, {})
    if found is None or found.kind not in ("removed", "added_later"):
        return None
    return found.message
