"""CUDA_VISIBLE_DEVICES as CUDA reads it: indices, GPU- UUIDs (unique prefixes), MIG devices; the first
invalid entry hides itself and everything after it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from doctor.gpu.facts import resolve_visible

UUIDS = ["GPU-0ee73c7c-ff49-1cbb-61c7-a88f2fc0f94f", "GPU-2503ab35-ae3f-bc62-f0c6-16605ecd596f",
         "GPU-2503ffff-0000-0000-0000-000000000000", "GPU-9a0b1c2d-3e4f-5a6b-7c8d-9e0f1a2b3c4d"]


def idx(value: str | None, uuids: list[str] = UUIDS, **kw: object) -> list[int]:
    return resolve_visible(value, uuids, **kw)["indices"]


def test_unset_is_every_gpu_and_empty_is_none() -> None:
    assert idx(None) == [0, 1, 2, 3]
    assert idx("") == [] and idx("  ") == []


def test_indices_in_the_given_order_with_spaces() -> None:
    assert idx("3, 1,0") == [3, 1, 0]


def test_first_invalid_entry_hides_the_rest() -> None:
    out = resolve_visible("1,7,0", UUIDS)
    assert out["indices"] == [1] and out["ignored"] == ["7", "0"]
    assert "no GPU with index 7 (4 GPUs)" in out["problems"][0]
    assert idx("0,,1") == [0] and idx("-1,0") == [] and idx("0,0,1") == [0] and idx("0,abc,1") == [0]


def test_uuid_prefix_must_be_unique() -> None:
    assert idx("GPU-0ee73c7c") == [0]
    assert idx("gpu-9A0B1C2D-3e4f-5a6b-7c8d-9e0f1a2b3c4d") == [3]
    out = resolve_visible("GPU-2503", UUIDS)
    assert out["indices"] == [] and "ambiguous UUID prefix (2 GPUs)" in out["problems"][0]
    assert "no GPU has this UUID" in resolve_visible("GPU-deadbeef", UUIDS)["problems"][0]
    assert idx("0ee73c7c-ff49-1cbb-61c7-a88f2fc0f94f") == []  # CUDA wants the GPU- prefix


def test_mig_devices() -> None:
    out = resolve_visible("MIG-abc", UUIDS, mig_parent=lambda t: 2 if t == "MIG-abc" else None)
    assert out["indices"] == [2] and out["mig_entries"] == ["MIG-abc"]
    assert idx("MIG-abc") == []  # no resolver: cannot be found
    assert idx("MIG-GPU-9a0b1c2d-3e4f-5a6b-7c8d-9e0f1a2b3c4d/1/0") == [3]
    assert idx("MIG-GPU-00000000-0000-0000-0000-000000000000/1/0") == []


@given(st.lists(st.integers(0, 3), unique=True, max_size=4), st.lists(st.text(max_size=6), max_size=3))
def test_valid_prefix_then_anything(valid: list[int], tail: list[str]) -> None:
    value = ",".join([str(i) for i in valid] + tail)
    got = idx(value) if value else idx("")
    assert got[: len(valid)] == valid if value.strip() else got == []
    assert len(got) == len(set(got)) and all(0 <= i < 4 for i in got)


def test_non_ascii_digits_are_invalid_not_a_crash() -> None:
    out = resolve_visible("0,\u00b9", UUIDS)  # '¹'.isdigit() is True; CUDA would not take it
    assert out["indices"] == [0] and out["ignored"] == ["\u00b9"]
    assert idx("+1") == [1] and idx("\u0661") == []  # Arabic-Indic one
