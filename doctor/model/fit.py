"""Whether the weights and the KV cache fit (model.fit): the --mem-fraction-static window as SGLang 0.5.23 accounts
memory (``doctor.model.memory``, constants in ``doctor/data/sglang_memory.toml``). SGLang measures the free memory
``pre`` before loading, puts the target's and the drafter's weights and the KV cache in ``pre x f``, and leaves
``pre x (1 - f)`` for the rest (CUDA-graph buffers at the DDTree verify width, the graphs' logits, prefill
activations, the request table, NCCL). ``f_min``: the KV cache holds what the profile asks; ``f_max``: the outside
still fits. "Raise or lower --mem-fraction-static?" is the question SGLang answers only after loading."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from doctor.core.context import FactUnavailable, MalformedFact
from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.model import memory
from doctor.model.consistency import config_view
from doctor.model.modelconfig import is_pos_int, json_data
from doctor.model.weights import GIB, TARGET, dir_problem, fmt_bytes

MORE_GPUS = Remediation("Use more GPUs (a larger TP), a profile for larger GPUs, or a smaller drafter.",
                        ["nvidia-smi --query-gpu=index,memory.total,memory.used --format=csv"])


def kv_bytes_per_token(view: Any, tp: int, kv_dtype: Any = None) -> int | None:
    """KV cache bytes per token on one GPU (``doctor.model.memory.kv_cell``): MLA caches one latent of
    kv_lora_rank + qk_rope_head_dim per layer on every TP rank; others K and V per KV head, split over TP."""
    g = memory.geometry(view.text) if view is not None else None
    if g is None:
        return None
    return memory.kv_cell(g, tp, 1 if isinstance(kv_dtype, str) and "fp8" in kv_dtype else 2)


def fraction_given(args: list[str], settings: Settings) -> float | None:
    f = memory.parse_server_args(args).get("mem_fraction")
    if f is None:
        f = settings.server.mem_fraction_static
    return float(f) if isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1 else None


def largest(items: dict[str, int], n: int = 3) -> str:
    top = sorted(items.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {fmt_bytes(v)}" for k, v in top)


def gpu_memory(nvml: Any) -> list[dict[str, Any]]:
    """The GPUs whose memory NVML read; else the check that judges why there are none."""
    if not isinstance(nvml, dict) or not nvml.get("available"):
        why = (nvml or {}).get("error") if isinstance(nvml, dict) else None
        raise NotJudged.blocked(f"no GPU facts (NVML unavailable{': ' + why if why else ''})", "gpu.driver")
    devices = [d for d in nvml.get("devices") or [] if isinstance(d, dict) and isinstance(d.get("memory"), dict)]
    if not devices:
        raise NotJudged.blocked("NVML reports no GPU memory (no visible GPUs)", "gpu.count")
    return devices


@dataclass
class Sizing:
    """The weights per GPU (target and drafter), the tightest GPU and what SGLang would find free on it."""

    total: int
    target: Any
    draft: Any
    draft_total: int
    weights: int
    rows: list[dict[str, Any]]
    worst: dict[str, Any]
    overhead: int
    draft_fact: dict[str, Any]

    @property
    def gpu(self) -> str:
        w = self.worst
        return f"GPU {w['index']} ({w['name']}, {fmt_bytes(w['total'])})"


def sizing(devices: list[dict[str, Any]], fact: dict[str, Any], tensors: Callable[[], Any],
           read_draft: Callable[[], Any], settings: Settings, c: dict[str, Any]) -> Sizing:
    totals = (fact.get("weights") or {}).get("totals") or {}
    total = totals.get("data_bytes") or 0
    if not total or totals.get("shards_ok") != totals.get("shards"):
        raise NotJudged.blocked("cannot size the weights: shards are not all valid (see model.shards)", "model.shards")
    tp = settings.tp
    target_w = memory.split_weights(((tensors() or {}).get("summary") or {}).get("patterns"), total, tp)
    draft = read_draft() or {}
    draft_total = ((draft.get("weights") or {}).get("totals") or {}).get("data_bytes") or 0
    draft_w = memory.split_weights((draft.get("tensors") or {}).get("patterns"), draft_total, tp, draft=True)
    weights = target_w.per_gpu + (draft_w.per_gpu if draft_total else 0)
    overhead = memory.runtime_overhead(tp, int(settings.parallel.pp or 1), c)
    rows = []
    for dev in devices[:settings.world_size]:
        mem = dev["memory"]
        tot, free = int(mem.get("total") or 0), int(mem.get("free") or 0)
        rows.append({"index": dev.get("index"), "name": dev.get("name"), "total": tot, "free": free,
                     "pre": max(0, free - overhead)})
    return Sizing(total, target_w, draft_w, draft_total, weights, rows, min(rows, key=lambda r: r["pre"]), overhead,
                  draft)


def judge_fit(read_nvml: Callable[[], Any], read_fact: Callable[[], dict[str, Any]], tensors: Callable[[], Any],
              draft: Callable[[], Any], args: tuple[list[str], Any], settings: Settings) -> Findings:
    """Read in this order, each only when needed: ``read_nvml()`` the ``nvml`` fact, ``read_fact()`` the ``model`` fact,
    then ``tensors()`` and ``draft()`` (``model.tensors``, ``drafter``: None when they cannot be had); ``args``: the
    server command and why it could not be built."""
    try:
        nvml = read_nvml()
    except MalformedFact:
        raise
    except FactUnavailable as exc:
        raise NotJudged.missing(f"no GPU facts: {exc.reason}") from None
    devices = gpu_memory(nvml)
    fact = read_fact()
    early = dir_problem(fact, TARGET, settings, cause="model.shards")
    if early is not None:
        return early
    c = memory.constants()
    size = sizing(devices, fact, tensors, draft, settings, c)
    draft = size.draft_fact
    argv, problem = args
    notes = [f"server arguments unreadable ({problem}): SGLang's defaults assumed"] if problem else []
    if len(size.rows) < settings.world_size:
        notes.append(f"only {len(size.rows)} GPUs visible for a world size of {settings.world_size}")
    f = fraction_given(argv, settings)
    out = Findings(weights_total=size.total, sharded=size.target.sharded, replicated=size.target.replicated,
                   drafter=size.draft_total, drafter_per_gpu=size.draft.per_gpu if size.draft_total else 0,
                   per_gpu_weights=size.weights, tp=settings.tp, mem_fraction_static=f, devices=size.rows,
                   runtime_overhead=size.overhead, pre=size.worst["pre"])
    too_big = weights_too_big(size, f, notes, settings, out)
    if too_big is not None:
        return too_big
    view, _ = config_view(fact)
    tgeom = memory.geometry(view.text) if view is not None else None
    if tgeom is None:
        out.details["notes"] = notes
        return out.warn("model.fit.no_geometry", f"{fmt_bytes(size.weights)} of weights per GPU fit in "
                        f"{fmt_bytes(size.worst['pre'])} on {size.gpu}; the KV cache and the graph buffers cannot be "
                        "sized: config.json lacks the attention geometry (see model.config)")
    return judge_window(size, tgeom, draft, argv, f, notes, settings, c, out)


def weights_too_big(size: Sizing, f: float | None, notes: list[str], settings: Settings, out: Findings
                    ) -> Findings | None:
    worst, weights = size.worst, size.weights
    held = worst["total"] - worst["free"]
    busy = f" (other processes hold {fmt_bytes(held)} of it now: see gpu.idle)" if held > 2 * GIB else ""
    if f is not None and weights >= worst["pre"] * f:
        more = ", and even all of its free memory" if weights >= worst["pre"] else ""
        out.details["notes"] = notes
        return out.fail("model.fit.weights", f"{fmt_bytes(weights)} of weights per GPU (TP{settings.tp}"
                        f"{' + drafter' if size.draft_total else ''}) exceed the static pool "
                        f"{fmt_bytes(worst['pre'] * f)} ({f:g} x {fmt_bytes(worst['pre'])} free now) of "
                        f"{size.gpu}{more}{busy}", MORE_GPUS)
    if weights >= worst["pre"]:
        out.details["notes"] = notes
        return out.fail("model.fit.weights", f"{fmt_bytes(weights)} of weights per GPU exceed the "
                        f"{fmt_bytes(worst['pre'])} SGLang would find free on {size.gpu}{busy}", MORE_GPUS)
    return None


def kv_need(shape: Any, cell: int, settings: Settings) -> int:
    """The KV tokens the profile asks for: one request at the full context, or ``kv_tokens_per_request`` for every
    running request; plus speculative decoding's per-step reservation; at least ``model.min_kv_cache_gib``."""
    requests = shape.max_running_requests
    per_request = settings.kv_tokens_per_request
    need = shape.context_len
    if per_request and requests:
        need = max(need, requests * per_request)
    if requests and shape.algorithm != "NONE":
        need += requests * 2 * shape.verify_width  # the per-step KV reservation of speculative decoding
    min_kv = settings.model.min_kv_cache_gib
    if isinstance(min_kv, (int, float)) and not isinstance(min_kv, bool) and min_kv > 0:
        need = max(need, math.ceil(min_kv * GIB / cell))
    return need


def judge_window(size: Sizing, tgeom: Any, draft: dict[str, Any], argv: list[str], f: float | None,
                 notes: list[str], settings: Settings, c: dict[str, Any], out: Findings) -> Findings:
    """The --mem-fraction-static window and where the profile's value lies in it."""
    worst = size.worst
    dcfg = json_data(draft.get("config")) if draft.get("given") else None
    dgeom = memory.geometry(dcfg) if isinstance(dcfg, dict) else None
    dflash = (dcfg.get("dflash_config") if isinstance(dcfg, dict) else None) or {}
    block = dflash.get("block_size", (dcfg or {}).get("block_size") if isinstance(dcfg, dict) else None)
    shape = memory.server_shape(argv, tgeom, gpu_gib=min(r["total"] for r in size.rows) / GIB,
                                draft_block=block if is_pos_int(block) else None, c=c)
    notes += shape.notes
    speculative_draft = shape.algorithm in memory.DFLASH_FAMILY and dgeom is not None
    cell = memory.kv_cell(tgeom, settings.tp, shape.kv_bytes) + (
        memory.kv_cell(dgeom, settings.tp, shape.kv_bytes) if speculative_draft else 0)
    need = kv_need(shape, cell, settings)
    outside = memory.outside_pool(tgeom, shape, draft=dgeom if speculative_draft else None,
                                  sms=memory.sm_count(worst["name"], c), c=c)
    requests = shape.max_running_requests
    if not requests:
        kv_guess = max(1, int(worst["pre"] * (f or 0.85) - size.weights) // cell)
        requests = memory.auto_max_running(kv_guess, shape.context_len, c)
    outside["request table"] = memory.req_to_token_bytes(shape, requests, c)
    win = memory.window(pre=worst["pre"], weights=size.weights, cell=cell, need_tokens=need, outside=outside,
                        per_token_outside=int(c["eager"]["bytes_per_kv_token"]))
    out.details.update(window=win.to_dict(), shape=vars(shape), kv_bytes_per_token=cell, kv_tokens_needed=need,
                       sglang_reserve=memory.sglang_reserve(shape, tgeom.mla, c), recommended=win.recommended,
                       f_min=win.f_min, f_max=win.f_max, notes=notes)
    f_out = f if f is not None else win.f_max
    outside_now = dict(outside, **{"static input buffers": win.outside_at(f_out) - sum(outside.values())})
    out.details["window"]["outside_at_f"] = outside_now
    what = (f"{fmt_bytes(size.weights)} weights + KV for {need:,} tokens ({fmt_bytes(win.need_kv)}) inside, "
            f"{fmt_bytes(win.outside_at(f_out))} outside ({largest(outside_now)})")
    if win.empty:
        return out.fail(
            "model.fit.no_window", f"no --mem-fraction-static works on {size.gpu}: it needs >= {win.f_min:.3f} for "
            f"{what.split(' inside')[0]} but <= {win.f_max:.3f} for {fmt_bytes(win.outside_at(win.f_max))} outside "
            f"the pool ({largest(outside_now)})",
            Remediation("Lower the context length, --max-running-requests, the CUDA graphs' max batch size or the "
                        "DDTree budget; or use more GPUs.",
                        ["k26-doctor check --only model.fit -v --context-length N --max-running-requests R"]))
    return judge_fraction(size, win, shape, tgeom, f, (need, requests), what, settings, c, out)


def judge_fraction(size: Sizing, win: Any, shape: Any, tgeom: Any, f: float | None, load: tuple[int, int], what: str,
                   settings: Settings, c: dict[str, Any], out: Findings) -> Findings:
    """The profile's --mem-fraction-static (or SGLang's own pick) against the window, with a recommended value."""
    worst, span = size.worst, f"[{win.f_min:.3f}, {win.f_max:.3f}]"
    need, requests = load  # KV tokens needed; running requests (the server's, or SGLang's own pick)
    set_cmd = (["# [server] mem_fraction_static = " + f"{win.recommended:g}"] if win.recommended else [])
    kv_at = win.kv_tokens(f) if f is not None else None
    out.details["kv_tokens"] = kv_at
    if f is None:
        auto = memory.sglang_auto_fraction(shape, tgeom.mla, worst["total"], c)
        out.details["sglang_auto_fraction"] = auto
        verdict = (f"SGLang would pick {auto:.3f}: inside" if win.f_min <= auto <= win.f_max
                   else f"SGLang would pick {auto:.3f}: outside it")
        return out.warn("model.fit.unset", f"window {span}, recommended {win.recommended:g}; mem_fraction_static not "
                        f"set, {verdict} ({what})", Remediation("Set the fraction in the profile or config:", set_cmd))
    outside_f = out.details["window"]["outside_at_f"]
    if f < win.f_min:
        per_request = settings.kv_tokens_per_request
        return out.warn("model.fit.below", f"mem_fraction_static {f:g} is below the window {span}: a KV cache of "
                        f"{kv_at:,} tokens where {need:,} are needed (context {shape.context_len:,}"
                        f"{', ' + str(requests) + ' requests' if per_request else ''}); "
                        f"recommended {win.recommended:g} on {size.gpu}",
                        Remediation("Raise it (or lower the context length):", set_cmd))
    if f > win.f_max:
        left = worst["pre"] * (1 - f)
        return out.warn("model.fit.above", f"mem_fraction_static {f:g} is above the window {span}: it leaves "
                        f"{fmt_bytes(left)} outside the pool where {fmt_bytes(win.outside_at(f))} are needed "
                        f"({largest(outside_f)}): out of memory at CUDA-graph capture or the first long prefill; "
                        f"recommended {win.recommended:g} on {size.gpu}",
                        Remediation("Lower it (or the CUDA graphs' max batch size / the DDTree budget):", set_cmd))
    return out.info("model.fit.inside", f"mem_fraction_static {f:g} inside the window {span} (recommended "
                    f"{win.recommended:g}): {fmt_bytes(size.weights)} of weights per GPU + KV for {kv_at:,} tokens "
                    f"({need:,} needed), {fmt_bytes(worst['pre'] * (1 - f))} left outside for "
                    f"{fmt_bytes(win.outside_at(f))} on the tightest GPU")
