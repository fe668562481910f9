"""A shard of random bytes is one root cause, never "the fact 'model' is malformed" once per check.

Random bytes read as a safetensors header length give a number past what a reading may hold (2**64 - 1 at most);
the header reader says it in words (model.shards: "header length ... exceeds safetensors' limit") instead of
recording the number, which would make the whole model fact malformed. And where a fact is malformed all the same
(a hand-edited snapshot), the checks that read it tell one cause: the first of them is the root, the others are
folded under it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import doctor_env, run_doctor
from hostile_support import small_model

ONLY = ["--only", "model.shards", "--only", "model.config", "--only", "model.tokenizer"]


@pytest.fixture(scope="module")
def random_shard_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = small_model(tmp_path_factory.mktemp("random-shard") / "model")
    shard = sorted(model.glob("*.safetensors"))[0]
    shard.write_bytes(b"\xa2" * 8 + os.urandom(shard.stat().st_size - 8))  # a length of 11.7e18 bytes, then noise
    return model


def test_a_shard_of_random_bytes_is_judged_by_model_shards(random_shard_model: Path, tmp_path: Path) -> None:
    out = run_doctor("snapshot", "--model-path", str(random_shard_model), "--fact", "model", "--output",
                     str(tmp_path / "snap.json"))
    assert out.returncode == 0, out.stderr
    doc = json.loads(run_doctor("check", "--from-snapshot", str(tmp_path / "snap.json"), "--only", "model.shards",
                                "--format", "json").stdout)
    (res,) = doc["results"]
    assert res["status"] == "fail" and "exceeds safetensors' limit" in res["summary"], res["summary"]
    assert "malformed" not in json.dumps(doc)


def test_checks_failing_on_one_malformed_fact_tell_one_root(random_shard_model: Path, tmp_path: Path) -> None:
    snap_path = tmp_path / "snap.json"
    assert run_doctor("snapshot", "--model-path", str(random_shard_model), "--fact", "model", "--output",
                      str(snap_path)).returncode == 0
    snap = json.loads(snap_path.read_text())
    snap["facts"]["model"]["weights"]["shards"][1]["header_len"] = 11_700_000_000_000_000_000  # by hand: too big
    snap_path.write_text(json.dumps(snap))
    args = ["check", "--from-snapshot", str(snap_path), *ONLY]
    doc = json.loads(run_doctor(*args, "--format", "json").stdout)
    malformed = [r for r in doc["results"] if "is malformed" in r["summary"]]
    assert len(malformed) >= 2, doc["results"]
    roots = [r["id"] for r in malformed if not r.get("root")]
    assert len(roots) == 1 and all(r["root"] == roots[0] for r in malformed if r["id"] != roots[0]), malformed
    text = run_doctor(*args, env=doctor_env(COLUMNS="100")).stdout
    assert text.count("is malformed") == 1 and f"same cause ({len(malformed) - 1})" in text, text
