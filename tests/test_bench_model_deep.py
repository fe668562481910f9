"""bench/bench_model_deep.py's ``--variants``: the doctor timed beside itself with other read-loop buffers.

The timings themselves are the bench's business (they run on the host that matters, never here); what is
checked is that a variant really runs with its buffer, gives the doctor's digests, and leaves the module as it
found it, and that its ratios are paired per run.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from file_modules import load_file

from doctor.model import hashing

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:
    sys.path.append(str(ROOT / "bench"))  # the bench's own helpers (timing.py), as when it runs as a script
deep = load_file(ROOT / "bench" / "bench_model_deep.py", "k26_bench_model_deep")


def test_a_variant_hashes_with_its_buffer_and_restores_the_default(tmp_path: Path) -> None:
    f = tmp_path / "x.bin"
    f.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    seen: list[int] = []
    real = hashing.sha256_file

    def spy() -> str:
        seen.append(hashing.BLOCK)
        return real(str(f))

    default = hashing.BLOCK
    assert deep.with_block(spy, 1024 * 1024)() == hashlib.sha256(f.read_bytes()).hexdigest()
    assert seen == [1024 * 1024] and hashing.BLOCK == default


def test_warm_set_times_each_variant_beside_xargs(tmp_path: Path) -> None:
    data = deep.Data(str(tmp_path / "bench"))
    d = data.dir_for((3, 1))
    w = deep.warm_set(d, 2, 1, {"xargs sha256sum": ["sha256sum"]}, min_timed_s=0.0, variants=True)
    names = {f"doctor {b // 1024}K" for b in deep.VARIANT_BLOCKS if b != hashing.read_block()}
    names.add("doctor prefetch 0M" if hashing.PREFETCH_AHEAD else "doctor prefetch 64M")
    names |= {f"doctor workers from {m // deep.MIB}M" for m in deep.WAIT_VARIANTS if m != hashing.WORKER_WAIT_MIN}
    assert len(names) == len(deep.VARIANT_BLOCKS) - 1 + 1 + len(deep.WAIT_VARIANTS) - 1
    assert names <= set(w["median_gib_s"]) and set(w["over_xargs"]) == names | {"doctor", "doctor call"}
    assert w["over_xargs"]["doctor"] == w["doctor_over_xargs"]["median"]


def test_the_real_check_deep_is_timed_beside_xargs_with_its_lead(tmp_path: Path) -> None:
    """``--cli``: the real ``check --deep`` passes against the manifest the bench wrote from the doctor's
    digests (any other digest from any tool ends the bench), its check's seconds are what count; the lead a
    real run gives its fork server is measured from real runs."""
    data = deep.Data(str(tmp_path / "bench"))
    d = data.dir_for((3, 1))
    said = deep.run_lead(d, runs=1)
    assert said is not None and set(said) == {"lead", "hash_files", "verify", "check"}
    lead = said["lead"]
    assert 0 < lead < 60 and 0 < said["hash_files"] <= said["verify"] <= said["check"] < 60
    w = deep.warm_set(d, 2, 1, {"xargs sha256sum": ["sha256sum"]}, min_timed_s=0.0, lead=lead, cli=True)
    assert set(w["over_xargs"]) == {"doctor", "doctor call", "doctor check --deep"}
    assert w["runs"] == 1 and w["mode"] == "run's workers x1"  # 3 MiB: one slot (MIN_SLOT_BYTES)
    took = deep.cli_call(d, 2)()
    assert isinstance(took, deep.Took) and took.digests == deep.MANIFEST_DIGESTS[d] and 0 < took.seconds < 60


def test_variant_ratios_pair_runs() -> None:
    rates = {"doctor": [2.0, 4.0, 6.0], "doctor 1024K": [3.0, 3.0, 3.0], "xargs sha256sum": [2.0, 2.0, 2.0],
             "threads": [1.0, 1.0, 1.0]}
    assert deep.variant_ratios(rates, "xargs sha256sum") == {"doctor": 2.0, "doctor 1024K": 1.5}
