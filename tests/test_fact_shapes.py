"""Every fact has a declared shape, and a fact without it is a clear verdict, never a crash.

Each fact of each recording of tests/fixtures is mutated (the whole value, and values deep inside it) to the
wrong type, to null, to an empty value, to numbers out of any reading's range; then every check that declares the
fact judges the recording, through the real runner. No result may say "check crashed" or "collector crashed"; a
check that reads a fact of the wrong type says "the fact 'X' is malformed: WHERE" (MalformedFact, from the shape
its collector declares: ``doctor.facts.shape``).
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import make_context
from recordings import config_for, name_of, recordings

from doctor import app
from doctor.core.registry import load
from doctor.core.result import Status
from doctor.facts.shape import problem

WHOLE = [None, "x", 7, [], {}, True]  # the whole fact replaced
INSIDE = [None, "x", -1, 10**30, 1e308, float("nan"), [], {}, True, "A" * 100_000]  # one value inside it replaced
PATHS_PER_FACT = 12
CRASHED = ("check crashed", "collector crashed", "judged nothing")


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (keys and list indices), the shallow ones first."""
    out: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, sub in items:
        out.append((*prefix, key))
        out += paths(sub, (*prefix, key))
    return out


def set_at(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    out = copy.deepcopy(value)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return out


def mutations(name: str, value: Any) -> list[tuple[str, Any]]:
    """(what was changed, the mutated fact): the whole value, then a fixed sample of the values inside it."""
    out = [(f"{name} = {w!r}", w) for w in WHOLE]
    inside = paths(value)
    rng = random.Random(f"{name}:{len(inside)}")  # the same sample on every run
    for path in rng.sample(inside, min(PATHS_PER_FACT, len(inside))):
        new = INSIDE[rng.randrange(len(INSIDE))]
        out.append((f"{name}{''.join(f'[{k!r}]' for k in path)} = {str(new)[:20]!r}", set_at(value, path, new)))
    return out


def cases() -> list[tuple[Path, str]]:
    """(recording, fact) for every fact of every recording, each distinct fact value once."""
    seen: set[str] = set()
    out = []
    for path in recordings():
        for name, value in sorted(json.loads(path.read_text())["facts"].items()):
            key = name + json.dumps(value, sort_keys=True)
            if key not in seen and not (isinstance(value, dict) and "__error__" in value):
                seen.add(key)
                out.append((path, name))
    return out


def tiers(path: Path, fact: str, tmp: Path) -> list[Any]:
    """The settings that judge the recording with every check that declares ``fact``, in both tiers (the default
    tier reads torch and SGLang from their files, --deep from their imports)."""
    ids = [c.id for c in load(plugins=False).sorted_checks() if fact in c.needs]
    return [app.settings_from_flags({"from_snapshot": str(path), "config": config_for(path, tmp), "deep": deep,
                                     "only": ids}) for deep in (False, True)]


def judge(settings: list[Any], doc: dict[str, Any]) -> dict[tuple[int, str], Any]:
    """The results of the real runner on the recording ``doc``, under each of ``settings``: (tier, id) -> result."""
    reg = load(plugins=False)
    return {(i, r.id): r for i, s in enumerate(settings)
            for r in app.run(replace(s, snapshot=doc), registry=reg)[0].results}


@pytest.mark.parametrize("path,fact", cases(), ids=lambda v: name_of(v) if isinstance(v, Path) else v)
def test_a_mutated_fact_is_a_verdict(path: Path, fact: str, tmp_path: Path) -> None:
    doc = json.loads(path.read_text())
    collectors = load(plugins=False).collectors
    if fact not in collectors:
        pytest.skip(f"{fact}: recorded by a collector this doctor no longer has")
    bad = []
    settings = tiers(path, fact, tmp_path)
    recorded = judge(settings, doc)
    malformed = f"the fact '{fact}' is malformed: "
    for what, value in mutations(fact, doc["facts"][fact]):
        mutated = dict(doc, facts=dict(doc["facts"], **{fact: value}))
        shape_says = problem(value, collectors[fact].shape)
        results = judge(settings, mutated)
        for key, res in results.items():
            cause = results.get((key[0], res.cause or ""))
            if any(c in res.summary for c in CRASHED):
                bad.append(f"{what}: {res.id}: {res.summary}")
            elif "is malformed" in res.summary and (res.status is not Status.FAIL or not shape_says
                                                    or not res.summary.startswith(malformed)):
                bad.append(f"{what}: {res.id}: {res.status.value} {res.summary}")
            elif (value is not None and not isinstance(value, dict) and (res.status, res.summary) != (
                    recorded[key].status, recorded[key].summary) and not res.summary.startswith(malformed)
                  and not (cause is not None and cause.summary.startswith(malformed))):
                # the whole fact of another type: a check that reads it says it is malformed (its dependents: "same
                # cause"), and nothing else changes
                bad.append(f"{what}: {res.id}: {res.status.value} {res.summary}")
    assert not bad, f"{len(bad)} mutation(s) of {fact} in {name_of(path)}:\n" + "\n".join(bad[:25])


def test_every_collector_declares_its_shape() -> None:
    """A collector without ``shape=`` would let a malformed value reach its checks (test_architecture holds the
    declaration in the sources; this holds it in the registry, plugins' rules aside)."""
    assert [n for n, c in load(plugins=False).collectors.items() if c.shape is None] == []


def test_every_recorded_fact_has_its_shape() -> None:
    """The shapes accept what the collectors really record (every fact of every recording)."""
    collectors = load(plugins=False).collectors
    wrong = []
    for path in recordings():
        for name, value in json.loads(path.read_text())["facts"].items():
            if name in collectors and not (isinstance(value, dict) and "__error__" in value):
                why = problem(value, collectors[name].shape)
                if why:
                    wrong.append(f"{name_of(path)}: {name}: {why}")
    assert wrong == []


@pytest.mark.parametrize("where", ["this interpreter", "no interpreter"])
def test_what_the_collectors_give_here_has_its_shape(where: str, tmp_path: Path) -> None:
    """The shapes accept what every collector returns live: on this machine (no GPU, no model; the stack probes
    run in this interpreter), and when the service's interpreter does not exist and the model paths are missing
    (every probe's failure record). A shape that rejected a real reading would turn a healthy host into a fail."""
    flags: dict[str, Any] = {"model_path": str(tmp_path / "no-model"), "draft_model_path": str(tmp_path / "none")}
    if where == "no interpreter":
        flags["python"] = str(tmp_path / "venv" / "bin" / "python")
    ctx = make_context(flags, live=True)
    wrong = []
    for name, col in sorted(load(plugins=False).collectors.items()):
        try:
            value = col.func(ctx.facts.options)
        except Exception as exc:  # a collector raising is the store's to turn into "collector crashed"
            wrong.append(f"{name}: raised {type(exc).__name__}: {exc}")
            continue
        why = problem(json.loads(json.dumps(value, default=str)), col.shape)
        if why:
            wrong.append(f"{name}: {why}")
    assert wrong == []
