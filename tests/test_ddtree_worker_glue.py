"""The DDTREE worker glue (ddtree_worker_v2.py) against SGLang 0.5.23's real modules, without a GPU.

What can be checked here: the opt-in gate (DDTREE stops at argument resolution unless
SGLANG_DDTREE_UNVALIDATED_WORKER=1), that the glue imports against the patched wheel's own modules and
subclasses DFlashWorkerV2, that every attribute it reads on ``self`` exists on DFlashWorkerV2, and that every
keyword argument it passes to SGLang's functions and dataclasses (ForwardBatch, GenerationBatchResult,
DFlashVerifyInput, the KV plan, the draft-KV append, ...) is in their real signatures. What cannot: running
it (needs CUDA, the models, a scheduler) -- see the patch set's README.

Runs under ``$K26_SGLANG_ARGS_PYTHON`` (an interpreter with SGLang's runtime dependencies and torch); only
``setproctitle`` and ``aiohttp`` -- imported by the scheduler module and the package for process titles and
the HTTP frontend, never called here -- may be absent and are then stubbed. Any other missing module skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from ddtree_support import patched_tree

STUBBABLE = ("setproctitle", "aiohttp")

_SCRIPT = textwrap.dedent(
    """
    import ast, importlib, inspect, json, os, re, sys, types
    root, stubbable = sys.argv[1], sys.argv[2].split(",")
    pkg = types.ModuleType("sglang"); pkg.__path__ = [root + "/sglang"]; sys.modules["sglang"] = pkg
    out = {"stubbed": []}
    w = importlib.import_module("sglang.srt.speculative.ddtree_worker")
    try:
        w.check_ddtree_worker_available()
        out["gate_default"] = "open"
    except NotImplementedError as e:
        out["gate_default"] = str(e)
    os.environ[w.UNVALIDATED_WORKER_ENV] = "1"
    for _ in range(10):
        try:
            C = w.get_ddtree_worker_cls()
            break
        except ModuleNotFoundError as e:
            top = e.name.split(".")[0]
            if top not in stubbable or top in out["stubbed"]:
                print("MISSING " + e.name); sys.exit(3)
            m = types.ModuleType(top); m.__path__ = []
            m.__getattr__ = lambda attr: type(attr, (), {})
            sys.modules[top] = m
            out["stubbed"].append(top)
            keep = "sglang.srt.speculative.ddtree_worker"
            for k in [k for k in sys.modules if k.startswith("sglang.srt.") and k != keep]:
                del sys.modules[k]
    out["mro"] = [c.__name__ for c in C.__mro__[:2]]
    base = C.__mro__[1]
    src = inspect.getsource(C)
    own = set(re.findall(r"self\\.(\\w+) = ", src)) | {n for n in vars(C)}
    used = set(re.findall(r"self\\.(\\w+)", src))
    out["missing_attrs"] = sorted(a for a in used - own if not hasattr(base, a)
                                  and not re.search(r"self\\." + a + r"\\b", inspect.getsource(base)))
    mod = sys.modules[C.__module__]
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.managers.scheduler import GenerationBatchResult
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.kv_loc_plan import KVLocPlan
    callees = {
        "ForwardBatch": ForwardBatch, "GenerationBatchResult": GenerationBatchResult,
        "DFlashVerifyInput": mod.DFlashVerifyInput, "plan": KVIndexTranslator.plan, "bind": KVLocPlan.bind,
        "write_ids": KVLocPlan.write_ids, "assign_extend_cache_locs_func": mod.assign_extend_cache_locs_func,
        "make_draft_input_v2": mod.make_draft_input_v2, "build_block_pos_offsets": mod.build_block_pos_offsets,
        "make_draft_block_spec_info": mod.make_draft_block_spec_info,
        "_append_target_hidden_to_draft_kv_by_loc": base._append_target_hidden_to_draft_kv_by_loc,
        "prepare_for_verify": mod.DFlashVerifyInput.prepare_for_verify,
        "forward_batch_generation": TpModelWorker.forward_batch_generation,
        "apply_dflash_verify_logits_adjustments": mod.apply_dflash_verify_logits_adjustments,
        "ddtree_accept": mod.ddtree_accept, "build_tree_verify": mod.build_tree_verify,
        "plan_commit": mod.plan_commit, "vocab_parallel_topk": mod.vocab_parallel_topk,
    }
    bad, checked = [], 0
    for node in ast.walk(ast.parse(inspect.getsource(mod))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name not in callees:
            continue
        if name == "forward_batch_generation" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call):
            callee = base.forward_batch_generation  # super().forward_batch_generation
        else:
            callee = callees[name]
        params = inspect.signature(callee).parameters
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            continue
        for kw in node.keywords:
            checked += 1
            if kw.arg is not None and kw.arg not in params:
                bad.append(f"{name}({kw.arg}=) line {node.lineno}")
    out["kwargs_checked"], out["unknown_kwargs"] = checked, bad
    print("RESULT " + json.dumps(out))
    """
)


def test_worker_glue_imports_and_matches_sglang_signatures(tmp_path):
    python = os.environ.get("K26_SGLANG_ARGS_PYTHON", sys.executable)
    root = patched_tree(whole=True)
    script = tmp_path / "glue_probe.py"
    script.write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_DDTREE_UNVALIDATED_WORKER"}
    proc = subprocess.run([python, str(script), str(root), ",".join(STUBBABLE)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)
    missing = [ln for ln in proc.stdout.splitlines() if ln.startswith("MISSING ")]
    if proc.returncode == 3 and missing:
        pytest.skip(f"{python} lacks {missing[0][8:]!r} (set K26_SGLANG_ARGS_PYTHON to an interpreter with "
                    "SGLang's runtime dependencies)")
    if proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr:
        pytest.skip(f"{python} cannot import SGLang's modules: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert out["gate_default"].startswith("DDTREE: this revision"), out["gate_default"]
    assert "SGLANG_DDTREE_UNVALIDATED_WORKER=1" in out["gate_default"]
    assert out["mro"] == ["DDTreeWorkerV2", "DFlashWorkerV2"]
    assert out["missing_attrs"] == [], out["missing_attrs"]
    assert out["kwargs_checked"] > 50 and out["unknown_kwargs"] == [], out
    assert set(out["stubbed"]) <= set(STUBBABLE)
