"""sglang.flags on a drafting argv without a draft model: SGLang 0.5.23 stops at argument resolution
("DFLASH speculative decoding requires setting --speculative-draft-model-path"), after its slow imports. The
flag table is read from the released wheel's real sources."""

from __future__ import annotations

from pathlib import Path

import pytest
import sglang_wheels

from doctor.core.result import Result, Status
from doctor.sglang.flag_reader import read_flags
from doctor.sglang.flags import judge_flags

pytestmark = pytest.mark.network

BASE = ["--model-path", "/models/Kimi-K2.6", "--tp-size", "8", "--trust-remote-code", "--attention-backend", "triton",
        "--host", "127.0.0.1", "--port", "30000"]


@pytest.fixture(scope="module")
def fact(tmp_path_factory: pytest.TempPathFactory) -> dict:
    site: Path = sglang_wheels.site("0.5.23", tmp_path_factory)
    return {"found": True, "version": "0.5.23", "package_dir": str(site / "sglang"),
            "table": read_flags(site / "sglang", "0.5.23").to_dict()}


def judged(fact: dict, *extra: str) -> Result:
    return Result.judging(lambda: judge_flags(fact, [*BASE, *extra]))


@pytest.mark.parametrize("algorithm", ["DFLASH", "EAGLE3"])
def test_drafting_without_a_draft_model_fails(fact: dict, algorithm: str) -> None:
    res = judged(fact, "--speculative-algorithm", algorithm)
    assert res.status is Status.FAIL and res.has("sglang.flags.no_draft_model")
    assert f"--speculative-algorithm {algorithm} without --speculative-draft-model-path" in res.summary
    assert "[drafter] path" in res.remediation.text


@pytest.mark.parametrize("extra", [["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/m/d"],
                                   ["--speculative-algorithm=DFLASH", "--speculative-draft-model-path=/m/d"],
                                   ["--speculative-algorithm", "NEXTN"],  # the target's bundled MTP layer
                                   []])
def test_a_draft_model_given_or_not_needed(fact: dict, extra: list[str]) -> None:
    res = judged(fact, *extra)
    assert not res.has("sglang.flags.no_draft_model"), res.summary
    assert res.status is Status.PASS, res.summary


def test_diagnose_names_sglang_flags_for_sglangs_own_message(fact: dict) -> None:
    """The message is read from SGLang 0.5.23's sources (speculative_hook.py), as the server raises it."""
    import re

    from doctor.service.diagnose import diagnose_lines, load_signatures

    hook = Path(fact["package_dir"]) / "srt" / "arg_groups" / "speculative_hook.py"
    message = re.search(r'"(DFLASH speculative decoding requires setting --speculative-draft-model-path\.)"',
                        hook.read_text()).group(1)
    found = diagnose_lines([f"ValueError: {message}"], load_signatures())
    assert found[0].signature.id == "draft-model-path-required" and found[0].signature.check == "sglang.flags"
