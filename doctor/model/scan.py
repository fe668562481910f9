"""Scan a model directory at metadata speed: index, every shard's header, leftovers, a tensor summary.

The result is a JSON-ready dict (the ``model`` fact's ``weights`` part) small enough for a snapshot:
per-shard verdicts and counts, and a tensor summary that folds the ~208k K2.6 tensor names into a
few dozen patterns (``layers.#.mlp.experts.#.down_proj.weight_packed``) with their dtypes and shapes,
the layer indices present and the experts per MoE layer, so that ``model.config`` can judge the
config against the shards without the names themselves.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from doctor.host.access import ownership
from doctor.model.header import DTYPE_BITS, Defect, HeaderReport, read_header, recorded
from doctor.model.index import INDEX_NAME, SINGLE_NAME, Index, cross_check, index_summary, read_index
from doctor.model.layout import file_state, find_leftovers, hf_cache_root, read_hf_local_metadata
from doctor.model.shard_work import indexed_verdict, shard_summary, summary_of, verdict
from doctor.model.workers import map_in_workers, workers_for

MAX_PROBLEMS_PER_SHARD = 8
MAX_STRAY_SHARDS = 256  # *.safetensors files read as shards when there is no index (a model has 64)


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsed JSON has no cycles, yet 200k new dicts trigger
    full collections that would double the parse time. On the way out, what survives (the parsed
    headers kept for ``model.tensors``) is moved out of the collector's sight with ``gc.freeze``:
    otherwise every later full collection of the run walks them again. Reference counting still
    frees them as usual. Small models (tests, drafters) are not worth it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _cached_tensors() >= FREEZE_MIN_TENSORS:
            gc.freeze()
        if was:
            gc.enable()


def scan_weights(model_dir: str, *, workers: int = 8) -> dict[str, Any]:
    """Everything ``model.shards`` judges, for the model directory ``model_dir``."""
    with no_gc():
        return _scan_weights(model_dir, workers)


def _scan_weights(model_dir: str, workers: int) -> dict[str, Any]:
    out: dict[str, Any] = {"layout": None, "index": None, "shards": [], "problems": [], "leftovers": [],
                           "hf_cache": hf_cache_root(model_dir), "totals": {}}
    index, names = _layout(model_dir, out)
    states = {n: file_state(model_dir, n) for n in names}
    readable = [n for n, s in states.items() if s.exists and not s.dangling and s.error is None]
    fast = _fast_index_scan(model_dir, index, readable, states) if index is not None and index.ok else None
    if fast is not None and len(readable) == len(names) and _all_ok(fast):
        return _fast_result(out, model_dir, index, names, states, fast)  # type: ignore[arg-type]
    reports: dict[str, HeaderReport | None] = dict(zip(readable, read_headers(
        [states[n].path for n in readable], workers=workers), strict=True))
    for n in names:
        reports.setdefault(n, None)

    cc = cross_check(index, reports) if index is not None and index.ok else None
    if cc is not None:
        out["problems"].extend(recorded(p) for p in cc.general)
    for n in names:
        out["shards"].append(_shard_record(model_dir, n, states[n], reports[n],
                                           cc.per_shard.get(n, []) if cc is not None else []))
    out["leftovers"] = find_leftovers(model_dir, names)
    out["totals"] = _totals(out["shards"], names, reports, index)
    return out


def _totals(shards: list[dict[str, Any]], names: list[str], reports: dict[str, HeaderReport | None],
            index: Index | None) -> dict[str, Any]:
    """The directory's counts: shards (and how many are valid), tensors and data of the valid headers, bytes on
    disk, the tensors the index names."""
    valid = [r for r in reports.values() if r is not None and r.ok]
    return {
        "shards": len(names),
        "shards_ok": sum(1 for s in shards if s["ok"]),
        "tensors": sum(len(r.tensors) for r in valid),
        "data_bytes": sum(r.data_bytes for r in valid),
        "file_bytes": sum(s["size"] or 0 for s in shards),
        "index_tensors": len(index.weight_map) if index is not None else None,
    }


def _all_ok(fast: dict[str, dict[str, Any]]) -> bool:
    """Every shard the fast path read is valid and consistent with the index (else headers are read in full)."""
    return all(v["ok"] for v in fast.values())


def _layout(model_dir: str, out: dict[str, Any]) -> tuple[Index | None, list[str]]:
    """The directory's layout (an index, one ``model.safetensors``, or neither) and the shard names it names,
    recorded in ``out`` with the index's summary and what is wrong with the directory itself. Without either
    file, the ``*.safetensors`` files there stand in for the shards (SGLang would load them all)."""
    idx_state = file_state(model_dir, INDEX_NAME)
    if idx_state.exists:
        out["layout"] = "index"
        if idx_state.dangling:
            out["problems"].append(_p("index_dangling", f"{INDEX_NAME} is a dangling symlink (-> "
                                      f"{idx_state.link_target})"))
            return None, []
        index = read_index(idx_state.path)
        out["index"] = index_summary(index)
        out["index"]["path"] = INDEX_NAME
        out["problems"].extend(recorded(p) for p in index.problems)
        return index, list(index.shards)
    if file_state(model_dir, SINGLE_NAME).exists:
        out["layout"] = "single"
        return None, [SINGLE_NAME]
    out["layout"] = "none"
    hint = ""
    if os.path.isdir(os.path.join(model_dir, "snapshots")) and os.path.isdir(os.path.join(model_dir, "blobs")):
        hint = " (this is a Hugging Face cache repository: point at its snapshots/<revision> directory)"
    stray = _stray_shards(model_dir)
    names: list[str] = []
    if stray:  # without an index SGLang loads every *.safetensors there: those are judged as the shards
        out["stray_safetensors"] = stray[:100]
        names = stray[:MAX_STRAY_SHARDS]
        hint += (f"; without an index SGLang would load the {len(stray)} *.safetensors file(s) there, read "
                 "below as the shards")
    out["problems"].append(_p("index_missing", f"neither {INDEX_NAME} nor {SINGLE_NAME} is in {model_dir}{hint}"))
    return None, names


def _shard_record(model_dir: str, name: str, st: Any, rep: HeaderReport | None, against_index: list[Defect]
                  ) -> dict[str, Any]:
    """One shard as the fact records it: its file (size, allocation, symlink, blob; missing, a dangling link or
    unreadable: ``exists``, ``dangling``, ``error``), what its header holds (``parsed``: where its data end, which
    the judgement compares with the size), the Hugging Face download metadata, what the readers found wrong with
    its bytes and against the index, and ``ok``: read, valid and complete. The wording of what is wrong with the
    file itself and with its size is the judgement's (``doctor.model.weights.problems_of``)."""
    rec: dict[str, Any] = {"name": name, "size": st.size, "allocated": st.allocated}
    if st.is_symlink:
        rec["symlink"] = st.link_target
    if st.blob_sha256:
        rec["blob_sha256"] = st.blob_sha256
    file_bad = _file_state(st, rec)
    if rep is not None:
        rec.update(tensors=len(rep.tensors), data_bytes=rep.data_bytes, header_len=rep.header_len)
        if rep.metadata:
            rec["format"] = rep.metadata.get("format")
        if rep.parsed:
            rec["parsed"] = True
    defects = (rep.problems if rep is not None else []) + against_index
    if any(p.code == "permission" for p in defects):  # owner and mode, for the chmod/chown that fixes it
        rec["access"] = ownership(st.path)
    meta = read_hf_local_metadata(model_dir, name)
    if meta:
        rec["hf_metadata"] = {k: meta.get(k) for k in ("commit", "etag", "timestamp")}
    incomplete = rep is not None and not rep.complete
    rec["ok"] = not (file_bad or defects or incomplete)
    # what the judgement derives (the file's state, its size) joins these: the shard's lines keep within the cap
    rec["problems"] = [recorded(p) for p in defects[:MAX_PROBLEMS_PER_SHARD - file_bad - incomplete]]
    return rec


def _file_state(st: Any, rec: dict[str, Any]) -> bool:
    """What the file itself is, before its header is read, recorded as it is (missing, a dangling symlink, the
    error that stopped its reading); whether it could not be read."""
    if not st.exists:
        rec["exists"] = False
    elif st.dangling:
        rec["dangling"] = True
    if st.error:
        rec["error"] = st.error
    return not st.exists or st.dangling or bool(st.error)


# Parsed headers of this process, by path, valid while (device, inode, size, mtime_ns) is unchanged:
# ``model`` and ``model.tensors`` are two facts of one run, and parsing 208k tensors twice costs.
_HEADER_CACHE: dict[str, tuple[tuple[int, int, int, int], HeaderReport]] = {}
_CACHE_LOCK = threading.Lock()
FREEZE_MIN_TENSORS = 20_000


def _cached_tensors() -> int:
    with _CACHE_LOCK:
        return sum(len(rep.tensors) for _, rep in _HEADER_CACHE.values())


def _identity(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_cached(path: str) -> HeaderReport:
    ident = _identity(path)
    with _CACHE_LOCK:
        hit = _HEADER_CACHE.get(path)
    if hit is not None and ident is not None and hit[0] == ident:
        return hit[1]
    rep = read_header(path)
    if ident is not None and _identity(path) == ident:
        with _CACHE_LOCK:
            _HEADER_CACHE[path] = (ident, rep)
    return rep


def read_headers(paths: list[str], *, workers: int = 8) -> list[HeaderReport]:
    """Header reports for ``paths``. Threads overlap the reads on slow (network, cold) storage;
    parsing holds the GIL, so on page-cached local disks one thread is as fast."""
    if workers <= 1 or len(paths) <= 1:
        return [_read_cached(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(workers, len(paths))) as pool:
        return list(pool.map(_read_cached, paths))


def clear_cache() -> None:
    with _CACHE_LOCK:
        _HEADER_CACHE.clear()


def tensor_summary(model_dir: str, shard_names: list[str]) -> dict[str, Any] | None:
    """The tensor summary of the valid shards among ``shard_names`` (None when there is none)."""
    paths = [p for p in (os.path.join(model_dir, n) for n in shard_names) if os.path.isfile(p)]
    with no_gc():
        if workers_for(len(paths)) > 1:
            parts = [p for p in map_in_workers(summary_of, paths) if p is not None]
        else:  # in this process: the headers model.shards parsed are reused
            parts = [shard_summary(rep) for rep in map(_read_cached, paths) if rep.ok]
        return merge_summaries(parts) if parts else None


def shard_verdict(path: str, shard: str, weight_map: dict[str, str], indexed: int,
                  cache: bool = False) -> dict[str, Any]:
    """``doctor.model.shard_work.verdict`` of one shard's header; ``cache``: keep the parsed header for
    ``model.tensors`` (in-process runs only)."""
    return verdict(_read_cached(path) if cache else read_header(path), shard, weight_map, indexed)


def _fast_index_scan(model_dir: str, index: Index, readable: list[str],
                     states: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """Verdicts for every readable shard, spread over worker processes; None when it cannot help."""
    if len(readable) < 2:
        return None
    wmap = index.weight_map
    n_workers = workers_for(len(readable))
    if n_workers <= 1:
        indexed = Counter(wmap.values())
        return {n: shard_verdict(states[n].path, n, wmap, indexed[n], cache=True) for n in readable}
    # Workers get each shard's indexed tensor names (not the whole map: it would be pickled once per worker).
    names: dict[str, list[str]] = {n: [] for n in readable}
    for tensor, shard in wmap.items():
        if shard in names:
            names[shard].append(tensor)
    results = map_in_workers(indexed_verdict, [[states[n].path, n, names[n]] for n in readable], workers=n_workers)
    return dict(zip(readable, results, strict=True))


def _fast_result(out: dict[str, Any], model_dir: str, index: Index, names: list[str], states: dict[str, Any],
                 fast: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The usual case: every shard valid and exactly as indexed, so the index and the headers agree
    tensor for tensor (each header tensor is indexed to its shard, and the counts match)."""
    total = sum(v["data_bytes"] for v in fast.values())
    if index.total_size is not None and index.total_size != total:
        out["problems"].append(_p("total_size_mismatch", f"index metadata.total_size is {index.total_size} bytes, "
                                  f"the shard headers hold {total} bytes of tensor data"))
    for n in names:
        st, v = states[n], fast[n]
        rec: dict[str, Any] = {"name": n, "size": st.size, "allocated": st.allocated}
        if st.is_symlink:
            rec["symlink"] = st.link_target
        if st.blob_sha256:
            rec["blob_sha256"] = st.blob_sha256
        rec.update(tensors=v["tensors"], data_bytes=v["data_bytes"], header_len=v["header_len"])
        if v.get("format"):
            rec["format"] = v["format"]
        meta = read_hf_local_metadata(model_dir, n)
        if meta:
            rec["hf_metadata"] = {k: meta.get(k) for k in ("commit", "etag", "timestamp")}
        rec.update(parsed=True, ok=True, problems=[])
        out["shards"].append(rec)
    out["leftovers"] = find_leftovers(model_dir, names)
    out["totals"] = {"shards": len(names), "shards_ok": len(names), "tensors": sum(v["tensors"] for v in fast.values()),
                     "data_bytes": total, "file_bytes": sum(s["size"] or 0 for s in out["shards"]),
                     "index_tensors": len(index.weight_map)}
    return out


def _p(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message}


def _stray_shards(model_dir: str) -> list[str]:
    try:
        return sorted(e for e in os.listdir(model_dir) if e.endswith(".safetensors"))
    except OSError:
        return []




def merge_summaries(parts: list[dict[str, Any]]) -> dict[str, Any]:
    counts: Counter[tuple[str, str, tuple[int, ...]]] = Counter()
    layers: set[str] = set()
    pairs: set[tuple[str, str]] = set()
    for part in parts:
        for pat, dtype, shape, n in part["counts"]:
            counts[(pat, dtype, tuple(shape))] += n
        layers.update(part["layers"])
        pairs.update(tuple(x) for x in part["pairs"])
    patterns_out: dict[str, dict[str, Any]] = {}
    dtypes: Counter[str] = Counter()
    dtype_bytes: Counter[str] = Counter()
    for (pat, dtype, shape), n in sorted(counts.items()):
        size = DTYPE_BITS[dtype] * math.prod(shape) // 8 * n
        entry = patterns_out.setdefault(pat, {"shapes": {}, "bytes": 0, "count": 0})
        entry["shapes"][f"{dtype}{list(shape)}"] = n
        entry["bytes"] += size
        entry["count"] += n
        dtypes[dtype] += n
        dtype_bytes[dtype] += size
    experts: dict[int, set[int]] = defaultdict(set)
    for layer, expert in pairs:
        experts[int(layer)].add(int(expert))
    return {
        "patterns": patterns_out,
        "layers": sorted(int(x) for x in layers),
        "experts_per_layer": {str(k): len(v) for k, v in sorted(experts.items())},
        "max_expert_id": {str(k): max(v) for k, v in sorted(experts.items())},
        "dtypes": dict(dtypes),
        "dtype_bytes": dict(dtype_bytes),
    }
