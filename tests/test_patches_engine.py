"""The patch engine on real SGLang installs (0.5.23 and the pre-0.5.14 layout of 0.5.13.post1)."""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import sys
from pathlib import Path

import pytest
from patches_install import FIXTURE_SETS, Venv, fresh_venv, rewrite

from doctor.sglang.patching import generate, manifest, record
from doctor.sglang.patching.engine import Engine, EngineError
from doctor.sglang.patching.hashing import sha256_file
from doctor.sglang.patching.state import StateError, StateStore
from doctor.sglang.patching.status import APPLIED, DRIFTED, MISSING, PARTIAL, PRISTINE

SPEC = "sglang/srt/speculative/spec_info.py"
TRITON = "sglang/srt/layers/attention/triton_backend.py"
CREATED = "sglang/srt/speculative/k26_marker.py"
DELETED = "sglang/srt/speculative/lilicorr_utils.py"


@pytest.fixture
def v523(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Venv:
    return fresh_venv("0.5.23", tmp_path_factory, tmp_path / "venv")


@pytest.fixture
def v513(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Venv:
    return fresh_venv("0.5.13.post1", tmp_path_factory, tmp_path / "venv13")


def engine(venv: Venv, state: Path, set_name: str = "t-0.5.23", **kw: object) -> Engine:
    pset = manifest.resolve(set_name, str(FIXTURE_SETS))
    return Engine(pset, record.installed_in(venv.site_packages), state_dir=str(state), **kw)


def snapshot_files(eng: Engine) -> dict[str, str | None]:
    out = {}
    for path in eng.pset.chains():
        p = eng.root / path
        out[path] = sha256_file(p) if p.exists() else None
    return out


def assert_matches_record(eng: Engine) -> None:
    """Every file of the set is byte-exact what RECORD lists (or absent when RECORD does not list it)."""
    for path in eng.pset.chains():
        listed, digest = eng.installed.record_hash(path)
        p = eng.root / path
        if listed:
            assert p.exists() and sha256_file(p) == digest, path
        else:
            assert not p.exists(), path


@pytest.mark.network
def test_pristine_detected_from_record(v523: Venv, tmp_path: Path) -> None:
    eng = engine(v523, tmp_path / "state")
    ev = eng.status()
    assert ev.overall == PRISTINE and ev.version_ok and not ev.problems
    by = {f.path: f for f in ev.files}
    assert by[SPEC].record == by[SPEC].pristine == by[SPEC].sha256  # RECORD, manifest and disk agree
    assert by[CREATED].state == PRISTINE and by[CREATED].sha256 is None and not by[CREATED].in_record
    rewrite(eng.root / TRITON, (eng.root / TRITON).read_bytes() + b"# local edit\n")
    ev = eng.status()
    assert {f.path: f.state for f in ev.files}[TRITON] == DRIFTED and ev.overall == DRIFTED
    assert not ev.ok


@pytest.mark.network
def test_apply_reapply_revert_byte_exact(v523: Venv, tmp_path: Path) -> None:
    eng = engine(v523, tmp_path / "state")
    out = eng.apply()
    assert sorted(out.changed) == sorted(eng.pset.chains())
    ev = eng.status()
    assert ev.ok and ev.overall == APPLIED and all(p.state == APPLIED for p in ev.patches)
    for path, chain in eng.pset.chains().items():
        want = chain[-1][1].after
        assert (sha256_file(eng.root / path) if (eng.root / path).exists() else None) == want
    assert not (eng.root / DELETED).exists()
    assert b"K26_TEST_PATCH_0002" in (eng.root / SPEC).read_bytes()
    # second apply: nothing to do, nothing touched
    mtimes = {p: os.stat(eng.root / p).st_mtime_ns for p in eng.pset.chains() if (eng.root / p).exists()}
    plan = eng.plan_apply()
    assert plan.ok and plan.changes == []
    assert eng.apply().changed == []
    assert mtimes == {p: os.stat(eng.root / p).st_mtime_ns for p in eng.pset.chains() if (eng.root / p).exists()}
    # revert: RECORD's bytes again, the created module gone, the deleted one back
    eng.revert()
    assert_matches_record(eng)
    assert eng.status().overall == PRISTINE
    store = StateStore.existing(str(tmp_path / "state"), eng.installed.site_packages)[0]
    assert store.read_journal() is None and len(list(store.history.glob("*.json"))) == 2


@pytest.mark.network
def test_mode_kept_and_stale_bytecode_removed(v523: Venv, tmp_path: Path) -> None:
    eng = engine(v523, tmp_path / "state")
    target = eng.root / TRITON
    rewrite(target, target.read_bytes())
    os.chmod(target, 0o640)
    # where an interpreter without a pycache prefix writes it (a caller's PYTHONPYCACHEPREFIX would move it)
    beside = target.parent / "__pycache__" / f"{target.stem}.{sys.implementation.cache_tag}.pyc"
    pyc = Path(py_compile.compile(str(target), cfile=str(beside), doraise=True))
    assert pyc.exists() and pyc.parent.name == "__pycache__"
    out = eng.apply()
    assert str(pyc) in out.removed_bytecode and not pyc.exists()
    assert os.stat(target).st_mode & 0o7777 == 0o640


@pytest.mark.network
def test_version_gating_with_the_old_layout(v513: Venv, tmp_path: Path) -> None:
    """A set for 0.5.23 refuses 0.5.13.post1 before reading a diff; the set made for it works."""
    wrong = engine(v513, tmp_path / "state", "t-0.5.23")
    before = snapshot_files(wrong)
    ev = wrong.status()
    assert not ev.version_ok and ev.version == "0.5.13.post1"
    plan = wrong.plan_apply(force=True)
    assert not plan.ok and any("not one patch set t-0.5.23 is for" in r for r in plan.refusals)
    with pytest.raises(EngineError):
        wrong.apply(force=True)
    assert snapshot_files(wrong) == before
    right = engine(v513, tmp_path / "state", "t-0.5.13")
    assert right.status().overall == PRISTINE
    right.apply()
    assert right.status().ok
    assert (right.root / "sglang/srt/model_executor/cuda_graph_runner.py").read_bytes().endswith(
        b"pre-0.5.14 layout\n")
    right.revert()
    assert_matches_record(right)


@pytest.mark.network
def test_drift_refuses_apply_before_writing(v523: Venv, tmp_path: Path) -> None:
    eng = engine(v523, tmp_path / "state")
    edited = (eng.root / TRITON).read_bytes().replace(b"\nimport ", b"\n# by hand\nimport ", 1)
    rewrite(eng.root / TRITON, edited)
    before = snapshot_files(eng)
    plan = eng.plan_apply()
    assert not plan.ok and any(TRITON in r and "drifted" in r for r in plan.refusals)
    with pytest.raises(EngineError, match="drifted"):
        eng.apply()
    assert snapshot_files(eng) == before
    assert not StateStore.existing(str(tmp_path / "state"), eng.installed.site_packages) or \
        StateStore.existing(str(tmp_path / "state"), eng.installed.site_packages)[0].read_journal() is None
    # --force without a stored original: the diff goes onto the edited file (offset, no fuzz), backed up
    out = eng.apply(force=True)
    assert TRITON in out.changed
    store = StateStore.existing(str(tmp_path / "state"), eng.installed.site_packages)[0]
    assert store.get_object(before[TRITON]) == edited  # the hand-edited bytes are kept
    data = (eng.root / TRITON).read_bytes()
    assert b"# by hand" in data and b"k26-doctor test patch 0002: near the top" in data
    assert {f.path: f.state for f in eng.status().files}[TRITON] == DRIFTED  # honest: not the post-image


@pytest.mark.network
def test_force_rebuilds_from_a_stored_original(v523: Venv, tmp_path: Path) -> None:
    eng = engine(v523, tmp_path / "state")
    eng.apply()
    eng.revert()  # the originals are now in the object store
    rewrite(eng.root / TRITON, b"garbage\n")
    assert not eng.plan_apply().ok
    eng.apply(force=True)
    assert eng.status().ok
    # revert --force over a drifted file puts RECORD's bytes back from the store
    rewrite(eng.root / SPEC, b"edited\n")
    assert not eng.plan_revert().ok
    eng.revert(force=True)
    assert_matches_record(eng)


@pytest.mark.network
def test_missing_file(v523: Venv, tmp_path: Path) -> None:
    eng = engine(v523, tmp_path / "state")
    (eng.root / TRITON).unlink()
    ev = eng.status()
    assert {f.path: f.state for f in ev.files}[TRITON] == MISSING and ev.overall == MISSING
    plan = eng.plan_apply()
    assert not plan.ok and any("missing" in r and "force-reinstall" in r for r in plan.refusals)


@pytest.mark.network
def test_missing_file_restored_by_revert_from_the_store(v523: Venv, tmp_path: Path) -> None:
    eng = engine(v523, tmp_path / "state")
    eng.apply()
    (eng.root / TRITON).unlink()
    eng.revert()  # the original is in the store: restored without --force (no edit is lost)
    assert_matches_record(eng)


@pytest.mark.network
def test_partial_chain_and_selection(v523: Venv, tmp_path: Path) -> None:
    eng = engine(v523, tmp_path / "state")
    assert not eng.plan_apply(only=["triton-and-chain"]).ok  # builds on spec-marker (spec_info.py chain)
    assert not eng.plan_apply(only=["nope"]).ok
    eng.apply(only=["spec-marker"])
    ev = eng.status()
    assert {p.id: p.state for p in ev.patches} == {"spec-marker": APPLIED, "triton-and-chain": PRISTINE,
                                                   "eol-and-delete": PRISTINE}
    assert {f.path: f.state for f in ev.files}[SPEC] == PARTIAL and ev.overall == PARTIAL
    eng.apply()
    assert eng.status().ok
    assert not eng.plan_revert(only=["spec-marker"]).ok  # triton-and-chain builds on it
    eng.revert(only=["eol-and-delete"])
    assert {p.id: p.state for p in eng.status().patches}["eol-and-delete"] == PRISTINE
    eng.revert()
    assert_matches_record(eng)


@pytest.mark.network
def test_lock_keeps_two_runs_apart(v523: Venv, tmp_path: Path) -> None:
    eng = engine(v523, tmp_path / "state")
    store = StateStore.open(str(tmp_path / "state"), eng.installed.site_packages)
    before = snapshot_files(eng)
    with store.lock("test holder"):
        with pytest.raises(StateError, match="test holder"):
            eng.apply()
    assert snapshot_files(eng) == before
    eng.apply()
    assert eng.status().ok


@pytest.mark.network
def test_state_dir_falls_back_to_home(v523: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    eng = engine(v523, blocker / "state")
    out = eng.apply()
    assert out.history and out.history.startswith(str(tmp_path / "home" / ".local/state/k26-doctor"))
    eng.revert()
    assert_matches_record(eng)


@pytest.mark.network
def test_record_mismatch_is_refused(v523: Venv, tmp_path: Path) -> None:
    """A set whose 'before' is not RECORD's hash was made for another build: refused, even with --force."""
    d = tmp_path / "sets" / "other"
    shutil.copytree(FIXTURE_SETS / "t-0.5.23", d)
    doc = json.loads((d / "manifest.json").read_text())
    doc["name"] = "other"
    assert doc["patches"][1]["files"][0]["path"] == TRITON  # first in its chain
    doc["patches"][1]["files"][0]["before"] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(doc))
    pset = manifest.resolve("other", str(tmp_path / "sets"))
    eng = Engine(pset, record.installed_in(v523.site_packages), state_dir=str(tmp_path / "state"))
    ev = eng.status()
    assert any(TRITON in p and "another build" in p for p in ev.problems) and not ev.ok
    before = snapshot_files(eng)
    plan = eng.plan_apply(force=True)
    assert not plan.ok and plan.changes == []
    assert snapshot_files(eng) == before


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(sglang="not a spec"), "not a valid version specifier"),
    (lambda d: d["patches"][0]["files"][0].update(path="../../etc/passwd"), "normalised path"),
    (lambda d: d["patches"][0]["files"][0].update(before="abc"), "sha256"),
    (lambda d: d["patches"][0].update(id="spec marker"), "without spaces"),
    (lambda d: d["patches"].append(dict(d["patches"][0])), "duplicate patch id"),
    (lambda d: d["patches"][1]["files"][1].update(before="0" * 64), "not the 'after' of the earlier patch"),
    (lambda d: d["patches"][0].update(diff="9999-absent.patch"), "not in"),
    (lambda d: d.pop("patches"), "non-empty list"),
])
def test_bad_manifests_are_clear_errors(tmp_path: Path, mutate: object, match: str) -> None:
    d = tmp_path / "t-0.5.23"
    shutil.copytree(FIXTURE_SETS / "t-0.5.23", d)
    doc = json.loads((d / "manifest.json").read_text())
    mutate(doc)  # type: ignore[operator]
    (d / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(manifest.ManifestError, match=match):
        manifest.load(d)


def test_truncated_manifest_and_unknown_set(tmp_path: Path) -> None:
    d = tmp_path / "broken"
    d.mkdir()
    (d / "manifest.json").write_text('{"name": "broken", "patches": [')
    with pytest.raises(manifest.ManifestError, match="not valid JSON"):
        manifest.resolve("broken", str(tmp_path))
    with pytest.raises(manifest.ManifestError, match=r"not found.*available: .*t-0\.5\.13, t-0\.5\.23"):
        manifest.resolve("nope", str(FIXTURE_SETS))


@pytest.mark.network
def test_committed_fixture_manifests_are_what_the_generator_makes(tmp_path_factory: pytest.TempPathFactory,
                                                                  tmp_path: Path) -> None:
    for set_name, version in (("t-0.5.23", "0.5.23"), ("t-0.5.13", "0.5.13.post1")):
        venv = fresh_venv(version, tmp_path_factory, tmp_path / set_name)
        pset = generate.generate(FIXTURE_SETS / set_name, record.installed_in(venv.site_packages), write=False)
        assert pset.to_dict() == json.loads((FIXTURE_SETS / set_name / "manifest.json").read_text())


@pytest.mark.network
def test_generator_writes_a_manifest_and_refuses_a_patched_install(v523: Venv, tmp_path: Path) -> None:
    d = tmp_path / "fresh-set"
    d.mkdir()
    for p in (FIXTURE_SETS / "t-0.5.23").glob("*.patch"):
        shutil.copy(p, d)
    installed = record.installed_in(v523.site_packages)
    pset = generate.generate(d, installed)
    assert pset.sglang == "==0.5.23" and pset.patches[0].id == "0001-spec-marker"
    ref = manifest.load(FIXTURE_SETS / "t-0.5.23")
    assert [p.files for p in manifest.load(d).patches] == [p.files for p in ref.patches]
    rewrite(v523.site_packages / TRITON, b"# not pristine\n")
    with pytest.raises(generate.GenerateError, match="differs from RECORD"):
        generate.generate(d, installed, write=False)


@pytest.mark.network
def test_a_patch_that_creates_a_package_directory(v523: Venv, tmp_path: Path) -> None:
    """New directories are made inside the transaction and removed again by a roll-back or revert."""
    d = tmp_path / "sets" / "newpkg"
    d.mkdir(parents=True)
    from doctor.sglang.patching import udiff

    (d / "0001-newpkg.patch").write_bytes(udiff.make_diff("sglang/srt/k26pkg/sub/__init__.py", None, b"X = 1\n"))
    installed = record.installed_in(v523.site_packages)
    generate.generate(d, installed)
    eng = Engine(manifest.resolve("newpkg", str(tmp_path / "sets")), installed, state_dir=str(tmp_path / "state"))
    eng.apply()
    assert (v523.site_packages / "sglang/srt/k26pkg/sub/__init__.py").read_bytes() == b"X = 1\n"
    eng.revert()
    assert not (v523.site_packages / "sglang/srt/k26pkg/sub/__init__.py").exists()

    fired = []

    def fail_at_write(event: str, path: str) -> None:
        if event == "replaced" and not fired:
            fired.append(path)
            raise OSError(28, "No space left on device", path)

    with pytest.raises(EngineError, match="rolled back"):
        Engine(eng.pset, installed, state_dir=str(tmp_path / "state"), hook=fail_at_write).apply()
    assert not (v523.site_packages / "sglang/srt/k26pkg").exists()


@pytest.mark.network
def test_owner_kept_and_symlinks_refused(v523: Venv, tmp_path: Path) -> None:
    eng = engine(v523, tmp_path / "state")
    target = eng.root / TRITON
    if os.geteuid() == 0:
        rewrite(target, target.read_bytes())
        os.chown(target, 4321, 4321)  # a venv owned by the service user, patched by root
    link_target = tmp_path / "elsewhere.py"
    spec = eng.root / SPEC
    link_target.write_bytes(spec.read_bytes())
    spec.unlink()
    spec.symlink_to(link_target)
    plan = eng.plan_apply()
    assert not plan.ok and any("symbolic link" in r for r in plan.refusals)
    spec.unlink()
    os.replace(link_target, spec)
    eng.apply()
    if os.geteuid() == 0:
        st = os.stat(target)
        assert (st.st_uid, st.st_gid) == (4321, 4321)


@pytest.mark.network
def test_bad_installs_are_clear_errors(v523: Venv, tmp_path: Path) -> None:
    from doctor.sglang.patching import locate

    dist = next(v523.site_packages.glob("sglang-*.dist-info"))
    rewrite(dist / "RECORD", b"\xff\xfe not utf-8")
    with pytest.raises(record.RecordError, match="not a valid RECORD"):
        record.installed_in(v523.site_packages)
    with pytest.raises(locate.LocateError, match="not a valid RECORD"):
        locate.locate(v523.python)
    (dist / "METADATA").unlink()
    with pytest.raises(record.RecordError, match="METADATA"):
        record.installed_in(v523.site_packages)
    (v523.site_packages / "sglang-0.5.22.dist-info").mkdir()
    with pytest.raises(locate.LocateError, match="half-finished upgrade"):
        locate.locate(v523.python)
    hung = tmp_path / "hung-python"
    hung.write_text("#!/bin/sh\nsleep 30\n")
    hung.chmod(0o755)
    with pytest.raises(locate.LocateError, match="did not finish"):
        locate.locate(str(hung), timeout=1)
    with pytest.raises(locate.LocateError, match="could not start"):
        locate.locate(str(tmp_path / "no-python"))


@pytest.mark.network
def test_revert_needs_no_backups(v523: Venv, tmp_path: Path) -> None:
    """Applied by hand (GNU patch, another machine's doctor): revert rebuilds RECORD's bytes from the diffs."""
    engine(v523, tmp_path / "state-a").apply()
    shutil.rmtree(tmp_path / "state-a")
    eng = engine(v523, tmp_path / "state-b")
    assert eng.status().ok
    eng.revert()
    assert_matches_record(eng)
