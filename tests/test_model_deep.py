"""The deep tier (sha256 against manifest / HF metadata / HF cache blobs, verification cache, progress),
the `manifest` command, and the re-download fixer's plan."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "model"))
from model_replica import shard_name
from modelkit import SMALL, build, make_ctx, run, tree_state

from doctor.core.actions import RunCommand
from doctor.core.registry import load
from doctor.model.hashing import Progress, sha256_file, verify_model_hashes
from doctor.model.manifest import MANIFEST_NAME, manifest_text
from fixes.model import MoveAside

ROOT = Path(__file__).resolve().parents[1]
S1, S2 = shard_name(1, SMALL.shards), shard_name(2, SMALL.shards)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "verify-cache"
    monkeypatch.setenv("K26_DOCTOR_VERIFY_CACHE_DIR", str(d))
    monkeypatch.delenv("K26_DOCTOR_NO_VERIFY_CACHE", raising=False)
    return d


@pytest.fixture
def model(tmp_path) -> Path:
    return build(tmp_path)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def write_manifest(model: Path) -> None:
    files = {n: {"size": (model / n).stat().st_size, "sha256": sha(model / n)}
             for n in sorted(p.name for p in model.glob("model-*.safetensors"))}
    (model / MANIFEST_NAME).write_text(manifest_text(files))


def corrupt(path: Path, offset_from_end: int = 10) -> None:
    with open(path, "r+b") as fh:
        fh.seek(os.path.getsize(path) - offset_from_end)
        fh.write(b"\x01")


def deep(tmp_path, model, check_id="model.shards.deep"):
    before = tree_state(model)
    res = run(make_ctx(tmp_path, model, deep=True), check_id)
    assert tree_state(model) == before
    return res


def test_sha256_file_matches_hashlib(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    seen = []
    assert sha256_file(str(p), seen.append, block=1 << 20) == sha(p)
    assert sum(seen) == p.stat().st_size


def test_no_reference_skips(tmp_path, model):
    res = deep(tmp_path, model)
    assert res.status.value == "skip" and "nothing to compare with" in res.summary
    assert res.details["counts"]["no_reference"] == SMALL.shards


def test_manifest_match_then_mismatch_named(tmp_path, model, cache_dir):
    write_manifest(model)
    res = deep(tmp_path, model)
    assert res.status.value == "pass", res.summary
    assert f"all {SMALL.shards} files match" in res.summary
    assert str(cache_dir) in res.details["cache"]["path"] and not str(res.details["cache"]["path"]).startswith(
        str(model))
    corrupt(model / S2)
    res = deep(tmp_path, model)
    assert res.status.value == "fail"
    assert "1 sha256 mismatch (manifest): " + S2 in res.summary
    assert res.details["mismatch"][0]["name"] == S2
    # The headers are intact: only the deep tier can see this.
    assert run(make_ctx(tmp_path, model), "model.shards").status.value == "pass"


def test_hf_metadata_etag_is_the_reference(tmp_path, model):
    meta = model / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    for p in model.glob("model-*.safetensors"):
        (meta / (p.name + ".metadata")).write_text(f"{'ab' * 20}\n{sha(p)}\n{time.time()}\n")
    corrupt(model / S1)
    res = deep(tmp_path, model)
    assert res.status.value == "fail" and "(hf-metadata): " + S1 in res.summary


def test_hf_cache_blob_name_is_the_reference(tmp_path):
    flat = build(tmp_path, name="flat")
    root = tmp_path / "models--moonshotai--Kimi-K2.6"
    snap = root / "snapshots" / ("f" * 40)
    (root / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in flat.iterdir():
        digest = sha(f)
        os.rename(f, root / "blobs" / digest)
        os.symlink(f"../../blobs/{digest}", snap / f.name)
    res = deep(tmp_path, snap)
    assert res.status.value == "pass" and res.details["counts"]["match"] == SMALL.shards
    blob = (snap / S2).resolve()
    corrupt(blob)
    res = deep(tmp_path, snap)
    assert res.status.value == "fail" and "(hf-cache-blob): " + S2 in res.summary


def test_verification_cache(tmp_path, model, cache_dir, monkeypatch):
    write_manifest(model)
    first = verify_model_hashes(str(model))
    assert first["cache"]["hits"] == 0 and first["bytes_hashed"] > 0
    assert (cache_dir / "verify-cache.json").exists()
    second = verify_model_hashes(str(model))
    assert second["cache"]["hits"] == SMALL.shards and second["bytes_hashed"] == 0
    assert all(f["verdict"] == "match" for f in second["files"])
    # A changed file (new mtime/ctime) is hashed again, and the change is caught.
    corrupt(model / S1)
    third = verify_model_hashes(str(model))
    assert third["cache"]["hits"] == SMALL.shards - 1
    assert {f["name"]: f["verdict"] for f in third["files"]}[S1] == "mismatch"
    monkeypatch.setenv("K26_DOCTOR_NO_VERIFY_CACHE", "1")
    res = deep(tmp_path, model)
    assert res.details["cache"]["used"] is False and res.details["cache"]["hits"] == 0


def test_progress_line_and_terminal_output():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    p = Progress(10 * 1024 ** 3, 4, stream=out)
    p.start -= 2.0
    p.add(2 * 1024 ** 3)
    line = p.line()
    assert "2.0/10.0 GiB" in line and "GiB/s" in line and "ETA" in line and "[0/4 files]" in line
    assert out.getvalue().startswith("\r")
    quiet = io.StringIO()
    Progress(1, 1, stream=quiet).add(1)
    assert quiet.getvalue() == ""


def _doctor(*args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    env.pop("K26_DOCTOR_CONFIG", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "doctor", *args], capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_manifest_command_write_verify_export(tmp_path, model):
    out = _doctor("manifest", "write", str(model))
    assert out.returncode == 0, out.stderr
    man = json.loads((model / MANIFEST_NAME).read_text())
    assert man["kind"] == "k26-doctor-manifest" and man["files"][S1]["sha256"] == sha(model / S1)
    assert _doctor("manifest", "write", str(model)).returncode != 0  # no silent overwrite
    out = _doctor("manifest", "verify", str(model))
    assert out.returncode == 0 and out.stdout.count("match") == SMALL.shards
    exported = _doctor("manifest", "export", str(model)).stdout
    check = subprocess.run(["sha256sum", "-c", "-"], input=exported, cwd=model, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    corrupt(model / S2)
    out = _doctor("manifest", "verify", str(model), "--no-cache")
    assert out.returncode == 1 and f"mismatch      {S2}" in out.stdout


def test_manifest_from_hf_metadata(tmp_path, model):
    meta = model / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    for p in model.glob("model-*.safetensors"):
        (meta / (p.name + ".metadata")).write_text(f"{'ab' * 20}\n{sha(p)}\n{time.time()}\n")
    out = _doctor("manifest", "write", str(model), "--from-hf-metadata")
    assert out.returncode == 0, out.stderr
    (meta / (S1 + ".metadata")).unlink()
    out = _doctor("manifest", "write", str(model), "--from-hf-metadata", "--force")
    assert out.returncode != 0 and S1 in out.stderr


def test_check_cli_json_on_a_damaged_model(tmp_path, model):
    with open(model / S2, "r+b") as fh:
        fh.truncate(50)
    out = _doctor("check", "--only", "model.shards", "--model-path", str(model), "--format", "json")
    assert out.returncode == 1, out.stderr
    rep = json.loads(out.stdout)
    (res,) = [r for r in rep["results"] if r["id"] == "model.shards"]
    assert res["status"] == "fail" and S2 in res["summary"] and res["fixer"] == "model.redownload"
    assert "Traceback" not in out.stderr


# -- fixer ----------------------------------------------------------------------------------------

def _plan(ctx, check_id):
    res = run(ctx, check_id)
    ctx.results[check_id] = res
    return res, load(plugins=False).fixers["model.redownload"].plan(ctx, res)


def _damaged_with_metadata(model):
    with open(model / S2, "r+b") as fh:
        fh.truncate(100)
    (model / (S2 + ".aria2")).write_bytes(b"ctl")
    meta = model / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    for p in model.glob("model-*.safetensors"):
        (meta / (p.name + ".metadata")).write_text(f"{'c' * 40}\n{'0' * 64}\n{time.time()}\n")


def test_fixer_plan_downloads_to_staging_then_moves(tmp_path, model):
    _damaged_with_metadata(model)
    good = (tmp_path / "good.bin")
    good.write_bytes(b"the good bytes")
    ctx = make_ctx(tmp_path, model)
    ctx.settings.state_dir = str(tmp_path / "state")
    before = tree_state(model)
    _res, actions = _plan(ctx, "model.shards")
    assert tree_state(model) == before, "planning changed something"
    kinds = [type(a).__name__ for a in actions]
    assert kinds == ["WriteNewFile", "RunCommand", "MoveAside", "PlaceDownloaded"], kinds
    write, cmd, move_ctl, place = actions
    staging = place.staging
    assert staging.startswith(str(model / ".k26-doctor-download"))
    assert cmd.argv == ["hf", "download", "moonshotai/Kimi-K2.6", S2, "--local-dir", staging,
                        "--revision", "c" * 40]
    assert write.path.startswith(str(tmp_path / "state"))
    assert f"https://huggingface.co/moonshotai/Kimi-K2.6/resolve/{'c' * 40}/{S2}\n  dir={model}\n  out={S2}" \
        in write.new_text
    # Apply, with the download simulated as hf would leave it: the file and its metadata in staging.
    write.apply(tmp_path / "backups")
    (Path(staging) / ".cache/huggingface/download").mkdir(parents=True)
    (Path(staging) / S2).write_bytes(good.read_bytes())
    (Path(staging) / ".cache/huggingface/download" / (S2 + ".metadata")).write_text("new\n")
    damaged = (model / S2).read_bytes()
    for a in (move_ctl, place):
        a.apply(tmp_path / "backups")
    aside = Path(place.aside)
    assert (model / S2).read_bytes() == b"the good bytes"
    assert (aside / S2).read_bytes() == damaged and (aside / (S2 + ".aria2")).read_bytes() == b"ctl"
    assert (model / ".cache/huggingface/download" / (S2 + ".metadata")).read_text() == "new\n"
    assert (aside / ".cache/huggingface/download" / (S2 + ".metadata")).exists()
    assert Path(write.path).read_text() == write.new_text


def test_failed_download_leaves_the_model_as_it_was(tmp_path, model):
    from doctor.core.actions import ActionError

    _damaged_with_metadata(model)
    ctx = make_ctx(tmp_path, model)
    ctx.settings.state_dir = str(tmp_path / "state")
    _res, actions = _plan(ctx, "model.shards")
    before = tree_state(model)
    cmd = actions[1]
    cmd.argv = ["false"]  # the download fails (no network here): the plan stops at this step
    with pytest.raises(ActionError):
        cmd.apply(tmp_path / "backups")
    assert tree_state(model) == before


def test_stale_aria2_moved_aside_only_when_shard_verifies(tmp_path, model):
    write_manifest(model)
    (model / (S1 + ".aria2")).write_bytes(b"ctl")
    ctx = make_ctx(tmp_path, model, deep=True)
    res, actions = _plan(ctx, "model.shards")
    assert res.status.value == "fail"
    assert len(actions) == 1 and isinstance(actions[0], MoveAside) and actions[0].src.endswith(S1 + ".aria2")
    assert "verifies by sha256" in actions[0].summary
    # Without --deep nothing proves the shard whole: it is fetched again (aria2 would resume it).
    ctx = make_ctx(tmp_path, model, deep=False)
    res, actions = _plan(ctx, "model.shards")
    assert any(isinstance(a, RunCommand) and S1 in a.argv for a in actions)
    corrupt(model / S1)
    ctx = make_ctx(tmp_path, model, deep=True)
    res, actions = _plan(ctx, "model.shards")
    assert any(isinstance(a, RunCommand) and S1 in a.argv for a in actions)


def test_fixer_without_repo_plans_nothing_destructive(tmp_path, model):
    with open(model / S2, "r+b") as fh:
        fh.truncate(100)
    ctx = make_ctx(tmp_path, model)
    ctx.settings.profile["model"].pop("repo")
    _res, actions = _plan(ctx, "model.shards")
    assert actions == []


def test_no_hashing_without_deep(tmp_path, model, cache_dir):
    write_manifest(model)
    res = run(make_ctx(tmp_path, model, deep=False), "model.shards.deep")
    assert res.status.value == "skip" and "--deep" in res.summary
    assert not cache_dir.exists()


def test_check_deep_cli(tmp_path, model, cache_dir):
    write_manifest(model)
    env = {"K26_DOCTOR_VERIFY_CACHE_DIR": str(cache_dir)}
    out = _doctor("check", "--deep", "--only", "model.shards", "--model-path", str(model), "--format", "json",
                  env_extra=env)
    assert out.returncode == 0, out.stdout + out.stderr
    res = {r["id"]: r for r in json.loads(out.stdout)["results"]}
    assert res["model.shards"]["status"] == "pass"
    assert res["model.shards.deep"]["status"] == "pass"
    assert res["model.shards.deep"]["details"]["counts"]["match"] == SMALL.shards
    corrupt(model / S1)
    out = _doctor("check", "--deep", "--only", "model.shards", "--model-path", str(model), "--format", "json",
                  env_extra=env)
    res = {r["id"]: r for r in json.loads(out.stdout)["results"]}
    assert out.returncode == 1 and res["model.shards.deep"]["status"] == "fail" and S1 in res["model.shards.deep"][
        "summary"]


def test_verification_cache_forgets_changed_and_deleted_files(tmp_path, model, cache_dir):
    verify_model_hashes(str(model))
    entries = json.loads((cache_dir / "verify-cache.json").read_text())["entries"]
    assert len(entries) == SMALL.shards
    corrupt(model / S1)
    verify_model_hashes(str(model))
    entries = json.loads((cache_dir / "verify-cache.json").read_text())["entries"]
    assert len(entries) == SMALL.shards  # the old S1 entry was replaced, not kept beside the new one
    assert sorted(e["path"] for e in entries.values()) == sorted(str(p) for p in model.glob("model-*.safetensors"))
