"""Fault injection: an apply or revert that fails or dies at any step leaves every file as it was or
as planned, never in between, and the next run recovers.

Failures are injected through the engine's write hook (``Engine(hook=...)``, called at every step:
journal written, each tmp file written, each rename, verification), as an ``OSError(ENOSPC)`` (a
full disk: no small tmpfs here), as SIGKILL of a child process running the engine, and as a real
immutable/read-only file.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from patches_install import FIXTURE_SETS, Venv, fresh_venv, private_copy, rewrite

from doctor.core.fileio import TMP_SUFFIX
from doctor.sglang.patching import manifest, record
from doctor.sglang.patching.engine import Engine, EngineError
from doctor.sglang.patching.hashing import sha256_file
from doctor.sglang.patching.state import StateStore

ROOT = Path(__file__).resolve().parents[1]
TRITON = "sglang/srt/layers/attention/triton_backend.py"


@pytest.fixture
def venv(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Venv:
    return fresh_venv("0.5.23", tmp_path_factory, tmp_path / "venv")


def make_engine(venv: Venv, state: Path, hook: object = None) -> Engine:
    pset = manifest.resolve("t-0.5.23", str(FIXTURE_SETS))
    return Engine(pset, record.installed_in(venv.site_packages), state_dir=str(state), hook=hook)  # type: ignore[arg-type]


def hashes(eng: Engine) -> dict[str, str | None]:
    return {p: (sha256_file(eng.root / p) if (eng.root / p).exists() else None) for p in eng.pset.chains()}


def endpoints(eng: Engine) -> tuple[dict[str, str | None], dict[str, str | None]]:
    chains = eng.pset.chains()
    return ({p: c[0][1].before for p, c in chains.items()}, {p: c[-1][1].after for p, c in chains.items()})


def assert_each_old_or_new(eng: Engine) -> None:
    old, new = endpoints(eng)
    for path, digest in hashes(eng).items():
        assert digest in (old[path], new[path]), f"{path} is neither as it was nor as planned"


def no_tmp_left(eng: Engine) -> bool:
    return not any(p.name.endswith(TMP_SUFFIX) for path in eng.pset.chains()
                   for p in (eng.root / path).parent.iterdir())


def journal(eng: Engine, state: Path) -> dict | None:
    stores = StateStore.existing(str(state), eng.installed.site_packages)
    return stores[0].read_journal() if stores else None


def count_events(venv: Venv, state: Path, op: str) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    eng = make_engine(venv, state, hook=lambda ev, path: seen.append((ev, path)))
    getattr(eng, op)()
    return seen


@pytest.mark.network
def test_enospc_at_every_step_rolls_back(venv: Venv, tmp_path: Path) -> None:
    state = tmp_path / "state"
    for op, start_state in (("apply", "pristine"), ("revert", "applied")):
        if op == "revert":
            make_engine(venv, state).apply()
        events = count_events(venv, state, op)
        getattr(make_engine(venv, state), "revert" if op == "apply" else "apply")()  # back to the start
        assert len(events) >= 10
        for k in range(len(events)):
            calls = {"n": 0}

            def hook(event: str, path: str, k: int = k, calls: dict = calls) -> None:
                calls["n"] += 1
                if calls["n"] == k + 1:
                    raise OSError(errno.ENOSPC, "No space left on device", path)

            eng = make_engine(venv, state, hook)
            before = hashes(eng)
            with pytest.raises(EngineError, match="rolled back"):
                getattr(eng, op)()
            assert hashes(eng) == before, f"{op}: event {k} {events[k]} left a change behind"
            assert journal(eng, state) is None and no_tmp_left(eng)
            assert eng.status().overall == start_state


@pytest.mark.network
def test_full_disk_that_stays_full_leaves_a_journal_that_the_next_run_recovers(venv: Venv, tmp_path: Path) -> None:
    state = tmp_path / "state"
    events = count_events(venv, state, "apply")
    make_engine(venv, state).revert()
    writes = [i for i, (ev, _) in enumerate(events) if ev == "replaced"]
    k = writes[1] + 1  # after two files were replaced, every later write fails, the roll-back's too
    calls = {"n": 0}

    def hook(event: str, path: str) -> None:
        calls["n"] += 1
        if calls["n"] > k and event == "write":
            raise OSError(errno.ENOSPC, "No space left on device", path)

    eng = make_engine(venv, state, hook)
    with pytest.raises(EngineError, match=r"could not be rolled back completely.*next apply or revert"):
        eng.apply()
    assert_each_old_or_new(eng)
    doc = journal(eng, state)
    assert doc is not None and doc["op"] == "apply"
    ev = eng.status()
    assert ev.journal and not ev.ok
    assert not make_engine(venv, state).plan_apply().ok  # a plan waits for the recovery
    # space is back: the next run rolls back first, then applies
    fixed = make_engine(venv, state)
    out = fixed.apply()
    assert journal(fixed, state) is None and fixed.status().ok and out.changed
    history = sorted((StateStore.existing(str(state), fixed.installed.site_packages)[0].history).glob("*.json"))
    assert any("recovered" in json.loads(p.read_text())["outcome"] for p in history)


CHILD = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from doctor.sglang.patching import manifest, record
from doctor.sglang.patching.engine import Engine
site, state, sets, op, k = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
n = [0]
def hook(event, path):
    n[0] += 1
    if n[0] == k + 1:
        os.kill(os.getpid(), signal.SIGKILL)
eng = Engine(manifest.resolve("t-0.5.23", sets), record.installed_in(site), state_dir=state, hook=hook)
getattr(eng, op)()
"""


@pytest.mark.network
@pytest.mark.parametrize("op", ["apply", "revert"])
def test_killed_at_every_step_then_recovered(venv: Venv, tmp_path: Path, op: str) -> None:
    state = tmp_path / "state"
    events = count_events(venv, state, op)
    undo = "revert" if op == "apply" else "apply"
    getattr(make_engine(venv, state), undo)()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    for k in range(len(events)):
        res = subprocess.run([sys.executable, str(script), str(ROOT), str(venv.site_packages), str(state),
                              str(FIXTURE_SETS), op, str(k)], capture_output=True, text=True, timeout=60)
        assert res.returncode == -signal.SIGKILL, res.stderr[-500:]
        eng = make_engine(venv, state)
        assert_each_old_or_new(eng)
        assert journal(eng, state) is not None  # every event comes after the journal was written
        msg = eng.recover()
        assert msg and "rolled back" in msg
        assert journal(eng, state) is None and no_tmp_left(eng)
        assert eng.status().overall == ("pristine" if op == "apply" else "applied"), f"event {k} {events[k]}"
    getattr(make_engine(venv, state), op)()
    assert make_engine(venv, state).status().overall == ("applied" if op == "apply" else "pristine")


@pytest.mark.network
def test_read_only_file(venv: Venv, tmp_path: Path) -> None:
    """A file that cannot be replaced: nothing changes (refused up front, or rolled back), then it works."""
    state = tmp_path / "state"
    eng = make_engine(venv, state)
    target = eng.root / TRITON
    private_copy(target)
    before = hashes(eng)
    immutable = False
    if os.geteuid() == 0:
        immutable = subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode == 0
        if not immutable:
            pytest.skip("running as root without chattr +i support: permissions cannot stop a write")
        undo = ["chattr", "-i", str(target)]
    else:
        os.chmod(target.parent, 0o555)
        undo = ["chmod", "755", str(target.parent)]
    try:
        with pytest.raises(EngineError) as info:
            eng.apply()
        assert "Operation not permitted" in str(info.value) or "cannot write in" in str(info.value)
        assert hashes(eng) == before
        assert journal(eng, state) is None and no_tmp_left(eng)
    finally:
        subprocess.run(undo, check=True)
    eng.apply()
    assert eng.status().ok


@pytest.mark.network
def test_recovery_refuses_a_corrupt_backup_and_a_file_changed_meanwhile(venv: Venv, tmp_path: Path) -> None:
    state = tmp_path / "state"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    events = count_events(venv, state, "apply")
    make_engine(venv, state).revert()
    k = [i for i, (ev, _) in enumerate(events) if ev == "replaced"][1] + 1  # killed after two renames
    res = subprocess.run([sys.executable, str(script), str(ROOT), str(venv.site_packages), str(state),
                          str(FIXTURE_SETS), "apply", str(k)], capture_output=True, text=True, timeout=60)
    assert res.returncode == -signal.SIGKILL
    eng = make_engine(venv, state)
    doc = journal(eng, state)
    assert doc is not None
    replaced = [f for f in doc["files"] if hashes(eng)[f["path"]] == f["new"]]
    victim = next(f for f in replaced if f["old"])
    store = StateStore.existing(str(state), eng.installed.site_packages)[0]
    good = store.object_path(victim["old"]).read_bytes()
    store.object_path(victim["old"]).write_bytes(b"corrupted")
    snapshot = hashes(eng)
    with pytest.raises(EngineError, match="missing or corrupt"):
        eng.recover()
    assert journal(eng, state) is not None and hashes(eng)[victim["path"]] == snapshot[victim["path"]]
    store.object_path(victim["old"]).write_bytes(good)
    other = next(f for f in doc["files"] if f["path"] != victim["path"] and f["old"] and f["new"])
    target = eng.root / other["path"]
    rewrite(target, b"someone else's edit\n")  # never write into a hard-linked pristine inode
    with pytest.raises(EngineError, match="neither as it was"):
        eng.recover()
    assert target.read_bytes() == b"someone else's edit\n" and journal(eng, state) is not None


def test_oversized_files_are_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One capped reader (``fileio.read_capped``) for the manifest, the diffs and RECORD: a file larger than
    its cap is an error naming it, never read whole."""
    from doctor.core.fileio import read_capped

    big = tmp_path / "big"
    big.write_bytes(b"x" * 11)
    assert read_capped(big, 11, "a thing") == b"x" * 11
    with pytest.raises(OSError) as info:
        read_capped(big, 10, "a thing")
    assert info.value.errno == errno.EFBIG and info.value.strerror == "larger than 10 bytes: not a thing"
    dist = tmp_path / "sglang-0.5.23.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    (dist / "RECORD").write_bytes(b"a,,\n" * 8)
    monkeypatch.setattr(record, "MAX_RECORD_BYTES", 16)
    with pytest.raises(record.RecordError, match=r"cannot read .*RECORD: larger than 16 bytes: not a RECORD"):
        record.load_installed(dist)
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / manifest.MANIFEST_NAME).write_text("{}" + " " * 64)
    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 16)
    with pytest.raises(manifest.ManifestError, match=r"manifest\.json: larger than 16 bytes: not a manifest"):
        manifest.load(tmp_path / "set")
