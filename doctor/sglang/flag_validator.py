"""argparse's matching rules replayed on a server argv against a ``FlagTable``, and the one judgement of it.

``validate_args`` replays: exact option strings, ``--opt=value``, unique prefixes (``allow_abbrev``;
accepted by argparse, but fragile across releases), ambiguous prefixes (the "ambiguous option" error
0.5.20 gave to ``--cuda-graph-max-bs``), value arity and statically known choices. A rejected flag is
explained by ``doctor.sglang.flag_history`` (removed, with its replacement from
``doctor/data/sglang_removed_flags.toml``; added later; an underscore or a typo; a vLLM spelling; a fork's).
``doctor.sglang.flags.judge_flags`` turns its problems into the one verdict on an argv.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml
from doctor.core.result import Finding, Remediation, Severity
from doctor.sglang.flag_history import explain_abbreviation, explain_unknown
from doctor.sglang.flag_reader import FlagTable

REMOVED_FLAGS_FILE = Path(__file__).resolve().parents[1] / "data" / "sglang_removed_flags.toml"
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


# One finding on an argv, with the flag it is about (argparse's own subject): ``(flag, Finding)``. A ``fail``
# finding is what argparse would exit 2 on; its ``fix``, when there is one, names the replacement flag.
ArgFinding = tuple[str, Finding]


def on_flag(severity: str, kind: str, flag: str, message: str, replacement: str | None = None) -> ArgFinding:
    sev = Severity.FAIL if severity == "error" else Severity.WARN
    return flag, Finding(sev, f"sglang.flags.{kind}", message, Remediation(replacement) if replacement else None)


def replacement_of(item: ArgFinding) -> str | None:
    fix = item[1].fix
    return fix.text if fix else None


def as_dict(item: ArgFinding) -> dict[str, Any]:
    """One finding as the report's ``details.problems[]`` lists it (``severity`` in argparse's words)."""
    flag, f = item
    out = {"severity": "error" if f.severity is Severity.FAIL else "warning", "flag": flag, "message": f.message}
    if replacement_of(item):
        out["replacement"] = replacement_of(item)
    return out


def removed_flags(path: Path = REMOVED_FLAGS_FILE) -> dict[str, dict[str, Any]]:
    """The data table of flags SGLang removed: ``{"--flag": {"replacement": ..., "removed_in": ...}}``."""
    data = load_toml(path)
    return {str(k): dict(v) for k, v in (data.get("flags") or {}).items()}


def _looks_like_option(arg: str) -> bool:
    return arg.startswith("-") and len(arg) > 1 and not _NEGATIVE_NUMBER.match(arg)


def _arity_ok(nargs: Any, count: int) -> bool:
    if nargs == "?":
        return count <= 1
    if nargs == "*":
        return True
    if nargs == "+":
        return count >= 1
    if isinstance(nargs, int):
        return count == nargs
    return True


def validate_args(table: FlagTable, argv: list[str], removed: dict[str, dict[str, Any]] | None = None
                  ) -> list[ArgFinding]:
    """What argparse (``allow_abbrev=True``, as SGLang's parser) would say about ``argv``, and more.

    Errors: unknown option, ambiguous prefix, wrong number of values, a value outside strict
    choices, a non-number for an int/float flag, a required flag missing. Warnings: a deprecated
    spelling, a unique-prefix abbreviation (works today, breaks when a flag with that prefix is
    added), a value outside choices a plugin may extend.
    """
    removed = removed_flags() if removed is None else removed
    opts = table.options
    problems: list[ArgFinding] = []
    seen_dests: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            problems.append(on_flag("error", "positional", arg, "'--' ends the options, and SGLang's parser takes no "
                                    "positional arguments: argparse rejects it"))
            break
        if not _looks_like_option(arg):
            problems.append(on_flag("error", "positional", arg, f"unexpected positional argument {arg!r} "
                                                      "(SGLang's server takes only options)"))
            continue
        name, eq, inline = arg.partition("=")
        spec = opts.get(name)
        shown = name
        if spec is None:
            why = explain_unknown(name, opts, table.version, removed=removed)
        if spec is None and name.startswith("--"):
            matches = sorted(o for o in opts if o.startswith(name))
            if name in removed or (why.kind == "removed" and len(matches) > 1):
                msg = why.message
                if len(matches) > 1:
                    msg += f"; argparse fails with 'ambiguous option: {name} could match {', '.join(matches)}'"
                problems.append(on_flag("error", "removed", name, msg, why.replacement))
                i = _skip_values(argv, i, eq)
                continue
            if len(matches) == 1:
                spec = opts[matches[0]]
                then = explain_abbreviation(name, matches[0], table.version)
                problems.append(on_flag("warning", "abbreviation", name, f"{name} is accepted only as an abbreviation "
                                        f"of {matches[0]}; spell it out" + (f" ({then})" if then else ""),
                                        matches[0]))
                shown = matches[0]
            elif len(matches) > 1:
                problems.append(on_flag("error", "ambiguous", name, f"ambiguous option: {name} could match "
                                            f"{', '.join(matches)}"))
                i = _skip_values(argv, i, eq)
                continue
        if spec is None:
            problems.append(on_flag("error", "unknown", name, why.message, why.replacement))
            i = _skip_values(argv, i, eq)
            continue
        values: list[str] = []
        nargs = spec.get("nargs", 1)
        if eq:
            values = [inline]
            if nargs == 0:
                problems.append(on_flag("error", "no_value", shown, f"{shown} takes no value (got {arg!r})"))
                continue
        elif nargs != 0:
            limit = 1 if nargs in (1, "?") else (nargs if isinstance(nargs, int) else None)
            while i < len(argv) and not _looks_like_option(argv[i]) and argv[i] != "--" and (
                    limit is None or len(values) < limit):
                values.append(argv[i])
                i += 1
        want = 1 if nargs == 1 else nargs
        if not _arity_ok(want, len(values)):
            problems.append(on_flag("error", "nargs", shown,
                                    f"{shown} expects {_describe_nargs(want)}, got {len(values)}"))
            continue
        seen_dests.add(spec.get("dest", ""))
        if spec.get("deprecated") is not None:
            new = spec.get("deprecated") or None
            problems.append(on_flag("warning", "deprecated", shown, f"{shown} is deprecated"
                                        + (f"; use {new}" if new else ""), new))
        problems.extend(_check_values(shown, spec, values))
    for opt, spec in opts.items():
        if spec.get("required") and spec.get("dest") not in seen_dests and opt.startswith("--"):
            if not any(o for o, s in opts.items() if s.get("dest") == spec.get("dest") and o in argv):
                problems.append(on_flag("error", "required", opt, f"the required flag {opt} is missing"))
                seen_dests.add(spec.get("dest", ""))
    return problems


def _skip_values(argv: list[str], i: int, had_inline: str) -> int:
    if had_inline:
        return i
    while i < len(argv) and not _looks_like_option(argv[i]) and argv[i] != "--":
        i += 1
    return i


def _describe_nargs(nargs: Any) -> str:
    return {"?": "at most one value", "+": "one or more values", "*": "any number of values"}.get(
        nargs, f"{nargs} value{'s' if nargs != 1 else ''}")


def _check_values(flag: str, spec: dict[str, Any], values: list[str]) -> list[ArgFinding]:
    out: list[ArgFinding] = []
    type_name = spec.get("type")
    choices = spec.get("choices")
    for value in values:
        converted: Any = value
        if type_name in ("int", "float"):
            try:
                converted = int(value) if type_name == "int" else float(value)
            except ValueError:
                out.append(on_flag("error", "invalid_value", flag, f"{flag}: invalid {type_name} value {value!r}"))
                continue
        if choices is not None:
            as_str = [str(c) for c in choices]
            if converted not in choices and value not in as_str:
                shown = ", ".join(as_str[:12]) + (", ..." if len(as_str) > 12 else "")
                if spec.get("choices_strict", True):
                    out.append(on_flag("error", "invalid_choice", flag,
                                       f"{flag}: invalid choice {value!r} (choose from {shown})"))
                else:
                    out.append(on_flag("warning", "unknown_choice", flag, f"{flag}: {value!r} is not among the "
                                       f"built-in choices ({shown}); only a plugin registering it makes it valid"))
    return out
