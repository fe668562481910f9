"""The one judgement of a server argv: the flags the service's SGLang accepts (the ``sglang_flags`` fact)
against the argv the launcher builds. The ``sglang.flags`` check and ``k26-doctor launch`` both call
``judge_flags``; the fact comes from ``flags_fact`` (live) or a snapshot (replayed).
"""

from __future__ import annotations

from typing import Any

from doctor.core.proc import run_probe
from doctor.core.result import Findings, NotJudged, Remediation, Severity
from doctor.core.settings import ConfigError
from doctor.model.drafter import algorithm_of, arg_value
from doctor.sglang.flag_reader import FlagSourceError, FlagTable, read_flags
from doctor.sglang.flag_validator import ArgFinding, as_dict, replacement_of, validate_args

PROBE_TIMEOUT_S = 20.0
# Flags that only the DDTree patch set adds to SGLang: an unknown one means the patches are missing.
PATCH_FLAGS = ("--speculative-ddtree-",)
NO_DRAFT = "sglang.flags.no_draft_model"  # a drafting algorithm and no --speculative-draft-model-path


def locate_sglang(python: str, env: dict[str, str] | None = None, timeout: float = PROBE_TIMEOUT_S
                  ) -> dict[str, Any]:
    """Where ``python`` imports sglang from (probe ``site_packages``, nothing imported): ``found``,
    ``package_dir``, ``version``; ``probe_failed`` with ``error`` when the interpreter could not run it."""
    data, res = run_probe(python, "site_packages", ["sglang"], timeout=timeout, env=env)
    if data is None:
        return {"found": False, "probe_failed": True, "error": res.why(), "python": python}
    dirs = data.get("package_dirs") or []
    out = {"python": data.get("python"), "python_version": data.get("python_version"), "found": bool(dirs),
           "package_dir": dirs[0] if dirs else None, "origin": data.get("package_origin"),
           "version": data.get("version")}
    if data.get("spec_error"):
        out["error"] = data["spec_error"]
    elif not dirs and data.get("package_origin"):
        out["error"] = f"sglang resolves to {data['package_origin']}, not a package directory"
    return out


def flags_fact(python: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``sglang_flags`` fact: the flag table of the SGLang ``python`` would run, read from its sources."""
    where = locate_sglang(python, env)
    out: dict[str, Any] = {"python": python, "found": bool(where.get("found")), "version": where.get("version"),
                           "package_dir": where.get("package_dir")}
    if where.get("probe_failed"):
        out["probe_error"] = where.get("error")
        return out
    if not where.get("found"):
        out["error"] = where.get("error") or f"sglang is not importable from {python}"
        return out
    try:
        table = read_flags(where["package_dir"], where.get("version"))
    except FlagSourceError as exc:
        out["error"] = str(exc)
        return out
    except Exception as exc:  # sources shaped in a way this reader does not expect: say so, don't crash
        out["error"] = f"reading the flag definitions failed: {type(exc).__name__}: {exc}"
        return out
    out["table"] = table.to_dict()
    return out


def judge_flags(fact: dict[str, Any], args: list[str]) -> Findings:
    """The judgement of ``args`` given the ``sglang_flags`` fact (shared with ``k26-doctor launch``)."""
    if fact.get("probe_error"):
        raise NotJudged.failing(f"could not ask {fact.get('python')} where sglang is: {fact['probe_error']}")
    if not fact.get("found"):
        raise NotJudged.blocked(f"sglang is not importable from {fact.get('python')} (sglang.install judges that)",
                                "sglang.install")
    if "table" not in fact:
        raise NotJudged.failing(f"could not read SGLang's flags from {fact.get('package_dir')}: "
                                f"{fact.get('error', 'no flag table')}")
    try:
        table = FlagTable.from_dict(fact["table"])
    except FlagSourceError as exc:
        raise NotJudged.failing(f"recorded flag table is unusable: {exc}") from None
    problems = validate_args(table, args)
    version = table.version or "?"
    undrafted = draftless(args)
    errors = [p for p in problems if p[1].severity is Severity.FAIL]
    warnings = [p for p in problems if p[1].severity is Severity.WARN]
    out = Findings(sglang_version=version, package_dir=fact.get("package_dir"), style=table.style,
                   flags_known=len(table.options), args=args, problems=[as_dict(p) for p in problems])
    if undrafted:
        out.fail(NO_DRAFT, f"--speculative-algorithm {undrafted} without --speculative-draft-model-path: SGLang "
                 f"stops at argument resolution (\"{undrafted} speculative decoding requires setting "
                 "--speculative-draft-model-path\")",
                 Remediation("Give the drafter: --draft-model-path DIR (or [drafter] path = \"DIR\"), and set the "
                             "algorithm in [server] speculative_algorithm, so the launcher passes both."))
        if not errors:
            return out
    if errors:
        return out.fail("sglang.flags.rejected", f"{len(errors)} flag(s) SGLang {version} rejects: "
                        + "; ".join(f.message for _, f in errors[:3]) + (" ..." if len(errors) > 3 else ""),
                        rejected_remedy(errors))
    if warnings:
        return out.warn("sglang.flags.fragile", f"SGLang {version} accepts the command with {len(warnings)} "
                        "warning(s): " + "; ".join(f.message for _, f in warnings[:3]),
                        "Spell flags out and move off deprecated ones before an upgrade removes them.")
    return out.info("sglang.flags.accepted", f"all {sum(1 for a in args if a.startswith('-'))} flags accepted by "
                    f"SGLang {version} (read from {table.style} sources)")


def draftless(args: list[str]) -> str | None:
    """The algorithm of an argv that drafts with a separate draft model and names none, else None
    (``needs_draft_path`` of ``doctor/data/drafter_rules.toml``: NEXTN/EAGLE take the target's bundled MTP layer)."""
    algo, entry = algorithm_of(arg_value(args, "--speculative-algorithm"))
    if not algo or not entry.get("needs_draft_path"):
        return None
    given = arg_value(args, "--speculative-draft-model-path") or arg_value(args, "--speculative-draft-model")
    return None if given else algo


def judge_server_flags(fact: dict[str, Any], args: list[str], problem: ConfigError | None) -> Findings:
    """sglang.flags: the command ``k26-doctor launch`` would run (``problem``: why the settings cannot build it)."""
    if problem is not None:
        return Findings().fail("sglang.flags.no_command", f"the profile's server settings are invalid: {problem}",
                               "Fix the [server] table of the config.")
    return judge_flags(fact, args)


def rejected_remedy(errors: list[ArgFinding]) -> Remediation:
    commands = []
    text = "SGLang's parser would exit with status 2 after its slow imports. "
    replacements = [f"{flag} -> {replacement_of((flag, f))}" for flag, f in errors if replacement_of((flag, f))]
    if replacements:
        text += "Replace: " + "; ".join(replacements) + ". "
    if any(flag.startswith(PATCH_FLAGS) for flag, _ in errors):
        text += ("The DDTree flags come from the profile's SGLang patch set: apply it to this "
                 "interpreter's SGLang. ")
        commands.append("k26-doctor patches status")
        commands.append("k26-doctor patches apply")
    text += "Edit [server] args in the config (or the flags after --) accordingly."
    return Remediation(text, commands)
