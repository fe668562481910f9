"""The ddtree-0.5.23 patch set: manifest, strict application to the pristine wheel, compilation, revert to
RECORD, and the launch flags through SGLang 0.5.23's own argument code."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import zipfile
from pathlib import Path

import ci_requirements
import pytest
from ddtree_support import SET_DIR, bare_part, bare_sglang, patched_tree, patchset_tool, pristine_tree, require_wheel

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def manifest() -> dict:
    return json.loads((SET_DIR / "manifest.json").read_text())


def test_manifest_shape():
    m = manifest()
    assert m["name"] == "ddtree-0.5.23" == SET_DIR.name
    assert m["sglang"] == "==0.5.23"
    assert m["description"]
    ids = [p["id"] for p in m["patches"]]
    assert len(ids) == len(set(ids)) and ids == sorted(ids)
    for p in m["patches"]:
        assert p["description"] and (SET_DIR / p["diff"]).is_file()
        assert p["files"], p["id"]
        for f in p["files"]:
            assert f["path"].startswith("sglang/") and not f["path"].startswith("/")
            assert f["before"] is None or HEX64.match(f["before"])
            assert HEX64.match(f["after"])
    paths = [f["path"] for p in m["patches"] for f in p["files"]]
    assert "sglang/srt/speculative/ddtree_utils.py" in paths


@pytest.mark.network
def test_before_hashes_are_the_wheels_record():
    tool = patchset_tool()
    record = tool.record_hashes(require_wheel())
    after: dict = {}  # a file an earlier patch touched: its before is that patch's after (0005 after 0002)
    for p in manifest()["patches"]:
        for f in p["files"]:
            if f["path"] in after:
                assert f["before"] == after[f["path"]], (p["id"], f["path"])
            elif f["before"] is None:
                assert f["path"] not in record, "a created file must not exist in the wheel"
            else:
                assert f["before"] == record[f["path"]]
            after[f["path"]] = f["after"]


@pytest.mark.network
def test_applies_strictly_compiles_and_reverts_to_record(tmp_path):
    problems = patchset_tool().verify(SET_DIR, require_wheel(), workdir=tmp_path)
    assert problems == []


@pytest.mark.network
def test_manifest_hashes_are_regenerated_identically(tmp_path):
    copy = tmp_path / SET_DIR.name
    shutil.copytree(SET_DIR, copy)
    assert patchset_tool().cmd_hash(copy, require_wheel()) == 0
    assert json.loads((copy / "manifest.json").read_text()) == manifest()


@pytest.mark.network
def test_verify_catches_a_drifted_diff_and_a_wrong_hash(tmp_path):
    tool = patchset_tool()
    wheel = require_wheel()
    bad = tmp_path / "drift"
    shutil.copytree(SET_DIR, bad)
    diff = bad / "0003-tree-verify-mask-and-graphs.patch"
    lines = diff.read_text().splitlines(keepends=True)
    # change one context line of the first hunk: strict application (no fuzz) must refuse it
    first_hunk = next(i for i, ln in enumerate(lines) if ln.startswith("@@"))
    ctx = next(i for i in range(first_hunk + 1, len(lines)) if lines[i].startswith(" ") and lines[i].strip())
    lines[ctx] = lines[ctx].rstrip("\n") + "  # drifted\n"
    diff.write_text("".join(lines))
    with pytest.raises(RuntimeError, match="failed"):
        tool.verify(bad, wheel, workdir=tmp_path / "w1")
    wrong = tmp_path / "wrong"
    shutil.copytree(SET_DIR, wrong)
    m = json.loads((wrong / "manifest.json").read_text())
    m["patches"][1]["files"][0]["after"] = "0" * 64
    (wrong / "manifest.json").write_text(json.dumps(m))
    problems = tool.verify(wrong, wheel, workdir=tmp_path / "w2")
    assert any("after-hash mismatch" in p for p in problems)


@pytest.mark.network
def test_every_patched_python_file_compiles():
    root = patched_tree()
    for p in manifest()["patches"]:
        for f in p["files"]:
            compile((root / f["path"]).read_bytes(), f["path"], "exec", dont_inherit=True)


def _spec_parser(root: Path) -> argparse.ArgumentParser:
    """SGLang's own CLI generator over the ``spec`` namespace fields of the tree at ``root``.

    Parent packages are bare modules so their ``__init__`` (which imports torch, transformers, ...) does
    not run; ``arg_utils``, ``choices`` and ``fields/spec.py`` are the real files.
    """
    ci_requirements.require("msgspec", needed_for="to import sglang.srt.server_args")
    import importlib

    with bare_sglang(root, ("sglang.srt", "sglang.srt.arg_groups", "sglang.srt.arg_groups.fields")):
        spec = importlib.import_module("sglang.srt.arg_groups.fields.spec")
        arg_utils = importlib.import_module("sglang.srt.arg_groups.arg_utils")
        parser = argparse.ArgumentParser(exit_on_error=False)
        arg_utils.add_cli_args_from_dataclass(parser, spec.Spec)
        return parser


@pytest.mark.network
def test_flags_parse_with_sglangs_field_generated_parser():
    parser = _spec_parser(patched_tree(whole=True))
    args = parser.parse_args(["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "64"])
    assert args.speculative_algorithm == "DDTREE"
    assert args.speculative_ddtree_budget == 64
    assert parser.parse_args([]).speculative_ddtree_budget is None
    with pytest.raises(argparse.ArgumentError):
        parser.parse_args(["--speculative-ddtree-budget", "many"])


@pytest.mark.network
def test_pristine_parser_rejects_the_budget_flag():
    parser = _spec_parser(pristine_tree())
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-ddtree-budget", "64"])


@pytest.mark.network
def test_field_order_appends_the_new_field_last():
    text = (patched_tree() / "sglang/srt/arg_groups/field_order.py").read_text()
    body = text[text.index("POSITIONAL_FIELD_ORDER = ("):]
    names = re.findall(r'^\s+"([a-z0-9_]+)",$', body[: body.index("\n)")], flags=re.M)
    assert names[-1] == "speculative_ddtree_budget" and names.count("speculative_ddtree_budget") == 1


@pytest.mark.network
def test_server_args_parse_and_resolve_ddtree(tmp_path_factory):
    """The full 0.5.23 ServerArgs parser and DDTREE's resolution, where SGLang's light deps are importable.

    The ``server_args`` part of tests/ddtree_bare_probe.py, run under ``$K26_SGLANG_ARGS_PYTHON`` (default:
    this interpreter) in the session's one bare-package child; it needs psutil, pybase64, triton, pillow,
    starlette, pyzmq and msgspec, not a GPU. Skips naming the first missing module otherwise.
    """
    out = bare_part(tmp_path_factory, "server_args", "to import sglang.srt.server_args")
    assert out["parsed"] == ["DDTREE", 64]
    assert out["algo"] == ["DDTREE", True, True, False, False]
    assert out["target_width"] == 65
    # verify width = budget + 1, the DFlash drafter keeps its 16-token block, chain-only EAGLE knobs pinned
    assert out["resolved"] == [65, 16, 1, 1]
    assert out["resolution"].startswith("NotImplementedError: DDTREE starts only on a site validation record")
    assert "--speculative-ddtree-budget" in out["missing_budget"]
    # a verify width below the drafter block would let the draft block write past the per-step KV reservation
    assert "below the DFlash block" in out["small_budget"], out["small_budget"]
    refused = out["refused"]
    assert "--attention-backend (auto)" in refused["auto backend"]
    assert "--attention-backend flashinfer" in refused["flashinfer"]
    assert "pp_size == 1" in refused.pop("pp")  # SGLang's DFlash resolution refuses PP before DDTREE's own check
    assert "--enable-two-batch-overlap" in refused["tbo"]
    assert "PD disaggregation (--disaggregation-mode decode)" in refused["pd"]
    assert "--dcp-size 2" in refused["dcp"]
    assert "--enable-deterministic-inference" in refused["deterministic"]
    assert "ROCm/HIP" in refused["hip"]
    # parallel modes the validation gate does not judge, each naming its flag
    assert "expert parallelism (--ep-size 2;" in refused["ep"]
    assert "--moe-a2a-backend deepep (an all-to-all MoE dispatch such as DeepEP" in refused["deepep"]
    assert "--speculative-moe-a2a-backend deepep" in refused["spec deepep"]
    assert "attention context parallelism (--attn-cp-size 2;" in refused["attn cp"]
    assert "prefill context parallelism (--enable-prefill-cp)" in refused["prefill cp"]
    # SGLANG_SPEC_TP_SYNC settings that drop DFlash's prefill / start-up broadcasts DDTREE relies on at TP > 1
    assert "SGLANG_SPEC_TP_SYNC='off' at --tp-size 2 (it drops dflash-target, dflash-mem:" in refused["tp sync off"]
    assert "SGLANG_SPEC_TP_SYNC='init' at --tp-size 2 (it drops dflash-target:" in refused["tp sync init"]
    assert "'all,-dflash-target' at --tp-size 8 (it drops dflash-target:" in refused["tp sync no target"]
    # ... and not those that keep them, nor any setting at TP 1: those reach the site validation record gate
    for name in ("tp sync rng", "tp sync off at tp 1"):
        assert refused.pop(name).startswith("NotImplementedError: DDTREE starts only on a site validation record"), name
    assert all(v.startswith("ValueError: DDTREE was not validated with:") for v in refused.values()), refused


@pytest.mark.network
def test_only_a_site_record_of_the_configuration_passes_argument_resolution(tmp_path_factory):
    """The gate at argument resolution (0005, ddtree_site.py): a site validation record of exactly the
    configuration the resolution sees (SGLang, TP size, backend, graph and overlap modes, compute capability,
    torch, the budget, the GPUs, the stack, the model) opens it; a record of another budget or torch, or none
    named, refuses naming what differs; the opt-in opens it whatever the records."""
    out = bare_part(tmp_path_factory, "server_args", "to import sglang.srt.server_args")
    cfg, gates = out["configuration"], out["gates"]
    assert set(cfg) == {"sglang", "tp_size", "attention_backend", "cuda_graph", "overlap_schedule",
                        "compute_capability", "torch"}
    assert cfg["sglang"] == "0.5.23" and cfg["tp_size"] == 1 and cfg["attention_backend"] == "triton"
    assert cfg["cuda_graph"] is True and cfg["overlap_schedule"] is True
    assert out["site_configuration"]["ddtree_budget"] == 64
    assert gates["recorded"] == "completed" and gates["opt_in"] == "completed", gates
    for name in ("other_budget", "other_torch", "none"):
        assert gates[name].startswith("NotImplementedError: DDTREE"), gates
        assert "k26-doctor validate" in gates[name] and "SGLANG_DDTREE_UNVALIDATED_WORKER=1" in gates[name]
    assert "ddtree_budget 64 (validated: 16)" in gates["other_budget"]
    assert f"torch {cfg['torch']} (validated: 0.0.1)" in gates["other_torch"]
    assert "none is named" in gates["none"]


@pytest.mark.network
def test_the_patch_engines_generator_agrees_with_the_manifest(tmp_path):
    """doctor.sglang.patching's own manifest generator, run on a pristine unpack, yields the same hashes."""
    generate = pytest.importorskip("doctor.sglang.patching.generate")
    record = pytest.importorskip("doctor.sglang.patching.record")
    tool = patchset_tool()
    wheel = require_wheel()
    with zipfile.ZipFile(wheel) as zf:
        meta = [n for n in zf.namelist() if n.endswith((".dist-info/RECORD", ".dist-info/METADATA"))]
    tool.unpack(wheel, tmp_path, tool.touched_paths(SET_DIR, tool.load_manifest(SET_DIR)) + meta)
    generated = generate.generate(SET_DIR, record.installed_in(tmp_path), write=False).to_dict()

    def files(m):
        return [(p["id"], [(f["path"], f["before"], f["after"]) for f in p["files"]]) for p in m["patches"]]

    assert files(generated) == files(manifest())


@pytest.mark.network
def test_triton_keeps_the_custom_mask_for_ddtree_only(tmp_path_factory):
    """DFLASH on Triton skips the verify mask (a chain is causal); DDTREE must keep it. The ``mask_policy``
    part of tests/ddtree_bare_probe.py: needs SGLang's runtime dependencies (transformers, torchvision,
    fastapi, tvm-ffi, ...) in ``$K26_SGLANG_ARGS_PYTHON``; skips naming the first missing module otherwise."""
    assert bare_part(tmp_path_factory, "mask_policy", "to import dflash_utils and the Triton backend") == \
        [False, False, True]


@pytest.mark.network  # reads the released SGLang 0.5.23 wheel (a first-run download)
def test_the_manifest_mirrors_the_validated_record_of_the_worker():
    """manifest.json ``validated`` is ddtree_worker.VALIDATED (read from the patched file's AST: the literal
    the gate checks), each entry pinning every key the gate matches and saying where it was shown (date, GPU,
    run, figures): revision 5 lists TP 1 on an H200 with graphs + overlap, overlap only, and eager."""
    import ast

    tree = ast.parse((patched_tree() / "sglang/srt/speculative/ddtree_worker.py").read_text())
    assigned = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign)
                                                                       else None)
        if isinstance(target, ast.Name) and target.id in ("VALIDATED", "CONFIG_KEYS"):
            assigned[target.id] = ast.literal_eval(node.value)
    assert list(assigned["VALIDATED"]) == manifest()["validated"]
    modes = set()
    for entry in manifest()["validated"]:
        assert set(assigned["CONFIG_KEYS"]) <= set(entry), entry
        assert {"date", "gpu", "run", "figures"} <= set(entry), entry
        assert (entry["sglang"], entry["tp_size"], entry["attention_backend"], entry["compute_capability"],
                entry["torch"]) == ("0.5.23", 1, "triton", "9.0", "2.11.0"), entry
        modes.add((entry["cuda_graph"], entry["overlap_schedule"]))
    assert modes == {(True, True), (False, True), (False, False)}  # graphs without overlap: not validated
