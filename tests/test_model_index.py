"""Index parsing and the index/header cross-check: examples and property tests."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from doctor.model.header import HeaderReport
from doctor.model.index import cross_check, parse_index_bytes, unsafe_path_reason

SAFE = st.builds(lambda d, n: f"{d}{n}.safetensors", st.sampled_from(["", "sub/", "a/b/"]),
                 st.text(alphabet="abcxyz019_-", min_size=1, max_size=6))
EVIL = st.sampled_from(["../x.safetensors", "/abs.safetensors", "a/../../b", "a\\b", "", "ok/", "a\x00b",
                        "./..", "sub/../.."])
TENSOR = st.builds(lambda a, i, b: f"{a}.{i}.{b}", st.sampled_from(["model", "lm", "x"]), st.integers(0, 30),
                   st.sampled_from(["weight", "bias", "weight_packed", "weight_scale"]))


def report(names: list[str]) -> HeaderReport:
    rep = HeaderReport("x")
    pos = 0
    for n in names:
        rep.tensors[n] = {"dtype": "U8", "shape": [1], "data_offsets": [pos, pos + 1]}
        pos += 1
    rep.data_bytes = pos
    return rep


def test_examples():
    assert unsafe_path_reason("model-00001-of-000064.safetensors") is None
    assert unsafe_path_reason("sub/model.safetensors") is None
    assert "absolute" in unsafe_path_reason("/etc/passwd")
    assert "'..'" in unsafe_path_reason("../w.safetensors")
    idx = parse_index_bytes(b'{"weight_map": {"a": "../w.safetensors", "b": "ok.safetensors"}}')
    assert idx.shards == ["ok.safetensors"] and idx.problems[0].code == "path_unsafe"
    for raw, want in [(b"[]", "not an object"), (b"{}", "no weight_map"), (b"{", "not valid JSON"),
                      (b'{"weight_map": {"a": 1}}', "not a file name"), (b'{"weight_map": {"a": ["x"]}}', "not file"),
                      (b'{"weight_map": {"a": "s"}, "metadata": {"total_size": -1}}', "not a byte count"),
                      (b"\xff", "not UTF-8")]:
        idx = parse_index_bytes(raw)
        assert idx.problems and want in idx.problems[0].message, (raw, idx.problems)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(TENSOR, st.one_of(SAFE, EVIL, st.integers(), st.none(), st.lists(st.integers(), max_size=2)),
                       max_size=12),
       st.one_of(st.none(), st.integers(-5, 10 ** 12), st.floats(allow_nan=False), st.text(max_size=3)))
def test_any_index_gives_a_verdict(wmap, total):
    doc = {"metadata": {"total_size": total}, "weight_map": wmap}
    idx = parse_index_bytes(json.dumps(doc).encode())
    for shard in idx.shards:
        assert unsafe_path_reason(shard) is None
    evil = {v for v in wmap.values() if isinstance(v, str) and unsafe_path_reason(v)}
    text = " ".join(p.message for p in idx.problems)
    for name in evil:
        assert repr(name) in text
    if not wmap:
        assert idx.problems


@st.composite
def layouts(draw):
    """A true tensor -> shard assignment, and an index that may disagree with it in one way."""
    names = draw(st.lists(TENSOR, min_size=1, max_size=15, unique=True))
    shards = [f"s{i}.safetensors" for i in range(draw(st.integers(1, 4)))]
    truth = {n: draw(st.sampled_from(shards)) for n in names}
    index = dict(truth)
    how = draw(st.sampled_from(["same", "move", "drop", "add", "dup"]))
    if how == "move" and len(shards) > 1:
        n = draw(st.sampled_from(names))
        index[n] = draw(st.sampled_from([s for s in shards if s != truth[n]]))
    elif how == "drop":
        del index[draw(st.sampled_from(names))]
    elif how == "add":
        index["zz.not.there"] = draw(st.sampled_from(shards))
    changed = index != truth
    in_shard = {s: [n for n, v in truth.items() if v == s] for s in shards}
    if how == "dup" and len(shards) > 1:
        n = draw(st.sampled_from(names))
        other = draw(st.sampled_from([s for s in shards if s != truth[n]]))
        in_shard[other].append(n)
        changed = True
    return index, in_shard, changed


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_cross_check_finds_every_disagreement(case):
    index_map, in_shard, changed = case
    used = list(dict.fromkeys(index_map.values()))
    total = sum(len(in_shard[s]) for s in used)
    idx = parse_index_bytes(json.dumps({"metadata": {"total_size": total}, "weight_map": index_map}).encode())
    headers = {s: report(in_shard[s]) for s in in_shard}
    cc = cross_check(idx, headers)
    found = bool(cc.general) or any(cc.per_shard.values())
    # What the headers of the shards the index names hold, against what the index says.
    held = sorted((n, s) for s in used for n in in_shard[s])
    assert found == (held != sorted(index_map.items())), (index_map, in_shard, cc.general, cc.per_shard)
    if not changed:
        assert not found
