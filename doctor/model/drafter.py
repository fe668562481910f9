"""The draft model against the target and the server command: what SGLang checks only after the target
loaded (minutes into a start), or never, judged from the two configs and the argv.

* the draft path is the target's own directory (the server would load the target as its drafter);
* the drafter's ``architectures`` against ``--speculative-algorithm`` (an EAGLE3 drafter under DDTREE...),
  from SGLang 0.5.23's model registry (``doctor/data/drafter_rules.toml``);
* ``target_layer_ids`` against the width of the drafter's ``fc`` (one target hidden state per id);
* DDTREE: the drafter's block against ``--speculative-ddtree-budget`` (the patch set's resolution rule:
  block >= 2 and budget >= block - 1; its other bound, budget <= the distinct prefixes of block - 1
  positions over ``budget`` choices, always holds once block >= 2, since one position alone gives
  ``budget`` of them) and the target attention backend (only Triton applies the tree mask);
* the attention backend the DFlash draft will run on: SGLang gives it the target's when none is named,
  and replaces one it cannot run (an MLA-only backend of a Kimi target) with flashinfer, with only a
  log line.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml
from doctor.core.result import Finding, Findings, Remediation, Result, Severity, Status
from doctor.core.settings import Settings
from doctor.model.consistency import config_view
from doctor.model.modelconfig import is_pos_int, json_object
from doctor.model.weights import DRAFTER, dir_problem, judge_weights

RULES_FILE = Path(__file__).resolve().parents[1] / "data" / "drafter_rules.toml"
DFLASH_DEFAULT_BLOCK = 16  # SGLang 0.5.23 _handle_dflash: when neither the flags nor the config give one
_SHAPE = re.compile(r"\[(\d+),\s*(\d+)\]")


def rules(path: Path = RULES_FILE) -> dict[str, Any]:
    return load_toml(path)


def found(severity: str, code: str, message: str, fix: str = "") -> Finding:
    """One finding of the drafter against the target and the command (``severity``: fail or warn)."""
    return Finding(Severity(severity), f"model.drafter.{code}", message, Remediation(fix) if fix else None)


def arg_value(args: list[str], flag: str) -> str | None:
    """The last value given to ``flag`` in an argv (``--flag V`` or ``--flag=V``)."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == flag:
            found = value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return found


def algorithm_of(name: str | None) -> tuple[str | None, dict[str, Any]]:
    """The rules' entry for an algorithm name (aliases such as NEXTN -> EAGLE)."""
    if not name:
        return None, {}
    upper = name.upper()
    for algo, entry in rules().get("algorithms", {}).items():
        if upper == algo or upper in entry.get("aliases", []):
            return algo, entry
    return upper, {}


def same_directory(draft: dict[str, Any], target: dict[str, Any]) -> bool:
    a, b = draft.get("realpath") or draft.get("path"), target.get("realpath") or target.get("path")
    return bool(a) and a == b


def _fc_contexts(tensors: dict[str, Any] | None, hidden: int | None) -> int | None:
    """How many target hidden states the drafter's ``fc`` takes: its input width / hidden size."""
    fc = ((tensors or {}).get("patterns") or {}).get("fc.weight") or {}
    for shape in fc.get("shapes") or {}:
        m = _SHAPE.search(str(shape))
        if m and hidden and int(m.group(2)) % hidden == 0:
            return int(m.group(2)) // hidden
    return None


def judge_pairing(draft_cfg: dict[str, Any], *, target_archs: list[str], target_is_mla: bool,
                  target_hidden: int | None, draft_tensors: dict[str, Any] | None, algorithm: str | None,
                  server_args: list[str], budget: int | None) -> list[Finding]:
    """Everything about the drafter that depends on the target and the command; ``draft_cfg`` parsed."""
    algo, entry = algorithm_of(algorithm)
    archs = draft_cfg.get("architectures") if isinstance(draft_cfg.get("architectures"), list) else []
    dfl = draft_cfg.get("dflash_config") if isinstance(draft_cfg.get("dflash_config"), dict) else {}

    def get(key: str) -> Any:
        return dfl.get(key, draft_cfg.get(key))

    out = _kind_findings(draft_cfg, archs, target_archs, algorithm, algo, entry)
    out += _lm_head_findings(get("draft_vocab_size"), draft_tensors)
    ids = get("target_layer_ids")
    contexts = _fc_contexts(draft_tensors, target_hidden)
    if isinstance(ids, list) and ids and contexts is not None and contexts != len(ids):
        out.append(found("fail", "fc_width", f"the drafter's fc.weight takes {contexts} target hidden state(s) but "
                                        f"target_layer_ids lists {len(ids)}: config.json and the weights disagree",
                                "Re-download the drafter whole (config.json and weights of one revision)."))
    if algo in ("DFLASH", "DDTREE"):
        out += _block_findings(get("block_size"), server_args, algo, budget)
        out += _draft_backend_findings(server_args, target_is_mla)
        out += _target_backend_findings(entry.get("target_attention_backends"), server_args, algo)
    return out


def _kind_findings(draft_cfg: dict[str, Any], archs: list[Any], target_archs: list[str], algorithm: str | None,
                   algo: str | None, entry: dict[str, Any]) -> list[Finding]:
    """What kind of model the drafter is: a copy of the target, a drafter of another algorithm than the server
    runs (by its architectures, else by its config keys), or one SGLang does not run under this algorithm."""
    by_keys = named_by_keys(draft_cfg)
    copy = bool(archs and target_archs and set(archs) & set(target_archs))
    if copy and not (by_keys and algo and by_keys != algo):
        return [found("fail", "copy_of_target",
                      f"the drafter's architectures {archs} are the target's: --draft-model-path "
                      "points at a copy of the target model, not at a drafter",
                      "Point --draft-model-path ([drafter] path) at the drafter's own directory.")]
    if not (algo and entry and (archs or by_keys) and not set(archs) & set(entry.get("architectures", []))):
        return []
    other, named = _other_algorithm(draft_cfg, archs, algo, by_keys)
    if other:
        what = rules()["algorithms"][other].get("what", other)
        return [found("fail", "wrong_algorithm",
                      f"the drafter is {what} ({named}), but "
                      f"the server runs --speculative-algorithm {algorithm}, which needs {entry.get('what', algo)}",
                      f"Use the {algo} drafter trained for this target, or set [server] speculative_algorithm = "
                      f"{other} to run this one.")]
    return [found("warn", "unknown_architecture",
                  f"the drafter's architectures {archs} are none SGLang 0.5.23 runs under {algo} "
                  f"({', '.join(entry.get('architectures', []))})",
                  f"Use {entry.get('what', 'the drafter')} trained for this target.")]


def _other_algorithm(draft_cfg: dict[str, Any], archs: list[Any], algo: str, by_keys: str | None
                     ) -> tuple[str | None, str]:
    """(the algorithm the drafter is made for, if another: by its architectures, else by its config keys; how it
    is named in the message)."""
    other = next((name for name, e in rules().get("algorithms", {}).items()
                  if name != algo and set(archs) & set(e.get("architectures", []))), None)
    named = ", ".join(archs) or "no architectures"
    if other is None and by_keys and by_keys != algo:
        other = by_keys
        keys = [k for k in rules()["algorithms"][other].get("config_keys", []) if draft_cfg.get(k)]
        named = f"{named}; its config.json has {', '.join(keys)}"
    return other, named


def _target_backend_findings(wanted: list[str] | None, server_args: list[str], algo: str) -> list[Finding]:
    """The target's attention backend the algorithm verifies its tree on (``target_attention_backends``): another
    one is refused by the worker after the weights load."""
    if not wanted:
        return []
    backend = arg_value(server_args, "--decode-attention-backend") or arg_value(server_args, "--attention-backend")
    if backend in wanted:
        return []
    shown = f"--attention-backend {backend}" if backend else "no --attention-backend (SGLang picks one)"
    return [found("fail", "target_backend",
                  f"{algo} verifies its tree only on the {', '.join(wanted)} attention backend, the "
                  f"server has {shown}: the worker refuses it after the weights load",
                  "Set [server] attention_backend = \"triton\" (--attention-backend triton).")]


def named_by_keys(cfg: dict[str, Any]) -> str | None:
    """The algorithm a draft config is for by its keys (``config_keys`` of the rules: an EAGLE3 export's
    ``eagle_config``, an MTP layer's positive ``num_nextn_predict_layers``), for a draft whose architectures do
    not say it; None for a DFlash config (``dflash_config``) or one no key names."""
    if isinstance(cfg.get("dflash_config"), dict):
        return None
    for name, entry in rules().get("algorithms", {}).items():
        if any(cfg.get(k) not in (None, 0, False, "", [], {}) for k in entry.get("config_keys", [])):
            return name
    return None


def _lm_head_findings(draft_vocab: Any, tensors: dict[str, Any] | None) -> list[Finding]:
    """A config that declares a draft vocabulary (``draft_vocab_size``) needs the draft's own ``lm_head``: without
    it SGLang starts with the head uninitialised and accepts no drafted token. Judged on the shards' tensors."""
    patterns = (tensors or {}).get("patterns")
    if not is_pos_int(draft_vocab) or not isinstance(patterns, dict):
        return []
    head = patterns.get("lm_head.weight")
    if not isinstance(head, dict):
        return [found("fail", "no_lm_head",
                      f"config.json declares a draft vocabulary (draft_vocab_size {draft_vocab}) but the shards hold "
                      "no lm_head.weight: the server starts with an uninitialised head and accepts no drafted token",
                      "Re-download the drafter whole (its lm_head shard is missing), or use the drafter trained for "
                      "this target.")]
    rows = {int(m.group(1)) for shape in head.get("shapes") or {} for m in [_SHAPE.search(str(shape))] if m}
    if rows and draft_vocab not in rows:
        return [found("fail", "lm_head_rows",
                      f"the drafter's lm_head.weight has {sorted(rows)} rows, config.json's draft_vocab_size is "
                      f"{draft_vocab}: config.json and the weights disagree",
                      "Re-download the drafter whole (config.json and weights of one revision).")]
    return []


def _block_findings(config_block: Any, args: list[str], algo: str, budget: int | None) -> list[Finding]:
    out: list[Finding] = []
    flag_block = arg_value(args, "--speculative-dflash-block-size")
    try:
        block = int(flag_block) if flag_block is not None else (int(config_block) if type(config_block) is int
                                                                 else DFLASH_DEFAULT_BLOCK)
    except ValueError:
        return out  # sglang.flags names the non-integer
    where = ("--speculative-dflash-block-size" if flag_block is not None else
             "the drafter's block_size" if type(config_block) is int else f"SGLang's default block {block}")
    num_draft = arg_value(args, "--speculative-num-draft-tokens")
    if algo == "DFLASH" and num_draft is not None and num_draft.isdigit() and int(num_draft) != block:
        out.append(found("fail", "num_draft_tokens",
                         f"--speculative-num-draft-tokens {num_draft} differs from the DFlash block "
                                        f"{block} ({where}): SGLang refuses the pair",
                                "Drop --speculative-num-draft-tokens (DFLASH takes the block from the drafter)."))
    if algo != "DDTREE":
        return out
    flag_budget = arg_value(args, "--speculative-ddtree-budget")
    if flag_budget is not None and flag_budget.isdigit():
        budget = int(flag_budget)
    if budget is None:
        out.append(found("fail", "no_budget", "DDTREE needs --speculative-ddtree-budget N and the profile gives none",
                                "Set [server] ddtree_budget (e.g. 64)."))
        return out
    if block < 2:
        out.append(found("fail", "small_block", f"DDTREE needs a DFlash block of at least 2; {where} is {block}",
                                "Use a DFlash drafter with a block of 2 or more."))
    elif budget + 1 < block:
        out.append(found("fail", "budget_below_block",
                         f"--speculative-ddtree-budget {budget} is below the DFlash block minus one "
                                        f"({block - 1}, {where}): the per-step KV reservation would not cover the "
                                        "draft block; SGLang stops at argument resolution",
                                f"Set [server] ddtree_budget to at least {block - 1}."))
    return out


def _draft_backend_findings(args: list[str], target_is_mla: bool) -> list[Finding]:
    table = rules().get("draft_attention", {})
    allowed = table.get("backends", [])
    named = arg_value(args, "--speculative-draft-attention-backend")
    inherited = arg_value(args, "--prefill-attention-backend") or arg_value(args, "--attention-backend")
    backend = named or inherited
    if backend is None or backend in allowed:
        return []
    source = "--speculative-draft-attention-backend" if named else "the target's attention backend"
    mla = backend in table.get("mla_only", [])
    why = (f"{backend} runs only MLA attention (the {'target is MLA, ' if target_is_mla else ''}DFlash drafter is a "
           "GQA model)" if mla else f"{backend} is not one a DFlash draft runs on ({', '.join(allowed)})")
    return [found("warn", "draft_backend",
                  f"the DFlash draft would run on {backend} ({source}): {why}; SGLang silently "
                                 f"replaces it with {table.get('cuda_fallback', 'flashinfer')}",
                         "Name the draft backend: --speculative-draft-attention-backend triton (or fa3/flashinfer) "
                         "in [server] args.")]


# -- model.drafter: the draft model judged whole -------------------------------------------------------------

NO_DRAFT_ARG = "model.drafter.no_path"  # the argv drafts (its [server] args) and no draft model is given
IS_TARGET = "model.drafter.is_target"  # the drafter's path is the target's: model.redownload downloads nothing
MISMATCH = "model.drafter.mismatch"  # the drafter's config.json, or the drafter against the target


def config_problems(d: dict[str, Any], tview: Any, want_archs: Any, out: Findings) -> Findings:
    """The drafter's config.json on its own and against the target's (``tview``: its ConfigView, or None), each
    problem a ``MISMATCH`` failure (what was read goes into ``out``'s details)."""
    problems = Findings()
    dfl = d.get("dflash_config") if isinstance(d.get("dflash_config"), dict) else {}

    def get(key: str) -> Any:
        return dfl.get(key, d.get(key))

    archs = d.get("architectures")
    if want_archs and (not isinstance(archs, list) or not set(want_archs) & set(archs)):
        problems.fail(MISMATCH, f"architectures {archs!r} are not the profile's {want_archs}")
    bs = get("block_size")
    if bs is not None and not is_pos_int(bs):
        problems.fail(MISMATCH, f"block_size is {bs!r}; it must be an integer >= 1")
    nl = d.get("num_hidden_layers")
    if nl is not None and not is_pos_int(nl):
        problems.fail(MISMATCH, f"num_hidden_layers is {nl!r}, not a positive integer")
    t_hidden = tview.int_field("hidden_size") if tview else None
    t_vocab = tview.int_field("vocab_size") if tview else None
    ids = get("target_layer_ids")
    problems += layer_id_problems(ids, tview.int_field("num_hidden_layers") if tview else None)
    vocab = d.get("vocab_size")
    mtid = get("mask_token_id")
    problems += mask_token_problems(mtid, t_vocab or (vocab if is_pos_int(vocab) else None))
    hs = d.get("hidden_size")
    if t_hidden and hs != t_hidden:
        problems.fail(MISMATCH, f"hidden_size is {hs!r}, the target's is {t_hidden}")
    if t_vocab and vocab is not None and vocab != t_vocab:
        problems.fail(MISMATCH, f"vocab_size is {vocab!r}, the target's is {t_vocab}")
    out.details.update(block_size=bs, target_layer_ids=ids, mask_token_id=mtid, hidden_size=hs, vocab_size=vocab,
                       target_checked=tview is not None)
    return problems


def layer_id_problems(ids: Any, t_layers: int | None) -> Findings:
    """``target_layer_ids``: a non-empty list of integers, each a layer of the target (``t_layers``, when known),
    else a ``MISMATCH`` failure. A drafter built for a deeper target fails at its first draft step, and the error
    does not say why."""
    out = Findings()
    if ids is None:
        return out
    if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
        return out.fail(MISMATCH, f"target_layer_ids is {ids!r}, not a non-empty list of integers")
    outside = [i for i in ids if i < 0 or i >= t_layers] if t_layers else []
    if not outside:
        return out
    deeper = (f": the drafter was built for a target of at least {max(ids) + 1} layers (the first "
              "draft step fails with \"mat1 and mat2 shapes cannot be multiplied\")"
              if max(ids) >= t_layers else "")
    return out.fail(MISMATCH, f"target_layer_ids {outside} are outside the target's {t_layers} layers "
                    f"(0..{t_layers - 1}){deeper}")


def mask_token_problems(mtid: Any, limit: int | None) -> Findings:
    """``mask_token_id``: a non-negative integer inside the vocabulary (``limit``: the target's, else the
    drafter's own, when known), else a ``MISMATCH`` failure."""
    out = Findings()
    if mtid is None:
        return out
    if type(mtid) is not int or mtid < 0:
        return out.fail(MISMATCH, f"mask_token_id is {mtid!r}, not a non-negative integer")
    if limit and mtid >= limit:
        return out.fail(MISMATCH, f"mask_token_id {mtid} is outside the vocabulary ({limit} tokens)")
    return out


def same_as_target(fact: dict[str, Any], settings: Settings) -> Findings:
    repo = settings.drafter.repo or "<drafter repo>"
    return Findings(path=fact.get("path"), realpath=fact.get("realpath")).fail(
        IS_TARGET, f"the draft model path {fact.get('path')} is the target model's directory: the "
        "server would load the target itself as its drafter",
        Remediation("Point --draft-model-path ([drafter] path) at the drafter's own directory; download it if it is "
                    "not there:", [shlex.join(["hf", "download", str(repo), "--local-dir", "<drafter dir>"])]))


def judge_drafter(fact: dict[str, Any], read_target: Callable[[], Any], args: list[str], settings: Settings,
                  selected: frozenset[str]) -> Findings:
    """``fact``: the ``drafter`` fact; ``read_target()``: the ``model`` fact or None, read once the drafter's directory
    is usable; ``args``: the server command."""
    missing = _draft_not_given(fact, args, settings)
    if missing is not None:
        return missing
    early = dir_problem(fact, DRAFTER, settings)
    if early is not None:
        return early
    target = read_target() or {}
    if same_directory(fact, target):
        return same_as_target(fact, settings)
    weights = Result.of(judge_weights(fact, DRAFTER, settings, selected))
    d, problem = json_object(fact.get("config"), "config.json")
    tview = config_view(target)[0] if target.get("given") and not target.get("error") else None
    out = Findings(path=fact.get("path"), weights=weights.details)
    problems, pairing = _config_and_pairing(d, problem, tview, fact, args, settings, out)
    fails = [f for f in pairing if f.severity is Severity.FAIL]
    warns = [f for f in pairing if f.severity is Severity.WARN]
    out.details.update(problems=[f.message for f in problems], warnings=[f.message for f in warns],
                       problem_codes=[f.code for f in fails])
    if problems or weights.status.failed:
        return drafter_failure(problems, weights, fails, out)
    if warns:
        return pairing_warnings(warns, out)
    return _drafter_sound(d, weights, tview, out)


def _draft_not_given(fact: dict[str, Any], args: list[str], settings: Settings) -> Findings | None:
    """The server command asks for speculative decoding in ``[server] args`` with no draft model given: the
    server would refuse to start (None where that is not so, or where the profile names the algorithm: then the
    missing drafter is the directory's verdict)."""
    spec_arg = arg_value(args, "--speculative-algorithm")
    if fact.get("given") or not spec_arg or settings.server.speculative_algorithm:
        return None
    return Findings(algorithm=spec_arg).fail(
        NO_DRAFT_ARG, f"the server command runs --speculative-algorithm {spec_arg} (in [server] args) but no "
        "draft model is given", Remediation("Give --draft-model-path DIR (or [drafter] path) and set [server] "
                                             f"speculative_algorithm = \"{spec_arg}\" instead of passing it in "
                                             "[server] args."))


def _config_and_pairing(d: dict[str, Any] | None, problem: str | None, tview: Any, fact: dict[str, Any],
                        args: list[str], settings: Settings, out: Findings) -> tuple[Findings, list[Finding]]:
    """The drafter's failures (config.json unreadable, or against the target: ``MISMATCH``) with the pairing's
    failures last, each with its rule's code (``drafter_failure`` counts them from the end), and the pairing's
    findings; no pairing without a config."""
    problems = Findings().fail(MISMATCH, problem) if problem else Findings()
    if not d:
        return problems, []
    problems += config_problems(d, tview, settings.drafter.architectures, out)
    pairing = pairing_of(d, tview, fact, args, settings)
    problems += [f for f in pairing if f.severity is Severity.FAIL]
    return problems, pairing


def _drafter_sound(d: dict[str, Any], weights: Result, tview: Any, out: Findings) -> Findings:
    """The verdict of a drafter whose config and pairing are sound: its weights' warning where they have one, a
    warning where the target's config could not be read (nothing was compared), else consistent."""
    name = ", ".join(d.get("architectures") or ["drafter"])
    if weights.status is Status.WARN:
        return out.warn("model.drafter.weights", f"{name}: {weights.summary}", weights.remediation)
    summ = weights.summary.split(":")[0]
    if weights.details.get("sparse_judged_by"):
        summ += f" ({len(weights.details['sparse_shards'])} sparse, hashed by {weights.details['sparse_judged_by']})"
    if tview is None:
        return out.warn("model.drafter.unpaired", f"{name}: {summ}, config consistent with the target (target config "
                        "unavailable: consistency not checked)")
    return out.info("model.drafter.consistent", f"{name}: {summ}, config consistent with the target")


def pairing_warnings(warns: list[Finding], out: Findings) -> Findings:
    """The pairing's warnings, each with its rule's code, said in one line (the first, and how many more) with the
    first one's fix."""
    for found in warns:
        out.warn(found.code, found.message)
    return out.fold("drafter: ", warns[0].fix or Remediation(""))


def drafter_failure(problems: Findings, weights: Result, fixes: list[Finding], out: Findings) -> Findings:
    """Each problem a finding with its code (config.json's ``model.drafter.mismatch``, the pairing rules' own codes,
    the weights' damage last), said in one line (the first problem, the weights' when the config is fine, and how
    many more) with one fix: the weights' when they failed, else the pairing's when every problem is one, else the
    drafter trained for this target. ``fixes``: the pairing's failures, the last of ``problems``."""
    rem = weights.remediation or (Remediation((fixes[0].fix or Remediation()).text,
                                              [c for f in fixes for c in (f.fix.commands if f.fix else [])])
                                  if fixes and len(fixes) == len(problems) else
                                  Remediation("Use the DFlash drafter trained for this target model."))
    for found in problems:  # the one remediation above is the fold's: a pairing rule's own fix is not repeated
        out.fail(found.code, found.message)
    # Damaged weights keep their code (the re-download fixer acts on it), whatever else is wrong.
    damaged = [f.code for f in weights.findings if f.severity is Severity.FAIL and weights.status.failed]
    if weights.status.failed:
        out.fail(DRAFTER.damaged if DRAFTER.damaged in damaged else damaged[0] if damaged else MISMATCH,
                 weights.summary)
    return out.fold("drafter: ", rem)


def pairing_of(draft: dict[str, Any], tview: Any, fact: dict[str, Any], args: list[str],
               settings: Settings) -> list[Finding]:
    """The drafter against the target's config and the server command (``judge_pairing``)."""
    budget = settings.server.ddtree_budget
    return judge_pairing(draft, target_archs=tview.architectures if tview else [],
                         target_is_mla=bool(tview and tview.int_field("kv_lora_rank")),
                         target_hidden=tview.int_field("hidden_size") if tview else None,
                         draft_tensors=fact.get("tensors"), algorithm=settings.server.speculative_algorithm,
                         server_args=args, budget=budget if type(budget) is int else None)
