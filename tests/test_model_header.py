"""The safetensors header validator against real files (safetensors.numpy) and the reference parser."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_replica import header_bytes
from safetensors import safe_open
from safetensors.numpy import save_file

from doctor.model.header import DTYPE_BITS, MAX_HEADER_BYTES, HeaderReport, read_header, validate_header_bytes
from doctor.model.weights import size_problem


def _raw(header: dict | bytes, data_len: int) -> bytes:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(body)) + body + b"\0" * data_len


def _write(path, raw: bytes) -> str:
    with open(path, "wb") as fh:
        fh.write(raw)
    return str(path)


def _codes(rep: HeaderReport) -> list[str]:
    return [p.code for p in rep.problems]


def _size(rep: HeaderReport) -> dict[str, str] | None:
    """What the judgement says of the file's size, from what the model fact records of the header."""
    return size_problem({"size": rep.size, "header_len": rep.header_len, "data_bytes": rep.data_bytes,
                         "parsed": rep.parsed})


def test_real_file_is_valid(tmp_path):
    p = str(tmp_path / "a.safetensors")
    save_file({"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.zeros((5,), np.int8),
               "e": np.zeros((0, 3), np.int64)}, p, metadata={"format": "np"})
    rep = read_header(p)
    assert rep.ok, rep.problems
    assert set(rep.tensors) == {"w", "b", "e"}
    assert rep.data_bytes == 48 + 5
    assert rep.metadata == {"format": "np"}


def test_truncated_names_missing_bytes(tmp_path):
    p = str(tmp_path / "t.safetensors")
    save_file({"w": np.zeros((64, 64), np.float32)}, p)
    size = os.path.getsize(p)
    with open(p, "r+b") as fh:
        fh.truncate(size - 100)
    rep = read_header(p)
    assert _codes(rep) == [] and not rep.complete and not rep.ok  # the bytes read are sound; the size is not
    found = _size(rep)
    assert found is not None and found["code"] == "truncated" and "100 bytes missing" in found["message"]


def test_trailing_bytes(tmp_path):
    p = str(tmp_path / "t.safetensors")
    save_file({"w": np.zeros((4,), np.float32)}, p)
    with open(p, "ab") as fh:
        fh.write(b"xx")
    rep = read_header(p)
    assert not rep.ok and (_size(rep) or {}).get("code") == "trailing_bytes"
    assert _size(read_header(p)) is not None and _size(HeaderReport("x")) is None  # unparsed: nothing to compare


def test_the_size_is_judged_from_the_recorded_numbers():
    """A replayed fact is judged by today's rule: the numbers are the fact, the verdict the judgement's."""
    assert size_problem({"size": 108, "header_len": 50, "data_bytes": 50, "parsed": True}) is None
    assert size_problem({"size": 100, "header_len": 50, "data_bytes": 50, "parsed": True})["message"] == (
        "file is 100 bytes, header says 108 (8 bytes missing): truncated download")
    assert size_problem({"size": 110, "header_len": 50, "data_bytes": 50, "parsed": True})["code"] == "trailing_bytes"
    assert size_problem({"size": 100, "header_len": 50, "data_bytes": 50}) is None  # a snapshot from before


def test_lfs_pointer_is_named(tmp_path):
    p = _write(tmp_path / "s.safetensors", b"version https://git-lfs.github.com/spec/v1\noid sha256:"
               + b"a" * 64 + b"\nsize 9876543210\n")
    rep = read_header(p)
    assert _codes(rep) == ["lfs_pointer"]
    assert "Git LFS pointer" in rep.problems[0].message


def test_huge_header_length(tmp_path):
    p = _write(tmp_path / "h.safetensors", struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    rep = read_header(p)
    assert _codes(rep) == ["header_too_large"]
    assert str(MAX_HEADER_BYTES) in rep.problems[0].message


def test_header_longer_than_file(tmp_path):
    p = _write(tmp_path / "h.safetensors", struct.pack("<Q", 1000) + b"{}")
    assert _codes(read_header(p)) == ["truncated"]


def test_overlapping_offsets(tmp_path):
    hdr = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
           "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}
    rep = read_header(_write(tmp_path / "o.safetensors", _raw(hdr, 24)))
    assert _codes(rep) == ["offsets_overlap"]
    assert "'b'" in rep.problems[0].message


def test_hole_between_tensors(tmp_path):
    hdr = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
           "b": {"dtype": "F32", "shape": [4], "data_offsets": [20, 36]}}
    assert _codes(read_header(_write(tmp_path / "o.safetensors", _raw(hdr, 36)))) == ["offsets_hole"]


def test_wrong_dtype_for_shape(tmp_path):
    # BF16 [4, 4] needs 32 bytes; offsets hold 64 (as if F32).
    hdr = {"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 64]}}
    rep = read_header(_write(tmp_path / "d.safetensors", _raw(hdr, 64)))
    assert _codes(rep) == ["dtype_shape_mismatch"]
    assert "BF16[4, 4] needs 32 bytes" in rep.problems[0].message


@pytest.mark.parametrize("body,code", [
    (b"\xff\xfe{}", "header_invalid"),             # not starting with '{'
    (b"{\"a\": \xff}", "header_invalid"),           # not UTF-8
    (b"{\"a\": [1, 2}", "header_invalid"),         # not JSON
    (b"{\"a\": {\"dtype\": \"Q8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", "tensor_invalid"),
    (b"{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", "tensor_invalid"),
    (b"{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", "tensor_invalid"),
    (b"{\"a\": {\"dtype\": \"F32\", \"shape\": [true], \"data_offsets\": [0, 4]}}", "tensor_invalid"),
    (b"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", "tensor_invalid"),
    (b"{\"a\": 3}", "tensor_invalid"),
    (b"{\"__metadata__\": {\"x\": 1}}", "header_invalid"),
    (b"\0\0\0\0\0\0\0\0", "header_invalid"),         # zero-filled (preallocated, never written)
    (b"[1, 2]", "header_invalid"),
])
def test_bad_headers_fail_cleanly(tmp_path, body, code):
    rep = read_header(_write(tmp_path / "x.safetensors", _raw(body, 4)))
    assert code in _codes(rep)


def test_unreadable_and_special_files(tmp_path):
    os.mkfifo(tmp_path / "fifo.safetensors")  # opening it would block forever: must not be opened
    assert _codes(read_header(str(tmp_path / "fifo.safetensors"))) == ["not_a_file"]
    os.mkdir(tmp_path / "dir.safetensors")
    assert _codes(read_header(str(tmp_path / "dir.safetensors"))) == ["not_a_file"]
    assert _codes(read_header(str(tmp_path / "absent.safetensors"))) == ["unreadable"]
    assert _codes(read_header(_write(tmp_path / "empty.safetensors", b""))) == ["truncated"]


def test_replica_header_is_what_safetensors_reads(tmp_path):
    tensors = [("a.weight", "BF16", (3, 5)), ("b.packed", "I32", (4, 2)), ("c", "F8_E4M3", (7,)),
               ("d", "U8", (0,)), ("e", "F4", (2, 4))]
    head, data = header_bytes(tensors, {"format": "pt"})
    p = _write(tmp_path / "r.safetensors", head + b"\0" * data)
    rep = read_header(p)
    assert rep.ok, rep.problems
    with safe_open(p, "np") as f:
        assert set(f.keys()) == {t[0] for t in tensors}


# -- property tests: the validator agrees with the reference (Rust) parser --------------------------

_DTYPES = sorted(k for k in DTYPE_BITS if k not in ("F6_E2M3", "F6_E3M2", "F4"))
_name = st.text(alphabet="abcdefghij._0123456789", min_size=1, max_size=12)
_tensor = st.tuples(_name, st.sampled_from(_DTYPES), st.lists(st.integers(0, 6), min_size=0, max_size=3))


@st.composite
def headers(draw):
    """A header that is valid, then perhaps broken in one way the validator must notice."""
    specs = draw(st.lists(_tensor, min_size=0, max_size=6, unique_by=lambda t: t[0]))
    head, data = header_bytes([(n, d, tuple(s)) for n, d, s in specs])
    doc = json.loads(head[8:])
    names = [n for n in doc if n != "__metadata__"]
    mutation = draw(st.sampled_from(["none", "size", "offset", "dtype", "shape", "swap", "data_len"]))
    extra = 0
    if names and mutation != "none":
        victim = doc[draw(st.sampled_from(names))]
        delta = draw(st.integers(-3, 3).filter(lambda x: x != 0))
        if mutation == "size":
            victim["data_offsets"][1] = max(victim["data_offsets"][0], victim["data_offsets"][1] + delta)
        elif mutation == "offset":
            victim["data_offsets"][0] = max(0, victim["data_offsets"][0] + delta)
        elif mutation == "dtype":
            victim["dtype"] = draw(st.sampled_from(_DTYPES))
        elif mutation == "shape":
            victim["shape"] = draw(st.lists(st.integers(0, 6), max_size=3))
        elif mutation == "swap" and len(names) > 1:
            other = doc[draw(st.sampled_from(names))]
            victim["data_offsets"], other["data_offsets"] = other["data_offsets"], victim["data_offsets"]
        elif mutation == "data_len":
            extra = delta
    return doc, max(0, data + extra)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(headers())
def test_agrees_with_safe_open(tmp_path, case):
    doc, data_len = case
    p = _write(tmp_path / "p.safetensors", _raw(doc, data_len))
    rep = read_header(p)
    try:
        with safe_open(p, "np") as f:
            keys = set(f.keys())
        ref_ok = True
    except Exception:
        ref_ok = False
    assert rep.ok == ref_ok, (rep.problems, doc, data_len)
    if ref_ok:
        assert set(rep.tensors) == keys


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 2 ** 64 - 1))
def test_arbitrary_bytes_never_raise(raw, n):
    rep = validate_header_bytes(raw, HeaderReport("x", size=8 + len(raw), header_len=len(raw)))
    assert rep.ok or rep.problems or _size(rep)
    rep2 = validate_header_bytes(json.dumps({"a": {"dtype": "F32", "shape": [n % 7], "data_offsets": [0, n]}})
                                 .encode(), HeaderReport("x"))
    assert rep2.ok == (n == 4 * (n % 7))


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                    max_leaves=12))
def test_any_json_header_gives_a_verdict(value):
    raw = json.dumps(value).encode()
    rep = validate_header_bytes(raw, HeaderReport("x", size=8 + len(raw), header_len=len(raw)))
    assert isinstance(rep.ok, bool)
    for p in rep.problems:
        assert p.code and p.message
