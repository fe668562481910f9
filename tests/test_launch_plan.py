"""The server command and environment built from profile, config and flags."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from doctor.core.settings import ConfigError, resolve
from doctor.service.launcher import build_env, build_plan, build_server_args, merge_args, resolve_python


def settings_with(tmp_path: Path, toml: str = "", **flags: object):
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    return resolve({"config": str(cfg), "model_path": "/m", "draft_model_path": "/d", **flags}, environ={})


def test_default_profile_command(tmp_path: Path) -> None:
    plan = build_plan(settings_with(tmp_path, python=sys.executable), environ={})
    assert plan.argv == [sys.executable, "-m", "sglang.launch_server",
                         "--model-path", "/m", "--tp-size", "8", "--trust-remote-code",
                         "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/d",
                         "--speculative-ddtree-budget", "64", "--attention-backend", "triton",
                         "--mem-fraction-static", "0.85", "--host", "0.0.0.0", "--port", "30000",
                         "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2"]
    assert plan.env["NCCL_CUMEM_ENABLE"] == "1"


def test_other_profiles(tmp_path: Path) -> None:
    args, _ = build_server_args(settings_with(tmp_path, profile="b200-tp8"))
    assert "--speculative-ddtree-budget" not in args
    assert args[args.index("--speculative-algorithm") + 1] == "DFLASH"
    args, _ = build_server_args(settings_with(tmp_path, profile="rtxpro6000-ep8"))
    assert args[args.index("--ep-size") + 1] == "8"


def test_later_flags_replace_built_ones(tmp_path: Path) -> None:
    s = settings_with(tmp_path, '[server]\nargs = ["--port", "31000"]\n', tp=4)
    args, replaced = build_server_args(s, ["--mem-fraction-static=0.8", "--log-level", "debug"])
    assert args.count("--port") == 1 and args[args.index("--port") + 1] == "31000"
    assert "--mem-fraction-static=0.8" in args and "--mem-fraction-static" not in args
    assert args[args.index("--tp-size") + 1] == "4"
    assert set(replaced) == {"--port", "--mem-fraction-static"}
    # with SGLang's table, an alias replaces too
    table = {"--tp-size": {"dest": "tp_size"}, "--tensor-parallel-size": {"dest": "tp_size"}}
    merged, replaced = merge_args(["--tp-size", "8", "--host", "h"], ["--tensor-parallel-size", "2"], table)
    assert merged == ["--host", "h", "--tensor-parallel-size", "2"] and replaced == ["--tp-size"]


def test_parallel_and_no_remote_code(tmp_path: Path) -> None:
    s = settings_with(tmp_path, "[parallel]\npp = 2\ndp = 2\n[model]\ntrust_remote_code = false\n"
                                "[server]\nspeculative_algorithm = ''\n")
    args, _ = build_server_args(s)
    assert args[args.index("--pp-size") + 1] == "2" and args[args.index("--dp-size") + 1] == "2"
    assert "--trust-remote-code" not in args and "--speculative-algorithm" not in args


@pytest.mark.parametrize("toml, fragment", [
    ("[server]\nport = 0\n", "[server] port = 0"),
    ("[server]\nport = 'x'\n", "[server] port = 'x'"),
    ("[server]\nmem_fraction_static = 1.5\n", "[server] mem_fraction_static = 1.5"),
    ("[server]\nddtree_budget = 2.5\n", "[server] ddtree_budget = 2.5"),
    ("[server]\nargs = '--foo'\n", "[server] args = '--foo'"),
    ("[server]\nargs = ['--port', 1]\n", "[server] args = ['--port', 1]"),
    ("[server.env]\nX = ['a']\n", "[server.env] X = ['a']"),
])
def test_invalid_server_settings(tmp_path: Path, toml: str, fragment: str) -> None:
    """Invalid configuration is found when the config is loaded (exit 2), not minutes later."""
    with pytest.raises(ConfigError, match=re.escape(fragment)) as err:
        build_plan(settings_with(tmp_path, toml), environ={})
    assert str(err.value).startswith("invalid configuration: ") and "in the config file" in str(err.value)


def test_missing_paths(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npath = ""\n')
    with pytest.raises(ConfigError, match=re.escape("[model] path = '' in the config file")):
        resolve({"config": str(cfg)}, environ={})  # an empty path is a mistake, never "not set"
    cfg.write_text("")
    s = resolve({"config": str(cfg)}, environ={})
    s.model_path = s.draft_model_path = None
    with pytest.raises(ConfigError, match="no model path"):
        build_server_args(s)
    args, _ = build_server_args(s, placeholders=True)
    assert "<model-path>" in args and "<draft-model-path>" in args
    s = resolve({"config": str(cfg)}, environ={})
    s.draft_model_path = None
    with pytest.raises(ConfigError, match="needs a draft model"):
        build_server_args(s)


def test_environment_precedence(tmp_path: Path) -> None:
    env_file = tmp_path / "site.env"
    env_file.write_text('# site pins\nNCCL_CUMEM_ENABLE=0\nexport HF_HOME="/data/hf"\n')
    s = settings_with(tmp_path, f'[server]\nenv_file = "{env_file}"\n[server.env]\nNCCL_CUMEM_ENABLE = "1"\n'
                                'CUDA_VISIBLE_DEVICES = "0,1,2,3,4,5,6,7"\nSGLANG_FLAG = true\nN = 3\n')
    env, notes = build_env(s, {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "PATH": "/usr/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # the site's pin is kept
    assert env["NCCL_CUMEM_ENABLE"] == "0"  # the env file is the site too
    # the interpreter's directory first on PATH, as its venv's activate would put it (FlashInfer runs `ninja`)
    bin_dir = os.path.dirname(os.path.abspath(s.python))
    assert env["HF_HOME"] == "/data/hf" and env["PATH"] == f"{bin_dir}:/usr/bin"
    assert build_env(s, {"PATH": f"/usr/bin:{bin_dir}"})[0]["PATH"] == f"/usr/bin:{bin_dir}"  # already there
    assert env["SGLANG_FLAG"] == "1" and env["N"] == "3"
    assert len(notes) == 2 and all(" is kept (profile wants " in n for n in notes)
    assert "pinned by the site" in notes[0] and f"pinned by {env_file}" in notes[1]
    # an env file that is absent or unreadable is not fatal here (host.env reports it)
    s = settings_with(tmp_path, f'[server]\nenv_file = "{tmp_path}/absent.env"\n')
    assert build_env(s, {})[0]["NCCL_CUMEM_ENABLE"] == "1"


def test_interpreter_resolution(tmp_path: Path) -> None:
    assert resolve_python("/opt/venv/bin/python") == "/opt/venv/bin/python"
    assert Path(resolve_python("sh")).is_absolute()
    with pytest.raises(ConfigError, match="not found on PATH"):
        resolve_python("no-such-python-k26")
