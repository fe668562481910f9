"""The flag check against the real sources of SGLang 0.5.23 (dataclass fields) and 0.5.13.post1
(add_argument), and against Python's own argparse built from the table read out of them."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest
import sglang_wheels
from conftest import make_context, run_check
from flag_support import validate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from interpreters import find_python

from doctor.core.context import Context
from doctor.core.result import Result, Status
from doctor.sglang.flag_reader import FlagSourceError, FlagTable, read_flags
from doctor.sglang.flag_validator import removed_flags
from doctor.sglang.flags import flags_fact, judge_flags


@pytest.fixture(scope="session")
def site_0523(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sglang_wheels.site("0.5.23", tmp_path_factory)


@pytest.fixture(scope="session")
def site_0513(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sglang_wheels.site("0.5.13.post1", tmp_path_factory)


@pytest.fixture(scope="session")
def site_0523_ddtree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sglang_wheels.ddtree_site(tmp_path_factory)


@pytest.fixture(scope="session")
def t23(site_0523: Path) -> FlagTable:
    return read_flags(site_0523 / "sglang", "0.5.23")


@pytest.fixture(scope="session")
def t13(site_0513: Path) -> FlagTable:
    return read_flags(site_0513 / "sglang", "0.5.13.post1")


def errors(table: FlagTable, argv: list[str]) -> list[str]:
    return [p.message for p in validate(table, argv) if p.severity == "error"]


BASE = ["--model-path", "/models/Kimi-K2.6", "--tp-size", "8", "--trust-remote-code",
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/d",
        "--attention-backend", "triton", "--mem-fraction-static", "0.85", "--host", "0.0.0.0", "--port", "30000",
        "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2"]


@pytest.mark.network
def test_0523_is_read_from_the_annotated_fields(t23: FlagTable) -> None:
    assert t23.style == "fields"
    assert len(t23.options) > 400
    assert any("arg_groups/fields/" in f for f in t23.files)
    # aliases from Arg(aliases=[...]) and cli_name, the dest they share
    assert t23.options["--tensor-parallel-size"]["dest"] == t23.options["--tp-size"]["dest"] == "tp_size"
    assert t23.options["--speculative-draft-model"]["dest"] == "speculative_draft_model_path"
    assert t23.options["--trust-remote-code"]["nargs"] == 0
    assert t23.options["--port"]["type"] == "int"
    assert t23.options["--model-path"].get("required") is True
    # BooleanOptionalAction gives a --no- form; no_cli fields give no flag at all
    assert "--no-enable-tf32-matmul" in t23.options
    assert "--speculative-boundary-reduction" not in t23.options
    # Deprecated spelling registered by hand in add_cli_args, with its replacement
    assert t23.options["--disable-cuda-graph"]["deprecated"].startswith("--cuda-graph-backend")
    # Choices: Literal types are strict, registries that plugins extend are not
    assert set(t23.options["--cuda-graph-backend-decode"]["choices"]) >= {"full", "breakable", "disabled"}
    assert "triton" in t23.options["--attention-backend"]["choices"]
    assert t23.options["--attention-backend"]["choices_strict"] is False
    assert "kimi_k2" in t23.options["--reasoning-parser"]["choices"]


@pytest.mark.network
def test_0513_is_read_from_add_argument(t13: FlagTable) -> None:
    assert t13.style == "add_argument"
    assert len(t13.options) > 300
    assert t13.options["--cuda-graph-max-bs"]["type"] == "int"
    assert "--cuda-graph-max-bs-decode" not in t13.options
    assert "--speculative-dflash-draft-window-size" in t13.options


@pytest.mark.network
def test_the_profile_command_without_ddtree_is_accepted_by_both(t23: FlagTable, t13: FlagTable) -> None:
    assert errors(t23, BASE) == []
    assert errors(t13, BASE) == []


@pytest.mark.network
def test_removed_cuda_graph_max_bs_names_the_replacement(t23: FlagTable, t13: FlagTable) -> None:
    argv = [*BASE, "--cuda-graph-max-bs", "256"]
    assert errors(t13, argv) == []
    (msg,) = errors(t23, argv)
    assert "removed in SGLang 0.5.20" in msg and "--cuda-graph-max-bs-decode" in msg
    assert "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, " \
           "--cuda-graph-max-bs-prefill" in msg


@pytest.mark.network
def test_ddtree_flags_need_the_patch(t23: FlagTable, site_0523_ddtree: Path) -> None:
    argv = [*BASE, "--speculative-ddtree-budget", "64"]
    (msg,) = errors(t23, argv)
    assert "unrecognized argument --speculative-ddtree-budget" in msg
    patched = read_flags(site_0523_ddtree / "sglang", "0.5.23")
    assert errors(patched, argv) == []
    assert errors(patched, [*BASE, "--speculative-ddtree-budget", "many"]) == [
        "--speculative-ddtree-budget: invalid int value 'many'"]


@pytest.mark.network
@pytest.mark.parametrize("argv, fragment", [
    (["--tp-size"], "expects 1 value"),
    (["--trust-remote-code=yes"], "takes no value"),
    (["--cuda-graph-backend-decode", "fast"], "invalid choice 'fast'"),
    (["--port", "thirty"], "invalid int value"),
    (["--no-such-flag", "1"], "unrecognized argument --no-such-flag"),
    (["--cuda-graph", "1"], "ambiguous option: --cuda-graph could match"),
    (["stray"], "unexpected positional argument"),
])
def test_argparse_errors(t23: FlagTable, argv: list[str], fragment: str) -> None:
    assert any(fragment in m for m in errors(t23, [*BASE, *argv])), errors(t23, [*BASE, *argv])


@pytest.mark.network
def test_warnings_for_abbreviations_deprecations_and_plugin_choices(t23: FlagTable) -> None:
    probs = validate(t23, [*BASE, "--mem-frac", "0.8", "--disable-cuda-graph", "--attention-backend", "mine"])
    assert all(p.severity == "warning" for p in probs)
    text = " | ".join(p.message for p in probs)
    assert "abbreviation of --mem-fraction-static" in text
    assert "deprecated" in text
    assert "only a plugin registering it" in text


@pytest.mark.network
def test_missing_required_flag(t23: FlagTable) -> None:
    assert any("--model-path is missing" in m for m in errors(t23, ["--tp-size", "8"]))


def test_unreadable_or_foreign_sources(tmp_path: Path) -> None:
    pkg = tmp_path / "sglang"
    with pytest.raises(FlagSourceError, match="missing or not valid"):
        read_flags(pkg)
    (pkg / "srt").mkdir(parents=True)
    (pkg / "srt" / "server_args.py").write_text("def broken(:\n")
    with pytest.raises(FlagSourceError):
        read_flags(pkg)
    (pkg / "srt" / "server_args.py").write_text("class ServerArgs:\n    pass\n")
    with pytest.raises(FlagSourceError, match=r"no ServerArgs\.add_cli_args"):
        read_flags(pkg)


@pytest.mark.network
def test_removed_flags_table_agrees_with_the_real_sources(t23: FlagTable, t13: FlagTable) -> None:
    """Every flag the data table calls removed is really gone from 0.5.23; replacements exist."""
    for flag, info in removed_flags().items():
        assert flag not in t23.options, flag
        if info.get("present_in") == "0.5.13.post1":
            assert flag in t13.options, flag
        for word in str(info.get("replacement", "")).split():
            if word.startswith("--"):
                assert word.rstrip(",)") in t23.options, (flag, word)


# -- cross-check: our replay of argparse vs argparse itself, on the table read from the sources --

class _ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ParseError(message)


def argparse_from(table: FlagTable) -> argparse.ArgumentParser:
    parser = _Parser(prog="sglang serve", add_help=False)
    by_dest: dict[str, list[str]] = {}
    for opt, spec in table.options.items():
        by_dest.setdefault(spec["dest"] + ("/no" if opt.startswith("--no-") else ""), []).append(opt)
    for opts in by_dest.values():
        spec = table.options[opts[0]]
        kw: dict[str, object] = {"dest": spec["dest"]}
        if spec["nargs"] == 0:
            kw["action"] = "store_true"
        else:
            if spec["nargs"] != 1:
                kw["nargs"] = spec["nargs"]
            if spec.get("type") in ("int", "float"):
                kw["type"] = int if spec["type"] == "int" else float
            if spec.get("choices") is not None and spec.get("choices_strict", True):
                kw["choices"] = [str(c) for c in spec["choices"]]
        if spec.get("required"):
            kw["required"] = True
        parser.add_argument(*opts, **kw)  # type: ignore[arg-type]
    return parser


FLAGS = ["--tp-size", "--tp", "--port", "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--trust-remote-code",
         "--cuda-graph-backend-decode", "--mem-frac", "--no-such", "--enable-tf32-matmul", "--no-enable-tf32-matmul",
         "--lora-paths", "--cuda-graph", "--port=7", "--trust-remote-code=1", "--model-path"]
VALUES = ["8", "x", "full", "0.5", "-1", "-x", "--"]


@pytest.fixture(scope="session")
def parser23(t23: FlagTable) -> argparse.ArgumentParser:
    """The parser of 0.5.23's table, built once (its ~540 add_argument calls were 90% of the test below):
    parse_args leaves the parser as it was, so every example reads the same one."""
    return argparse_from(t23)


@pytest.mark.network
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(FLAGS), st.lists(st.sampled_from(VALUES), max_size=2)), max_size=4))
def test_validate_agrees_with_argparse(t23: FlagTable, parser23: argparse.ArgumentParser,
                                       groups: list[tuple[str, list[str]]]) -> None:
    argv = ["--model-path", "/m"] + [a for flag, values in groups for a in (flag, *values)]
    parser = parser23
    try:
        parser.parse_args(argv)
        accepted = True
    except _ParseError:
        accepted = False
    mine = [p for p in validate(t23, argv, removed={}) if p.severity == "error"]
    assert accepted == (not mine), (argv, [p.message for p in mine])


# -- the fact (probe under a real interpreter) and the check --------------------------------

def _py(version: str) -> str:
    found = find_python(version)
    return str(found) if found else sys.executable


@pytest.mark.network
def test_fact_from_a_real_service_interpreter(site_0523: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(site_0523))
    fact = flags_fact(_py("3.10.13"), env)
    assert fact["found"] and fact["version"] == "0.5.23"
    assert fact["package_dir"] == str(site_0523 / "sglang")
    assert fact["table"]["style"] == "fields"


def test_fact_without_sglang_or_interpreter(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert flags_fact(sys.executable, env)["found"] is False
    missing = flags_fact(str(tmp_path / "nope" / "python"), env)
    assert "probe_error" in missing and "No such file" in missing["probe_error"]
    assert Result.judging(lambda: judge_flags(missing, BASE)).status is Status.ERROR
    assert Result.judging(lambda: judge_flags(flags_fact(sys.executable, env), BASE)).status is Status.SKIP


def _ctx(site: Path, **flags: object) -> Context:
    fact = flags_fact(sys.executable, dict(os.environ, PYTHONPATH=str(site)))
    return make_context({"model_path": "/models/Kimi-K2.6", "draft_model_path": "/models/d", **flags},
                        facts={"sglang_flags": fact})


@pytest.mark.network
def test_check_fails_on_unpatched_sglang_and_points_at_the_patches(site_0523: Path) -> None:
    res = run_check("sglang.flags", _ctx(site_0523))
    assert res.status is Status.FAIL
    assert "--speculative-ddtree-budget" in res.summary
    assert "k26-doctor patches apply" in res.remediation.commands


@pytest.mark.network
def test_check_passes_on_patched_sglang(site_0523_ddtree: Path) -> None:
    res = run_check("sglang.flags", _ctx(site_0523_ddtree))
    assert res.status is Status.PASS, res.summary
    assert res.details["sglang_version"] == "0.5.23"


@pytest.mark.network
def test_check_catches_a_removed_flag_in_the_config(site_0523_ddtree: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[server]\nargs = ["--cuda-graph-max-bs", "160", "--reasoning-parser", "kimi_k2"]\n')
    res = run_check("sglang.flags", _ctx(site_0523_ddtree, config=str(cfg)))
    assert res.status is Status.FAIL
    assert res.details["problems"][0]["replacement"].startswith("--cuda-graph-max-bs-decode")


@pytest.mark.network
def test_check_runs_through_the_cli_with_a_service_interpreter(site_0523_ddtree: Path) -> None:
    from conftest import doctor_env, run_doctor

    env = doctor_env(PYTHONPATH=str(site_0523_ddtree))
    res = run_doctor("check", "--only", "sglang.flags", "--python", _py("3.12.1"), "--model-path", "/m",
                     "--draft-model-path", "/d", "--format", "json", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert '"sglang.flags"' in res.stdout and '"pass"' in res.stdout


def test_hostile_sources_give_an_error_verdict_not_a_crash(tmp_path: Path) -> None:
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    lines = ["class ServerArgs:", "    @staticmethod", "    def add_cli_args(parser):",
             "        names = ['--x']", "        parser.add_argument(*names)",
             "        parser.add_argument('--bad', choices=" + "(" * 5000 + "1" + ")" * 5000 + ")"]
    lines += [f"        parser.add_argument('--flag-{i}', type=int)" for i in range(25)]
    (pkg / "srt" / "server_args.py").write_text("\n".join(lines) + "\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    fact = flags_fact(sys.executable, env)
    assert fact["found"] and "table" not in fact and fact["error"]
    assert Result.judging(lambda: judge_flags(fact, BASE)).status is Status.ERROR
    (pkg / "srt" / "server_args.py").write_bytes(b"\xff\xfe\x00 not python at all \x00")
    assert Result.judging(lambda: judge_flags(flags_fact(sys.executable, env), BASE)).status is Status.ERROR
