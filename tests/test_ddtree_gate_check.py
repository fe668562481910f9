"""sglang.ddtree: the worker gate of the shipped DDTree patch set is seen before a start, not after it."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import doctor_env, run_doctor


def verdict(*args: str, **env: str) -> dict:
    out = run_doctor("check", "--only", "sglang.ddtree", "--format", "json", *args, env=doctor_env(**env))
    return json.loads(out.stdout)["results"][0]


def test_ddtree_profile_without_the_opt_in_fails() -> None:
    res = verdict()
    assert res["status"] == "fail" and "SGLANG_DDTREE_UNVALIDATED_WORKER=1" in res["summary"]
    assert "DFLASH" in res["remediation"]["text"]


def test_opt_in_is_a_warning_never_a_pass() -> None:
    assert verdict(SGLANG_DDTREE_UNVALIDATED_WORKER="1")["status"] == "warn"
    assert verdict(SGLANG_DDTREE_UNVALIDATED_WORKER="yes")["status"] == "fail", "the patch accepts exactly 1"


def test_opt_in_from_the_env_file(tmp_path: Path) -> None:
    envf = tmp_path / "sglang.env"
    envf.write_text("SGLANG_DDTREE_UNVALIDATED_WORKER=1\n")
    cfg = tmp_path / "k26.toml"
    cfg.write_text(f'[server]\nenv_file = "{envf}"\n')
    assert verdict("--config", str(cfg))["status"] == "warn"


def test_dflash_profile_skips(tmp_path: Path) -> None:
    assert verdict("--profile", "b200-tp8")["status"] == "skip"
    cfg = tmp_path / "k26.toml"
    cfg.write_text('[server]\nspeculative_algorithm = "DFLASH"\n')
    assert verdict("--config", str(cfg))["status"] == "skip"
