"""Unit tests of the core pieces: settings precedence, redaction, runner selection and concurrency."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import make_context

from doctor.core.context import Context, FactUnavailable
from doctor.core.registry import Check
from doctor.core.result import Result, Status
from doctor.core.runner import matches, run_all, select
from doctor.core.settings import ConfigError, profile_names, resolve
from doctor.facts.redaction import redact
from doctor.facts.store import CollectOptions, FactStore


def ctx_for(**flags: object) -> Context:
    return make_context(dict(flags), facts={})


def test_every_profile_loads_with_what_checks_expect() -> None:
    assert {"b300-tp8-ddtree", "b200-tp8", "h200-tp8", "rtxpro6000-ep8"} <= set(profile_names())
    for name in profile_names():
        s = resolve({"profile": name}, environ={})
        assert s.profile["name"] == name
        for key in ("parallel.tp", "gpu.compute_capability", "gpu.min_memory_gib", "gpu.nvlink_required",
                    "stack.sglang", "model.num_hidden_layers", "model.n_routed_experts", "server.port",
                    "server.args"):
            assert s.get(key) is not None, (name, key)
        assert s.stack.sglang == "==0.5.23"
    assert resolve({}, environ={}).profile_name == "b300-tp8-ddtree"
    assert resolve({"profile": "b300-tp8-ddtree"}, environ={}).gpu.compute_capability == "10.3"
    assert resolve({"profile": "rtxpro6000-ep8"}, environ={}).gpu.nvlink_required is False


def test_flags_over_config_over_profile(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[doctor]\ntp = 4\nignore = ["gpu.health"]\n[server]\nport = 31000\n[model]\npath = "/cfg/model"\n')
    s = resolve({"config": str(cfg)}, environ={})
    assert (s.tp, s.server.port, s.model_path, s.ignore) == (4, 31000, "/cfg/model", ["gpu.health"])
    assert s.server.host == "0.0.0.0", "tables merge key by key"
    s = resolve({"config": str(cfg), "tp": 2, "model_path": "/flag/model", "ignore": ["host.port"]}, environ={})
    assert (s.tp, s.model_path) == (2, "/flag/model")
    assert s.ignore == ["gpu.health", "host.port"], "ignores from config and flags add up"
    s = resolve({}, environ={"K26_DOCTOR_CONFIG": str(cfg)})
    assert s.tp == 4


def test_config_errors() -> None:
    with pytest.raises(ConfigError):
        resolve({"profile": "nope"}, environ={})
    with pytest.raises(ConfigError):
        resolve({"tp": "x"}, environ={})


def test_secret_names_are_words_not_substrings() -> None:
    from doctor.facts.redaction import is_secret_name

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "DB_PASSWORD", "MY_SERVICE_API_KEY", "AWS_SECRET_ACCESS_KEY",
                 "OPENAI_KEY", "password", "api_key", "client_secret", "hf_token"):
        assert is_secret_name(name), name
    for name in ("mask_token_id", "pad_token_id", "tokenizer_class", "bos_token", "num_key_value_heads",
                 "TOKENIZERS_PARALLELISM", "KEYBOARD", "MONKEY", "HF_TOKEN_PATH", "max_tokens", "NCCL_IB_HCA"):
        assert not is_secret_name(name), name


def test_redaction() -> None:
    tok = "hf_" + "x" * 30
    data = {"HF_TOKEN": tok, "AWS_SECRET_ACCESS_KEY": "abc", "password": "p", "KEYBOARD": "us",
            "nested": [{"url": f"https://h/?t={tok}"}], "MONKEY": "banana", "api_key": "", "count": 3,
            "mask_token_id": 163838}
    out = redact(data)
    assert out["HF_TOKEN"] == out["AWS_SECRET_ACCESS_KEY"] == out["password"] == "<redacted>"
    assert out["KEYBOARD"] == "us" and out["MONKEY"] == "banana" and out["count"] == 3
    assert out["mask_token_id"] == 163838
    assert tok not in out["nested"][0]["url"]


def test_selection_globs_and_areas() -> None:
    assert matches("gpu.nvlink", ["gpu"]) and matches("gpu.nvlink", ["gpu.*"]) and not matches("gpux.a", ["gpu"])
    mk = lambda i, deep=False: Check(i, i, lambda c: Result.passed("x"), deep=deep)  # noqa: E731
    checks = [mk("a.one"), mk("a.two"), mk("b.one"), mk("b.deep", deep=True)]
    assert [c.id for c in select(checks, ["a.*"], [], False)] == ["a.one", "a.two"]
    assert [c.id for c in select(checks, [], ["a.two"], False)] == ["a.one", "b.one"]
    assert "b.deep" in [c.id for c in select(checks, [], [], True)]
    assert "b.deep" in [c.id for c in select(checks, ["b.deep"], [], False)], "naming a deep check runs it"


def test_runner_runs_checks_concurrently_and_respects_dependencies() -> None:
    barrier = threading.Barrier(4, timeout=5)

    def waits(ctx: Context) -> Result:
        barrier.wait()  # only returns if all four run at the same time
        return Result.passed("met the others")

    def after(ctx: Context) -> Result:  # a runner that ignored depends would start it beside c.0, still waiting
        return Result.passed("after c.0") if "c.0" in ctx.results else Result.failed("ran before c.0 finished")

    checks = [Check(f"c.{i}", "w", waits) for i in range(4)]
    checks.append(Check("c.after", "a", after, depends=("c.0",)))
    checks.append(Check("d.fails", "f", lambda c: Result.failed("broken")))
    checks.append(Check("d.after", "a", lambda c: Result.passed("ran anyway"), depends=("d.fails",)))
    by = {r.id: r for r in run_all(checks, ctx_for()).results}
    assert [by[f"c.{i}"].status for i in range(4)] == [Status.PASS] * 4
    assert by["c.after"].status is Status.PASS, by["c.after"].summary
    assert by["d.after"].status is Status.SKIP and by["d.after"].cause == "d.fails"
    assert by["d.after"].summary == "skipped: depends on d.fails (fail)"


def test_runner_fact_unavailable_and_bad_return() -> None:
    def needs_fact(ctx: Context) -> Result:
        ctx.fact("nvml")
        return Result.passed("unreachable")

    checks = [Check("f.a", "a", needs_fact, needs=("nvml",)), Check("f.c", "c", needs_fact),
              Check("f.b", "b", lambda c: "not a result")]  # type: ignore[arg-type]
    by = {r.id: r for r in run_all(checks, ctx_for()).results}
    assert by["f.a"].status is Status.SKIP and "not recorded in the snapshot" in by["f.a"].summary
    assert by["f.b"].status is Status.ERROR
    # a fact the check does not declare is refused: its declaration is the contract with the collectors
    assert by["f.c"].status is Status.ERROR and "reads the fact 'nvml' without declaring it" in by["f.c"].summary


def test_dependency_cycle_is_an_error_not_a_hang() -> None:
    a = Check("x.a", "a", lambda c: Result.passed("a"), depends=("x.b",))
    b = Check("x.b", "b", lambda c: Result.passed("b"), depends=("x.a",))
    t0 = time.monotonic()
    res = run_all([a, b], ctx_for()).results
    assert time.monotonic() - t0 < 5
    assert {r.status for r in res} == {Status.ERROR}


def test_fact_store_collects_once_and_isolated_collector_hang_is_killed() -> None:
    from doctor.core.registry import Collector, Registry

    registry = Registry()  # this test's own registry: nothing global is edited
    calls = []

    def slow(opts: CollectOptions) -> dict:
        calls.append(1)
        time.sleep(0.2)
        return {"ok": True}

    registry.add(Collector("test.once", slow))
    registry.add(Collector("test.hang", _hang_forever, timeout=1.0, isolate=True))
    store = FactStore(CollectOptions(), collectors=registry.collectors)
    threads = [threading.Thread(target=store.get, args=("test.once",)) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    # An isolated collector runs in a child process killed at its deadline.
    t0 = time.monotonic()
    with pytest.raises(FactUnavailable) as err:
        store.get("test.hang")
    assert time.monotonic() - t0 < 8
    assert "hung and was killed" in err.value.reason


def _hang_forever(opts: CollectOptions) -> None:  # the worker imports this module and calls it by name
    time.sleep(3600)


def test_text_report_color_only_when_asked_and_no_color_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from doctor.app import Report
    from doctor.core.runner import RunOutcome
    from doctor.report.text import render_text, use_color

    res = Result.failed("broken", "do this")
    res.id, res.title, res.fixer = "a.b", "t", "a.fix"
    report = Report(resolve({}, environ={}), RunOutcome([res], 0.1))

    class Tty(io.StringIO):
        encoding = "utf-8"

        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert use_color(Tty()) and not use_color(io.StringIO())
    colored = render_text(report, stream=Tty())
    assert "\033[31m" in colored and "✘" in colored
    monkeypatch.setenv("NO_COLOR", "1")
    plain = render_text(report, stream=Tty())
    assert "\033[" not in plain
    assert "fix: do this" in plain
    assert "k26-doctor fix --only a.b" in plain
    assert "--ignore" not in plain  # no paste line that hides every failure




def test_the_planned_server_argv_is_the_runs_computed_once() -> None:
    """The checks that judge the server's command read ``ctx.server_args``: planned once per run (by the launcher,
    through ``doctor.app``), the same argv for every check's view, a list of its own for each reader."""
    calls: list[str] = []

    def planner(settings):  # the launcher's planned_args, counted
        from doctor.app import planned_server

        calls.append(settings.profile_name)
        return planned_server(settings)

    ctx = make_context({"profile": "b300-tp8-ddtree", "model_path": "/m", "draft_model_path": "/d"})
    ctx = Context(ctx.settings, ctx.facts, planner)
    first, problem = ctx.view(("nvml",)).server_args
    assert problem is None and first[:2] == ["--model-path", "/m"] and "--speculative-draft-model-path" in first
    first.append("--edited-by-one-check")
    again, _ = ctx.view(("model",)).server_args
    assert again == first[:-1] and calls == ["b300-tp8-ddtree"]
    other_run = make_context({"profile": "b300-tp8-ddtree", "model_path": "/other"})
    assert other_run.server_args[0][:2] == ["--model-path", "/other"], "each run plans its own"
