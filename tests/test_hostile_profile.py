"""Hostile input to the typed profile and the declared applicability.

- a known table given as something else (``server = "x"``, ``parallel = [8]``, ``gpu = 3``) in a config or a
  profile is exit 2 naming the table: read as-is it was every key at its default, and in a config it silently
  replaced the whole table of the profile (its ``[server] args`` gone from the launch);
- ``applies_if`` on settings whose values are not of their kind (``tp = "eight"``, ``tp = 0``, ``[parallel] pp =
  "x"``, an NVLink generation of ``"5"``) or a predicate that raises: the check is not judged, saying why, never
  "not applicable", never a pass, never a crash with a traceback.

Real parts: the CLI in this process (``cli_run``), the real runner and the built-in checks on a recorded host.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hostile_support import cli_run

from doctor.core.registry import Applicability, Check, Registry, load
from doctor.core.result import Result, Status
from doctor.core.runner import execute
from doctor.core.settings import ConfigError, Settings, resolve

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("body, table", [
    ('server = "x"\n', "server"),
    ("parallel = [8]\n", "parallel"),
    ("gpu = 3\n", "gpu"),
    ('model = "m"\n', "model"),
    ("smoke = true\n", "smoke"),
])
def test_a_table_given_as_a_scalar_or_a_list_is_refused_by_name(tmp_path: Path, body: str, table: str) -> None:
    """Config and profile alike: one line naming the table and where it came from, exit 2, no traceback."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError, match=rf"{table} = .* in the config file {cfg} must be a table"):
        resolve({"config": str(cfg)}, environ={})
    for args in (("check", "--config", str(cfg)), ("launch", "--dry-run", "--config", str(cfg)),
                 ("env", "--config", str(cfg)), ("check", "--profile", str(cfg))):
        code, out, err = cli_run(*args)
        assert code == 2, (args, code, out[-400:], err)
        assert f"{table} = " in err and "must be a table" in err and "Traceback" not in out + err, (args, err)


def test_a_config_cannot_silently_drop_the_profiles_server_table(tmp_path: Path) -> None:
    """The b300 profile's ``[server]`` holds its speculative flags; ``server = "x"`` in a config replaced them all
    and the launch went ahead on defaults. Now it is refused, and a config that sets one key keeps the rest."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('server = "x"\n')
    with pytest.raises(ConfigError, match="server = 'x'"):
        resolve({"config": str(cfg), "profile": "b300-tp8-ddtree"}, environ={})
    cfg.write_text("[server]\nport = 31000\n")
    kept = resolve({"config": str(cfg), "profile": "b300-tp8-ddtree"}, environ={})
    assert kept.server.port == 31000 and kept.server.speculative_algorithm == "DDTREE"


# -- applies_if on values of the wrong kind ---------------------------------------------------------------
ODD = {
    "tp eight": {"tp": "eight"},
    "tp zero": {"tp": 0},
    "tp None": {"tp": None},
    "pp a string": {"profile": {"parallel": {"tp": 8, "pp": "x"}, "gpu": {"nvswitch": True}}},
    "parallel a list": {"profile": {"parallel": [8], "gpu": {"nvswitch": True}}},
    "nvlink generation a string": {"profile": {"gpu": {"nvlink_generation": "5", "nvswitch": True}}},
    "nvswitch a string": {"profile": {"gpu": {"nvswitch": "no"}}},
    "patch set a list": {"profile": {"patches": {"set": ["ddtree-0.5.23"]}}},
    "algorithm bytes": {"profile": {"server": {"speculative_algorithm": b"DDTREE"}}},
    "profile None": {"profile": None},
}


@pytest.mark.parametrize("odd", list(ODD), ids=list(ODD))
def test_a_declared_applicability_on_values_of_the_wrong_kind_is_not_judged(odd: str) -> None:
    """Every built-in check with ``applies_if``, on a recorded healthy host, under settings no config can load: not
    judged (skip, unjudged: launch refuses it) naming the value, never "not applicable", a pass or a crash."""
    from conftest import make_context
    from recordings import SNAPS

    facts = json.loads((SNAPS / "b300x8-healthy.json").read_text())["facts"]
    settings = Settings(profile_name="b300-tp8-ddtree", **ODD[odd])
    declared = [c for c in load(plugins=False).sorted_checks() if c.applies_if is not None]
    assert len(declared) >= 5
    for chk in declared:
        res = execute(chk, make_context(settings, facts=facts))
        assert (res.status, res.unjudged, res.traceback) == (Status.SKIP, True, None), (chk.id, res.summary)
        assert "could not be decided" in res.summary and "applies_if_error" in res.details, res.summary


def test_a_predicate_that_raises_is_not_judged_and_its_check_never_runs() -> None:
    """A plugin's predicate with a bug (or one that meets a value it did not expect): its check is not judged with
    the exception named, its judgement and its facts untouched; the reason's failure is the same."""
    from conftest import make_context

    runs: list[str] = []

    def judge(ctx):
        runs.append("judge")
        return Result.passed("judged")

    def broken(settings: Settings) -> bool:
        return settings.get("site.racks") > 2  # None > 2: TypeError

    def broken_reason(settings: Settings) -> str:
        raise KeyError("rack")

    reg = Registry()
    reg.add(Check("x.rack", "Racks", run=judge, failure="node", applies_if=Applicability(broken, str)))
    reg.add(Check("x.why", "Why", run=judge, failure="node",
                  applies_if=Applicability(lambda settings: False, broken_reason)))
    ctx = make_context({"profile": "b200-tp8"})
    for cid, words in (("x.rack", "TypeError: '>' not supported"), ("x.why", "KeyError: 'rack'")):
        res = execute(reg.checks[cid], ctx)
        assert (res.status, res.unjudged, res.traceback) == (Status.SKIP, True, None), res
        assert words in res.summary and res.id == cid
    assert runs == []
    fine = execute(replace(reg.checks["x.rack"], applies_if=Applicability(lambda s: True, str)), ctx)
    assert fine.status is Status.PASS and runs == ["judge"]


@pytest.mark.parametrize("body, words", [
    ('[server.env]\n"A=B" = "x"\n', r"\[server.env\] 'A=B' .* is no environment variable name"),
    ('[server.env]\n"" = "x"\n', r"\[server.env\] '' .* is no environment variable name"),
    ('[server.env]\nA = "x\\u0000y"\n', r"\[server\] env .* holds a NUL character"),
    ('[server]\nargs = ["--x\\u0000y"]\n', r"\[server\] args .* holds a NUL character"),
    ('[model]\npath = "/tmp/a\\u0000b"\n', r"\[model\] path .* holds a NUL character"),
    ('[server]\napi_key = "k\\u0000y"\n', r"\[server\] api_key .* holds a NUL character"),
    ('[doctor]\npython = "/bin/tr\\u0000ue"\n', r"\[doctor\] python .* holds a NUL character"),
])
def test_what_execve_refuses_is_refused_when_the_config_loads(tmp_path: Path, body: str, words: str) -> None:
    """An environment name that is empty or holds '=', a NUL in a path, an argument or a value: ``launch`` went
    through every check and died at ``execve`` with "internal error, no report: ValueError" (exit 3). Now exit 2
    naming the key, before anything runs."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError, match=words):
        resolve({"config": str(cfg)}, environ={})
    # (never this process replaced: an interpreter that does not exist, unless the config's own is the case)
    python = [] if "python" in body else ["--python", str(tmp_path / "no-python")]
    code, out, err = cli_run("launch", "--no-check", "--no-flag-check", "--no-prewarm", *python, "--config", str(cfg))
    assert code == 2 and "Traceback" not in out + err and "internal error" not in err, (code, err)
