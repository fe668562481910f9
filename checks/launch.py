"""Launch checks: the server command the profile builds is one the installed SGLang accepts."""

from __future__ import annotations

from typing import Any

from doctor.context import Context
from doctor.launcher import build_server_args
from doctor.registry import check
from doctor.result import Remediation, Result
from doctor.settings import ConfigError
from doctor.sglang_flags import FlagSourceError, FlagTable, validate_args

# Flags that only the DDTree patch set adds to SGLang: an unknown one means the patches are missing.
PATCH_FLAGS = ("--speculative-ddtree-",)


def judge_flags(fact: dict[str, Any], args: list[str]) -> Result:
    """The verdict on ``args`` given the ``sglang_flags`` fact (shared with ``k26-doctor launch``)."""
    if fact.get("probe_error"):
        return Result.errored(f"could not ask {fact.get('python')} where sglang is: {fact['probe_error']}")
    if not fact.get("found"):
        return Result.skipped(f"sglang is not importable from {fact.get('python')} (sglang.install judges that)")
    if "table" not in fact:
        return Result.errored(f"could not read SGLang's flags from {fact.get('package_dir')}: "
                              f"{fact.get('error', 'no flag table')}")
    try:
        table = FlagTable.from_dict(fact["table"])
    except FlagSourceError as exc:
        return Result.errored(f"recorded flag table is unusable: {exc}")
    problems = validate_args(table, args)
    version = table.version or "?"
    errors = [p for p in problems if p.severity == "error"]
    warnings = [p for p in problems if p.severity == "warning"]
    details = {"sglang_version": version, "package_dir": fact.get("package_dir"), "style": table.style,
               "flags_known": len(table.options), "args": args, "problems": [p.to_dict() for p in problems]}
    if errors:
        commands = []
        text = "SGLang's parser would exit with status 2 after its slow imports. "
        replacements = [f"{p.flag} -> {p.replacement}" for p in errors if p.replacement]
        if replacements:
            text += "Replace: " + "; ".join(replacements) + ". "
        if any(p.flag.startswith(PATCH_FLAGS) for p in errors):
            text += ("The DDTree flags come from the profile's SGLang patch set: apply it to this "
                     "interpreter's SGLang. ")
            commands.append("k26-doctor patches status")
            commands.append("k26-doctor patches apply")
        text += "Edit [server] args in the config (or the flags after --) accordingly."
        return Result.failed(f"{len(errors)} flag(s) SGLang {version} rejects: "
                             + "; ".join(p.message for p in errors[:3]) + (" ..." if len(errors) > 3 else ""),
                             Remediation(text, commands), **details)
    if warnings:
        return Result.warned(f"SGLang {version} accepts the command with {len(warnings)} warning(s): "
                             + "; ".join(p.message for p in warnings[:3]),
                             Remediation("Spell flags out and move off deprecated ones before an upgrade "
                                         "removes them."), **details)
    return Result.passed(f"all {sum(1 for a in args if a.startswith('-'))} flags accepted by SGLang {version} "
                         f"(read from {table.style} sources)", **details)


@check("sglang.flags", "Every server flag is one the installed SGLang accepts", needs=("sglang_flags",),
       tags=("sglang", "launch"))
def sglang_flags(ctx: Context) -> Result:
    """Reads the flags the service interpreter's SGLang accepts from its sources (the annotated
    fields of ``sglang/srt/arg_groups/fields/`` in 0.5.2x, ``add_argument`` calls in older releases;
    nothing is imported) and replays argparse on the command ``k26-doctor launch`` would run: the
    profile's flags, its ``[server] args``.

    Why: SGLang parses its flags only after seconds to minutes of imports, then exits with status 2:
    0.5.20 removed ``--cuda-graph-max-bs`` and argparse calls it an "ambiguous option"; a DDTree flag
    is "unrecognized" when the patch set is not applied. Under systemd that becomes a restart loop.
    Fix by hand: use the replacement flag named in the result (`k26-doctor launch --dry-run` shows the
    command), or apply the patch set (`k26-doctor patches apply`).
    """
    fact = ctx.fact("sglang_flags")
    try:
        args, _ = build_server_args(ctx.settings, placeholders=True)
    except ConfigError as exc:
        return Result.failed(f"the profile's server settings are invalid: {exc}",
                             "Fix the [server] table of the config.")
    return judge_flags(fact, args)
