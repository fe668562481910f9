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


def test_without_sglang_it_does_not_speak_of_the_patched_sglang(tmp_path: Path) -> None:
    """A service interpreter with no SGLang (a bare venv): the gate is still the news, but not "the patched SGLang
    refuses it" of an SGLang that is not there; with SGLang installed, that is what it says."""
    import subprocess
    import sys

    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=300)
    res = verdict("--python", str(bare / "bin" / "python"))
    assert res["status"] == "fail"
    assert res["summary"] == ("DDTREE needs SGLang with the DDTree patch set (not installed) and "
                              "SGLANG_DDTREE_UNVALIDATED_WORKER=1 (not set)")
    site = bare / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang-0.5.23.dist-info").mkdir()
    (site / "sglang-0.5.23.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    res = verdict("--python", str(bare / "bin" / "python"))
    assert res["summary"].startswith("the profile launches DDTREE, but SGLANG_DDTREE_UNVALIDATED_WORKER=1 is not set")
