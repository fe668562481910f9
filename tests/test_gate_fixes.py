"""Every fix fits its cause (issue 13), on real K2.6-shaped replicas and through the CLI as users run it:
a damaged shard does not also fail config.json, a bad TP says which sizes work, permissions get a chmod
(never a download), the deep check of the right directory is suggested, "nothing to compare with" says
what settles it, the footer offers only fixers that act, and every command is shell-quoted."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, doctor_env, run_doctor

sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "model"))
from model_replica import shard_name, write_sparse_safetensors
from modelkit import SMALL, build, build_drafter, small_config_toml

S2 = shard_name(2, SMALL.shards)
SETPRIV = shutil.which("setpriv")


def check_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    out = run_doctor("check", *args, "--format", "json", env=env)
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


def by_id(report: dict) -> dict[str, dict]:
    return {r["id"]: r for r in report["results"]}


def commands(res: dict) -> list[str]:
    return list((res.get("remediation") or {}).get("commands") or [])


def test_a_damaged_shard_does_not_fail_the_config(tmp_path: Path) -> None:
    model = build(tmp_path)
    with open(model / S2, "r+b") as fh:  # header intact, data cut short: the shard does not validate
        fh.truncate(os.path.getsize(model / S2) // 2)
    cfg = small_config_toml(tmp_path)
    rc, js = check_json("--config", str(cfg), "--model-path", str(model), "--only", "model.shards",
                        "--only", "model.config")
    res = by_id(js)
    assert rc == 1 and res["model.shards"]["status"] == "fail"
    conf = res["model.config"]
    assert conf["status"] == "skip" and conf["cause"] == "model.shards" and not conf.get("unjudged")
    assert "not compared with the shards: 1 of 4 shard(s) did not validate" in conf["summary"]
    assert "n_routed_experts" not in conf["summary"] and not any("config.json" in c for c in commands(conf))
    text = run_doctor("check", "--config", str(cfg), "--model-path", str(model), "--only", "model.shards",
                      "--only", "model.config").stdout
    assert text.rstrip().splitlines()[-1] == "next: k26-doctor fix --only model.shards   (the plan; then add --apply)"
    healthy = build(tmp_path, name="ok")
    _, js = check_json("--config", str(cfg), "--model-path", str(healthy), "--only", "model.config")
    assert by_id(js)["model.config"]["status"] == "pass"  # compared with shards that all validate


def test_a_tp_that_does_not_divide_says_which_sizes_do(tmp_path: Path) -> None:
    model = build(tmp_path)
    rc, js = check_json("--config", str(small_config_toml(tmp_path)), "--model-path", str(model), "--tp", "3",
                        "--only", "model.config")
    res = by_id(js)["model.config"]
    assert rc == 1 and "not divisible by TP 3" in res["summary"]
    assert res["details"]["working_tp_sizes"] == [1, 2, 4, 8]  # 8 heads, 256-wide experts in int4 groups
    assert "TP sizes that do: 1, 2, 4, 8" in res["remediation"]["text"]
    assert commands(res) == ["k26-doctor check --tp 8"]  # the profile's TP works: no config re-download


def sparse_drafter(tmp_path: Path) -> Path:
    d = build_drafter(tmp_path, layers=4, target_layer_ids=[0, 1, 2, 3])
    assert os.path.getsize(d / "model.safetensors") >= 64 * 1024 ** 2
    return d


def test_a_sparse_drafter_names_its_own_deep_check_and_deep_settles_it(tmp_path: Path) -> None:
    model, drafter = build(tmp_path), sparse_drafter(tmp_path)
    cfg = small_config_toml(tmp_path)
    common = ["--config", str(cfg), "--model-path", str(model), "--draft-model-path", str(drafter)]
    _, js = check_json(*common, "--only", "model.drafter")
    res = by_id(js)["model.drafter"]
    assert res["status"] == "warn" and "sparse" in res["summary"]
    cmds = [shlex.split(c, comments=True) for c in commands(res)]
    deep = next(c for c in cmds if "--deep" in c)
    assert deep[deep.index("--only") + 1] == "model.drafter.deep"
    assert deep[deep.index("--draft-model-path") + 1] == str(drafter) and "--model-path" not in deep
    # No published digest recorded here: the first fix is what settles it (hf download records it).
    assert cmds[0][:3] == ["hf", "download", "example/Kimi-K2.6-DFlash"] and cmds[0][-1] == str(drafter)
    # The suggested command: no second "sparse" warning with the same fix; what settles it, first.
    suggested = shlex.split(commands(res)[1], comments=True)[2:]  # after "k26-doctor check"
    _, js = check_json(*suggested, "--config", str(cfg), "--model-path", str(model))
    res = by_id(js)
    assert list(res) == ["model.drafter.deep"]
    deep_res = res["model.drafter.deep"]
    assert deep_res["status"] == "skip" and deep_res["unjudged"] and "nothing to compare with" in deep_res["summary"]
    first = shlex.split(commands(deep_res)[0])
    assert first[:2] == ["hf", "download"] and "--force-download" not in first  # hashes, fetches what differs
    assert any("manifest write" in c for c in commands(deep_res))
    _, js = check_json(*common, "--deep", "--only", "model.drafter", "--only", "model.drafter.deep")
    res = by_id(js)
    drafter_res = res["model.drafter"]
    assert drafter_res["status"] == "pass" and "hashed by model.drafter.deep" in drafter_res["summary"]
    strict = run_doctor("check", *suggested, "--config", str(cfg), "--model-path", str(model), "--strict")
    assert strict.returncode == 1  # nothing compared: not a pass under --strict


def test_a_sparse_target_shard_names_model_shards_deep(tmp_path: Path) -> None:
    d = tmp_path / "sparse"
    d.mkdir()
    write_sparse_safetensors(str(d / "model.safetensors"), [("w", "BF16", (8192, 8192))])
    _, js = check_json("--model-path", str(d), "--only", "model.shards")
    res = by_id(js)["model.shards"]
    deep = next(shlex.split(c, comments=True) for c in commands(res) if "--deep" in c)
    assert deep[deep.index("--only") + 1] == "model.shards.deep" and deep[deep.index("--model-path") + 1] == str(d)


def test_the_drafter_fixer_never_downloads_into_the_target(tmp_path: Path) -> None:
    """--draft-model-path equal to the target: whatever model.drafter says, its fixer plans no download."""
    model = build(tmp_path)
    with open(model / S2, "r+b") as fh:
        fh.truncate(100)
    out = run_doctor("fix", "--config", str(small_config_toml(tmp_path)), "--model-path", str(model),
                     "--draft-model-path", str(model), "--only", "model.drafter", "--format", "json")
    plans = json.loads(out.stdout)["plans"]
    assert plans and all(p["actions"] == [] for p in plans)
    assert any("is the target model's directory" in n for p in plans for n in p["notes"])


def as_unprivileged(args: list[str]) -> list[str]:
    """Permissions do not stop root: drop the capabilities that bypass them (same user, same interpreter)."""
    if os.geteuid() != 0:
        return args
    assert SETPRIV, "setpriv (util-linux) is needed to test permissions as root"
    return [SETPRIV, "--bounding-set", "-dac_override,-dac_read_search,-fowner", *args]


def doctor_cmd(*args: str) -> list[str]:
    return as_unprivileged([sys.executable, "-m", "doctor", *args])


def test_a_shard_the_user_cannot_read_gets_a_chmod_not_a_download(tmp_path: Path) -> None:
    model = build(tmp_path)
    os.chmod(model / S2, 0o000)
    cfg = small_config_toml(tmp_path)
    out = subprocess.run(doctor_cmd("check", "--config", str(cfg), "--model-path", str(model), "--only",
                                    "model.shards", "--format", "json"),
                         capture_output=True, text=True, env=doctor_env(), timeout=120)
    res = by_id(json.loads(out.stdout))["model.shards"]
    assert out.returncode == 1 and res["status"] == "fail" and "unreadable by" in res["summary"]
    assert "mode 0000" in res["summary"] and res["details"]["redownload"] == []
    cmds = commands(res)
    assert shlex.split(cmds[0]) == ["sudo", "chmod", "a+r", str(model / S2)]
    assert not any("hf download" in c for c in cmds)
    owner = res["details"]["unreadable"][0]["access"]["owner"]
    assert f"owned by {owner}:" in res["remediation"]["text"]
    text = subprocess.run(doctor_cmd("check", "--config", str(cfg), "--model-path", str(model), "--only",
                                     "model.shards"), capture_output=True, text=True, env=doctor_env(), timeout=120)
    assert "plan fixes:" not in text.stdout  # the re-download fixer has nothing to do here
    fix = subprocess.run(doctor_cmd("fix", "--config", str(cfg), "--model-path", str(model), "--only",
                                    "model.shards"), capture_output=True, text=True, env=doctor_env(), timeout=120)
    assert fix.stdout.count("nothing can change automatically; by hand:") == 1
    assert "(nothing can be changed automatically" not in fix.stdout and "sudo chmod a+r" in fix.stdout


def test_a_model_directory_the_user_cannot_enter(tmp_path: Path) -> None:
    model = build(tmp_path)
    os.chmod(model, 0o600)
    try:
        out = subprocess.run(doctor_cmd("check", "--model-path", str(model), "--only", "model.shards", "--format",
                                        "json"), capture_output=True, text=True, env=doctor_env(), timeout=120)
        res = by_id(json.loads(out.stdout))["model.shards"]
        assert res["status"] == "fail" and "mode 0600" in res["summary"]
        assert shlex.split(commands(res)[0]) == ["sudo", "chmod", "a+rx", str(model)]
    finally:
        os.chmod(model, 0o755)


def test_host_disk_not_writable_gets_chown_with_owner_and_mode(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    os.chmod(locked, 0o555)
    env = doctor_env(TMPDIR=str(locked), TRITON_CACHE_DIR=str(locked / "triton"))
    out = subprocess.run(doctor_cmd("check", "--only", "host.disk", "--format", "json"), capture_output=True,
                         text=True, env=env, timeout=120)
    res = by_id(json.loads(out.stdout))["host.disk"]
    assert res["status"] == "fail" and "mode 0555" in res["summary"], res["summary"]
    cmds = [shlex.split(c) for c in commands(res)]
    assert ["sudo", "install", "-d", "-o"] == cmds[0][:4] and cmds[0][-1] == str(locked / "triton")
    assert any(c[:2] == ["sudo", "chown"] and c[-1] == str(locked) for c in cmds)
    assert "Free space" not in res["remediation"]["text"]


def test_every_suggested_command_is_shell_quoted(tmp_path: Path) -> None:
    """Paths with a space and non-ASCII characters: every command parses, and the path is one word."""
    base = tmp_path / "my modèls ü"
    base.mkdir()
    model = build(base, name="Kimi K2.6 ä")
    drafter = build_drafter(base, name="draft é")
    with open(model / S2, "r+b") as fh:
        fh.truncate(100)
    (model / "tokenizer_config.json").unlink(missing_ok=True)
    # A real venv of this interpreter at that path, without its site-packages (a link to this interpreter would
    # bring its torch and transformers: the tokenizer probe alone then took 12 of the test's 13 s). Its probes
    # find nothing installed, so the interpreter's pip commands are there for every package.
    venv = base / "py env ø" / "bin"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv.parent)], check=True, capture_output=True,
                   timeout=120)
    cfg = small_config_toml(base)
    _, js = check_json("--config", str(cfg), "--model-path", str(model), "--draft-model-path", str(drafter),
                       "--python", str(venv / "python"), "--state-dir", str(base / "state ß"))
    seen = 0
    for res in js["results"]:
        for cmd in commands(res):
            words = shlex.split(cmd, comments=True)  # raises on broken quoting
            if "modèls ü" in cmd:
                seen += 1
                assert any(w.startswith(str(base)) for w in words), (res["id"], cmd)
                assert not any(w.endswith("modèls") for w in words), (res["id"], cmd)
    assert seen >= 3  # model.shards' download, the interpreter's pip commands, ...
