"""One child process for the DDTREE tests that import the patched 0.5.23 tree as a *bare* ``sglang`` package.

``python ddtree_bare_probe.py ROOT STUBBABLE``: ``ROOT`` is ``ddtree_support.patched_tree(whole=True)``;
``sglang`` is a bare module whose ``__path__`` is ``ROOT/sglang`` (the package's ``__init__`` -- the frontend
language, its HTTP client -- is not run), so ``sglang.srt.*`` import against the patched files and this
interpreter's torch/transformers/triton. Importing those costs 10-25 s per process; the probes below
share one (``ddtree_support.bare_package_probe``: once per patched tree and interpreter) and each reports
on its own:

* ``mask_policy`` (tests/test_ddtree_patchset.py): DFlash's verify-mask policy on the Triton backend;
* ``server_args`` (tests/test_ddtree_patchset.py): the ServerArgs parser and DDTREE's argument resolution;
* ``gate_argv`` (tests/test_ddtree_gate_check.py): the gate's configuration of each argv of ``GATE_ARGVS``, parsed
  by the ServerArgs parser (the doctor's sglang.ddtree must read the same from the same argv);
* ``site_argv`` (tests/test_ddtree_gate_check.py): the site record's argument keys of each argv of ``SITE_ARGVS``;
* ``admission`` (tests/test_ddtree_admission.py): DDTREE's admission refusals on SGLang's own ``Req``;
* ``worker_glue`` (tests/test_ddtree_worker_glue.py): the worker glue against SGLang's real modules.

They run in that order: the first four read the environment as a user's launch would (the opt-in variable
unset: the caller removes it), the glue probe then sets it and may stub ``setproctitle``/``aiohttp`` (only
those, only when absent), which the others must not see. A part that raises reports ``error`` (the
traceback) and, for a missing module, ``missing``; the others still run.

Prints one line: ``RESULT {"mask_policy": {...}, "server_args": {...}, "gate_argv": {...}, "admission": {...},
"worker_glue": {...}}``.
"""

import argparse
import ast
import importlib
import inspect
import json
import os
import re
import sys
import traceback
import types


class Missing(Exception):
    def __init__(self, name):
        super().__init__(name)
        self.name = name


def mask_policy():
    dflash_utils = importlib.import_module("sglang.srt.speculative.dflash_utils")
    triton_backend = importlib.import_module("sglang.srt.layers.attention.triton_backend")
    algo = importlib.import_module("sglang.srt.speculative.spec_info").SpeculativeAlgorithm
    backend = object.__new__(triton_backend.TritonAttnBackend)  # the policy reads the backend's type only
    policy = dflash_utils.resolve_dflash_verify_mask_policy
    return [policy(backend)[1], policy(backend, spec_algorithm=algo.DFLASH)[1],
            policy(backend, spec_algorithm=algo.DDTREE)[1]]


def server_args_part():
    server_args = importlib.import_module("sglang.srt.server_args")
    hook = importlib.import_module("sglang.srt.arg_groups.speculative_hook")
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    spec_info = importlib.import_module("sglang.srt.speculative.spec_info")
    out = {}
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "/m", "--speculative-algorithm", "DDTREE",
                            "--speculative-ddtree-budget", "64", "--speculative-draft-model-path", "/d",
                            "--speculative-dflash-block-size", "16"])
    out["parsed"] = [ns.speculative_algorithm, ns.speculative_ddtree_budget]
    algo = spec_info.SpeculativeAlgorithm.from_string("ddtree")
    out["algo"] = [algo.name, algo.is_ddtree(), algo.is_dflash(), algo.supports_grammar_overlap(),
                   spec_info.SpeculativeAlgorithm.DFLASH.is_ddtree()]
    out["target_width"] = algo.get_num_tokens_per_req_for_target_verify(65, False)
    sa = server_args.ServerArgs(model_path="/m", speculative_algorithm="DDTREE", speculative_ddtree_budget=64,
                                speculative_draft_model_path="/d", speculative_dflash_block_size=16, device="cuda",
                                attention_backend="triton")
    try:
        hook._handle_ddtree(sa)
        out["resolution"] = "completed"
    except NotImplementedError as e:
        out["resolution"] = "NotImplementedError: " + str(e)
    v = overrides.resolving_view(sa)
    out["resolved"] = [v.speculative_num_draft_tokens, v.speculative_dflash_block_size, v.speculative_eagle_topk,
                       v.speculative_num_steps]
    bad = server_args.ServerArgs(model_path="/m", speculative_algorithm="DDTREE",
                                 speculative_draft_model_path="/d", device="cuda")
    try:
        hook._handle_ddtree(bad)
    except ValueError as e:
        out["missing_budget"] = str(e)
    small = server_args.ServerArgs(model_path="/m", speculative_algorithm="DDTREE", speculative_ddtree_budget=8,
                                   speculative_draft_model_path="/d", speculative_dflash_block_size=16,
                                   device="cuda", attention_backend="triton")
    try:
        hook._handle_ddtree(small)
        out["small_budget"] = "accepted"
    except ValueError as e:
        out["small_budget"] = str(e)
    # what was not validated is refused at argument resolution, naming the flag
    refused = {}
    for name, extra in (("auto backend", {}), ("flashinfer", {"attention_backend": "flashinfer"}),
                        ("pp", {"attention_backend": "triton", "pp_size": 2}),
                        ("tbo", {"attention_backend": "triton", "enable_two_batch_overlap": True}),
                        ("pd", {"attention_backend": "triton", "disaggregation_mode": "decode"})):
        args = server_args.ServerArgs(model_path="/m", speculative_algorithm="DDTREE", speculative_ddtree_budget=64,
                                      speculative_draft_model_path="/d", speculative_dflash_block_size=16,
                                      device="cuda", **extra)
        try:
            hook._handle_ddtree(args)
            refused[name] = "accepted"
        except (ValueError, NotImplementedError) as e:
            refused[name] = f"{type(e).__name__}: {e}"
    # decode-context parallelism and deterministic inference (their kernels read the FULL_MASK layout or
    # raise on custom masks), and ROCm/HIP (split-KV verify ignores the mask): refused, naming the flag
    for name, extra in (("dcp", {"dcp_size": 2}), ("deterministic", {"enable_deterministic_inference": True})):
        args = server_args.ServerArgs(model_path="/m", speculative_algorithm="DDTREE", speculative_ddtree_budget=64,
                                      speculative_draft_model_path="/d", speculative_dflash_block_size=16,
                                      device="cuda", attention_backend="triton", **extra)
        try:
            hook._handle_ddtree(args)
            refused[name] = "accepted"
        except (ValueError, NotImplementedError, AssertionError) as e:
            refused[name] = f"{type(e).__name__}: {e}"
    # parallel modes the validation gate does not judge (expert parallelism, all-to-all MoE backends such as
    # DeepEP, attention and prefill context parallelism) and a SGLANG_SPEC_TP_SYNC that drops DFlash's
    # prefill / start-up broadcasts at TP > 1: refused, naming the flag or the setting
    for name, extra, env in (("ep", {"tp_size": 2, "ep_size": 2}, None),
                             ("deepep", {"tp_size": 2, "moe_a2a_backend": "deepep"}, None),
                             ("spec deepep", {"tp_size": 2, "speculative_moe_a2a_backend": "deepep"}, None),
                             ("attn cp", {"tp_size": 2, "attn_cp_size": 2}, None),
                             ("prefill cp", {"tp_size": 2, "enable_prefill_cp": True}, None),
                             ("tp sync off", {"tp_size": 2}, "off"),
                             ("tp sync init", {"tp_size": 2}, "init"),
                             ("tp sync no target", {"tp_size": 8}, "all,-dflash-target"),
                             ("tp sync rng", {"tp_size": 2}, "rng"),
                             ("tp sync off at tp 1", {}, "off")):
        saved = os.environ.get("SGLANG_SPEC_TP_SYNC")
        if env is not None:
            os.environ["SGLANG_SPEC_TP_SYNC"] = env
        try:
            args = server_args.ServerArgs(model_path="/m", speculative_algorithm="DDTREE",
                                          speculative_ddtree_budget=64, speculative_draft_model_path="/d",
                                          speculative_dflash_block_size=16, device="cuda",
                                          attention_backend="triton", **extra)
            hook._handle_ddtree(args)
            refused[name] = "accepted"
        except (ValueError, NotImplementedError, AssertionError) as e:
            refused[name] = f"{type(e).__name__}: {e}"
        finally:
            if saved is None:
                os.environ.pop("SGLANG_SPEC_TP_SYNC", None)
            else:
                os.environ["SGLANG_SPEC_TP_SYNC"] = saved
    utils = importlib.import_module("sglang.srt.utils")
    real_is_hip = utils.is_hip
    utils.is_hip = lambda: True
    try:
        args = server_args.ServerArgs(model_path="/m", speculative_algorithm="DDTREE", speculative_ddtree_budget=64,
                                      speculative_draft_model_path="/d", speculative_dflash_block_size=16,
                                      device="cuda", attention_backend="triton")
        hook._handle_ddtree(args)
        refused["hip"] = "accepted"
    except (ValueError, NotImplementedError) as e:
        refused["hip"] = f"{type(e).__name__}: {e}"
    finally:
        utils.is_hip = real_is_hip
    out["refused"] = refused
    # the site validation record: the configuration the resolution sees, recorded, opens the gate; a record of
    # another budget or torch, none named, keep it closed; the opt-in opens it whatever the records
    worker = importlib.import_module("sglang.srt.speculative.ddtree_worker")
    site = importlib.import_module("sglang.srt.speculative.ddtree_site")
    cfg = overrides.resolving_view(sa)
    here = worker.server_configuration(cfg)
    out["configuration"] = dict(here)
    running = site.running_configuration(cfg, here, [])
    running.pop("_uuids")
    host = {"machine_id": site.machine_id(), "hostname": __import__("socket").gethostname(), "gpu_uuids": []}
    folder = os.path.abspath("site-records")
    os.makedirs(folder, exist_ok=True)

    def record(name, **change):
        conf = dict(running, patch_set="ddtree-0.5.23", **change)
        body = {"kind": site.KIND, "schema_version": 1, "key": site.config_key(conf), "outcome": "pass",
                "configuration": conf, "host": host, "figures": {}, "date": "2026-12-02", "command": "validate"}
        body["integrity"] = site.integrity_of(body)
        path = os.path.join(folder, name + ".json")
        with open(path, "w") as fh:
            json.dump(body, fh)
        return path

    out["site_configuration"] = running
    gates = {}
    for name, env in (("recorded", {site.RECORD_ENV: record("recorded")}),
                      ("other_budget", {site.RECORD_ENV: record("other_budget", ddtree_budget=16)}),
                      ("other_torch", {site.RECORD_ENV: record("other_torch", torch="0.0.1")}),
                      ("none", {}),
                      ("opt_in", {worker.UNVALIDATED_WORKER_ENV: "1"})):
        saved = {k: os.environ.pop(k, None) for k in (site.RECORD_ENV, worker.UNVALIDATED_WORKER_ENV)}
        os.environ.update(env)
        fresh = server_args.ServerArgs(model_path="/m", speculative_algorithm="DDTREE", speculative_ddtree_budget=64,
                                       speculative_draft_model_path="/d", speculative_dflash_block_size=16,
                                       device="cuda", attention_backend="triton")
        try:
            hook._handle_ddtree(fresh)
            gates[name] = "completed"
        except NotImplementedError as e:
            gates[name] = "NotImplementedError: " + str(e)
        finally:
            for k in (site.RECORD_ENV, worker.UNVALIDATED_WORKER_ENV):
                os.environ.pop(k, None)
                if saved[k] is not None:
                    os.environ[k] = saved[k]
    out["gates"] = gates
    return out


# Server argvs whose gate configuration sglang.ddtree reads from the argv itself: the launcher's for the
# b300-tp8-ddtree profile, then what a [server] args or a site's flags can change in it (aliases, a unique
# prefix, --opt=value, a flag given twice: the last wins, each graph and overlap switch).
LAUNCHER_B300 = ["--model-path", "/models/Kimi-K2.6", "--tp-size", "8", "--trust-remote-code",
                 "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/models/Kimi-K2.6-DFlash",
                 "--speculative-ddtree-budget", "64", "--attention-backend", "triton", "--mem-fraction-static",
                 "0.85", "--host", "0.0.0.0", "--port", "30000", "--reasoning-parser", "kimi_k2",
                 "--tool-call-parser", "kimi_k2"]
GATE_ARGVS = {
    "launcher b300": LAUNCHER_B300,
    "tp 1 later": [*LAUNCHER_B300, "--tp-size", "1"],
    "tp alias": [*LAUNCHER_B300, "--tensor-parallel-size", "2"],
    "tp equals": [*LAUNCHER_B300, "--tp-size=4"],
    "no backend": ["--model-path", "/m", "--speculative-algorithm", "DDTREE"],
    "backend equals": [*LAUNCHER_B300, "--attention-backend=fa3"],
    "eager": [*LAUNCHER_B300, "--disable-cuda-graph"],
    "decode eager": [*LAUNCHER_B300, "--disable-decode-cuda-graph"],
    "no overlap": [*LAUNCHER_B300, "--disable-overlap-schedule"],
    "no overlap, prefix": [*LAUNCHER_B300, "--disable-overlap"],
    "eager, no overlap": [*LAUNCHER_B300, "--disable-cuda-graph", "--disable-overlap-schedule"],
    "prefill graphs off only": [*LAUNCHER_B300, "--disable-prefill-cuda-graph"],
}
ARGV_KEYS = ("tp_size", "attention_backend", "cuda_graph", "overlap_schedule")


def gate_argv():
    server_args = importlib.import_module("sglang.srt.server_args")
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    worker = importlib.import_module("sglang.srt.speculative.ddtree_worker")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    out = {}
    for name, argv in GATE_ARGVS.items():
        parsed = server_args.ServerArgs.from_cli_args(parser.parse_args(argv))
        config = worker.server_configuration(overrides.resolving_view(parsed))
        out[name] = {k: config[k] for k in ARGV_KEYS}
    return out


SITE_ARGVS = {
    "launcher b300": LAUNCHER_B300,
    "ep 8": [*LAUNCHER_B300, "--ep-size", "8"],
    "ep alias": [*LAUNCHER_B300, "--ep", "4"],
    "a2a deepep": [*LAUNCHER_B300, "--moe-a2a-backend", "deepep"],
    "attention cp": [*LAUNCHER_B300, "--attention-context-parallel-size", "2"],
    "prefill cp": [*LAUNCHER_B300, "--enable-prefill-cp"],
    "budget later": [*LAUNCHER_B300, "--speculative-ddtree-budget=16"],
}
SITE_ARG_KEYS = ("ep_size", "moe_a2a_backend", "attn_cp_size", "enable_prefill_cp", "ddtree_budget")


def site_argv():
    """The site record's argument keys of each argv of ``SITE_ARGVS`` as the patched server's ``ddtree_site``
    derives them from SGLang's parsed arguments (tests/test_ddtree_gate_check.py: the doctor reads the same)."""
    server_args = importlib.import_module("sglang.srt.server_args")
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    worker = importlib.import_module("sglang.srt.speculative.ddtree_worker")
    site = importlib.import_module("sglang.srt.speculative.ddtree_site")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    out = {}
    for name, argv in SITE_ARGVS.items():
        view = overrides.resolving_view(server_args.ServerArgs.from_cli_args(parser.parse_args(argv)))
        conf = site.running_configuration(view, worker.server_configuration(view), [])
        out[name] = {k: conf[k] for k in SITE_ARG_KEYS}
    return out


ADMISSION_CASES = {
    "plain": ({}, {}),
    "sampled": ({}, {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.0, "frequency_penalty": 0.0,
                     "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}),
    "logit_bias": ({}, {"logit_bias": {"5": 1.0}}),
    "return_logprob": ({"return_logprob": True}, {}),
    "return_sampling_mask": ({"return_sampling_mask": True}, {}),
    "return_routed_experts": ({"return_routed_experts": True}, {}),
    "return_indexer_topk": ({"return_indexer_topk": True}, {}),
    "return_hidden_states": ({"return_hidden_states": True}, {}),
    "custom_logit_processor": ({"custom_logit_processor": "serialized-processor"}, {}),
    "min_p": ({}, {"min_p": 0.05}),
    "frequency_penalty": ({}, {"frequency_penalty": 0.5}),
    "presence_penalty": ({}, {"presence_penalty": -0.5}),
    "repetition_penalty": ({}, {"repetition_penalty": 1.1}),
    "min_new_tokens": ({}, {"min_new_tokens": 3}),
    "regex": ({}, {"regex": "[a-z]+"}),
}


def admission():
    """ddtree_unsupported_request on SGLang's own ``Req`` and ``SamplingParams`` (the scheduler's objects,
    built as the tokenizer manager's request would make them)."""
    from array import array

    sb = importlib.import_module("sglang.srt.managers.schedule_batch")
    spm = importlib.import_module("sglang.srt.sampling.sampling_params")
    w = importlib.import_module("sglang.srt.speculative.ddtree_worker")
    out = {}
    for name, (flags, sampling) in ADMISSION_CASES.items():
        req = sb.Req("rid", "", array("q", [1, 2, 3]), spm.SamplingParams(**sampling), **flags)
        out[name] = w.ddtree_unsupported_request(req)
    return out


def worker_glue(stubbable):
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
                raise Missing(e.name) from None
            m = types.ModuleType(top)
            m.__path__ = []
            m.__getattr__ = lambda attr: type(attr, (), {})
            sys.modules[top] = m
            out["stubbed"].append(top)
            keep = "sglang.srt.speculative.ddtree_worker"
            for k in [k for k in sys.modules if k.startswith("sglang.srt.") and k != keep]:
                del sys.modules[k]
    out["mro"] = [c.__name__ for c in C.__mro__[:2]]
    base = C.__mro__[1]
    src = inspect.getsource(C)
    own = set(re.findall(r"self\.(\w+) = ", src)) | {n for n in vars(C)}
    used = set(re.findall(r"self\.(\w+)", src))
    out["missing_attrs"] = sorted(a for a in used - own if not hasattr(base, a)
                                  and not re.search(r"self\." + a + r"\b", inspect.getsource(base)))
    mod = sys.modules[C.__module__]
    from sglang.srt.managers.scheduler import GenerationBatchResult
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.kv_loc_plan import KVLocPlan
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
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
        "plan_commit": mod.plan_commit, "DraftTopK": mod.DraftTopK,
        "DraftTreeCapture": mod.DraftTreeCapture,
        "warm_verify_kernels": mod.warm_verify_kernels, "TreeBuildGraphs": mod.TreeBuildGraphs,
        "build": mod.TreeBuildGraphs.build, "phase": mod.RoundProfiler.phase,
        "gather_path_rows": mod.gather_path_rows,
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
    return out


def main():
    root, stubbable = sys.argv[1], sys.argv[2].split(",")
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [root + "/sglang"]
    sys.modules["sglang"] = pkg
    out = {}
    for name, part in (("mask_policy", mask_policy), ("server_args", server_args_part), ("gate_argv", gate_argv),
                       ("site_argv", site_argv), ("admission", admission),
                       ("worker_glue", lambda: worker_glue(stubbable))):
        try:
            out[name] = {"result": part()}
        except (ModuleNotFoundError, Missing) as e:
            out[name] = {"missing": e.name, "error": traceback.format_exc()}
        except Exception:
            out[name] = {"error": traceback.format_exc()}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
