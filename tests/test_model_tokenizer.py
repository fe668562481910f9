"""model.tokenizer: the tokenizer loaded as SGLang loads it, in interpreters with real transformers.

The model directory is a small K2.6 replica (real safetensors headers) with the Kimi tokenizer layout:
a generated, valid tiktoken.model of 163,584 ranks, tokenizer_config.json with Kimi's special-token ids,
and remote code + chat template written for these tests with the contract of the model repository's
(tests/fixtures/model/kimi_tokenizer/). The service interpreters are venvs with transformers 4.57.6
(the last 4.x), 5.19.0 (what SGLang 0.5.23 requires) and 5.4.0 (a release that routes kimi_k25 past
the remote tokenizer), created once and cached (kimi_kit.transformers_python).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from interpreters import bare_python

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from kimi_kit import KIMI_VOCAB, special_ids, tokenization_source, transformers_python, write_kimi_tokenizer
from model_replica import K26Spec
from model_replica_tokenizer import tiktoken_bpe_bytes
from modelkit import build, make_ctx, run, tree_state

from doctor.model.remote_code import (
    MODULE_MISSING,
    MODULE_OUTSIDE,
    analyse_source,
    named_module_problems,
    scan_remote_code,
)
from doctor.model.tiktoken_bpe import read_tiktoken_bpe
from doctor.model.tokenizer import parsers_from_args, required_markers

SPEC = K26Spec.small(vocab_size=KIMI_VOCAB)
# Same layout and special-token offsets, 4,096 ids: the scenarios that only need the scheme load in a
# fraction of the time (transformers 5.4's generic backend converts the whole vocabulary twice).
SMALL_VOCAB = 4096
SPEC_SMALL = K26Spec.small(vocab_size=SMALL_VOCAB)
PARSER_MARKERS = ["<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                  "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"]


# -- files, without transformers ----------------------------------------------------------------

@pytest.mark.network
def test_generated_vocabulary_is_valid_and_tiktoken_reads_it_alike(tmp_path: Path) -> None:
    path = tmp_path / "tiktoken.model"
    path.write_bytes(tiktoken_bpe_bytes(163584))
    mine = read_tiktoken_bpe(str(path))
    assert mine["ok"] and mine["tokens"] == 163584 and mine["max_rank"] == 163583
    code = ("import sys\nfrom tiktoken.load import load_tiktoken_bpe\nr = load_tiktoken_bpe(sys.argv[1])\n"
            "print(len(r), max(r.values()))")
    out = subprocess.run([transformers_python("5.19.0"), "-c", code, str(path)], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["163584", "163583"], out.stderr


@pytest.mark.parametrize("mutate, fragment", [
    (lambda b: b.replace(b"AQ== 1\n", b"AQ== 1 x\n"), "line 2: expected '<base64 token> <rank>', got 3 fields"),
    (lambda b: b.replace(b"AQ== 1\n", b"A=Q= 1\n"), "line 2: not a base64 token"),
    (lambda b: b.replace(b"AA== 0\n", b""), "ranks run from 1 to"),
    (lambda b: b + base64.b64encode(b"a") + b" 999999\n", "appears twice"),
    (lambda b: b.replace(b"AQ== 1\n", b"AQ== 1\n  \n"), "got 0 fields"),
    (lambda b: b"version https://git-lfs.github.com/spec/v1\noid sha256:e9\nsize 28\n", "Git LFS pointer"),
    (lambda b: b"", "holds no tokens"),
])
def test_broken_vocabulary_named(tmp_path: Path, mutate, fragment: str) -> None:
    path = tmp_path / "tiktoken.model"
    path.write_bytes(mutate(tiktoken_bpe_bytes(300)))
    got = read_tiktoken_bpe(str(path))
    assert not got["ok"] and any(fragment in p for p in got["problems"]), got


@pytest.mark.network
def test_a_vocabulary_tiktoken_refuses_is_refused(tmp_path: Path) -> None:
    """What the reader calls broken, tiktoken's own loader cannot load either."""
    path = tmp_path / "tiktoken.model"
    path.write_bytes(tiktoken_bpe_bytes(300).replace(b"AQ== 1\n", b"AQ== 1\n  \n"))
    assert not read_tiktoken_bpe(str(path))["ok"]
    code = "import sys\nfrom tiktoken.load import load_tiktoken_bpe\nload_tiktoken_bpe(sys.argv[1])"
    out = subprocess.run([transformers_python("5.19.0"), "-c", code, str(path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "ValueError" in out.stderr


def test_remote_code_is_read_not_run() -> None:
    portable = analyse_source(tokenization_source("portable"))
    assert portable["moved"] == [] and portable["num_reserved_special_tokens"] == 256
    assert {"tiktoken", "transformers"} <= set(portable["imports"])
    old = analyse_source(tokenization_source("gpt2"))
    (hit,) = old["moved"]
    assert hit["name"] == "bytes_to_unicode" and hit["gone_from"] == "5.0.0"


def test_relative_imports_of_remote_code_must_be_there(tmp_path: Path) -> None:
    (tmp_path / "tokenization_kimi.py").write_text(
        "from .tool_declaration_ts import encode_tools_to_typescript_style\nimport tiktoken\n")
    got = scan_remote_code(str(tmp_path), ["tokenization_kimi.TikTokenTokenizer", "org/other--x.Y"])
    assert got["missing"] == ["tool_declaration_ts.py"]
    assert got["files"]["tool_declaration_ts.py"]["needed_by"] == "tokenization_kimi.py"
    assert got["external"] == ["org/other--x.Y"]
    (tmp_path / "tool_declaration_ts.py").write_text("def encode_tools_to_typescript_style(t):\n    return ''\n")
    assert scan_remote_code(str(tmp_path), ["tokenization_kimi.TikTokenTokenizer"])["missing"] == []


def test_modules_auto_map_names_are_coded_by_their_fix(tmp_path: Path) -> None:
    """A named module that is not there (a download fetches it) and one outside the model directory (the config
    must name another) are two findings with two codes; a module only imported by another is model.config's."""
    elsewhere = tmp_path / "shared"
    elsewhere.mkdir()
    (elsewhere / "tok.py").write_text("class Tok: pass\n")
    model = tmp_path / "m"
    model.mkdir()
    (model / "modeling.py").write_text("from .helpers import x\n")
    scanned = scan_remote_code(str(model), ["tokenization_kimi.TikTokenTokenizer", f"{elsewhere}/tok.Tok",
                                            "modeling.Model"])
    found = named_module_problems(scanned)
    assert [f.code for f in found] == [MODULE_MISSING, MODULE_OUTSIDE]
    assert found[0].message == "remote-code module tokenization_kimi.py named by auto_map is missing"
    assert "outside the model directory (it exists there, but" in found[1].message
    assert found.details["download"] == ["tokenization_kimi.py"]
    (model / "tokenization_kimi.py").write_text("import tiktoken\n")
    (model / "helpers.py").write_text("x = 1\n")
    assert [f.code for f in named_module_problems(scan_remote_code(str(model), ["tokenization_kimi.T",
                                                                                "modeling.Model"]))] == []


def test_markers_come_from_the_profile_parsers() -> None:
    parsers = parsers_from_args(["--reasoning-parser", "kimi_k2", "--tool-call-parser=kimi_k2"])
    assert parsers == {"reasoning_parser": "kimi_k2", "tool_call_parser": "kimi_k2"}
    assert sorted(required_markers(parsers)) == sorted(PARSER_MARKERS)
    assert required_markers({}) == {}


# -- the load, in real interpreters -------------------------------------------------------------

def replica(root: Path, style: str, spec: K26Spec = SPEC) -> Path:
    model = build(root, spec)
    write_kimi_tokenizer(model, import_style=style, vocab_size=spec.vocab_size)
    return model


def judge(root: Path, model: Path, python: str, spec: K26Spec = SPEC):
    before = tree_state(model)
    res = run(make_ctx(root, model, spec=spec, python=python), "model.tokenizer")
    assert tree_state(model) == before  # the load wrote nothing into the model directory
    return res


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kimi-portable")
    return root, replica(root, "portable")


@pytest.fixture(scope="module")
def k2_instruct_style(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kimi-gpt2")
    return root, replica(root, "gpt2")


@pytest.fixture(scope="module")
def portable_small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kimi-portable-small")
    return root, replica(root, "portable", SPEC_SMALL)


@pytest.fixture(scope="module")
def k2_instruct_style_small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kimi-gpt2-small")
    return root, replica(root, "gpt2", SPEC_SMALL)


@pytest.mark.network
@pytest.mark.parametrize("version", ["4.57.6", "5.19.0"])
def test_loads_as_sglang_does_on_both_majors(portable: tuple[Path, Path], version: str) -> None:
    root, model = portable
    res = judge(root, model, transformers_python(version))
    assert res.status.value == "pass", (res.summary, res.details.get("problems"))
    assert res.details["loaded_as"] == "TikTokenTokenizer (remote code tokenization_kimi.py)"
    assert res.details["transformers"] == version
    assert set(PARSER_MARKERS) <= set(res.details["markers_checked"])
    assert set(res.details["markers_required"]) == set(PARSER_MARKERS)
    assert res.details["chat_template"]["with_tools"] is True
    assert "special tokens round-trip" in res.summary


@pytest.mark.network
def test_v4_only_remote_code_on_transformers_5_fails_with_the_fix(k2_instruct_style: tuple[Path, Path]) -> None:
    root, model = k2_instruct_style
    res = judge(root, model, transformers_python("5.19.0"))
    assert res.status.value == "fail"
    text = " | ".join(res.details["problems"])
    assert "imports bytes_to_unicode from transformers.models.gpt2.tokenization_gpt2" in text
    assert "transformers 5.0.0 and later no longer have (installed: 5.19.0)" in text
    assert "cannot import name 'bytes_to_unicode'" in text  # the load, tried for real, fails the same way
    assert (f"hf download moonshotai/Kimi-K2.6 --include tokenization_kimi.py --local-dir {model}"
            in res.remediation.commands)


@pytest.mark.network
def test_v4_only_remote_code_still_loads_on_transformers_4(k2_instruct_style: tuple[Path, Path]) -> None:
    root, model = k2_instruct_style
    res = judge(root, model, transformers_python("4.57.6"))
    assert res.status.value == "pass", res.details.get("problems")


@pytest.mark.network
def test_generic_backend_corrupts_the_think_tokens(k2_instruct_style_small: tuple[Path, Path]) -> None:
    """transformers 5.4.0 skips the remote class for kimi_k25; SGLang's fallback to the declared class
    cannot import this remote code there, so the generic backend stays, with other ids."""
    root, model = k2_instruct_style_small
    res = judge(root, model, transformers_python("5.4.0"), SPEC_SMALL)
    assert res.status.value == "fail"
    text = " | ".join(res.details["problems"])
    assert "loads as transformers' generic TokenizersBackend" in text
    ids = special_ids(SMALL_VOCAB)
    assert f"<think> encodes to [{ids['<think>'] - 3}], tokenizer_config.json says [{ids['<think>']}]" in text
    assert res.details["loaded_as"].endswith(".TokenizersBackend")


@pytest.mark.network
def test_sglang_fallback_recovers_the_remote_class_on_the_bad_release(portable_small: tuple[Path, Path]) -> None:
    root, model = portable_small
    res = judge(root, model, transformers_python("5.4.0"), SPEC_SMALL)
    assert res.status.value == "warn", res.details.get("problems")
    assert res.details["loaded_as"] == "TikTokenTokenizer (remote code tokenization_kimi.py)"
    assert "plain AutoTokenizer gives the generic TokenizersBackend" in res.summary \
        or any("TokenizersBackend" in n for n in res.details["notes"])
    assert res.remediation and "5.5.4" in res.remediation.text


def test_without_transformers_the_load_is_not_judged_but_files_are(portable: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    root, model = portable
    res = judge(root, model, str(bare_python()))  # an interpreter without transformers
    assert res.status.value == "skip" and "transformers is not importable" in res.summary
    broken = build(tmp_path, SPEC)
    write_kimi_tokenizer(broken)
    with open(broken / "tiktoken.model", "r+b") as fh:
        fh.truncate(1_000_000)
    res = run(make_ctx(tmp_path, broken, spec=SPEC, python=str(bare_python())), "model.tokenizer")
    assert res.status.value == "fail" and "tiktoken.model" in res.summary
    assert any("--include tiktoken.model" in c for c in res.remediation.commands)


@pytest.mark.network
def test_vocabulary_and_config_from_different_revisions(tmp_path: Path) -> None:
    model = build(tmp_path, SPEC)
    write_kimi_tokenizer(model, vocab_size=KIMI_VOCAB - 64)  # a tiktoken.model 64 ranks short
    res = run(make_ctx(tmp_path, model, spec=SPEC, python=transformers_python("5.19.0")), "model.tokenizer")
    assert res.status.value == "fail"
    assert "tiktoken.model has 163,520 tokens; with the remote code's 256 reserved special ids the vocabulary " \
           "is 163,776, config.json says 163,840" in " | ".join(res.details["problems"])


@pytest.mark.network
def test_a_missing_marker_fails_when_the_parser_needs_it(tmp_path: Path) -> None:
    model = build(tmp_path, SPEC_SMALL)
    write_kimi_tokenizer(model, vocab_size=SMALL_VOCAB)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {k: v for k, v in cfg["added_tokens_decoder"].items() if v["content"] != "</think>"}
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    res = judge(tmp_path, model, transformers_python("5.19.0"), SPEC_SMALL)
    assert res.status.value == "fail"
    assert "</think> is not a special token of this tokenizer" in " | ".join(res.details["problems"])


def test_probe_deadline_is_an_error_not_a_pass(portable: tuple[Path, Path], tmp_path: Path) -> None:
    """A service interpreter that hangs: the probe is killed at its deadline and the check errors."""
    root, model = portable
    hang = tmp_path / "python"
    hang.write_text("#!/bin/sh\nsleep 600\n")
    hang.chmod(0o755)
    import doctor.model.tokenizer as tok

    old, tok.PROBE_TIMEOUT_S = tok.PROBE_TIMEOUT_S, 2.0
    try:
        res = run(make_ctx(root, model, spec=SPEC, python=str(hang)), "model.tokenizer")
    finally:
        tok.PROBE_TIMEOUT_S = old
    assert res.status.value == "error" and "did not finish within 2.0s" in res.summary


@pytest.mark.network
def test_a_module_the_remote_code_imports_is_missing_from_the_service_env(tmp_path: Path) -> None:
    model = build(tmp_path, SPEC_SMALL)
    write_kimi_tokenizer(model, vocab_size=SMALL_VOCAB)
    src = (model / "tokenization_kimi.py").read_text()
    src = src.replace("import tiktoken\n", "import tiktoken\nimport k26_absent\n", 1)
    (model / "tokenization_kimi.py").write_text(src)
    python = transformers_python("5.19.0")
    res = judge(tmp_path, model, python, SPEC_SMALL)
    assert res.status.value == "fail"
    text = " | ".join(res.details["problems"])
    assert f"the remote code imports k26_absent, not installed in {python}" in text
    assert "k26_absent" in text.split(" | ")[-1]  # transformers' own import check fails the load on it too
    assert f"{python} -m pip install k26_absent" in res.remediation.commands


@pytest.mark.parametrize("bad, where", [
    ({"given": True, "probe": "crashed"}, "probe: str, not an object"),
    ({"given": True, "tiktoken": {"ok": True, "tokens": "3840"}}, "tiktoken.tokens: str, not int"),
    ({"given": True, "probe": {"transformers_found": True, "load": {"ok": False, "steps": "x"}}},
     "probe.load.steps: str, not a list"),
])
def test_a_malformed_replayed_load_fails_naming_the_fact(tmp_path: Path, bad: dict, where: str) -> None:
    """A hand-edited or corrupt snapshot: the check fails naming the fact and the place, never crashes and
    never skips as if the load had not been collected."""
    model = build(tmp_path, SPEC_SMALL)
    write_kimi_tokenizer(model, vocab_size=SMALL_VOCAB)
    live = make_ctx(tmp_path, model, spec=SPEC_SMALL)
    res = run(make_ctx(tmp_path, model, spec=SPEC_SMALL, facts={"model": live.fact("model"), "model.tokenizer": bad}),
              "model.tokenizer")
    assert res.status.value == "fail", res.summary
    assert "model.tokenizer" in res.summary and where in res.summary


def test_a_server_without_a_tokenizer_is_not_judged_on_one(tmp_path):
    """--skip-tokenizer-init (the tiny DDTree validation servers, input_ids only): no tokenizer is loaded,
    so a model directory without tokenizer files is not a failure; without the flag it is."""
    from modelkit import make_ctx
    from stack_support import run_check

    from doctor.core.result import Status

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}')
    ctx = make_ctx(tmp_path, model, tp=1, python=str(bare_python()))  # the files alone fail it
    assert run_check("model.tokenizer", ctx).status is Status.FAIL
    ctx = make_ctx(tmp_path, model, tp=1, extra_toml='[server]\nargs = ["--skip-tokenizer-init"]\n')
    res = run_check("model.tokenizer", ctx)
    assert res.status is Status.SKIP and "--skip-tokenizer-init" in res.summary
