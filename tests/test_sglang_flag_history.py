"""The flag history of SGLang 0.4.0..0.5.23 (doctor/data/sglang_flag_history.json) and what
``sglang.flags`` / ``launch`` say with it, against the real sources of 0.5.23 and 0.5.13.post1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sglang_wheels
from flag_support import validate

from doctor.core.result import Result
from doctor.sglang.flag_history import (
    HISTORY_FILE,
    FlagHistory,
    explain_unknown,
    fork_prefixes,
    load_history,
    vllm_equivalents,
)
from doctor.sglang.flag_reader import FlagTable, read_flags
from doctor.sglang.flag_validator import removed_flags
from doctor.sglang.flags import judge_flags

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--model-path", "/models/Kimi-K2.6", "--tp-size", "8", "--trust-remote-code"]


@pytest.fixture(scope="session")
def t23(tmp_path_factory: pytest.TempPathFactory) -> FlagTable:
    return read_flags(sglang_wheels.site("0.5.23", tmp_path_factory) / "sglang", "0.5.23")


@pytest.fixture(scope="session")
def t13(tmp_path_factory: pytest.TempPathFactory) -> FlagTable:
    return read_flags(sglang_wheels.site("0.5.13.post1", tmp_path_factory) / "sglang", "0.5.13.post1")


@pytest.fixture(scope="session")
def history() -> FlagHistory:
    return load_history()


def problems(table: FlagTable, *extra: str) -> list:
    return validate(table, [*BASE, *extra])


def only_error(table: FlagTable, *extra: str):
    errs = [p for p in problems(table, *extra) if p.severity == "error"]
    assert len(errs) == 1, [p.message for p in errs]
    return errs[0]


# -- the table itself ---------------------------------------------------------------------------

def test_history_covers_every_release_from_040_to_0523(history: FlagHistory) -> None:
    assert history.releases[0] == "0.4.0" and history.releases[-1] == "0.5.23"
    assert len(history.releases) >= 90 and not history.unreadable
    assert "0.5.13.post1" in history.releases and "0.4.10.post2" in history.releases
    # compact: runs of release indices, not one entry per release
    assert HISTORY_FILE.stat().st_size < 200_000


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.5.23", "0.5.13.post1"])
def test_history_says_exactly_what_the_real_sources_say(history: FlagHistory, version: str,
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    """For the two releases the tests unpack, the committed table lists exactly their flags."""
    table = read_flags(sglang_wheels.site(version, tmp_path_factory) / "sglang", version)
    at = history.releases.index(version)
    in_history = {f for f in history.flags if any(a <= at <= b for a, b in history.runs(f))}
    assert in_history == set(table.options)
    for opt, spec in table.options.items():
        if at == len(history.releases) - 1:
            assert history.flags[opt]["dest"] == spec["dest"], opt


@pytest.mark.network
def test_removed_flags_table_agrees_with_the_history(history: FlagHistory, t23: FlagTable) -> None:
    """The hints table says when a flag went; the history, read from every release, must agree."""
    for flag, info in removed_flags().items():
        runs = history.runs(flag)
        assert runs, flag
        last = runs[-1][1]
        removed_in = history.releases[last + 1]
        if info.get("removed_in"):
            assert removed_in == info["removed_in"], flag
        if info.get("present_in"):
            at = history.releases.index(info["present_in"])
            assert any(a <= at <= b for a, b in runs), flag
        if info.get("absent_in"):
            at = history.releases.index(info["absent_in"])
            assert not any(a <= at <= b for a, b in runs), flag
        assert flag not in t23.options


@pytest.mark.network
def test_vllm_table_names_only_flags_sglang_never_had(history: FlagHistory, t23: FlagTable) -> None:
    table = vllm_equivalents()
    assert {"--max-model-len", "--enable-reasoning", "--gpu-memory-utilization", "-tp"} <= set(table)
    for flag, entry in table.items():
        assert not history.known(flag), f"{flag} is an SGLang flag in {history.runs(flag)}"
        for cand in entry.get("sglang") or []:
            assert history.known(cand.split()[0]), (flag, cand)
        if entry.get("sglang"):  # older spellings may follow, but the release this project runs has one
            assert any(c.split()[0] in t23.options for c in entry["sglang"]), flag


def test_fork_flags_are_read_from_the_fork_and_never_upstream(history: FlagHistory) -> None:
    kt = history.forks["sglang-kt"]
    assert kt["version"] and "--kt-gpu-experts-ratio" in kt["flags"]
    prefixes = [p for info in fork_prefixes().values() for p in info["prefixes"]]
    for flag in kt["flags"]:
        assert not history.known(flag)
        assert any(flag.startswith(p) for p in prefixes), flag
    # upstream took some --kt-* flags over: those are judged by the history, not called fork-only
    assert history.known("--kt-weight-path")


# -- what the check says ------------------------------------------------------------------------

@pytest.mark.network
def test_underscore_spelling(t23: FlagTable) -> None:
    p = only_error(t23, "--reasoning_parser", "kimi_k2")
    assert "SGLang spells it --reasoning-parser" in p.message and p.replacement == "--reasoning-parser"


@pytest.mark.network
def test_typo_did_you_mean(t23: FlagTable) -> None:
    p = only_error(t23, "--reasoning-parsr", "kimi_k2")
    assert "did you mean --reasoning-parser?" in p.message and p.replacement == "--reasoning-parser"


@pytest.mark.network
def test_flag_added_after_the_installed_release(t13: FlagTable) -> None:
    p = only_error(t13, "--cuda-graph-max-bs-decode", "160")
    assert "--cuda-graph-max-bs-decode was added in SGLang 0.5.14; the installed SGLang is 0.5.13.post1" in p.message
    # the removed-flags table, read backwards: the spelling 0.5.13.post1 has
    assert p.replacement == "--cuda-graph-max-bs"
    assert not [e for e in problems(t13, "--cuda-graph-max-bs", "160") if e.severity == "error"]


@pytest.mark.network
def test_flag_removed_before_the_installed_release(t23: FlagTable) -> None:
    p = only_error(t23, "--enable-piecewise-cuda-graph")
    assert "removed in SGLang 0.5.14 (last in 0.5.13.post1); the installed SGLang is 0.5.23" in p.message
    assert p.replacement == "--cuda-graph-backend-prefill {full,breakable}"
    # removed without an entry in the hints table: the history alone dates it
    p = only_error(t23, "--enable-ep-moe")
    assert "--enable-ep-moe was removed in SGLang 0.5.4.post1 (last in 0.5.4)" in p.message


@pytest.mark.network
def test_removed_flag_that_is_now_a_unique_prefix_of_another(t23: FlagTable) -> None:
    """argparse takes --return-hidden-states as --return-hidden-states-mode (which wants a value)."""
    probs = problems(t23, "--return-hidden-states", "all")
    (warn,) = [p for p in probs if p.severity == "warning"]
    assert "abbreviation of --return-hidden-states-mode" in warn.message
    assert "--return-hidden-states was removed in SGLang 0.4.3.post3 (last in 0.4.3.post2)" in warn.message


@pytest.mark.network
def test_vllm_spellings(t23: FlagTable, t13: FlagTable) -> None:
    p = only_error(t23, "--enable-reasoning")
    assert "vLLM's flag; SGLang's is --reasoning-parser" in p.message
    p = only_error(t23, "--max-model-len", "65536")
    assert p.replacement == "--context-length"
    assert only_error(t23, "--gpu-memory-utilization", "0.9").replacement == "--mem-fraction-static"
    assert only_error(t23, "-tp", "8").replacement == "--tp-size"
    # the equivalent the installed release has: 0.5.23 has the decode backend, 0.5.13.post1 not yet
    assert only_error(t23, "--enforce-eager").replacement == "--cuda-graph-backend-decode disabled"
    assert only_error(t13, "--enforce-eager").replacement == "--disable-cuda-graph"
    # vLLM and SGLang spell --tensor-parallel-size alike: no complaint
    assert not problems(t23, "--tensor-parallel-size", "8")


@pytest.mark.network
def test_fork_only_flags(t23: FlagTable) -> None:
    p = only_error(t23, "--kt-gpu-experts-ratio", "0.2")
    assert "ktransformers fork of SGLang" in p.message and "sglang-kt 0.7.2 has it" in p.message
    p = only_error(t23, "--router-policy", "cache_aware")
    assert "sglang_router.launch_server" in p.message
    # an upstream --kt-* flag is accepted by 0.5.23 (taken over from the fork)
    assert not [e for e in problems(t23, "--kt-weight-path", "/w") if e.severity == "error"]


@pytest.mark.network
def test_unknown_everywhere(t23: FlagTable) -> None:
    p = only_error(t23, "--no-such-flag-anywhere")
    assert p.message.endswith("nor did any release from 0.4.0 to 0.5.23") and p.replacement is None


@pytest.mark.network
def test_a_modified_build_lacking_a_released_flag(t23: FlagTable) -> None:
    options = {k: v for k, v in t23.options.items() if k != "--log-requests"}
    why = explain_unknown("--log-requests", options, "0.5.23", removed=removed_flags())
    assert why.kind == "not_in_this_build" and "reinstall sglang==0.5.23" in why.message


@pytest.mark.parametrize("version, kind", [("0.5.24", "removed"), ("0.5.24.dev3+g1234", "removed"),
                                           ("0.4.0", "added_later"), ("not-a-version", "other_release")])
def test_versions_outside_the_table(history: FlagHistory, version: str, kind: str) -> None:
    flag = "--cuda-graph-max-bs-decode" if kind == "added_later" else "--cuda-graph-max-bs"
    assert explain_unknown(flag, {}, version, history=history).kind == kind


@pytest.mark.network
def test_check_names_every_replacement(t23: FlagTable) -> None:
    fact = {"found": True, "python": sys.executable, "package_dir": "/x", "table": t23.to_dict()}
    argv = [*BASE, "--reasoning_parser", "kimi_k2", "--max-model-len", "65536"]
    res = Result.judging(lambda: judge_flags(fact, argv))
    assert res.status.value == "fail"
    assert "--reasoning_parser -> --reasoning-parser" in res.remediation.text
    assert "--max-model-len -> --context-length" in res.remediation.text


# -- the generator ----------------------------------------------------------------------------

@pytest.mark.network
def test_generator_reproduces_the_committed_entries(tmp_path: Path, history: FlagHistory) -> None:
    """scripts/make_flag_history.py run on the real 0.5.13.post1 and 0.5.23 wheels (from the cache,
    no index query) writes what the committed table says of those releases."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for version in ("0.5.13.post1", "0.5.23"):
        wheel = sglang_wheels.wheel_for(version)
        (cache / wheel.name).symlink_to(wheel)
    out = tmp_path / "h.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_flag_history.py"), "--versions",
                          "0.5.13.post1", "0.5.23", "--cache", str(cache), "--out", str(out)],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stderr[-2000:]
    made = json.loads(out.read_text())
    assert made["releases"] == ["0.5.13.post1", "0.5.23"] and not made["unreadable"]
    i13, i23 = history.releases.index("0.5.13.post1"), history.releases.index("0.5.23")
    for flag, entry in made["flags"].items():
        got = {v for a, b in entry["in"] for v in made["releases"][a:b + 1]}
        want = {v for v, i in (("0.5.13.post1", i13), ("0.5.23", i23))
                if any(a <= i <= b for a, b in history.runs(flag))}
        assert got == want, flag
    assert not list(tmp_path.glob("flaghist-*"))  # unpacked trees are removed
