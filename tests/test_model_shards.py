"""model.shards on real (sparse) K2.6-shaped replicas: every bad input of the issue is a clean fail that
names the problem, and nothing changes on disk."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from model_replica import K26Spec, shard_name
from modelkit import SMALL, build, make_ctx, run, tree_state

S1, S2, S3 = (shard_name(i, SMALL.shards) for i in (1, 2, 3))


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return build(tmp_path)


def judge(tmp_path: Path, model: Path, check_id: str = "model.shards"):
    before = tree_state(model)
    res = run(make_ctx(tmp_path, model), check_id)
    assert tree_state(model) == before, "check changed the model directory"
    return res


def test_replica_is_real_and_passes(tmp_path, model):
    idx = json.loads((model / "model.safetensors.index.json").read_text())
    for shard in set(idx["weight_map"].values()):
        with safe_open(str(model / shard), "np") as f:
            assert f.keys()
    assert S1 == "model-00001-of-000004.safetensors"
    res = judge(tmp_path, model)
    assert res.status.value == "pass", res.summary
    assert res.details["totals"]["tensors"] == len(idx["weight_map"])


def test_no_model_path_fails(tmp_path):
    """A missing required input is a failure, never a skip that passes."""
    res = run(make_ctx(tmp_path, None), "model.shards")
    assert res.status.value == "fail"
    assert "--model-path" in res.summary
    for other in ("model.config", "model.tokenizer"):  # said once: the others name model.shards as the cause
        dep = run(make_ctx(tmp_path, None), other)
        assert dep.status.value == "fail" and dep.cause == "model.shards"


def test_missing_path_fails(tmp_path):
    res = run(make_ctx(tmp_path, tmp_path / "nope"), "model.shards")
    assert res.status.value == "fail"
    assert "does not exist" in res.summary


def test_truncated_shard(tmp_path, model):
    with open(model / S2, "r+b") as fh:
        fh.truncate(os.path.getsize(model / S2) - 4096)
    res = judge(tmp_path, model)
    assert res.status.value == "fail"
    assert S2 in res.summary and "truncated" in res.summary
    assert res.details["redownload"] == [S2]
    assert "hf download moonshotai/Kimi-K2.6 " + S2 in res.remediation.commands[0]


def test_lfs_pointer(tmp_path, model):
    (model / S1).write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "b" * 64 + "\nsize 123\n")
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "Git LFS pointer" in res.summary and S1 in res.summary


def test_huge_header_length(tmp_path, model):
    with open(model / S3, "r+b") as fh:
        fh.write(struct.pack("<Q", 2 ** 40))
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "exceeds safetensors' limit" in res.summary and S3 in res.summary


def _rewrite_header(path: Path, mutate) -> None:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    doc = json.loads(raw[8:8 + n])
    mutate(doc)
    body = json.dumps(doc, separators=(",", ":")).encode()
    body += b" " * (n - len(body))
    assert len(body) == n
    path.write_bytes(raw[:8] + body + raw[8 + n:])


def test_overlapping_offsets(tmp_path, model):
    def mutate(doc):
        names = [k for k in doc if k != "__metadata__"]
        _a, b = sorted(names, key=lambda k: doc[k]["data_offsets"][0])[:2]
        doc[b]["data_offsets"] = [doc[b]["data_offsets"][0] - 2, doc[b]["data_offsets"][1] - 2]
    _rewrite_header(model / S2, mutate)
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "overlaps" in res.summary and S2 in res.summary


def test_wrong_dtype_for_shape(tmp_path, model):
    def mutate(doc):
        name = next(k for k, v in doc.items() if k != "__metadata__" and v["dtype"] == "BF16" and v["shape"])
        doc[name]["dtype"] = "F32"
    _rewrite_header(model / S2, mutate)
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "needs" in res.summary and S2 in res.summary


def test_bad_json_index(tmp_path, model):
    (model / "model.safetensors.index.json").write_text('{"weight_map": {"a": ')
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "not valid JSON" in res.summary


def test_missing_index(tmp_path, model):
    (model / "model.safetensors.index.json").unlink()
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "model.safetensors.index.json" in res.summary
    assert res.details["stray_safetensors"]
    assert "4 *.safetensors file(s)" in res.summary  # read as the shards: all four valid


def test_a_truncated_single_shard_without_an_index_says_truncated(tmp_path):
    """One shard named as one of one (``-00001-of-00001``, not the index's six-digit total), no index, cut short:
    the truncation is the news, not only that the index is missing."""
    model = build(tmp_path, K26Spec.small(shards=1))
    (model / "model.safetensors.index.json").unlink()
    shard = model / "model-00001-of-00001.safetensors"
    (model / shard_name(1, 1)).rename(shard)
    with open(shard, "r+b") as fh:
        fh.truncate(os.path.getsize(shard) // 2)
    res = judge(tmp_path, model)
    assert res.status.value == "fail"
    assert res.summary.startswith("1 of 1 shards damaged: model-00001-of-00001.safetensors: file is ")
    assert "truncated download" in res.summary
    assert [b["name"] for b in res.details["bad_shards"]] == ["model-00001-of-00001.safetensors"]
    assert any("model.safetensors.index.json" in p["message"] for p in res.details["problems"])
    assert res.details["redownload"] == ["model.safetensors.index.json", "model-00001-of-00001.safetensors"]


@pytest.mark.parametrize("evil", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors",
                                  "a\\b.safetensors"])
def test_path_traversal(tmp_path, model, evil):
    idx_path = model / "model.safetensors.index.json"
    idx = json.loads(idx_path.read_text())
    first = next(iter(idx["weight_map"]))
    idx["weight_map"][first] = evil
    idx_path.write_text(json.dumps(idx))
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "refusing to look outside" in res.summary and repr(evil) in res.summary


def test_dangling_symlink(tmp_path, model):
    (model / S3).unlink()
    os.symlink("../blobs/0123abcd", model / S3)
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "dangling symlink" in res.summary and S3 in res.summary


def test_directory_instead_of_shard(tmp_path, model):
    (model / S3).unlink()
    (model / S3).mkdir()
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "not a regular file" in res.summary


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to an unprivileged user to make a file unreadable")
def test_unreadable_file_as_unprivileged_user(tmp_path):
    """Permissions do not stop root, so the check runs as `nobody` in a child process."""
    base = Path("/tmp") / f"k26-unreadable-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o755)
    try:
        model = build(base)
        for p in [base, *base.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        os.chmod(model / S2, 0o000)
        root = str(Path(__file__).resolve().parents[1])
        code = (f"import sys; sys.path.insert(0, {root!r}); from doctor.model.scan import scan_weights; "
                f"import json; r = scan_weights({str(model)!r}); "
                "print(json.dumps([s for s in r['shards'] if not s['ok']]))")
        # The pyenv interpreter lives under /root (0700); the system one is reachable for `nobody`.
        python = next((p for p in ("/usr/bin/python3", sys.executable) if os.path.exists(p)), sys.executable)
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                             user="nobody", cwd="/", env={"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"})
        if (out.returncode != 0 and "No module named" in out.stderr) or "SyntaxError" in out.stderr:
            pytest.skip(f"{python} cannot run the doctor as nobody: {out.stderr.strip().splitlines()[-1]}")
        assert out.returncode == 0, out.stderr
        bad = json.loads(out.stdout)
        assert [b["name"] for b in bad] == [S2]
        assert "Permission denied" in bad[0]["problems"][0]["message"]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_tensor_in_wrong_shard(tmp_path, model):
    idx_path = model / "model.safetensors.index.json"
    idx = json.loads(idx_path.read_text())
    name = next(k for k, v in idx["weight_map"].items() if v == S1)
    idx["weight_map"][name] = S2
    idx_path.write_text(json.dumps(idx))
    res = judge(tmp_path, model)
    assert res.status.value == "fail"
    text = json.dumps(res.details)
    assert "another shard" in text and name in text and f"found in {S1}" in text


def test_tensor_missing_from_index_and_total_size(tmp_path, model):
    idx_path = model / "model.safetensors.index.json"
    idx = json.loads(idx_path.read_text())
    idx["metadata"]["total_size"] += 1
    idx_path.write_text(json.dumps(idx))
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "total_size" in res.summary


def test_aria2_leftover(tmp_path, model):
    (model / (S2 + ".aria2")).write_bytes(b"\x00\x01" + b"\0" * 100)
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and S2 + ".aria2" in res.summary and "did not finish" in res.summary
    assert S2 in res.details["redownload"]


def test_hf_incomplete_leftover(tmp_path, model):
    meta = model / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "Zx3Ab.0123456789abcdef.incomplete").write_bytes(b"\0" * 10)
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and ".incomplete" in res.summary


def test_huggingface_cache_layout_passes(tmp_path):
    """snapshots/<rev>/<file> -> ../../blobs/<sha256>: normal, and the blob names become expected digests."""
    flat = build(tmp_path, name="flat")
    root = tmp_path / "hub" / "models--moonshotai--Kimi-K2.6"
    snap = root / "snapshots" / ("c0ffee" * 6 + "abcd")
    (root / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    import hashlib

    for f in flat.iterdir():
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.move(str(f), root / "blobs" / digest)
        os.symlink(os.path.join("..", "..", "blobs", digest), snap / f.name)
    res = judge(tmp_path, snap)
    assert res.status.value == "pass", res.summary
    assert res.details["hf_cache"] == str(root)
    (root / "blobs" / "deadbeef.incomplete").write_bytes(b"x")
    res = judge(tmp_path, snap)
    assert res.status.value == "fail" and "blobs/deadbeef.incomplete" in res.summary


def test_single_file_model(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    d = tmp_path / "single"
    d.mkdir()
    save_file({"model.embed_tokens.weight": np.zeros((8, 4), np.float32)}, str(d / "model.safetensors"))
    res = judge(tmp_path, d)
    assert res.status.value == "pass" and "1 shard" in res.summary


def test_many_problems_are_all_named(tmp_path, model):
    with open(model / S1, "r+b") as fh:
        fh.truncate(100)
    (model / S2).unlink()
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and "2 of 4 shards damaged" in res.summary
    assert {b["name"] for b in res.details["bad_shards"]} == {S1, S2}


def test_sparse_shard_warns(tmp_path):
    """A shard whose data are holes (an unfinished segmented download) is named; --deep decides."""
    from model_replica import write_sparse_safetensors

    d = tmp_path / "sparse"
    d.mkdir()
    write_sparse_safetensors(str(d / "model.safetensors"), [("w", "BF16", (8192, 8192))])
    res = judge(tmp_path, d)
    assert res.status.value == "warn" and "sparse" in res.summary and "model.safetensors" in res.summary
    assert res.details["sparse_shards"] == ["model.safetensors"]


# -- property: random damage to a real shard is always a clean verdict, agreeing with safe_open -------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["truncate", "flip", "append"]), st.integers(0, 10 ** 9), st.integers(0, 255))
def test_random_damage_is_a_clean_verdict(tmp_path_factory, how, where, byte):
    import tempfile

    base = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    model = build(base)
    shard = model / S2
    size = shard.stat().st_size
    header_end = 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]
    if how == "truncate":
        with open(shard, "r+b") as fh:
            fh.truncate(where % size)
    elif how == "flip":  # inside the header, where a validator can see it
        pos = where % header_end
        raw = bytearray(shard.read_bytes()[:header_end])
        raw[pos] = byte if raw[pos] != byte else (byte + 1) % 256
        with open(shard, "r+b") as fh:
            fh.write(raw)
    else:
        with open(shard, "ab") as fh:
            fh.write(bytes([byte]) * (1 + where % 64))
    before = tree_state(model)
    res = run(make_ctx(base, model), "model.shards")
    assert tree_state(model) == before
    assert res.status.value in ("pass", "fail"), res.summary
    try:
        with safe_open(str(shard), "np") as f:
            keys = set(f.keys())
        idx = json.loads((model / "model.safetensors.index.json").read_text())
        ref_ok = keys == {k for k, v in idx["weight_map"].items() if v == S2}
    except Exception:
        ref_ok = False
    assert (res.status.value == "pass") == ref_ok, (how, where, byte, res.summary)


def test_renamed_tensor_in_header_is_caught(tmp_path, model):
    """Found by the property test: a header tensor name the index lacks (one byte changed)."""
    raw = bytearray((model / S2).read_bytes())
    pos = raw.index(b'"language_model') + 1
    raw[pos] = ord(" ")
    (model / S2).write_bytes(raw)
    res = judge(tmp_path, model)
    assert res.status.value == "fail" and S2 in json.dumps(res.details["bad_shards"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["move", "drop", "add", "rename", "swap", "none"]), st.integers(0, 10 ** 6))
def test_fast_path_agrees_with_full_cross_check(tmp_path_factory, how, seed):
    """scan_weights' per-shard index check (the fast path) and the full index/header cross-check agree."""
    import random
    import tempfile

    from doctor.model.header import read_header
    from doctor.model.index import cross_check, read_index
    from doctor.model.scan import clear_cache, scan_weights

    rnd = random.Random(seed)
    model = build(Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())))
    idx_path = model / "model.safetensors.index.json"
    idx = json.loads(idx_path.read_text())
    wmap = idx["weight_map"]
    names = sorted(wmap)
    shards = sorted(set(wmap.values()))
    victim = rnd.choice(names)
    if how == "move":
        wmap[victim] = rnd.choice([s for s in shards if s != wmap[victim]])
    elif how == "drop":
        del wmap[victim]
    elif how == "add":
        wmap["not.in.any.header"] = rnd.choice(shards)
    elif how == "rename":
        wmap[victim + "x"] = wmap.pop(victim)
    elif how == "swap":
        other = rnd.choice([n for n in names if wmap[n] != wmap[victim]])
        wmap[victim], wmap[other] = wmap[other], wmap[victim]
    idx_path.write_text(json.dumps(idx))
    clear_cache()
    fast = scan_weights(str(model))
    fast_ok = all(s["ok"] for s in fast["shards"]) and not fast["problems"]
    index = read_index(str(idx_path))
    cc = cross_check(index, {s: read_header(str(model / s)) for s in index.shards})
    full_ok = not cc.general and not any(cc.per_shard.values())
    assert fast_ok == full_ok == (how == "none"), (how, fast["problems"], cc.general, cc.per_shard)
