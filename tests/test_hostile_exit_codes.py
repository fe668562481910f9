"""Issue 21, exit codes and words: every bad input is exit 2 (3 only for a bug in the doctor), and what went
wrong is said as it is: a directory or FIFO as config, an index naming a path outside the model directory
(with a fix that is one), a symlink loop, a remote-code module outside the model directory, an interpreter
that is not one, a process that does not exist, and a fix for 10,000 broken shards that fits on a line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import doctor_env, run_doctor
from hostile_support import model_with, small_model

pytestmark = pytest.mark.timeout(180)
SNAPSHOT = Path(__file__).resolve().parent / "fixtures" / "snapshots" / "h200x1-all-facts.json"


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_model(tmp_path_factory.mktemp("exit-codes") / "model")


def refused(*args: str, words: str, env: dict[str, str] | None = None) -> str:
    out = run_doctor(*args, env=env, timeout=60)
    assert out.returncode == 2, (args, out.returncode, out.stderr[-800:])
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert words in out.stderr, out.stderr
    return out.stderr


def test_deep_nesting_is_a_bad_input_not_a_crash(tmp_path: Path) -> None:
    toml = tmp_path / "deep.toml"
    toml.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    refused("check", "--only", "host.port", "--config", str(toml), words="nested too deeply")
    modest = tmp_path / "modest.toml"  # within the parser's reach, beyond any config
    modest.write_text("[server]\nx = " + "[" * 200 + "]" * 200 + "\n")
    refused("check", "--only", "host.port", "--config", str(modest), words="nested more than 64 levels")
    for depth, words in ((200_000, "nested too deeply"), (500, "nested more than 64 levels")):
        snap = tmp_path / f"deep-{depth}.json"
        snap.write_text('{"kind": "k26-doctor-snapshot", "schema_version": 1, "facts": {"x": '
                        + "[" * depth + "]" * depth + "}}")
        refused("check", "--from-snapshot", str(snap), words=words)
        refused("env", "--from-snapshot", str(snap), words=words)


@pytest.mark.parametrize("toml, words", [
    ("[doctor]\nignore = 5\n", "[doctor] ignore = 5"),
    ("[doctor]\nskip = \"gpu.*\"\n", "[doctor] skip = 'gpu.*'"),
    ("[doctor]\nprofile = 5\n", "[doctor] profile = 5"),
    ("[doctor]\ndeep = \"no\"\n", "[doctor] deep = 'no'"),
    ("[doctor]\npython = 3\n", "[doctor] python = 3"),
    ("[doctor]\ntp = 8.5\n", "[doctor] tp = 8.5"),
    ("[doctor]\ntimeout = \"soon\"\n", "[doctor] timeout = 'soon'"),
    ("[doctor]\nstate_dir = []\n", "[doctor] state_dir = []"),
])
def test_a_config_value_of_the_wrong_type_is_exit_2(tmp_path: Path, toml: str, words: str) -> None:
    cfg = tmp_path / "k26.toml"
    cfg.write_text(toml)
    refused("check", "--only", "host.port", "--config", str(cfg), words=words)


def test_a_ten_megabyte_host_is_refused_in_a_line_of_its_own(tmp_path: Path) -> None:
    cfg = tmp_path / "k26.toml"
    cfg.write_text('[server]\nhost = "' + "a" * 10_000_000 + '"\n')
    err = refused("check", "--only", "host.*", "--config", str(cfg), words="[server] host = 'aaaa")
    assert "(10000000 long)" in err and len(err) < 1000 and "collector crashed" not in err


def test_a_directory_or_fifo_as_config_says_what_it_is(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    (tmp_path / "dir.toml").mkdir()
    for path, words in ((fifo, "is a FIFO (named pipe)"), (tmp_path / "dir.toml", "is a directory")):
        err = refused("check", "--only", "host.port", env=doctor_env(K26_DOCTOR_CONFIG=str(path)), words=words)
        assert "does not exist" not in err
    refused("check", "--only", "host.port", "--config", str(tmp_path / "absent.toml"), words="does not exist")


def test_env_from_a_snapshot_with_facts_of_wrong_types_never_crashes(tmp_path: Path) -> None:
    """Every recorded fact replaced by values of every wrong type: ``env`` summarises what it can read."""
    from doctor.app import Report
    from doctor.core.runner import RunOutcome
    from doctor.core.settings import resolve
    from doctor.facts.store import CollectOptions, FactStore
    from doctor.report.environment import collect_summary, render_summary

    base = json.loads(SNAPSHOT.read_text())
    settings = resolve({}, environ={})
    report = Report(settings, RunOutcome([], 0.0))
    wrong = [5, "x", [], [1, "a", None], None, True, 1.5, {"devices": "x", "vars": 3, "distributions": []}]
    for name in base["facts"]:
        for value in wrong:
            snap = json.loads(json.dumps(base))
            snap["facts"][name] = value
            store = FactStore(CollectOptions.from_settings(settings), snapshot=snap)
            render_summary(collect_summary(report, store, live=False))
    snap = dict(base, facts={name: "wrong" for name in base["facts"]})
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(snap))
    for fmt in ("text", "json"):
        out = run_doctor("env", "--from-snapshot", str(path), "--format", fmt, timeout=120)
        assert out.returncode == 0 and "internal error" not in out.stderr, out.stderr


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999/", "ftp://x/", "http:///health"])
def test_a_url_that_is_none_is_exit_2(url: str) -> None:
    refused("smoke", "--url", url, "--timeout", "1", words="--url")
    refused("wait-ready", "--url", url, "--timeout", "1", words="--url")


def test_index_naming_a_path_outside_gets_a_fix_that_is_one(base_model: Path, tmp_path: Path) -> None:
    model = model_with(base_model, tmp_path / "m", **{"model.safetensors.index.json": "absent"})
    index = json.loads((base_model / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../../etc/evil.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    out = run_doctor("check", "--model-path", str(model), "--only", "model.shards", "--format", "json")
    (res,) = json.loads(out.stdout)["results"]
    assert res["status"] == "fail" and "outside the model directory" in res["summary"]
    rem = res["remediation"]  # before: "Fix the index or path by hand:" and no command
    assert any(c.startswith("hf download") and "model.safetensors.index.json" in c for c in rem["commands"]), rem


def test_a_symlink_loop_is_named_a_loop(base_model: Path, tmp_path: Path) -> None:
    model = model_with(base_model, tmp_path / "m", **{"tiktoken.model": "loop", "tokenization_kimi.py": "loop",
                                                       "model-00002-of-000004.safetensors": "loop"})
    out = run_doctor("check", "--model-path", str(model), "--only", "model.shards", "--only", "model.tokenizer",
                     "--python", "/bin/true", "--format", "json")
    text = json.dumps(json.loads(out.stdout)["results"])
    assert "tiktoken.model is a symlink loop" in text
    assert "tokenization_kimi.py: is a symlink loop" in text
    assert "model-00002-of-000004.safetensors: cannot be read: is a symlink loop" in text
    assert "tiktoken.model is a dangling symlink" not in text and "tokenization_kimi.py named by auto_map is " \
        "missing" not in text


def test_an_auto_map_module_outside_the_model_directory_is_said_to_be_outside(base_model: Path,
                                                                              tmp_path: Path) -> None:
    elsewhere = tmp_path / "shared"
    elsewhere.mkdir()
    (elsewhere / "tok.py").write_text("class Tok: pass\n")
    model = model_with(base_model, tmp_path / "m", **{"tokenizer_config.json": "absent"})
    tc = json.loads((base_model / "tokenizer_config.json").read_text())
    tc["auto_map"] = {"AutoTokenizer": [f"{elsewhere}/tok.Tok", None]}
    (model / "tokenizer_config.json").write_text(json.dumps(tc))
    out = run_doctor("check", "--model-path", str(model), "--only", "model.tokenizer", "--python", "/bin/true",
                     "--format", "json")
    (res,) = json.loads(out.stdout)["results"]
    problems = " | ".join(res["details"].get("problems") or [res["summary"]])
    assert f"{elsewhere}/tok.py named by auto_map is outside the model directory (it exists there" in problems
    assert "is missing" not in problems
    assert "model.tokenizer.module_outside" in [f["code"] for f in res["findings"]]  # its fix is the config's


def test_a_remote_code_module_in_a_subdirectory_is_found(base_model: Path, tmp_path: Path) -> None:
    model = model_with(base_model, tmp_path / "m", **{"tokenizer_config.json": "absent"})
    (model / "code").mkdir()
    (model / "code" / "tok.py").write_text("class Tok: pass\n")
    tc = json.loads((base_model / "tokenizer_config.json").read_text())
    tc["auto_map"] = {"AutoTokenizer": ["code.tok.Tok", None]}
    (model / "tokenizer_config.json").write_text(json.dumps(tc))
    out = run_doctor("check", "--model-path", str(model), "--only", "model.tokenizer", "--python", "/bin/true",
                     "--format", "json")
    assert "code/tok.py named by auto_map is missing" not in out.stdout


def test_an_interpreter_that_is_none_is_said_to_be_none(base_model: Path) -> None:
    out = run_doctor("check", "--python", "/bin/true", "--model-path", str(base_model), "--only", "sglang.install",
                     "--only", "cuda.libcuda", "--format", "json")
    text = json.dumps(json.loads(out.stdout)["results"])
    assert "exited with -1" not in text
    assert "exited with 0 and printed no probe result: it is not a Python interpreter" in text


def test_wait_ready_for_a_process_that_is_none_or_ends(tmp_path: Path) -> None:
    refused("wait-ready", "--url", "http://127.0.0.1:9/health", "--pid", "999999", "--timeout", "5",
            words="--pid 999999: no such process")
    refused("wait-ready", "--url", "http://127.0.0.1:9/health", "--pid", "0",
            words="'--pid': must be an integer between 1")
    # The process ends once wait-ready has polled (its first progress line), not after a second that a loaded
    # machine may spend starting the doctor: it then would be gone before wait-ready looked.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    doctor = subprocess.Popen([sys.executable, "-m", "doctor", "wait-ready", "--url", "http://127.0.0.1:9/health",
                               "--pid", str(child.pid), "--timeout", "60", "--interval", "0.2"], env=doctor_env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert doctor.stderr is not None and child.stdin is not None
        first = doctor.stderr.readline()
        assert "not listening yet" in first, first
        child.stdin.close()
        _, rest = doctor.communicate(timeout=60)
    finally:
        for proc in (doctor, child):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
    assert doctor.returncode == 1 and f"the server process {child.pid} exited before it was ready" in rest, rest
    assert "status -1" not in rest


def test_a_fix_for_ten_thousand_broken_shards_fits_on_a_line(tmp_path: Path) -> None:
    model = tmp_path / "m10k"
    model.mkdir()
    wmap = {f"t{i}.weight": f"model-{i + 1:05d}-of-10000.safetensors" for i in range(10_000)}
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 10_000},
                                                                    "weight_map": wmap}))
    out = run_doctor("check", "--model-path", str(model), "--only", "model.shards", "--format", "json")
    (res,) = json.loads(out.stdout)["results"]
    assert res["status"] == "fail"  # (a hang is the run's deadline's and the test timeout's to catch)
    commands = res["remediation"]["commands"]
    assert commands and max(len(c) for c in commands) < 400, [len(c) for c in commands]
    assert "--include 'model-*-of-*.safetensors'" in commands[0]
    assert len(res["details"]["redownload"]) == 10_000  # the exact list stays in the details
