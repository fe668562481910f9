"""The start plan: how long the server will take to answer /health 200 after ``launch`` starts it, part by part,
and which of those minutes are avoidable.

Why: a start is expensive even when it succeeds: K2.6's 554 GiB of weights at disk speed when the page cache is
cold, FlashInfer's JIT modules compiled on an empty cache (sampling ~107 s, norm ~40 s on the H200), every Triton
kernel of the CUDA-graph captures compiled on an empty Triton cache (~130 s for a DDTree server), then the captures
themselves, one per batch size. Most of it is avoidable: the modules compiled ahead (``launch`` prewarms them in
parallel with its checks), caches that survive a reboot (host.jit_cache), weights left resident, capture sizes
that the profile's concurrency needs and no more.

Three steps, kept apart: ``start_inputs`` gathers what the run's facts say (GPU, shards and their residency,
compiled modules, the Triton cache, the server arguments) into a JSON dict; ``predict(inputs, constants)`` is a
pure function of that dict and the measured constants of ``doctor/data/start_constants.toml`` (each naming the run
it was measured on); ``compare`` sets a start's actual parts (``doctor.service.startlog``) beside the prediction,
and ``record`` keeps both in ``<state_dir>/start/`` (atomic), so the constants can be checked.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml
from doctor.core.fileio import atomic_write
from doctor.host.jitcache import module_compiled

CONSTANTS_FILE = Path(__file__).resolve().parents[1] / "data" / "start_constants.toml"
GIB = 1024**3
DEFAULT_KIND = "h200"  # the constants used for a GPU no kind matches (the plan says so)
ASSUMED_LAYERS = 61  # Kimi K2.6's num_hidden_layers, when the target's config.json was not read
TREE_MODULE = "speculative_tree"  # SGLang's JIT module of the DDTree tree-verify kernels


@dataclass
class Part:
    """One part of a start: predicted seconds, how they were reckoned, and the seconds a change would save."""

    name: str
    seconds: float
    basis: str
    avoidable_s: float = 0.0
    advice: str = ""


@dataclass
class StartPlan:
    kind: str
    kind_matched: bool
    parts: list[Part] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return round(sum(p.seconds for p in self.parts), 1)

    @property
    def avoidable_s(self) -> float:
        return round(sum(p.avoidable_s for p in self.parts), 1)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "kind_matched": self.kind_matched, "total_s": self.total_s,
                "avoidable_s": self.avoidable_s, "parts": [asdict(p) for p in self.parts], "notes": self.notes}


def constants() -> dict[str, Any]:
    return load_toml(CONSTANTS_FILE)


# -- capture sizes (SGLang's own rules, as data) ---------------------------------------------------------------

def capture_sizes(ranges: list[list[int]], max_bs: int) -> list[int]:
    """SGLang's capture sizes from ``[start, stop, step]`` ranges, capped at ``max_bs`` (appended when missing)."""
    sizes = sorted({n for start, stop, step in ranges for n in range(start, stop + 1, step) if n <= max_bs})
    if max_bs > 0 and max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def arg_value(args: list[str], *names: str) -> str | None:
    """The last value given to any of ``names`` in an argv (``--flag V`` or ``--flag=V``)."""
    found = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                found = args[i + 1]
            elif a.startswith(n + "="):
                found = a.split("=", 1)[1]
    return found


def arg_list(args: list[str], *names: str) -> list[int] | None:
    """The integers given to the last of ``names`` (``--flag 1 2 4`` or ``--flag=1,2,4``), None when not given or
    not integers."""
    found: list[str] | None = None
    for i, a in enumerate(args):
        for n in names:
            if a == n:
                found = []
                for v in args[i + 1:]:
                    if v.startswith("--"):
                        break
                    found.append(v)
            elif a.startswith(n + "="):
                found = a.split("=", 1)[1].replace(",", " ").split()
    try:
        return [int(v) for v in found] if found else None
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def graph_plan(args: list[str], table: dict[str, Any]) -> dict[str, Any]:
    """Which graphs the server captures and how many sizes of each, from its arguments: ``{"kinds": {kind:
    sizes}, "max_bs", "max_bs_from", "needed_bs"}``. Nothing when CUDA graphs are disabled."""
    if "--disable-cuda-graph" in args or arg_value(args, "--cuda-graph-backend-decode") == "disabled":
        return {"kinds": {}, "max_bs": 0, "max_bs_from": "--disable-cuda-graph", "needed_bs": None}
    speculative = bool(arg_value(args, "--speculative-algorithm"))
    running = _int(arg_value(args, "--max-running-requests"))
    given = _int(arg_value(args, "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs"))
    if given is not None:
        max_bs, source = given, "--cuda-graph-max-bs-decode"
    elif running is not None:
        max_bs, source = running, "--max-running-requests"
    else:
        max_bs, source = int(table["default_max_bs"]), "SGLang's default for the GPU (assumed)"
    listed = arg_list(args, "--cuda-graph-bs-decode", "--cuda-graph-bs")
    if listed:
        max_bs, source = max(listed), "--cuda-graph-bs-decode"
    kinds: dict[str, int] = {}
    if arg_value(args, "--cuda-graph-backend-prefill") != "disabled":
        plist = arg_list(args, "--cuda-graph-bs-prefill")
        pmax = _int(arg_value(args, "--cuda-graph-max-bs-prefill", "--chunked-prefill-size"))
        kinds["prefill"] = len(plist) if plist else len(capture_sizes(table["prefill"],
                                                                      pmax or int(table["default_prefill_max"])))
    sizes = len(listed) if listed else len(capture_sizes(table["speculative" if speculative else "decode"], max_bs))
    if speculative:
        kinds["verify"] = sizes
        kinds["draft"] = sizes
    else:
        kinds["decode"] = sizes
    return {"kinds": kinds, "max_bs": max_bs, "max_bs_from": source, "needed_bs": running,
            "speculative": speculative}


# -- the inputs: what the facts say -----------------------------------------------------------------------------

def cache_state(env: dict[str, str], home: str) -> dict[str, Any]:
    """What the server's caches hold now, read where the server will look (its environment ``env``): FlashInfer's
    compiled modules (``<base>/.cache/flashinfer/<version>/<archs>/cached_ops/<module>/<module>.so``), the Triton
    cache's entry count (SGLang's redirect of its default included) and SGLang's own JIT modules (the DDTree
    tree-verify kernels). Stat and listdir only: ``launch`` reads them again after its prewarm, and a plan made on
    them predicts a warm start warm and a cold one cold."""
    from doctor.host.jitcache import (
        cache_dirs,
        entry_count,
        flashinfer_compiled,
        server_triton_dir,
        sglang_jit_compiled,
        sglang_jit_dir,
    )

    fi = cache_dirs(env, home)["flashinfer"]["path"]
    triton, triton_from = server_triton_dir(env, home)
    sgl = sglang_jit_dir(env, home)
    return {"flashinfer": {"cache": fi, "compiled": flashinfer_compiled(fi)},
            "triton_cache": {"path": triton, "from": triton_from, "entries": entry_count(triton) or 0},
            "sglang_jit": {"path": sgl, "compiled": sglang_jit_compiled(sgl)}}


def start_inputs(get: Callable[[str], Any], args: list[str], *, tp: int,
                 python_import_s: float | None = None, caches: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan's inputs from the facts ``get(name)`` returns (None where a fact is not to be had): the GPU, the
    shards and how much of them is resident, the compiled FlashInfer modules and the Triton cache, the server's
    arguments. ``caches`` (``cache_state`` of the server's environment) replaces what the facts say of the caches.
    JSON only, so a plan can be recorded and replayed."""
    nvml, resident, jit_facts, stack, imp = (get(n) for n in ("nvml", "weights_resident", "jit_caches", "stack",
                                                              "sglang_import"))
    gpu_name, cc_text = _gpu_input(nvml)
    import_s = (imp or {}).get("import_s") if isinstance(imp, dict) and (imp or {}).get("imported") else None
    fi = _flashinfer_input(stack, jit_facts)
    triton = _triton_input(jit_facts)
    sgl_jit = None
    if caches:
        fi.update(caches["flashinfer"])
        triton, sgl_jit = caches["triton_cache"], caches["sglang_jit"]
    return {
        "gpu_name": gpu_name,
        "compute_capability": cc_text,
        "tp": tp,
        "server_args": list(args),
        "algorithm": arg_value(args, "--speculative-algorithm"),
        "target": _model_input((resident or {}).get("target") if isinstance(resident, dict) else None),
        "drafter": _model_input((resident or {}).get("drafter") if isinstance(resident, dict) else None),
        "meminfo": (resident or {}).get("meminfo") if isinstance(resident, dict) else None,
        "flashinfer": fi,
        "triton_cache": triton,
        "sglang_jit": sgl_jit,
        "vocab_size": target_vocab(args),
        "import_s": import_s if isinstance(import_s, (int, float)) else python_import_s,
    }


def _gpu_input(nvml: Any) -> tuple[Any, str | None]:
    """The first GPU's name and compute capability ("9.0"), None for what the fact does not hold: a missing or
    malformed fact gives an unknown, never a traceback."""
    dev = ((nvml or {}).get("devices") or [{}])[0] if isinstance(nvml, dict) else {}
    cc = dev.get("compute_capability") if isinstance(dev, dict) else None
    cc_text = ".".join(str(x) for x in cc) if isinstance(cc, list) else (str(cc) if cc else None)
    return (dev.get("name") if isinstance(dev, dict) else None), cc_text


def _flashinfer_input(stack: Any, caches: Any) -> dict[str, Any]:
    """FlashInfer's installed version, compiled modules and cache folder (None where not known): what decides
    whether its modules compile at start."""
    dists = (stack or {}).get("distributions") if isinstance(stack, dict) else None
    fi = (dists or {}).get("flashinfer-python") if isinstance(dists, dict) else None
    return {"installed": (fi is not None) if isinstance(dists, dict) else None,
            "version": (fi or {}).get("version") if isinstance(fi, dict) else None,
            "compiled": (caches or {}).get("flashinfer_compiled") if isinstance(caches, dict) else None,
            "cache": (((caches or {}).get("caches") or {}).get("flashinfer") or {}).get("path")
            if isinstance(caches, dict) else None}


def _triton_input(caches: Any) -> dict[str, Any] | None:
    """The Triton cache's folder and entry count, None when not recorded: an empty cache compiles every kernel."""
    triton = ((caches or {}).get("caches") or {}).get("triton") if isinstance(caches, dict) else None
    return ({"path": (triton or {}).get("path"), "entries": (triton or {}).get("entries")}
            if isinstance(triton, dict) else None)


def _model_input(entry: Any) -> dict[str, Any] | None:
    if not isinstance(entry, dict) or not entry.get("files"):
        return None
    return {"bytes": entry.get("bytes"), "resident_bytes": entry.get("resident_bytes"), "layers": entry.get("layers")}


# -- the prediction: a pure function ----------------------------------------------------------------------------

def kind_of(gpu_name: str | None, table: dict[str, Any]) -> tuple[str, bool]:
    for kind, spec in table["kinds"].items():
        if gpu_name and any(m.lower() in gpu_name.lower() for m in spec.get("match", [])):
            return kind, True
    return DEFAULT_KIND, False


def _value(k: dict[str, Any], name: str) -> float:
    return float(k[name]["value"])


def predict(inputs: dict[str, Any], table: dict[str, Any]) -> StartPlan:
    """The expected time to /health 200 from the server's exec, and its parts, from ``inputs`` (``start_inputs``)
    and the constants ``table``. A part whose facts are missing is reckoned from the constants alone and says so."""
    kind, matched = kind_of(inputs.get("gpu_name"), table)
    k = table["kinds"][kind]
    plan = StartPlan(kind, matched)
    if not matched:
        plan.notes.append(f"no measured constants for {inputs.get('gpu_name') or 'this GPU'}: the {kind.upper()}'s "
                          "are used")
    imp = inputs.get("import_s")
    extra = _value(k, "interpreter_extra_s")  # the server's own imports and argument parsing after SGLang's import
    source = "SGLang's import as sglang.install timed it" if imp else "SGLang's import (measured constant)"
    plan.parts.append(Part("interpreter", round((float(imp) if imp else _value(k, "interpreter_s")) + extra, 1),
                           f"{source}, and {extra:g} s more to the server's first log line (measured constant)"))
    plan.parts.append(Part("startup", _value(k, "startup_s"), "server args, tokenizer, scheduler processes, "
                           "model import (measured constant)"))
    plan.parts += [_load("weights", inputs.get("target"), inputs.get("meminfo"), k),
                   _load("drafter", inputs.get("drafter"), None, k)]
    plan.parts.append(Part("kv_cache", _value(k, "kv_cache_s"), "measured constant"))
    to_first_forward = sum(p.seconds for p in plan.parts)  # where the server first calls FlashInfer's modules
    model = _model_kernels(inputs, table, k)
    graphs, kernels = _graphs(inputs, table, k, to_first_forward + model.seconds)
    plan.parts += [graphs, model, kernels,
                   _jit(inputs, table, k, to_first_forward, graphs.seconds + model.seconds + kernels.seconds),
                   Part("warmup", _value(k, "warmup_s"), "measured constant"), _ready(inputs, k)]
    plan.parts = [p for p in plan.parts if p.seconds > 0 or p.basis]
    return plan


def triton_cold(inputs: dict[str, Any]) -> bool:
    """Whether the server's Triton cache is empty (or named and not there): every kernel compiles at first use."""
    tri = inputs.get("triton_cache") or {}
    entries = tri.get("entries")
    return entries == 0 or (entries is None and tri.get("path") is not None)


def _ready(inputs: dict[str, Any], k: dict[str, Any]) -> Part:
    """'fired up' to the first /health 200: the health check's request runs the non-graph path, whose Triton kernels
    compile then on an empty Triton cache ("Triton kernel '_fwd_kernel' took 1.03 s to compile after serving
    started"): ``ready_triton_cold_s`` more."""
    secs, basis = _value(k, "ready_after_fired_up_s"), "first /health 200 after the warm-up (measured constant)"
    if triton_cold(inputs):
        extra = _value(k, "ready_triton_cold_s")
        secs, basis = secs + extra, f"{basis}, and {extra:g} s of the first request's Triton compiles (empty cache)"
    return Part("ready", round(secs, 1), basis)


def _sglang_have(inputs: dict[str, Any]) -> set[str] | None:
    """The module names SGLang's JIT cache holds for this GPU's target (``sm90a`` for 9.0), None when not read."""
    sgl = inputs.get("sglang_jit")
    if not isinstance(sgl, dict) or not isinstance(sgl.get("compiled"), list):
        return None
    want = str(inputs.get("compute_capability") or "").replace(".", "")
    return {str(m).split("/")[-1] for m in sgl["compiled"]
            if not want or "".join(ch for ch in str(m).split("/")[0] if ch.isdigit()) == want}


def _model_kernels(inputs: dict[str, Any], table: dict[str, Any], k: dict[str, Any]) -> Part:
    """SGLang's JIT kernels of the model's own layers (``sgl_kernel_jit_*`` modules other than DDTree's: activation,
    rope, the KV-cache stores, DeepSeek's fused a-gemm; their arguments follow the model's shapes, so no prewarm
    names them ahead), built with nvcc in the server's first forward (the prefill capture) when SGLang's JIT cache
    holds none of them for this GPU. When that cache was not read, the Triton cache's state stands for it."""
    from doctor.host.jitcache import sglang_module_name

    have = _sglang_have(inputs)
    path = (inputs.get("sglang_jit") or {}).get("path") if isinstance(inputs.get("sglang_jit"), dict) else None
    if have is None:
        cold = triton_cold(inputs)
        why = "SGLang's JIT cache not read: taken as " + ("cold" if cold else "warm") + " as the Triton cache"
    else:
        tree = [sglang_module_name(m) for m in table["jit"]["sglang_ddtree"]]
        own = sorted(h for h in have if not any(h == t or h.startswith(t + "_") for t in tree))
        cold = not own
        why = (f"SGLang's JIT cache {path} holds none of the model's kernels: built with nvcc in the first forward"
               if cold else f"SGLang's JIT cache {path} holds {len(own)} of the model's kernels")
    secs = _value(k, "model_kernels_cold_s") if cold else 0.0
    return Part("model_kernels", secs, why, secs, "keep SGLANG_JIT_CACHE_DIR on a persistent, writable filesystem "
                "(host.jit_cache): the next start reuses the model's kernels" if cold else "")


def _load(name: str, model: dict[str, Any] | None, mem: dict[str, Any] | None, k: dict[str, Any]) -> Part:
    if not model or not model.get("bytes"):
        return Part(name, 0.0, "" if name == "drafter" else "no shards found at the model path: not counted")
    size = float(model["bytes"])
    res = model.get("resident_bytes")
    known = isinstance(res, (int, float))
    here = float(res) if known else 0.0
    disk, cache = _value(k, "disk_gibps") * GIB, _value(k, "page_cache_gibps") * GIB
    seconds = _value(k, "load_overhead_s") + here / cache + (size - here) / disk
    basis = (f"{size / GIB:.1f} GiB, {here / GIB:.1f} GiB in the page cache ({'mincore' if known else 'not known'})"
             f" at {cache / GIB:g} GiB/s, the rest from disk at {disk / GIB:g} GiB/s")
    cold = size - here
    avoid = cold / disk - cold / cache if cold > 0.01 * size else 0.0
    advice = ""
    if avoid > 1:
        room = (mem or {}).get("MemAvailable") if isinstance(mem, dict) else None
        if isinstance(room, int) and room + here >= size:
            advice = (f"{cold / GIB:.0f} GiB of the shards are not resident and the host has {room / GIB:.0f} GiB "
                      "available: read them into the page cache just before the start (`k26-doctor check --deep` "
                      "reads every shard: start right after it), and keep them resident (nothing else on the host "
                      "should evict them)")
        elif isinstance(room, int) and room > 0.05 * size:
            part = room / cache + (size - room) / disk
            advice = (f"the shards ({size / GIB:.0f} GiB) do not all fit in the memory available "
                      f"({room / GIB:.0f} GiB); the server reads them in index order, so the part left resident "
                      "should be the first shards: read them last-to-first just before the start (what a read "
                      "leaves resident is what it read last: `check --deep` hashes the largest files first, in "
                      "parallel, so after it the resident part is not the first shards, and the server's first "
                      "reads evict it); never drop pages the service needs to make room")
            avoid = max(0.0, seconds - _value(k, "load_overhead_s") - part)
        elif isinstance(room, int):
            advice = (f"the shards ({size / GIB:.0f} GiB) do not fit in the memory available ({room / GIB:.0f} GiB): "
                      "they load at disk speed; a faster or striped volume is the remedy (never drop the service's "
                      "own pages to make room)")
            avoid = 0.0
    return Part(name, round(seconds, 1), basis, round(avoid, 1), advice)


def _graph_seconds(kind: str, sizes: int, layers: int, cold: bool, k: dict[str, Any]) -> tuple[float, float]:
    g = k["graphs"][kind]
    warm = sizes * (float(g["per_size_s"]) + float(g["per_size_layer_s"]) * layers)
    return warm, float(g["triton_cold_s"]) if cold and sizes else 0.0


def _graphs(inputs: dict[str, Any], table: dict[str, Any], k: dict[str, Any],
            to_first_forward: float) -> tuple[Part, Part]:
    gp = graph_plan(inputs.get("server_args") or [], table["graphs"])
    entries = (inputs.get("triton_cache") or {}).get("entries")
    cold = triton_cold(inputs)
    known_layers = (inputs.get("target") or {}).get("layers")
    layers = int(known_layers or ASSUMED_LAYERS)
    draft_layers = int(((inputs.get("drafter") or {}).get("layers")) or 0)
    warm_total, cold_total, rows, before_tree = 0.0, 0.0, [], 0.0
    for kind, sizes in gp["kinds"].items():
        warm, extra = _graph_seconds(kind, sizes, draft_layers if kind == "draft" else layers, cold, k)
        warm_total += warm
        cold_total += extra
        before_tree += warm + extra if kind in ("prefill", "verify") else 0.0
        rows.append(f"{kind} {sizes}")
    basis = _graph_basis(rows, layers, bool(known_layers), cold, entries)
    advice, saved = _capture_advice(gp, table, layers, k)
    avoid = cold_total + saved
    if cold:
        advice = ("; " if advice else "").join(filter(None, [advice, "keep TRITON_CACHE_DIR on a persistent, "
                                                             "writable filesystem (host.jit_cache): the next start "
                                                             "reuses the compiled kernels"]))
    graphs = Part("cuda_graphs", round(warm_total + cold_total, 1), basis, round(avoid, 1), advice)
    return graphs, _kernels(inputs, table, gp, cold, k, to_first_forward + before_tree)


def _graph_basis(rows: list[str], layers: int, known_layers: bool, cold: bool, entries: Any) -> str:
    """What the graphs' estimate rests on (sizes, layers, the Triton cache's state): a plan says what it assumed."""
    tri_note = ("Triton cache empty: every kernel compiles first" if cold else f"Triton cache has {entries} entries"
                if entries is not None else "Triton cache not known: warm assumed")
    at = f"{layers} layers" if known_layers else f"{layers} layers (K2.6's: config.json not read)"
    return (f"{', '.join(rows) or 'none'} sizes at {at}; {tri_note}" if rows else
            "CUDA graphs disabled")


def _capture_advice(gp: dict[str, Any], table: dict[str, Any], layers: int, k: dict[str, Any]) -> tuple[str, float]:
    """Advice on capturing fewer sizes and the seconds it saves: none when the captures already fit the profile's
    concurrency (or no graphs are captured)."""
    needed = gp.get("needed_bs")
    if gp["kinds"] and needed is None and gp["max_bs"] > 64:
        return (f"capture sizes up to {gp['max_bs']} ({gp['max_bs_from']}): the profile sets no concurrency "
                "(server.max_running_requests); a bound that the service needs captures fewer sizes"), 0.0
    if gp["kinds"] and needed is not None and gp["max_bs"] > needed:
        spec = "speculative" if gp.get("speculative") else "decode"
        fewer = len(capture_sizes(table["graphs"][spec], needed))
        extra = sum(_graph_seconds(kd, n - fewer, layers, False, k)[0]
                    for kd, n in gp["kinds"].items() if kd != "prefill")
        return (f"graphs captured up to batch size {gp['max_bs']} ({gp['max_bs_from']}) while the profile serves "
                f"at most {needed} requests at once: --cuda-graph-max-bs-decode {needed} captures "
                f"{fewer} sizes per kind and saves about {extra:.0f} s"), extra
    return "", 0.0


def _kernels(inputs: dict[str, Any], table: dict[str, Any], gp: dict[str, Any], cold: bool, k: dict[str, Any],
             needed_at: float) -> Part:
    """Kernel warm-up outside the captures: DDTree's tree kernels are SGLang JIT modules, compiled (nvcc) when its
    cache lacks them, unless ``launch``'s prewarm builds them beside the server: the server calls them after the
    target's verify capture (warm_verify_kernels), ``needed_at`` s after the exec, and waits for the last of them
    still compiling then; when that cache was not read, the Triton cache's state (``cold``) stands for it."""
    spec = bool(gp.get("speculative")) and str(inputs.get("algorithm") or "").upper() == "DDTREE"
    missing = missing_sglang_modules(inputs, table)
    cold, why = _tree_kernels_state(inputs, table, missing, cold) if spec else (False, "")
    warm_s = _value(k, "kernel_warmup_s")
    ksec = _value(k, "kernel_warmup_cold_s" if cold else "kernel_warmup_s")
    basis = "kernel warm-up outside the captures" + (f" (DDTree's tree kernels: {why})" if why else "")
    building = _prewarm_building(inputs.get("sglang_jit"), missing) if cold else None
    if building is not None:
        elapsed = float(building.get("elapsed_s") or 0.0)
        ends = {m: float(k["jit"][m]["value"]) - elapsed for m in missing or [] if m in k["jit"]}
        left = max([0.0, *(end - needed_at for end in ends.values())])
        rows = ", ".join(f"{m} done {end:.0f} s after the exec" for m, end in ends.items())
        return Part("kernels", round(warm_s + left, 1), f"{basis}: being compiled by the prewarm beside the server "
                    f"({elapsed:g} s so far; {rows}; needed {needed_at:.0f} s after the exec, after the verify "
                    f"capture): the server waits {left:.0f} s")
    return Part("kernels", ksec, basis, round(ksec - warm_s, 1) if cold else 0.0,
                "keep SGLANG_JIT_CACHE_DIR on a persistent, writable filesystem and let `k26-doctor launch` "
                "prewarm the tree kernels: the next start reuses them" if cold else "")


def _tree_kernels_state(inputs: dict[str, Any], table: dict[str, Any], missing: list[str] | None,
                        triton_cold: bool) -> tuple[bool, str]:
    """Whether a DDTREE server compiles its tree kernels at start, and why: SGLang's JIT cache read, else the
    Triton cache's state stands for it (a host whose caches are all new or all kept)."""
    if missing is None:
        return triton_cold, "the SGLang JIT cache not read: taken as cold as the Triton cache" if triton_cold else ""
    sgl = inputs.get("sglang_jit") or {}
    names = ", ".join(missing or table["jit"]["sglang_ddtree"])
    return bool(missing), f"SGLang's {names} JIT modules {'not built' if missing else 'built'} in {sgl.get('path')}"


def _prewarm_building(sgl: Any, missing: list[str] | None) -> dict[str, Any] | None:
    """The prewarm's ``building`` record when it builds every missing SGLang module (``sglang.<module>[.<arg>]``)."""
    building = sgl.get("building") if isinstance(sgl, dict) else None
    if not missing or not isinstance(building, dict):
        return None
    names = [str(b).split(".")[1:2] for b in building.get("modules") or []]
    return building if all([m] in names for m in missing) else None


def missing_sglang_modules(inputs: dict[str, Any], table: dict[str, Any]) -> list[str] | None:
    """SGLang's JIT modules a DDTREE server builds at start and its cache (``sglang_jit``) lacks for this GPU (a
    target directory naming its compute capability, "sm90a" for 9.0); None when the cache was not read, [] for
    another algorithm."""
    if str(inputs.get("algorithm") or "").upper() != "DDTREE":
        return []
    have = _sglang_have(inputs)
    if have is None:
        return None
    vocab = inputs.get("vocab_size")
    return [m for m in table["jit"]["sglang_ddtree"]
            if not sglang_module_built(have, m, vocab if isinstance(vocab, int) else None)]


def sglang_module_built(have: set[str], module: str, vocab: int | None) -> bool:
    """Whether ``have`` (module directory names of SGLang's JIT cache) holds the instance of ``module`` the server
    builds: ``speculative_tree`` takes no more arguments; ``speculative_sampling`` is built per ``gcd(4, vocab)``,
    deterministic (the patch set's warm_verify_kernels), so with the vocabulary known only that instance counts,
    else any instance does."""
    from doctor.host.jitcache import sglang_module_name

    if module == "speculative_sampling":
        if vocab:
            return sglang_module_name(module, math.gcd(4, vocab), True) in have
        return any(h.startswith(sglang_module_name(module) + "_") for h in have)
    return sglang_module_name(module) in have


def target_vocab(server_args: list[str]) -> int | None:
    """``vocab_size`` of the target's config.json (``--model-path``), None when it cannot be read: it names the
    sampling kernel's instance (``gcd(4, vocab_size)``)."""
    from doctor.core.fileio import read_text

    path = arg_value(server_args, "--model-path", "--model")
    if not path:
        return None
    try:
        cfg = json.loads(read_text(os.path.join(str(path), "config.json"), 1 << 20, "a model config"))
        vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
        return int(vocab) if isinstance(vocab, int) and vocab > 0 else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def needed_modules(inputs: dict[str, Any], table: dict[str, Any]) -> list[str]:
    """FlashInfer's modules this configuration compiles at start when its cache lacks them."""
    fi = inputs.get("flashinfer") or {}
    if fi.get("installed") is False:
        return []
    jit = table["jit"]
    mods = list(jit["always"])
    if str(inputs.get("algorithm") or "").upper() in jit["speculative_algorithms"]:
        mods += jit["speculative"]
    return mods


def missing_modules(inputs: dict[str, Any], table: dict[str, Any]) -> list[str]:
    fi = inputs.get("flashinfer") or {}
    compiled = fi.get("compiled")
    return [m for m in needed_modules(inputs, table)
            if not (isinstance(compiled, list) and module_compiled(compiled, m, fi.get("version"),
                                                                   inputs.get("compute_capability")))]


def _jit(inputs: dict[str, Any], table: dict[str, Any], k: dict[str, Any], to_first_forward: float,
         captures_s: float) -> Part:
    """FlashInfer's modules: none to compile (warm), compiled by the server when it first calls them (one after the
    other, the start waits for each), or being compiled by ``launch``'s prewarm beside the server (all at once, one
    process each: the server waits on FlashInfer's file lock only for what is not done when it calls a module:
    ``norm`` at its first forward, ``to_first_forward`` s after the exec, ``sampling`` at the sampling rehearsal
    after its captures, ``captures_s`` later: ``[jit.need]``)."""
    need = needed_modules(inputs, table)
    if not need:
        return Part("jit", 0.0, "FlashInfer not installed: no JIT modules")
    missing = missing_modules(inputs, table)
    seconds = sum(float(k["jit"][m]["value"]) for m in missing if m in k["jit"])
    where = (inputs.get("flashinfer") or {}).get("cache") or "the cache"
    if not missing:
        return Part("jit", 0.0, f"FlashInfer's {', '.join(need)} compiled in {where}")
    building = (inputs.get("flashinfer") or {}).get("building")
    if isinstance(building, dict) and set(missing) <= set(building.get("modules") or []):
        elapsed = float(building.get("elapsed_s") or 0.0)
        waited, rows = _prewarm_waits(missing, table, k, elapsed, to_first_forward, captures_s)
        return Part("jit", round(waited, 1), f"FlashInfer's {', '.join(missing)} being compiled by the prewarm beside "
                    f"the server, in parallel ({elapsed:g} s so far): the server waits for what is not done when it "
                    f"calls them ({'; '.join(rows)})")
    return Part("jit", round(seconds, 1), f"FlashInfer's {', '.join(missing)} not compiled in {where}: compiled at "
                "start", round(seconds, 1), "compile them ahead: `k26-doctor launch` prewarms them in parallel with "
                "its checks (unless --no-prewarm)")


def _prewarm_waits(missing: list[str], table: dict[str, Any], k: dict[str, Any], elapsed: float,
                   to_first_forward: float, captures_s: float) -> tuple[float, list[str]]:
    """The seconds the server waits for modules the prewarm is building, in the order it calls them: each is done
    ``compile - elapsed`` s after the exec; a wait moves every later call."""
    order = {"first_forward": 0, "after_captures": 1}
    when = table["jit"].get("need", {})
    waited, rows = 0.0, []
    for m in sorted(missing, key=lambda m: order.get(when.get(m, "first_forward"), 0)):
        at = to_first_forward + waited + (captures_s if when.get(m) == "after_captures" else 0.0)
        compile_s = float(k["jit"].get(m, {}).get("value", 0.0))
        wait = max(0.0, compile_s - elapsed - at)
        waited += wait
        rows.append(f"{m}: {compile_s:g} s to build, needed {at:.0f} s after the exec, waits {wait:.0f} s")
    return waited, rows


# -- rendering, comparison, record ------------------------------------------------------------------------------

def render(plan: StartPlan) -> list[str]:
    """The plan as lines: the total, each part with its basis, then what can be saved and how."""
    lines = [f"start plan: healthy about {plan.total_s:.0f} s after the server starts ({plan.kind.upper()} "
             f"constants{'' if plan.kind_matched else ', assumed'}); avoidable about {plan.avoidable_s:.0f} s"]
    for p in plan.parts:
        lines.append(f"  {p.name:<12} {p.seconds:7.1f} s  {p.basis}")
    for p in plan.parts:
        if p.advice:
            lines.append(f"  save {p.avoidable_s:.0f} s on {p.name}: {p.advice}")
    lines += [f"  note: {n}" for n in plan.notes]
    return lines


def render_compact(plan: StartPlan) -> str:
    """The parts in one paragraph (a report's note): seconds per part, then what can be saved and how."""
    parts = ", ".join(f"{p.name} {p.seconds:.0f}" for p in plan.parts)
    saves = "; ".join(f"save {p.avoidable_s:.0f} s on {p.name}: {p.advice}" for p in plan.parts if p.advice)
    return f"parts (s): {parts}." + (f" {saves}." if saves else "") + "".join(f" Note: {n}." for n in plan.notes)


# The actual parts as a log shows them, and the predicted parts each one holds (FlashInfer's JIT compiles run
# inside the captures and the kernel warm-up, so they are compared together).
GROUPS = {"startup": ("interpreter", "startup"), "weights": ("weights",), "drafter": ("drafter",),
          "kv_cache": ("kv_cache",), "graphs+kernels+jit": ("cuda_graphs", "model_kernels", "kernels", "jit"),
          "warmup": ("warmup",), "ready": ("ready",)}


def compare(plan: dict[str, Any], actual: dict[str, Any], *, launched_to_ready_s: float | None) -> list[dict[str,
                                                                                                        Any]]:
    """Rows ``{"part", "predicted_s", "actual_s", "ratio"}``: the actual parts (``startlog.read_start``) grouped as
    ``GROUPS``, and the total (exec to /health 200, which ``launch --wait`` measured)."""
    pred = {p["name"]: float(p["seconds"]) for p in plan.get("parts", [])}
    got = actual.get("parts") or {}
    rows = []
    for group, names in GROUPS.items():
        p = sum(pred.get(n, 0.0) for n in names)
        if group == "startup":  # before the first log line: measured by launch --wait, else taken as predicted
            a = got.get("startup")
            a = a + float(got.get("interpreter", pred.get("interpreter", 0.0))) if a is not None else None
        elif group == "graphs+kernels+jit":
            parts = [got.get(n) for n in ("cuda_graphs", "kernels")]
            a = sum(x for x in parts if x is not None) if any(x is not None for x in parts) else None
        elif group == "ready":
            a = None
        else:
            a = got.get(group)
        rows.append(_row(group, p, a))
    rows.append(_row("total", float(plan.get("total_s") or 0.0), launched_to_ready_s))
    return rows


def _row(part: str, predicted: float, actual: float | None) -> dict[str, Any]:
    ratio = round(predicted / actual, 2) if actual and actual > 0.5 else None
    return {"part": part, "predicted_s": round(predicted, 1), "actual_s": None if actual is None else round(actual, 1),
            "ratio": ratio}


def render_comparison(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["start plan against the start: part, predicted s, actual s, predicted/actual"]
    for r in rows:
        actual = "-" if r["actual_s"] is None else f"{r['actual_s']:.1f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"  {r['part']:<20} {r['predicted_s']:8.1f} {actual:>8} {ratio:>6}")
    return lines


def record(state_dir: str, entry: dict[str, Any], *, now: float | None = None) -> Path:
    """Keep one start (inputs, plan, actual, comparison) as ``<state_dir>/start/<UTC time>.json`` and
    ``last.json``, each written whole (``atomic_write``), secrets redacted (the server arguments may carry an
    ``--api-key``). Returns the timestamped file."""
    from doctor.facts.redaction import redact

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
    folder = Path(os.path.expanduser(state_dir)) / "start"
    folder.mkdir(parents=True, exist_ok=True)
    data = json.dumps(redact(entry), indent=2, sort_keys=True).encode("utf-8") + b"\n"
    path = folder / f"{stamp}.json"
    atomic_write(path, data, 0o644)
    atomic_write(folder / "last.json", data, 0o644)
    return path


# -- the notice of check -v ------------------------------------------------------------------------------------------
START_PLAN_NOTICE = "doctor.start_plan"
READ_ONLY_FACTS = ("jit_caches", "weights_resident")  # collected for the plan if no check did


def fact_reader(ctx: Any, also: tuple[str, ...] = ()) -> Callable[[str], Any]:
    """``get(name)``: the run's fact, or None when it cannot be had (a snapshot without it, a failed collector).
    Facts that a probe would collect are read only when the run already has them (or they are named in ``also``:
    ``launch`` reads the GPUs when no check did); the two of ``READ_ONLY_FACTS`` only read (stat and listdir;
    ``mincore(2)``: no page is read or evicted)."""
    def get(name: str) -> Any:
        if name not in ctx.facts.collected() and name not in READ_ONLY_FACTS + also:
            return None
        try:
            return ctx.facts.get(name)
        except Exception:  # FactUnavailable, MalformedFact: the plan reckons without it
            return None
    return get


def start_plan_notice(ctx: Any) -> Any:
    """With -v, said once at the top of the report: how long the server would take to become healthy on this host
    now, and which minutes are avoidable. A notice, never a verdict (no status, no exit code); nothing is compiled
    or started. None where there is no start to come (a snapshot, --while-serving) or without -v."""
    settings = ctx.settings
    if not settings.verbose or settings.from_snapshot or settings.while_serving:
        return None
    from doctor.core.result import Notice, Remediation
    from doctor.service.launcher import build_env, planned_args

    args, _problem = planned_args(settings)
    try:  # the caches where the server will look (its environment as launch builds it): stat and listdir only
        env, _notes = build_env(settings)
        caches: dict[str, Any] | None = cache_state(env, env.get("HOME") or os.path.expanduser("~"))
    except Exception:  # a profile whose environment cannot be built: the jit_caches fact stands in
        caches = None
    plan = predict(start_inputs(fact_reader(ctx), args, tp=settings.tp, caches=caches), constants())
    return Notice(START_PLAN_NOTICE, render(plan)[0], Remediation(render_compact(plan), []))
