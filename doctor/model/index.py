"""``model.safetensors.index.json``: parse it, keep its paths inside the model, check it against headers.

The index is the only source of shard names (K2.6 uses ``-of-000064``, six digits; nothing is
guessed). A weight map entry is a path relative to the model directory: absolute paths, ``..``,
backslashes and empty names are refused before anything is opened.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from doctor.core.fileio import read_capped
from doctor.model.header import Defect, HeaderReport, problem, recorded

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_INDEX_BYTES = 512 * 1024 * 1024


@dataclass
class Index:
    """A parsed index: ``weight_map`` tensor -> shard name; ``shards`` in first-seen order."""

    path: str
    weight_map: dict[str, str] = field(default_factory=dict)
    total_size: int | None = None
    shards: list[str] = field(default_factory=list)
    problems: list[Defect] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def unsafe_path_reason(name: str) -> str | None:
    """Why a shard name from an index would leave the model directory (or is unusable), or None."""
    if not isinstance(name, str) or not name:
        return "empty or not a string"
    if "\x00" in name:
        return "contains a NUL byte"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/") or os.path.isabs(name):
        return "is an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "contains '..'"
    if posixpath.normpath(name) in (".", "") or name.endswith("/"):
        return "does not name a file"
    return None


def parse_index_bytes(raw: bytes, path: str = INDEX_NAME) -> Index:
    """Parse the index JSON; problems (never exceptions) for anything malformed."""
    idx = Index(path)
    doc = _index_object(raw, path, idx)
    if doc is None:
        return idx
    wmap = doc.get("weight_map")
    if not isinstance(wmap, dict) or not wmap:
        idx.problems.append(problem("index_invalid", "index has no weight_map object (or it is empty)"))
        return idx
    _metadata(doc.get("metadata"), idx)
    try:
        shard_names: list[Any] = list(dict.fromkeys(wmap.values()))  # first-seen order, C speed
    except TypeError:  # an unhashable value (list, object)
        wmap = {t: v for t, v in wmap.items() if isinstance(v, str)}
        shard_names = list(dict.fromkeys(wmap.values()))
        idx.problems.append(problem("index_invalid", "weight_map has values that are not file names"))
    bad_paths = _unsafe_names(shard_names, idx)
    idx.weight_map = {t: s for t, s in wmap.items() if isinstance(s, str)} if len(idx.problems) else wmap
    seen = [s for s in shard_names if isinstance(s, str)]
    idx.shards = [s for s in seen if s not in bad_paths]
    return idx


def _index_object(raw: bytes, path: str, idx: Index) -> dict[str, Any] | None:
    """The index's JSON object; None (the defect recorded in ``idx``) when it is not UTF-8, not JSON, nested too
    deeply or not an object."""
    name = posixpath.basename(path)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        idx.problems.append(problem("index_invalid", f"{name} is not UTF-8 (byte {exc.start})"))
        return None
    except json.JSONDecodeError as exc:
        idx.problems.append(problem("index_invalid", f"{name} is not valid JSON: {exc.msg} "
                                    f"(line {exc.lineno}, column {exc.colno})"))
        return None
    except RecursionError:
        idx.problems.append(problem("index_invalid", f"{name} is nested too deeply"))
        return None
    if not isinstance(doc, dict):
        idx.problems.append(problem("index_invalid", "index JSON is not an object"))
        return None
    return doc


def _metadata(meta: Any, idx: Index) -> None:
    """``metadata``: an object, whose ``total_size`` (when given) is a byte count, kept in ``idx.total_size``."""
    if meta is not None and not isinstance(meta, dict):
        idx.problems.append(problem("index_invalid", "index metadata is not an object"))
    elif isinstance(meta, dict) and "total_size" in meta:
        ts = meta["total_size"]
        if (isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0
                or int(ts) != ts):
            idx.problems.append(problem("index_invalid", f"metadata.total_size {ts!r} is not a byte count"))
        else:
            idx.total_size = int(ts)


def _unsafe_names(shard_names: list[Any], idx: Index) -> dict[str, str]:
    """The shard names that are not file names, and those that would lead outside the model directory (with why):
    the doctor refuses to look there."""
    bad_paths: dict[str, str] = {}
    for shard in shard_names:
        if not isinstance(shard, str):
            idx.problems.append(problem("index_invalid", f"weight_map names {shard!r}, which is not a file name"))
            continue
        why = unsafe_path_reason(shard)
        if why:
            bad_paths[shard] = why
    for shard, why in bad_paths.items():
        idx.problems.append(problem("path_unsafe", f"index names shard {shard!r}, which {why}: refusing to "
                                    "look outside the model directory"))
    return bad_paths


def read_index(path: str) -> Index:
    """Read and parse the index file at ``path``."""
    try:
        raw = read_capped(path, MAX_INDEX_BYTES, "a safetensors index")  # a FIFO or device: refused, not waited on
    except OSError as exc:
        idx = Index(path)
        code = "index_missing" if isinstance(exc, FileNotFoundError) else "index_unreadable"
        idx.problems.append(problem(code, f"cannot read {posixpath.basename(path)}: {exc.strerror or exc}"))
        return idx
    return parse_index_bytes(raw, path)


@dataclass
class CrossCheck:
    """Index against headers: problems per shard name (``""`` for the index as a whole)."""

    per_shard: dict[str, list[Defect]] = field(default_factory=dict)
    general: list[Defect] = field(default_factory=list)
    header_total: int = 0

    def add(self, shard: str, problem: Defect) -> None:
        self.per_shard.setdefault(shard, []).append(problem)


def _examples(names: Iterable[str], n: int = 3) -> str:
    out = []
    for i, name in enumerate(names):
        if i == n:
            out.append("...")
            break
        out.append(repr(name))
    return ", ".join(out)


def cross_check(index: Index, headers: Mapping[str, HeaderReport | None]) -> CrossCheck:
    """Every indexed tensor in the shard the index names; none in two shards; total_size agrees.

    ``headers`` maps each shard name to its header report (None: missing/unreadable, judged elsewhere).
    Only shards with a valid header are compared.
    """
    cc = CrossCheck()
    valid = {s: r for s in index.shards if (r := headers.get(s)) is not None and r.ok}
    if len(valid) == len(index.shards) and _agrees_at_once(index, valid, cc):
        return cc
    owner, dup, complete = _owners(index, headers, cc)
    for name, shards in list(dup.items())[:20]:
        cc.general.append(problem("tensor_duplicated", f"tensor {name!r} is in {len(shards)} shards: "
                                  f"{', '.join(shards)}"))
    if len(dup) > 20:
        cc.general.append(problem("tensor_duplicated", f"... and {len(dup) - 20} more tensors in two shards"))
    _indexed_elsewhere(index, headers, owner, cc)
    # Tensors in a header the index does not name: loaders that follow the index never see them.
    unindexed: dict[str, list[str]] = {}
    for name, shard in owner.items():
        if index.weight_map.get(name) is None:
            unindexed.setdefault(shard, []).append(name)
    for shard, items in unindexed.items():
        cc.add(shard, problem("tensor_unindexed", f"{len(items)} tensor(s) in {shard} are not in the index: "
                              f"{_examples(items)}"))
    if complete and index.total_size is not None and index.total_size != cc.header_total:
        cc.general.append(problem("total_size_mismatch", f"index metadata.total_size is {index.total_size} bytes, "
                                  f"the shard headers hold {cc.header_total} bytes of tensor data"))
    return cc


def _agrees_at_once(index: Index, valid: Mapping[str, HeaderReport], cc: CrossCheck) -> bool:
    """The usual case, every header valid: one dict built in C from the headers equals the weight map. Then only
    total_size remains to compare; False sends the caller through the tensor-by-tensor comparison."""
    owner_fast: dict[str, str] = {}
    count = 0
    for shard, rep in valid.items():
        owner_fast.update(dict.fromkeys(rep.tensors, shard))
        count += len(rep.tensors)
    if count != len(owner_fast) or owner_fast != index.weight_map:
        return False
    cc.header_total = sum(r.data_bytes for r in valid.values())
    if index.total_size is not None and index.total_size != cc.header_total:
        cc.general.append(problem("total_size_mismatch", f"index metadata.total_size is "
                                  f"{index.total_size} bytes, the shard headers hold {cc.header_total} "
                                  "bytes of tensor data"))
    return True


def _owners(index: Index, headers: Mapping[str, HeaderReport | None], cc: CrossCheck
            ) -> tuple[dict[str, str], dict[str, list[str]], bool]:
    """(the shard each tensor is first found in, the tensors found in several, whether every shard was valid);
    the valid headers' data bytes in ``cc.header_total``."""
    owner: dict[str, str] = {}
    dup: dict[str, list[str]] = {}
    total = 0
    complete = True
    for shard in index.shards:
        rep = headers.get(shard)
        if rep is None or not rep.ok:
            complete = False
            continue
        total += rep.data_bytes
        for name in rep.tensors:
            prev = owner.get(name)
            if prev is None:
                owner[name] = shard
            else:
                dup.setdefault(name, [prev]).append(shard)
    cc.header_total = total
    return owner, dup, complete


def _indexed_elsewhere(index: Index, headers: Mapping[str, HeaderReport | None], owner: dict[str, str],
                       cc: CrossCheck) -> None:
    """Tensors the index puts in a shard whose header lacks them: in another shard, or in none."""
    missing: dict[str, list[str]] = {}
    misplaced: dict[str, list[tuple[str, str]]] = {}
    for tensor, shard in index.weight_map.items():
        rep = headers.get(shard)
        if rep is None or not rep.ok:
            continue
        if tensor not in rep.tensors:
            where = owner.get(tensor)
            if where is not None:
                misplaced.setdefault(shard, []).append((tensor, where))
            else:
                missing.setdefault(shard, []).append(tensor)
    for shard, items in misplaced.items():
        ex = ", ".join(f"{t!r} (found in {w})" for t, w in items[:3])
        cc.add(shard, problem("tensor_wrong_shard", f"{len(items)} tensor(s) the index puts in {shard} are in "
                              f"another shard: {ex}{', ...' if len(items) > 3 else ''}"))
    for shard, items in missing.items():
        cc.add(shard, problem("tensor_missing", f"{len(items)} tensor(s) the index puts in {shard} are not in "
                              f"its header: {_examples(items)}"))


def index_summary(index: Index) -> dict[str, Any]:
    """Small JSON description of an index (for facts)."""
    return {"path": index.path, "shards": list(index.shards), "tensors": len(index.weight_map),
            "total_size": index.total_size, "problems": [recorded(p) for p in index.problems]}
