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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml

RULES_FILE = Path(__file__).resolve().parents[1] / "data" / "drafter_rules.toml"
DFLASH_DEFAULT_BLOCK = 16  # SGLang 0.5.23 _handle_dflash: when neither the flags nor the config give one
_SHAPE = re.compile(r"\[(\d+),\s*(\d+)\]")


def rules(path: Path = RULES_FILE) -> dict[str, Any]:
    return load_toml(path)


@dataclass
class DraftFinding:
    """``severity``: fail or warn; ``fix``: what to do, ``commands``: exactly."""

    severity: str
    message: str
    fix: str = ""
    commands: list[str] = field(default_factory=list)


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
                  server_args: list[str], budget: int | None) -> list[DraftFinding]:
    """Everything about the drafter that depends on the target and the command; ``draft_cfg`` parsed."""
    out: list[DraftFinding] = []
    algo, entry = algorithm_of(algorithm)
    archs = draft_cfg.get("architectures") if isinstance(draft_cfg.get("architectures"), list) else []
    dfl = draft_cfg.get("dflash_config") if isinstance(draft_cfg.get("dflash_config"), dict) else {}

    def get(key: str) -> Any:
        return dfl.get(key, draft_cfg.get(key))

    if archs and target_archs and set(archs) & set(target_archs):
        out.append(DraftFinding("fail", f"the drafter's architectures {archs} are the target's: --draft-model-path "
                                        "points at a copy of the target model, not at a drafter",
                                "Point --draft-model-path ([drafter] path) at the drafter's own directory."))
    elif algo and entry and archs and not set(archs) & set(entry.get("architectures", [])):
        other = next((name for name, e in rules().get("algorithms", {}).items()
                      if name != algo and set(archs) & set(e.get("architectures", []))), None)
        if other:
            out.append(DraftFinding(
                "fail", f"the drafter is {rules()['algorithms'][other].get('what', other)} ({', '.join(archs)}), but "
                        f"the server runs --speculative-algorithm {algorithm}, which needs {entry.get('what', algo)}",
                f"Use the {algo} drafter trained for this target, or set [server] speculative_algorithm = {other} "
                "to run this one."))
        else:
            out.append(DraftFinding(
                "warn", f"the drafter's architectures {archs} are none SGLang 0.5.23 runs under {algo} "
                        f"({', '.join(entry.get('architectures', []))})",
                f"Use {entry.get('what', 'the drafter')} trained for this target."))
    ids = get("target_layer_ids")
    contexts = _fc_contexts(draft_tensors, target_hidden)
    if isinstance(ids, list) and ids and contexts is not None and contexts != len(ids):
        out.append(DraftFinding("fail", f"the drafter's fc.weight takes {contexts} target hidden state(s) but "
                                        f"target_layer_ids lists {len(ids)}: config.json and the weights disagree",
                                "Re-download the drafter whole (config.json and weights of one revision)."))
    if algo in ("DFLASH", "DDTREE"):
        out += _block_findings(get("block_size"), server_args, algo, budget)
        out += _draft_backend_findings(server_args, target_is_mla)
        wanted = entry.get("target_attention_backends")
        if wanted:
            backend = arg_value(server_args, "--decode-attention-backend") or arg_value(server_args,
                                                                                        "--attention-backend")
            if backend not in wanted:
                shown = f"--attention-backend {backend}" if backend else "no --attention-backend (SGLang picks one)"
                out.append(DraftFinding(
                    "fail", f"{algo} verifies its tree only on the {', '.join(wanted)} attention backend, the "
                            f"server has {shown}: the worker refuses it after the weights load",
                    "Set [server] attention_backend = \"triton\" (--attention-backend triton)."))
    return out


def _block_findings(config_block: Any, args: list[str], algo: str, budget: int | None) -> list[DraftFinding]:
    out: list[DraftFinding] = []
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
        out.append(DraftFinding("fail", f"--speculative-num-draft-tokens {num_draft} differs from the DFlash block "
                                        f"{block} ({where}): SGLang refuses the pair",
                                "Drop --speculative-num-draft-tokens (DFLASH takes the block from the drafter)."))
    if algo != "DDTREE":
        return out
    flag_budget = arg_value(args, "--speculative-ddtree-budget")
    if flag_budget is not None and flag_budget.isdigit():
        budget = int(flag_budget)
    if budget is None:
        out.append(DraftFinding("fail", "DDTREE needs --speculative-ddtree-budget N and the profile gives none",
                                "Set [server] ddtree_budget (e.g. 64)."))
        return out
    if block < 2:
        out.append(DraftFinding("fail", f"DDTREE needs a DFlash block of at least 2; {where} is {block}",
                                "Use a DFlash drafter with a block of 2 or more."))
    elif budget + 1 < block:
        out.append(DraftFinding("fail", f"--speculative-ddtree-budget {budget} is below the DFlash block minus one "
                                        f"({block - 1}, {where}): the per-step KV reservation would not cover the "
                                        "draft block; SGLang stops at argument resolution",
                                f"Set [server] ddtree_budget to at least {block - 1}."))
    return out


def _draft_backend_findings(args: list[str], target_is_mla: bool) -> list[DraftFinding]:
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
    return [DraftFinding("warn", f"the DFlash draft would run on {backend} ({source}): {why}; SGLang silently "
                                 f"replaces it with {table.get('cuda_fallback', 'flashinfer')}",
                         "Name the draft backend: --speculative-draft-attention-backend triton (or fa3/flashinfer) "
                         "in [server] args.")]
