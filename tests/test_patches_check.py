"""``sglang.patches`` (check, fact, fixer) and ``k26-doctor patches`` on real SGLang installs."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import doctor_env, make_context, run_check, run_doctor
from interpreters import find_python
from patches_install import FIXTURE_SETS, Venv, fresh_venv, rewrite

from doctor.core.registry import load
from doctor.core.result import Status
from doctor.core.settings import resolve
from doctor.sglang.patching import manifest, record
from doctor.sglang.patching.engine import Engine, EngineError
from doctor.sglang.patching.hashing import sha256_file

TRITON = "sglang/srt/layers/attention/triton_backend.py"


@pytest.fixture
def v523(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Venv:
    return fresh_venv("0.5.23", tmp_path_factory, tmp_path / "venv")


def settings_for(tmp_path: Path, python: str, set_name: str = "t-0.5.23", profile: str = "b300-tp8-ddtree"):
    """Settings as a site configures them: a config file naming the set, its directory and the state dir."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[doctor]\nprofile = "{profile}"\npython = "{python}"\npatches_dir = "{FIXTURE_SETS}"\n'
                   f'state_dir = "{tmp_path / "state"}"\n\n[patches]\nset = "{set_name}"\ndir = "{FIXTURE_SETS}"\n')
    return resolve({"config": str(cfg)}, environ={})


def judge(settings) -> tuple[object, object]:
    ctx = make_context(settings, live=True)
    return run_check("sglang.patches", ctx), ctx


def engine(venv: Venv, tmp_path: Path, hook=None) -> Engine:
    return Engine(manifest.resolve("t-0.5.23", str(FIXTURE_SETS)), record.installed_in(venv.site_packages),
                  state_dir=str(tmp_path / "state"), hook=hook)


def test_profile_without_a_set_skips(tmp_path: Path) -> None:
    settings = resolve({"profile": "b200-tp8"}, environ={})
    res, _ = judge(settings)
    assert res.status is Status.SKIP and "uses no SGLang patch set" in res.summary


@pytest.mark.network
def test_pristine_fails_with_the_command_then_passes_once_applied(v523: Venv, tmp_path: Path) -> None:
    settings = settings_for(tmp_path, v523.python)
    res, _ = judge(settings)
    assert res.status is Status.FAIL
    assert "t-0.5.23 pristine (0/3 patches, 0/5 files applied); 5 pristine: " in res.summary and TRITON in res.summary
    assert any(c.startswith("k26-doctor patches apply --profile b300-tp8-ddtree --python ") for c in
               res.remediation.commands)
    assert res.details["files"][TRITON] == "pristine"
    engine(v523, tmp_path).apply()
    res, _ = judge(settings)
    assert res.status is Status.PASS and "all 3 patches applied" in res.summary


@pytest.mark.network
def test_drift_fails_naming_the_file(v523: Venv, tmp_path: Path) -> None:
    engine(v523, tmp_path).apply()
    rewrite(v523.site_packages / TRITON, b"# edited\n")
    res, _ = judge(settings_for(tmp_path, v523.python))
    assert res.status is Status.FAIL and f"1 drifted: {TRITON}" in res.summary
    assert any("--force" in c for c in res.remediation.commands)


@pytest.mark.network
def test_version_mismatch_fails(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    old = fresh_venv("0.5.13.post1", tmp_path_factory, tmp_path / "v13")
    res, _ = judge(settings_for(tmp_path, old.python))
    assert res.status is Status.FAIL and "is for sglang ==0.5.23, installed 0.5.13.post1" in res.summary


@pytest.mark.network
def test_unusable_set_and_interpreter_fail_clearly(v523: Venv, tmp_path: Path) -> None:
    res, _ = judge(settings_for(tmp_path, v523.python, set_name="no-such-set"))
    assert res.status is Status.FAIL and "cannot be used" in res.summary and "not found" in res.summary
    res, _ = judge(settings_for(tmp_path, str(tmp_path / "nope" / "python")))
    assert res.status is Status.FAIL and "cannot be judged" in res.summary
    bare = tmp_path / "bare"
    bare.mkdir()
    os.symlink(Path(v523.python).resolve(), bare / "python")  # an interpreter without sglang
    res, _ = judge(settings_for(tmp_path, str(bare / "python")))
    assert res.status is Status.FAIL and "not installed" in res.summary


@pytest.mark.network
def test_snapshot_replays_the_verdict(v523: Venv, tmp_path: Path) -> None:
    settings = settings_for(tmp_path, v523.python)
    live, ctx = judge(settings)
    fact = json.loads(json.dumps(ctx.fact("sglang_patches")))
    shutil.rmtree(v523.root)  # the host is gone; the snapshot still judges it
    replayed = run_check("sglang.patches", make_context(settings, facts={"sglang_patches": fact}))
    assert (replayed.status, replayed.summary) == (live.status, live.summary)


@pytest.mark.network
def test_interrupted_run_fails_the_check(v523: Venv, tmp_path: Path) -> None:
    n = {"k": 0}

    def full_disk(event: str, path: str) -> None:
        n["k"] += 1
        if n["k"] > 4 and event == "write":
            raise OSError(errno.ENOSPC, "No space left on device", path)

    with pytest.raises(EngineError):
        engine(v523, tmp_path, full_disk).apply()
    res, _ = judge(settings_for(tmp_path, v523.python))
    assert res.status is Status.FAIL and "interrupted" in res.summary


@pytest.mark.network
def test_fixer_plans_shows_diffs_and_applies(v523: Venv, tmp_path: Path) -> None:
    load(plugins=False)
    settings = settings_for(tmp_path, v523.python)
    res, ctx = judge(settings)
    fx = load(plugins=False).fixers["sglang.patches.apply"]
    (action,) = fx.plan(ctx, res)
    text = "\n".join(action.details())
    assert "+# k26-doctor test patch 0002: near the top" in text and TRITON in text
    original = sha256_file(v523.site_packages / TRITON)
    backup_dir = tmp_path / "fix-backups"
    msg = action.apply(backup_dir)
    assert "applied patch set t-0.5.23: 5 file(s) changed" in msg
    copies = list(backup_dir.rglob("triton_backend.py"))
    assert len(copies) == 1 and sha256_file(copies[0]) == original
    res, _ = judge(settings)
    assert res.status is Status.PASS
    assert fx.plan(judge(settings)[1], res) == []


@pytest.mark.network
def test_fixer_refuses_drift_and_a_changed_plan(v523: Venv, tmp_path: Path) -> None:
    load(plugins=False)
    settings = settings_for(tmp_path, v523.python)
    res, ctx = judge(settings)
    (action,) = load(plugins=False).fixers["sglang.patches.apply"].plan(ctx, res)
    rewrite(v523.site_packages / TRITON, b"# edited after the plan was shown\n")
    from doctor.core.actions import ActionError

    with pytest.raises(ActionError, match="drifted"):
        action.apply(tmp_path / "b")
    with pytest.raises(EngineError, match="drifted"):
        load(plugins=False).fixers["sglang.patches.apply"].plan(*judge(settings)[::-1])


# -- the CLI, as users run it --------------------------------------------------------------------

def cli(venv: Venv, tmp_path: Path, *args: str):
    return run_doctor("patches", *args, "--python", venv.python, "--patches-dir", str(FIXTURE_SETS),
                      "--state-dir", str(tmp_path / "state"), "--set", "t-0.5.23", env=doctor_env())


@pytest.mark.network
def test_cli_status_apply_revert(v523: Venv, tmp_path: Path) -> None:
    res = cli(v523, tmp_path, "status")
    assert res.returncode == 1 and "overall: pristine (0/3 patches, 0/5 files applied)" in res.stdout
    before = sha256_file(v523.site_packages / TRITON)
    res = cli(v523, tmp_path, "apply")  # stdin is not a terminal and no --yes
    assert res.returncode == 2 and "without --yes" in res.stderr and "plan: apply 5 file(s)" in res.stdout
    assert sha256_file(v523.site_packages / TRITON) == before
    res = cli(v523, tmp_path, "apply", "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "now: applied" in res.stdout
    res = cli(v523, tmp_path, "apply", "--yes")
    assert res.returncode == 0 and "nothing to apply" in res.stdout
    res = cli(v523, tmp_path, "status")
    assert res.returncode == 0 and "last run: apply of t-0.5.23, done" in res.stdout
    res = cli(v523, tmp_path, "status", "--format", "json")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["ok"] and doc["overall"] == "applied" and len(doc["files"]) == 5
    res = cli(v523, tmp_path, "revert", "--yes")
    assert res.returncode == 0 and "now: pristine" in res.stdout
    assert sha256_file(v523.site_packages / TRITON) == before


@pytest.mark.network
def test_cli_refusals_and_usage_errors(v523: Venv, tmp_path: Path) -> None:
    rewrite(v523.site_packages / TRITON, b"# edited\n")
    res = cli(v523, tmp_path, "apply", "--yes")
    assert res.returncode == 1 and "refused" in res.stdout and "drifted" in res.stdout
    res = run_doctor("patches", "status", "--python", v523.python, "--set", "no-such-set")
    assert res.returncode == 2 and "not found" in res.stderr
    res = run_doctor("patches", "status", "--python", v523.python, "--profile", "b200-tp8")
    assert res.returncode == 0 and "uses no SGLang patch set" in res.stdout


def test_cli_list_shows_site_and_builtin_sets(tmp_path: Path) -> None:
    site = tmp_path / "sets"
    shutil.copytree(FIXTURE_SETS / "t-0.5.23", site / "t-0.5.23")
    (site / "broken").mkdir()
    (site / "broken" / "manifest.json").write_text("{")
    res = run_doctor("patches", "list", "--patches-dir", str(site))
    assert res.returncode == 0
    assert "t-0.5.23" in res.stdout and "3 patch(es), 5 file(s)" in res.stdout
    assert "broken" in res.stdout and "unusable" in res.stdout


@pytest.mark.network
def test_cli_make_manifest(v523: Venv, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    res = run_doctor("patches", "make-manifest", str(FIXTURE_SETS / "t-0.5.23"), "--python", v523.python, "--check")
    assert res.returncode == 0, res.stderr
    d = tmp_path / "myset"
    d.mkdir()
    shutil.copy(FIXTURE_SETS / "t-0.5.23" / "0001-spec-marker.patch", d)
    res = run_doctor("patches", "make-manifest", str(d), "--site-packages", str(v523.site_packages),
                     "--name", "myset")
    assert res.returncode == 0 and "1 patch(es), 2 file(s), sglang ==0.5.23" in res.stdout
    assert manifest.load(d).name == "myset"
    (d / "0001-spec-marker.patch").write_bytes(b"--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    res = run_doctor("patches", "make-manifest", str(d), "--site-packages", str(v523.site_packages), "--check")
    assert res.returncode == 1


@pytest.mark.network
def test_cli_asks_per_patch_on_a_terminal(v523: Venv, tmp_path: Path) -> None:
    """Without --yes on a terminal: one question per patch; a patch another builds on cannot be left out."""
    import pty
    import subprocess
    import sys

    def run_with_tty(answers: str) -> tuple[int, str]:
        master, slave = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "doctor", "patches", "apply", "--python", v523.python,
                                 "--patches-dir", str(FIXTURE_SETS), "--state-dir", str(tmp_path / "state"),
                                 "--set", "t-0.5.23"], stdin=slave, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=doctor_env(), text=True)
        os.close(slave)
        os.write(master, answers.encode())
        out, _ = proc.communicate(timeout=60)
        os.close(master)
        return proc.returncode, out

    before = sha256_file(v523.site_packages / TRITON)
    code, out = run_with_tty("y\nn\ny\n")  # skip triton-and-chain only
    assert code == 0, out
    assert all(f"apply {pid} (" in out for pid in ("spec-marker", "triton-and-chain", "eol-and-delete"))
    ev = engine(v523, tmp_path).status()
    assert {p.id: p.state for p in ev.patches} == {"spec-marker": "applied", "triton-and-chain": "pristine",
                                                   "eol-and-delete": "applied"}
    assert sha256_file(v523.site_packages / TRITON) == before
    code, out = run_with_tty("n\n")  # decline the remaining one: nothing written
    assert code == 0 and "nothing chosen" in out
    assert "apply triton-and-chain (" in out and "apply spec-marker (" not in out  # asked only what is left
    assert sha256_file(v523.site_packages / TRITON) == before


def test_probe_runs_on_other_interpreters(tmp_path: Path) -> None:
    """The probe is stdlib-only for any service interpreter; without SGLang it says so, no traceback."""
    from doctor.sglang.patching import locate

    pythons = [p for p in (find_python(v) for v in ("3.10", "3.12", "3.13")) if p is not None]
    if not pythons:
        pytest.skip("no other interpreters (pyenv) on this host")
    for py in pythons:
        data = locate.probe_install(str(py))
        assert data["python_version"].startswith(py.parent.parent.name[:4]) and data["dist_infos"] == []
        with pytest.raises(locate.LocateError, match="not installed"):
            locate.from_probe(data)


@pytest.mark.network
def test_ddtree_set_round_trip_if_shipped(v523: Venv, tmp_path: Path) -> None:
    """The shipped DDTree set (another issue's) applies and reverts byte-exact with this engine."""
    try:
        pset = manifest.resolve("ddtree-0.5.23")
    except manifest.ManifestError:
        pytest.skip("sglang_patches/ddtree-0.5.23 is not in this checkout")
    eng = Engine(pset, record.installed_in(v523.site_packages), state_dir=str(tmp_path / "state"))
    assert eng.check_diffs() == [] and eng.status().overall == "pristine"
    eng.apply()
    assert eng.status().ok
    eng.revert()
    for path in pset.chains():
        listed, digest = eng.installed.record_hash(path)
        p = v523.site_packages / path
        assert (sha256_file(p) == digest) if listed else not p.exists()


@pytest.mark.network
def test_site_patches_dir_from_the_config_reaches_the_check(v523: Venv, tmp_path: Path) -> None:
    """`[doctor] patches_dir` alone: judged when the run's CollectOptions carry it, else an honest error."""
    from doctor.facts.store import CollectOptions

    cfg = tmp_path / "site.toml"
    cfg.write_text(f'[doctor]\npython = "{v523.python}"\npatches_dir = "{FIXTURE_SETS}"\n\n'
                   '[patches]\nset = "t-0.5.23"\n')
    res, _ = judge(resolve({"config": str(cfg)}, environ={}))
    if hasattr(CollectOptions(), "patches_dir"):
        assert res.status is Status.FAIL and "t-0.5.23 pristine" in res.summary
    else:
        assert res.status is Status.ERROR and "collected without the site's patch-set directory" in res.summary


@pytest.mark.network
def test_cli_status_from_a_snapshot(v523: Venv, tmp_path: Path) -> None:
    settings_for(tmp_path, v523.python)  # writes config.toml
    engine(v523, tmp_path).apply()
    snap = tmp_path / "snap.json"
    res = run_doctor("snapshot", "--config", str(tmp_path / "config.toml"), "--fact", "sglang_patches",
                     "--output", str(snap))
    assert res.returncode == 0, res.stderr
    shutil.rmtree(v523.root)
    res = run_doctor("patches", "status", "--from-snapshot", str(snap))
    assert res.returncode == 0 and "overall: applied (3/3 patches, 5/5 files applied)" in res.stdout
    res = run_doctor("patches", "status", "--from-snapshot", str(tmp_path / "config.toml"))
    assert res.returncode == 2


@pytest.mark.network
def test_cli_on_a_pip_installed_sglang(tmp_path: Path) -> None:
    """`pip install --no-deps sglang==0.5.13.post1` (RECORD as pip writes it: INSTALLER, bin/ scripts)."""
    from patches_install import pip_venv

    venv = pip_venv("0.5.13.post1", tmp_path / "pipvenv")
    args = ("--python", venv.python, "--patches-dir", str(FIXTURE_SETS), "--state-dir", str(tmp_path / "state"),
            "--set", "t-0.5.13")
    res = run_doctor("patches", "status", *args)
    assert res.returncode == 1 and "overall: pristine (0/1 patches, 0/2 files applied)" in res.stdout
    assert run_doctor("patches", "apply", "--yes", *args).returncode == 0
    assert run_doctor("patches", "status", *args).returncode == 0
    assert run_doctor("patches", "revert", "--yes", *args).returncode == 0
    installed = record.installed_in(venv.site_packages)
    for path in manifest.resolve("t-0.5.13", str(FIXTURE_SETS)).chains():
        assert sha256_file(venv.site_packages / path) == installed.record_hash(path)[1]


@pytest.mark.network
def test_a_run_in_progress_is_told_apart_from_an_interrupted_one(v523: Venv, tmp_path: Path) -> None:
    """While an apply holds the lock (paused inside its hook), the check says it is running, not broken."""
    verdicts = []

    def pause(event: str, path: str) -> None:
        if event == "replaced" and not verdicts:
            verdicts.append(judge(settings_for(tmp_path, v523.python))[0])

    engine(v523, tmp_path, pause).apply()
    assert verdicts[0].status is Status.FAIL and "right now (pid" in verdicts[0].summary
    assert judge(settings_for(tmp_path, v523.python))[0].status is Status.PASS


@pytest.mark.parametrize("fact", [
    ["a", "list"],
    {"set_name": "t-0.5.23", "set": "nonsense"},
    {"set_name": "t-0.5.23", "set": {"manifest": {"name": "x"}}},
    {"set_name": "t-0.5.23", "set": {"manifest": json.loads((FIXTURE_SETS / "t-0.5.23" / "manifest.json").read_text())},
     "files": ["not", "a", "dict"], "sglang": "0.5.23", "journal": 7},
])
def test_hostile_recorded_facts_fail_clearly(tmp_path: Path, fact: object) -> None:
    settings = settings_for(tmp_path, "/nonexistent/python")
    res = run_check("sglang.patches", make_context(settings, facts={"sglang_patches": fact}))
    assert res.status is Status.FAIL and res.summary
