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
        i, dest, found = _one_option(table, argv, i, arg, removed)
        problems.extend(found)
        if dest is not None:
            seen_dests.add(dest)
    problems.extend(_missing_required(table.options, argv, seen_dests))
    return problems


def _one_option(table: FlagTable, argv: list[str], i: int, arg: str, removed: dict[str, dict[str, Any]]
                ) -> tuple[int, str | None, list[ArgFinding]]:
    """One option (``argv[i - 1]``) and the values it takes, as argparse consumes them.

    Returns where the next option starts, the ``dest`` the option set (``None`` when argparse would reject it,
    so a missing required flag is still reported) and what is wrong with it.
    """
    name, eq, inline = arg.partition("=")
    spec, shown, note = _resolve_option(table, name, removed)
    found = [note] if note else []
    if spec is None:
        return _skip_values(argv, i, eq), None, found
    nargs = spec.get("nargs", 1)
    if eq and nargs == 0:
        return i, None, [*found, on_flag("error", "no_value", shown, f"{shown} takes no value (got {arg!r})")]
    values, i = ([inline], i) if eq else _take_values(argv, i, nargs)
    want = 1 if nargs == 1 else nargs
    if not _arity_ok(want, len(values)):
        return i, None, [*found, on_flag("error", "nargs", shown,
                                         f"{shown} expects {_describe_nargs(want)}, got {len(values)}")]
    return i, spec.get("dest", ""), found + _deprecation(shown, spec) + _check_values(shown, spec, values)


def _resolve_option(table: FlagTable, name: str, removed: dict[str, dict[str, Any]]
                    ) -> tuple[dict[str, Any] | None, str, ArgFinding | None]:
    """The option ``name`` stands for, as argparse's exact-then-unique-prefix matching finds it.

    Returns ``(spec, the flag's full spelling, a finding)``. ``spec`` is ``None`` when argparse rejects the
    name, and the finding says why (removed, ambiguous, unknown); a unique prefix resolves with a warning,
    since it breaks the day a flag with that prefix is added.
    """
    opts = table.options
    spec = opts.get(name)
    if spec is not None:
        return spec, name, None
    why = explain_unknown(name, opts, table.version, removed=removed)
    long_form = name.startswith("--")
    matches = sorted(o for o in opts if o.startswith(name)) if long_form else []
    if long_form and (name in removed or (why.kind == "removed" and len(matches) > 1)):
        msg = why.message
        if len(matches) > 1:
            msg += f"; argparse fails with 'ambiguous option: {name} could match {', '.join(matches)}'"
        return None, name, on_flag("error", "removed", name, msg, why.replacement)
    if len(matches) == 1:
        then = explain_abbreviation(name, matches[0], table.version)
        return opts[matches[0]], matches[0], on_flag(
            "warning", "abbreviation", name, f"{name} is accepted only as an abbreviation of {matches[0]}; "
            "spell it out" + (f" ({then})" if then else ""), matches[0])
    if len(matches) > 1:
        return None, name, on_flag("error", "ambiguous", name, f"ambiguous option: {name} could match "
                                   f"{', '.join(matches)}")
    return None, name, on_flag("error", "unknown", name, why.message, why.replacement)


def _take_values(argv: list[str], i: int, nargs: Any) -> tuple[list[str], int]:
    """The values after an option, as many as its ``nargs`` lets argparse take (up to the next option)."""
    limit = 1 if nargs in (1, "?") else (nargs if isinstance(nargs, int) else None)
    values: list[str] = []
    while i < len(argv) and not _looks_like_option(argv[i]) and argv[i] != "--" and (
            limit is None or len(values) < limit):
        values.append(argv[i])
        i += 1
    return values, i


def _deprecation(shown: str, spec: dict[str, Any]) -> list[ArgFinding]:
    """A warning for a flag SGLang marks deprecated, naming its replacement when the parser gives one."""
    if spec.get("deprecated") is None:
        return []
    new = spec.get("deprecated") or None
    return [on_flag("warning", "deprecated", shown, f"{shown} is deprecated" + (f"; use {new}" if new else ""), new)]


def _missing_required(opts: dict[str, dict[str, Any]], argv: list[str], seen_dests: set[str]) -> list[ArgFinding]:
    """Required flags no accepted option set: one error per ``dest`` (a flag's aliases share it)."""
    out: list[ArgFinding] = []
    seen = set(seen_dests)
    for opt, spec in opts.items():
        if spec.get("required") and spec.get("dest") not in seen and opt.startswith("--"):
            if not any(o for o, s in opts.items() if s.get("dest") == spec.get("dest") and o in argv):
                out.append(on_flag("error", "required", opt, f"the required flag {opt} is missing"))
                seen.add(spec.get("dest", ""))
    return out


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
