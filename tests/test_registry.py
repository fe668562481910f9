"""The registry object: declarations collected per module, validated on load, plugins disabled by name;
and the one settings record the config keys, flags and collector options derive from."""

from __future__ import annotations

import types

import pytest

from doctor.core.context import UndeclaredFact
from doctor.core.registry import (
    Applicability,
    Check,
    Collector,
    Fixer,
    Hook,
    Registry,
    RegistryError,
    check,
    collector,
    disabled_from_env,
    fixer,
)
from doctor.core.result import Result, Status


def _module(name: str) -> types.ModuleType:
    """A module whose functions are marked like a plugin's (built in memory, imported by nobody)."""
    mod = types.ModuleType(name)

    def run(ctx):
        return Result.passed("ok")

    def collect(opts):
        return {}

    def plan(ctx, result):
        return []

    for fn in (run, collect, plan):
        fn.__module__ = name
    mod.run, mod.collect, mod.plan = run, collect, plan
    return mod


def test_a_module_is_loaded_with_every_reference_resolved() -> None:
    mod = _module("site_ok")
    check("site.a", "A", needs=("site.fact",), fixer="site.fix")(mod.run)
    collector("site.fact")(mod.collect)
    fixer("site.fix", "Fix")(mod.plan)
    reg = Registry()
    items = reg.add_module(mod)
    assert {type(i).__name__ for i in items} == {"Check", "Collector", "Fixer"}
    reg.validate()
    assert reg.checks["site.a"].module == "site_ok" and reg.fixers["site.fix"].plan is mod.plan


@pytest.mark.parametrize("kw, words", [
    ({"fixer": "site.nofix"}, "names fixer 'site.nofix', which is not registered"),
    ({"depends": ("site.none",)}, "depends on 'site.none', which is not a registered check"),
    ({"needs": ("no.such.fact",)}, "needs fact 'no.such.fact', which no collector provides"),
])
def test_an_unresolved_reference_fails_loading_naming_the_module(kw: dict, words: str) -> None:
    mod = _module("site_broken")
    check("site.b", "B", **kw)(mod.run)
    collector("site.other")(mod.collect)
    reg = Registry()
    reg.add_module(mod)
    with pytest.raises(RegistryError) as err:
        reg.validate()
    assert "site_broken" in str(err.value) and words in str(err.value)


def test_duplicates_are_refused_and_registries_are_independent() -> None:
    a, b = Registry(), Registry()
    a.add(Check("x.one", "One", run=lambda ctx: Result.passed("")))
    with pytest.raises(RegistryError, match="registered twice"):
        a.add(Check("x.one", "Other", run=lambda ctx: Result.passed("")))
    with pytest.raises(RegistryError, match="lowercase"):
        a.add(Check("X One", "Bad", run=lambda ctx: Result.passed("")))
    b.add(Collector("x.fact", lambda opts: {}))
    assert "x.one" not in b.checks and "x.fact" not in a.collectors


def test_the_builtin_registry_resolves_and_every_area_has_checks() -> None:
    from doctor.core.registry import load

    reg = load(plugins=False)
    assert reg.problems() == [] and reg.load_errors == {}
    prefixes = {c.id.split(".")[0] for c in reg.checks.values()}
    assert {"host", "gpu", "stack", "cuda", "torch", "triton", "python", "sglang", "model"} <= prefixes
    for chk in reg.checks.values():  # a check lives in its area's module
        area = {"cuda": "stack", "torch": "stack"}.get(chk.id.split(".")[0], chk.id.split(".")[0])
        assert chk.module == f"checks.{area}", (chk.id, chk.module)
    for fx in reg.fixers.values():
        area = fx.id.split(".")[0]
        assert fx.module == f"fixes.{area}", (fx.id, fx.module)


def test_disabled_plugins_come_from_the_environment() -> None:
    assert disabled_from_env({"K26_DOCTOR_DISABLE_PLUGINS": "site, other,,"}) == ("site", "other")
    assert disabled_from_env({}) == ()


def test_one_settings_record_gives_config_keys_flags_and_collector_options() -> None:
    from click.testing import CliRunner

    from doctor.cli import cli
    from doctor.core.settings import COLLECT_FIELDS, DOCTOR_KEYS, Settings, key_of, resolve, setting_fields
    from doctor.facts.store import CollectOptions

    help_text = CliRunner().invoke(cli, ["check", "--help"]).output
    for f in setting_fields():
        if f.metadata["flag"]:
            assert f.metadata["flag"].split("/")[-1] in help_text, f.name
        if f.metadata["config"]:
            assert key_of(f) in DOCTOR_KEYS
    # one options type: collectors get the run's settings, only the fields marked collect (env among them)
    assert CollectOptions is Settings and "env" in COLLECT_FIELDS
    collected = resolve({"deep": True, "only": ["gpu.*"]}, environ={}).collected()
    assert set(collected.to_dict()) == set(COLLECT_FIELDS)
    assert collected.deep is True and collected.only == [], "a field not marked collect stays at its default"
    assert "disable_plugins" in DOCTOR_KEYS


@pytest.mark.parametrize("item, words", [
    (Check("x.two", "Two", run=lambda ctx, extra: Result.passed("")), "check 'x.two': <lambda>(ctx, extra) cannot be "
     "called as (ctx)"),
    (Collector("x.fact", lambda: {}), "collector 'x.fact': <lambda>() cannot be called as (opts)"),
    (Fixer("x.fix", "Fix", plan=lambda ctx: []), "fixer 'x.fix': <lambda>(ctx) cannot be called as (ctx, result)"),
    (Hook("notice", lambda: None, module="site"), "cannot be called as (ctx, results)"),
    (Hook("after_everything", lambda ctx: None, module="site"), "after_everything"),
])
def test_a_declaration_that_cannot_be_called_as_its_kind_is_refused_when_added(item, words: str) -> None:
    """A check taking two arguments, a collector none, a fixer one, a hook of an unknown kind: refused at load
    (naming it), not found out when a run calls it."""
    with pytest.raises(RegistryError) as err:
        Registry().add(item)
    assert words in str(err.value)


def test_a_fixer_needing_a_fact_no_collector_provides_fails_loading() -> None:
    reg = Registry()
    reg.add(Collector("x.fact", lambda opts: {}))
    reg.add(Fixer("x.fix", "Fix", plan=lambda ctx, result: [], needs=("x.fact", "x.gone")))
    assert reg.problems() == ["builtin: fixer 'x.fix' needs fact 'x.gone', which no collector provides"]


def test_a_check_reads_only_the_facts_it_declares() -> None:
    """``needs=`` is enforced: the runner hands a check a view of its declared facts, and reading another is that
    check's ``error`` naming the fact (the check's bug), never a silent read of whatever the run collected."""
    from conftest import make_context, run_check

    def sneaky(ctx):
        ctx.fact("nvml")
        ctx.fact("port")
        return Result.passed("read both")

    reg = Registry()
    reg.add(Collector("nvml", lambda opts: {}))
    reg.add(Collector("port", lambda opts: {}))
    reg.add(Check("x.sneaky", "Sneaky", run=sneaky, needs=("nvml",)))
    ctx = make_context(facts={"nvml": {"available": False, "devices": []}, "port": {"free": True}})
    res = run_check("x.sneaky", ctx, reg)
    assert res.status is Status.ERROR
    assert "reads the fact 'port' without declaring it (needs=('nvml',))" in res.summary
    with pytest.raises(UndeclaredFact):
        ctx.view(("nvml",)).fact("port")
    assert ctx.view(("nvml", "port")).fact("port") == {"free": True}


def _profiles_of(settings_flags: list[dict]) -> list:
    from doctor.core.settings import resolve

    return [resolve(dict(flags), environ={}) for flags in settings_flags]


@pytest.mark.parametrize("applies_if, words", [
    ("tp > 1", "is not an Applicability"),
    (Applicability(lambda: True, lambda settings: "why"), "applies_if predicate: <lambda>() cannot be called as "
     "(settings)"),
    (Applicability(lambda settings: True, "one rank"), "applies_if reason 'one rank' is not callable"),
    (Applicability(lambda settings: True, lambda settings, more: "why"), "applies_if reason: <lambda>(settings, "
     "more) cannot be called as (settings)"),
])
def test_a_bad_applicability_is_refused_when_loaded(applies_if, words: str) -> None:
    """``applies_if=`` is validated as pluggy validates a hook implementation: an ``Applicability`` whose predicate
    and reason each take the settings, else the check is refused when it is added, naming it."""
    mod = _module("site_applies")
    check("x.applies", "Applies", applies_if=applies_if)(mod.run)
    with pytest.raises(RegistryError) as err:
        Registry().add_module(mod, "plugin:site")
    assert "check 'x.applies'" in str(err.value) and words in str(err.value)


def test_a_check_that_does_not_apply_is_not_run_and_collects_none_of_its_facts() -> None:
    """The runner asks ``applies_if`` before the check reads a fact: a check that does not apply is "not
    applicable" (skip, never unjudged) with the declared reason, its run never called and its facts never
    collected; one that applies runs as before."""
    from conftest import make_context, run_check

    collected: list[str] = []
    runs: list[str] = []

    def probe(opts):
        collected.append("x.probe")
        return {"ok": True}

    def judge(ctx):
        runs.append("judge")
        return Result.passed(f"read {ctx.fact('x.probe')}")

    reg = Registry()
    reg.add(Collector("x.probe", probe))
    reg.add(Check("x.many", "Many ranks", run=judge, needs=("x.probe",), failure="node",
                  applies_if=Applicability(lambda settings: settings.world_size > 1,
                                           lambda settings: f"{settings.world_size} rank: nothing between ranks")))
    one = run_check("x.many", make_context({"profile": "b200-tp8", "tp": 1}, live=True, collectors=reg.collectors),
                    reg)
    assert (one.status, one.summary, one.unjudged) == (Status.SKIP, "1 rank: nothing between ranks", False)
    assert collected == [] and runs == []
    eight = run_check("x.many", make_context({"profile": "b200-tp8"}, live=True, collectors=reg.collectors), reg)
    assert eight.status is Status.PASS and collected == ["x.probe"] and runs == ["judge"]


def test_a_judgement_does_not_also_decide_what_its_check_declares() -> None:
    """Each built-in check with ``applies_if`` run past its declaration (the check alone, on a recorded host) under
    every built-in profile (and TP 1) it does not apply to: its judgement never says the declared reason again (the
    applicability is decided once, on the check), and the declaration does refuse at least one of them."""
    import json
    from dataclasses import replace

    from conftest import make_context
    from recordings import SNAPS

    from doctor.core.registry import load
    from doctor.core.runner import execute

    facts = json.loads((SNAPS / "b300x8-healthy.json").read_text())["facts"]
    profiles = _profiles_of([{"profile": p, **tp} for p in ("b200-tp8", "b300-tp8-ddtree", "h200-tp8",
                                                             "rtxpro6000-ep8") for tp in ({}, {"tp": 1})])
    declared = [c for c in load(plugins=False).sorted_checks() if c.applies_if is not None]
    assert {"sglang.ddtree", "sglang.patches", "gpu.multicast", "gpu.fabric.manager", "gpu.fabric.nvlsm"} <= {
        c.id for c in declared}
    for chk in declared:
        refused = [(s, chk.applies_if.refusal(s)) for s in profiles if chk.applies_if.refusal(s) is not None]
        assert refused, f"{chk.id}: no built-in profile it does not apply to"
        for settings, why in refused:
            res = execute(replace(chk, applies_if=None), make_context(settings, facts=facts))
            assert res.summary != why, f"{chk.id} under {settings.profile_name}: the judgement says {why!r} too"
