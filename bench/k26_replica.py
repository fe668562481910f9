"""Build (or reuse) the sparse Kimi K2.6 replica for the model benchmarks.

    python bench/k26_replica.py DIR        # 64 shards, ~208k tensors, ~554 GiB apparent, ~50 MB on disk

The builder itself is ``tests/model_replica.py`` ``build_k26_replica`` (tests use it at small scale).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the replica builder is a test fixture, not shipped

from model_replica import K26Spec, build_k26_replica  # noqa: E402


def ensure_replica(directory: str, spec: K26Spec | None = None) -> dict[str, object]:
    """Build the replica unless ``directory`` already holds a complete one (the index exists last)."""
    marker = os.path.join(directory, ".k26-replica.json")
    if os.path.exists(marker) and os.path.exists(os.path.join(directory, "model.safetensors.index.json")):
        with open(marker, encoding="utf-8") as fh:
            return json.load(fh)
    info = build_k26_replica(directory, spec or K26Spec())
    with open(marker, "w", encoding="utf-8") as fh:
        json.dump(info, fh)
    return info


def disk_usage(directory: str) -> int:
    """Bytes actually allocated (sparse files count only their written blocks)."""
    return sum(os.stat(os.path.join(directory, f)).st_blocks * 512 for f in os.listdir(directory)
               if os.path.isfile(os.path.join(directory, f)))


if __name__ == "__main__":
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/k26-replica"
    info = ensure_replica(d)
    print(json.dumps(info), f"on disk: {disk_usage(d) / 1e6:.1f} MB")
