"""The GPU snapshot fixtures: what scenarios.py builds, marked, loadable, the real recording kept."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from file_modules import load_file

from doctor.facts.snapshot import load_snapshot

SNAPS = Path(__file__).parent / "fixtures" / "snapshots"
# The real recordings from the H200 hosts (shared/reference), as they were copied in: their sha256 then. The
# converted and the synthetic fixtures derive from them, so an edit of one changes every verdict built on it.
RECORDED = {"reference/h200x2-nvml.json": "882b1bbf60017b855844cb25d09095a73a19551413c2a61473a7d112c545a74c",
            "reference/h200x2-snapshot.json": "16841782ea307ae26cc041859e62d97435ac2d90b855eef98e0262cb189c813b"}


def _scenarios() -> object:
    return load_file(SNAPS / "scenarios.py", "gpu_scenarios", register=False)


def test_committed_fixtures_are_what_the_builder_makes() -> None:
    mod = _scenarios()
    ref = json.loads((SNAPS / "reference" / "h200x2-nvml.json").read_text())
    for name, doc in mod.scenarios(ref).items():
        assert json.loads((SNAPS / name).read_text()) == doc, f"{name} is stale: run {SNAPS / 'scenarios.py'}"


def test_reference_recording_kept_verbatim() -> None:
    """Byte for byte what the hosts recorded (a reformatted or edited copy fails, whatever it still parses to)."""
    for rel, digest in RECORDED.items():
        assert hashlib.sha256((SNAPS / rel).read_bytes()).hexdigest() == digest, f"{rel} is not the recording"


@pytest.mark.parametrize("path", sorted(SNAPS.glob("*.json")), ids=lambda p: p.name)
def test_snapshots_load_and_say_what_they_are(path: Path) -> None:
    doc = load_snapshot(path)
    assert isinstance(doc["synthetic"], bool) and doc["note"]
    if doc["synthetic"]:
        assert "synthetic, derived from the real" in doc["note"]
    nvml = doc["facts"]["nvml"]
    for key in ("available", "error", "driver_version", "cuda_driver_version", "device_count_total", "visible",
                "devices"):
        assert key in nvml, key
    for d in nvml["devices"]:
        for key in ("index", "name", "uuid", "compute_capability", "memory", "pci_bus_id"):
            assert key in d, key


def test_converted_reference_keeps_the_real_readings() -> None:
    ref = json.loads((SNAPS / "reference" / "h200x2-nvml.json").read_text())
    conv = load_snapshot(SNAPS / "h200x2-reference.json")["facts"]["nvml"]
    assert conv["driver_version"] == ref["driver"] == "580.159.04"
    assert [d["uuid"] for d in conv["devices"]] == [d["uuid"] for d in ref["devices"]]
    assert [d["nvlink"]["active"] for d in conv["devices"]] == [18, 18]
    assert conv["pairs"][0]["topology"] == "PHB" and conv["pairs"][0]["p2p_nvlink"] == "ok"
    assert "convert parameter 3" in conv["pairs"][0]["errors"]["p2p_read"]
