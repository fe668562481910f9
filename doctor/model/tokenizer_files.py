"""What the server's tokenizer loads, from the model directory (model.tokenizer): tokenizer_config.json, the
vocabulary, a chat template, the remote code auto_map names; then the load in the service's interpreter
(``doctor.model.tokenizer``). A missing tokenizer file fails the start after the weights loaded; a tokenizer that
loads with other special-token ids serves reasoning inside the answer and unparsed tool calls, with no error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from doctor.core.result import Finding, Findings, NotJudged, Remediation, Severity
from doctor.core.settings import Settings
from doctor.model.consistency import config_view
from doctor.model.modelconfig import json_data, json_object
from doctor.model.remote_code import named_module_problems
from doctor.model.tokenizer import judge_files, judge_load
from doctor.model.weights import TARGET, dir_problem, redownload_commands

DEFAULT_FIX = "Download the missing tokenizer files from the model's repository."
BROKEN = "model.tokenizer.broken"  # what the files say (a load failure keeps its own code)
# The modules auto_map names have codes of their own (their fixes differ): doctor.model.remote_code.MODULE_MISSING
# (model.tokenizer.module_missing, a download) and MODULE_OUTSIDE (model.tokenizer.module_outside, the config).


def auto_map_modules(auto_map: Any) -> list[str]:
    refs: list[str] = []
    if isinstance(auto_map, dict):
        for v in auto_map.values():
            for ref in (v if isinstance(v, list) else [v]):
                if isinstance(ref, str) and "." in ref:
                    refs.append(ref)
    return refs


class TokenizerFiles:
    """The files of the directory against what the tokenizer needs: problems, notes, and what it is."""

    def __init__(self, fact: dict[str, Any], trust_remote_code: Any) -> None:
        tok = fact.get("tokenizer") or {}
        self.files = tok.get("files") or {}
        self.problems = self._link_problems()  # failures, in the order said (``BROKEN`` unless a code of its own)
        self.notes: list[str] = []
        tc = tok.get("tokenizer_config") or {}
        data, problem = json_object(tc, "tokenizer_config.json")
        self._config_presence(tc, problem)
        self.cls = data.get("tokenizer_class") if isinstance(data.get("tokenizer_class"), str) else ""
        refs = auto_map_modules(data.get("auto_map"))
        cfg = json_data(fact.get("config"))
        self.remote = refs + (auto_map_modules(cfg.get("auto_map")) if isinstance(cfg, dict) else [])
        self.tiktoken = "tiktoken" in self.cls.lower() or any("tiktoken" in r.lower() or "tokenization_kimi" in r
                                                              for r in refs)
        self.vocabulary(data)
        self.chat_template(tc, data)
        self.remote_code(fact.get("remote_code") or {}, trust_remote_code)

    def _link_problems(self) -> Findings:
        """Files the loader would open and fail on: dangling symlinks (or loops) and files that are not regular."""
        return Findings([Finding(Severity.FAIL, BROKEN, m) for m in
                         [f"{n} is {'a symlink loop' if v.get('loop') else 'a dangling symlink'}"
                          for n, v in self.files.items() if isinstance(v, dict) and v.get("dangling")]
                         + [f"{n} is {v['kind']}, not a regular file" for n, v in self.files.items()
                            if isinstance(v, dict) and v.get("kind")]])

    def _config_presence(self, tc: dict[str, Any], problem: str | None) -> None:
        """tokenizer_config.json missing (a problem only without tokenizer.json, which is enough alone) or
        unreadable."""
        if not tc.get("present"):
            if "tokenizer.json" not in self.files:
                self.problems.fail(BROKEN, "tokenizer_config.json is missing (and there is no tokenizer.json)")
        elif problem:
            self.problems.fail(BROKEN, problem)

    def chat_template(self, tc: dict[str, Any], data: dict[str, Any]) -> None:
        """A chat template in tokenizer_config.json or a file of its own (without one, chat completions fail;
        not said where tokenizer_config.json gave nothing to judge)."""
        self.has_template = bool(tc.get("chat_template")) or any(n in self.files for n in ("chat_template.jinja",
                                                                                           "chat_template.json"))
        if not self.has_template and data:
            self.problems.fail(BROKEN, "no chat template (chat_template in tokenizer_config.json, chat_template.jinja "
                               "or chat_template.json): chat completions will fail")

    def remote_code(self, remote_fact: dict[str, Any], trust_remote_code: Any) -> None:
        """The remote code auto_map names: another repository's (network at start), modules missing or broken, and
        --trust-remote-code, which any of it needs."""
        self.notes += [f"auto_map {ref} loads code from another repository at start (needs network)"
                       for ref in self.remote if "--" in ref]
        modules = named_module_problems(remote_fact)
        self.problems += modules
        self.missing_mods = sorted(set(modules.details["download"]))
        self.needs_trc = bool(self.remote)
        if self.needs_trc and trust_remote_code is False:
            self.problems.fail(BROKEN, "auto_map means the server needs --trust-remote-code, but the profile sets "
                               "model.trust_remote_code = false")

    def vocabulary(self, data: dict[str, Any]) -> None:
        files = self.files
        if self.tiktoken:
            if "tiktoken.model" not in files:
                self.problems.fail(BROKEN, f"tokenizer {self.cls or 'TikToken'} needs tiktoken.model, which is "
                                   "missing")
        elif not any(n in files for n in ("tokenizer.json", "tokenizer.model", "vocab.json")) and data:
            self.problems.fail(BROKEN, "no vocabulary file (tokenizer.json, tokenizer.model, vocab.json or "
                               "tiktoken.model)")
        if "vocab.json" in files and "merges.txt" not in files and "tokenizer.json" not in files:
            self.problems.fail(BROKEN, "vocab.json without merges.txt (BPE needs both)")


def the_load(fact: dict[str, Any], tok: Any, settings: Settings) -> tuple[Findings, NotJudged | None]:
    """The tokenizer loaded in the service's interpreter (fact ``model.tokenizer``), judged with the files; and
    why the load could not be judged, if it could not."""
    load = Findings()
    if not isinstance(tok, dict) or not tok.get("given"):
        return load, NotJudged.missing("the tokenizer load was not collected (fact model.tokenizer)")
    view, _ = config_view(fact)
    repo = settings.model.repo
    load.extend(judge_files(tok, view.int_field("vocab_size") if view else None, repo, named_reported=True))
    try:
        judge_load(tok, view.model_type if view else None, repo, load)
    except NotJudged as exc:
        return load, exc
    return load, None


def judge_tokenizer(fact: dict[str, Any], read_tok: Callable[[], Any], args: list[str], settings: Settings
                    ) -> Findings:
    """``fact``: the ``model`` fact; ``read_tok()``: ``model.tokenizer`` or None, read once the files are judged;
    ``args``: the server command."""
    early = dir_problem(fact, TARGET, settings, cause="model.shards")
    if early is not None:
        return early
    if "--skip-tokenizer-init" in args:
        raise NotJudged.inapplicable("the server runs with --skip-tokenizer-init: it loads no tokenizer "
                                     "(requests carry input_ids)", server_flag="--skip-tokenizer-init")
    trc = settings.model.trust_remote_code
    seen = TokenizerFiles(fact, trc)
    load, unjudged = the_load(fact, read_tok(), settings)
    out = Findings(tokenizer_class=seen.cls or None, files=seen.files, auto_map=seen.remote,
                   trust_remote_code_required=seen.needs_trc, chat_template=seen.has_template, notes=seen.notes)
    out.details.update(load.details)
    out.details.setdefault("loaded_as", None)
    failing = load.of(Severity.FAIL)
    if seen.problems or failing:
        return tokenizer_failure(fact, seen, failing, settings, out)
    summary = (f"{seen.cls or 'tokenizer'}: " + ("tiktoken.model, " if seen.tiktoken else "") + "chat template present"
               + ("; needs --trust-remote-code" + (" (profile sets it)" if trc else "") if seen.needs_trc else ""))
    if unjudged is not None:
        raise NotJudged(unjudged.status, f"{summary}; {unjudged.summary}", unjudged=unjudged.unjudged,
                        **(out.details if unjudged.unjudged else {}))
    summary += (f"; loads as {out.details['loaded_as']} (transformers {load.details.get('transformers')}), "
                f"{len(load.details.get('markers_checked') or [])} special tokens round-trip, chat template renders")
    warnings = load.of(Severity.WARN)
    notes = out.details["notes"] = seen.notes + [f.message for f in warnings]  # the report lists them all
    if seen.needs_trc and trc is None:
        return out.warn("model.tokenizer.trust_remote_code", summary + "; the profile does not say whether "
                        "trust_remote_code is on", "Set [model] trust_remote_code = true and pass --trust-remote-code.")
    if notes:
        fix = next((f.fix for f in warnings if f.fix), None)
        return out.warn("model.tokenizer.note", f"{summary}; {notes[0]}", fix)
    return out.info("model.tokenizer.loads", summary)


def tokenizer_failure(fact: dict[str, Any], seen: TokenizerFiles, failing: list[Any], settings: Settings,
                      out: Findings) -> Findings:
    """Each problem a finding (the files' ``model.tokenizer.broken``, the auto_map modules' ``module_missing`` and
    ``module_outside``, the load's own codes), said in one line (the
    first, and how many more); the fix of the first load problem when the files are fine, with the commands of
    every load problem."""
    problems = [f.message for f in seen.problems + failing]
    commands = redownload_commands(settings, fact, seen.missing_mods, TARGET)
    fix = DEFAULT_FIX
    if failing and not seen.problems:
        fix = (failing[0].fix.text if failing[0].fix else "") or fix
    commands += [c for f in failing for c in (f.fix.commands if f.fix else []) if c not in commands]
    out.details["problems"] = problems
    for found in seen.problems:  # the files' problems (BROKEN, or the auto_map modules' own codes)
        out.fail(found.code, found.message)
    for found in failing:  # the load's own codes (model.tokenizer.load_fails, ...), for the fixers
        out.fail(found.code, found.message)
    return out.fold("tokenizer: ", Remediation(fix, commands))
