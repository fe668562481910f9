"""What one shard's header says, as small JSON: the work ``doctor.model.scan`` shares out to worker processes.

Kept apart from ``scan`` (stdlib and ``doctor.model.header`` only) so that a worker interpreter imports little
before it parses: every function here is pure, takes JSON and returns JSON.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from itertools import repeat
from typing import Any

from doctor.model.header import HeaderReport, read_header

_NUM = re.compile(r"\.\d+(?=[.\n]|\Z)")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.")


def shard_summary(rep: HeaderReport) -> dict[str, Any]:
    """One shard's share of the tensor summary (JSON): pattern/dtype/shape counts, layers, experts."""
    names = list(rep.tensors)
    if not names:
        return {"counts": [], "layers": [], "pairs": []}
    joined = "\n".join(names)
    if "\n" in joined and joined.count("\n") != len(names) - 1:  # a name with a newline: fold slowly
        patterns = [_NUM.sub(".#", n) for n in names]
    else:
        patterns = _NUM.sub(".#", joined).split("\n")
    vals = rep.tensors.values()
    counts = Counter(zip(patterns, [v["dtype"] for v in vals], [tuple(v["shape"]) for v in vals], strict=True))
    return {"counts": [[p, d, list(s), n] for (p, d, s), n in counts.items()],
            "layers": sorted(set(_LAYER.findall(joined))),
            "pairs": sorted(set(_EXPERT.findall(joined)))}


def summary_of(path: str) -> dict[str, Any] | None:
    """The summary share of the shard at ``path``, None when its header is not valid."""
    rep = read_header(path)
    return shard_summary(rep) if rep.ok else None


def verdict(rep: HeaderReport, shard: str, weight_map: dict[str, str], indexed: int) -> dict[str, Any]:
    """One shard's header verdict and whether its tensors are exactly those the index puts there (same count,
    and the index maps each of them to this shard)."""
    v: dict[str, Any] = {"ok": rep.ok, "tensors": len(rep.tensors), "data_bytes": rep.data_bytes,
                         "header_len": rep.header_len, "format": (rep.metadata or {}).get("format")}
    if rep.ok:
        names = rep.tensors.keys()
        # operator.eq, not shard.__eq__: the latter answers NotImplemented (truthy) for a name the
        # index lacks (get -> None).
        v["ok"] = len(names) == indexed and all(map(operator.eq, repeat(shard), map(weight_map.get, names)))
    return v


def indexed_verdict(item: list[Any]) -> dict[str, Any]:
    """``verdict`` of ``[path, shard, the tensor names the index puts in it]``."""
    path, shard, names = item
    return verdict(read_header(path), shard, dict.fromkeys(names, shard), len(names))
