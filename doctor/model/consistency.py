"""config.json judged as the server will parse it (model.config): valid and supported, consistent with the shards
(packed int4 experts, experts per MoE layer, layers), divisible by the TP size, the profile's model, and every
remote-code file ``auto_map`` names there. A config that disagrees with its weights fails at load after minutes, or
loads and produces garbage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from doctor.core.result import Finding, Findings, NotJudged, Remediation, Severity
from doctor.core.settings import Settings
from doctor.model.modelconfig import ConfigView, json_data, read_config
from doctor.model.remote_code import download_command
from doctor.model.weights import TARGET, dir_problem, redownload_commands

# model.config's failures, one code per kind of problem (each with its own fix)
MISMATCH = "model.config.mismatch"  # config.json itself, or against the shards
TP = "model.config.tp"  # the tensor-parallel size does not divide the model
PROFILE = "model.config.profile"  # not the model the profile serves
REMOTE_CODE = "model.config.remote_code"  # the remote code auto_map names is missing


def config_view(fact: dict[str, Any]) -> tuple[ConfigView | None, str | None]:
    cfg = fact.get("config") or {}
    if not cfg.get("present"):
        return None, "config.json is missing"
    if cfg.get("error"):
        return None, cfg["error"]
    return read_config(json_data(cfg)), None


def expert_shape_problems(view: ConfigView, summary: dict[str, Any]) -> Findings:
    """int4 pack-quantized experts: packed I32 [out, in/8], scales [out, in/group_size], each mismatch a
    ``MISMATCH`` failure."""
    q = view.quant or {}
    h, m = view.int_field("hidden_size"), view.int_field("moe_intermediate_size")
    pats = summary.get("patterns") or {}
    packed = {p: v for p, v in pats.items() if p.endswith(".weight_packed") and ".experts.#." in p}
    if q.get("kind") != "int4-group" or not packed:
        return _packing_problems(q.get("kind") == "int4-group", packed, pats)
    gs = q["group_size"]
    if not (h and m):
        return Findings()
    dims = {"gate_proj": (m, h), "up_proj": (m, h), "down_proj": (h, m), "w1": (m, h), "w3": (m, h), "w2": (h, m)}
    out = Findings()
    for pat, v in packed.items():
        proj = pat.rsplit(".", 2)[-2]
        if proj in dims:
            out += _packed_expert_problems(pat, v, pats.get(pat[: -len("weight_packed")] + "weight_scale"),
                                           dims[proj], (h, m, gs))
    return out


def _packing_problems(int4: bool, packed: dict[str, Any], pats: dict[str, Any]) -> Findings:
    """config.json's quantization against whether the shards' expert weights are packed at all: packed weights
    without an int4 quantization_config, or an int4 one over unpacked experts (nothing else can be compared)."""
    out = Findings()
    if not int4 and packed:
        out.fail(MISMATCH, f"the shards hold int4 packed expert weights ({len(packed)} patterns) but config.json "
                 "has no compressed-tensors int4 quantization_config")
    elif int4 and any(".experts.#." in p for p in pats):
        out.fail(MISMATCH, "config.json says int4 pack-quantized, but the expert weights in the shards are not "
                 "packed (no *.weight_packed)")
    return out


def _packed_expert_problems(pat: str, v: dict[str, Any], sv: dict[str, Any] | None, dims: tuple[int, int],
                            config: tuple[int, int, Any]) -> Findings:
    """One packed expert projection (``pat``, its summary ``v``; ``sv``: its scales' summary, None where absent;
    ``dims``: its (out, in); ``config``: hidden, moe_intermediate and group size) against config.json."""
    h, m, gs = config
    o, i = dims
    out = Findings()
    want_p = f"I32{[o, i // 8]}"
    got = list(v["shapes"])
    if got != [want_p]:
        out.fail(MISMATCH, f"{pat}: shards hold {', '.join(got)}, config (hidden {h}, moe_intermediate {m}, int4) "
                 f"implies {want_p}")
    spat = pat[: -len("weight_packed")] + "weight_scale"
    if sv is None:
        return out.fail(MISMATCH, f"{spat} is missing from the shards (int4 needs scales)")
    want_s = [o, i // gs]
    gots = [s for s in sv["shapes"] if not s.endswith(str(want_s))]
    if gots:
        out.fail(MISMATCH, f"{spat}: shards hold {', '.join(gots)}, config group_size {gs} implies {want_s}"
                 f"{_implied_group(gots[0], i)}")
    return out


def _implied_group(shape_text: str, in_dim: int) -> str:
    """The group size a scales shape such as ``F32[7168, 112]`` implies for an input of ``in_dim`` (said after
    the mismatch, so that a download quantized with another group size is recognised), or ""."""
    try:
        shape = [int(x) for x in shape_text.split("[", 1)[1].rstrip("]").split(",")]
    except ValueError:
        return ""
    if len(shape) == 2 and shape[1]:
        return f" (group size {in_dim // shape[1]} in the shards)"
    return ""


def layer_problems(view: ConfigView, summary: dict[str, Any]) -> Findings:
    """The shards' layers against config.json: layers missing or beyond the config (MTP layers allowed), then
    the routed experts per layer and the MoE layers that have none (each a ``MISMATCH`` failure)."""
    n_layers = view.int_field("num_hidden_layers")
    layers = summary.get("layers") or []
    if not n_layers or not layers:
        return Findings()
    nextn = view.text.get("num_nextn_predict_layers") if type(view.text.get("num_nextn_predict_layers")) is int else 0
    have = set(layers)
    missing = sorted(set(range(n_layers)) - have)
    extra = sorted(x for x in have if x >= n_layers + nextn)
    out = Findings()
    if missing:
        out.fail(MISMATCH, f"config has num_hidden_layers={n_layers} but the shards lack layer(s) {ranges(missing)}")
    if extra:
        out.fail(MISMATCH, f"config has num_hidden_layers={n_layers} but the shards hold layer(s) {ranges(extra)}")
    n_exp = view.int_field("n_routed_experts")
    per = summary.get("experts_per_layer") or {}
    if n_exp and per:
        out += _expert_count_problems(view, n_layers, n_exp, per)
    return out


def _expert_count_problems(view: ConfigView, n_layers: int, n_exp: int, per: dict[str, int]) -> Findings:
    """``per`` (routed experts per layer in the shards) against n_routed_experts, and the MoE layers the config
    implies (first_k_dense_replace, moe_layer_freq) that have none, said only where others have experts (a few
    layers lost from a download, not a whole naming unrecognised)."""
    out = Findings()
    wrong = {int(k): v for k, v in per.items() if v != n_exp and int(k) < n_layers}
    if wrong:
        ex = ", ".join(f"layer {k}: {v}" for k, v in sorted(wrong.items())[:4])
        out.fail(MISMATCH, f"config has n_routed_experts={n_exp}; the shards differ: {ex}"
                 + (" ..." if len(wrong) > 4 else ""))
    want_moe = _moe_layers(view, n_layers)
    lacking = sorted(want_moe - {int(k) for k in per})
    if lacking and len(lacking) < len(want_moe):
        out.fail(MISMATCH, f"MoE layer(s) {ranges(lacking)} have no experts in the shards")
    return out


def _moe_layers(view: ConfigView, n_layers: int) -> set[int]:
    """The layers the config makes MoE: from first_k_dense_replace on, every moe_layer_freq-th (ill-typed values
    read as their defaults, 0 and 1)."""
    first_dense = view.text.get("first_k_dense_replace", 0)
    first_dense = first_dense if type(first_dense) is int else 0
    freq = view.text.get("moe_layer_freq", 1)
    freq = freq if type(freq) is int and freq > 0 else 1
    return {i for i in range(first_dense, n_layers) if (i - first_dense) % freq == 0}


def ranges(nums: list[int]) -> str:
    out: list[str] = []
    start = prev = None
    for n in nums:
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = n
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out[:10]) + (" ..." if len(out) > 10 else "")


TP_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def working_tp_sizes(settings: Settings, view: ConfigView) -> list[int]:
    """TP sizes (up to 64) that divide this model under the profile's EP: heads, experts, int4 groups."""
    return sorted(t for t in TP_CANDIDATES if not tp_problems(settings, view, t))


def tp_problems(settings: Settings, view: ConfigView, tp: int | None = None) -> Findings:
    """What stops ``tp`` (the run's TP size by default) from splitting this model under the profile's EP: attention
    heads, experts over EP, the MoE projections and their int4 groups per rank, each a ``TP`` failure."""
    out = Findings()
    tp = settings.tp if tp is None else tp
    ep = settings.parallel.ep
    ep = ep if type(ep) is int and ep > 0 else 1
    heads = view.int_field("num_attention_heads")
    if heads and heads % tp:
        out.fail(TP, f"num_attention_heads={heads} is not divisible by TP {tp}")
    n_exp = view.int_field("n_routed_experts")
    if ep > 1:
        if tp % ep:
            out.fail(TP, f"TP {tp} is not a multiple of EP {ep}")
        if n_exp and n_exp % ep:
            out.fail(TP, f"n_routed_experts={n_exp} is not divisible by EP {ep}")
    moe_tp = max(1, tp // ep)
    m = view.int_field("moe_intermediate_size")
    if m and moe_tp > 1:
        if m % moe_tp:
            out.fail(TP, f"moe_intermediate_size={m} is not divisible by the MoE TP size {moe_tp}")
        elif (view.quant or {}).get("kind") == "int4-group":
            per = m // moe_tp
            gs = view.quant["group_size"]  # type: ignore[index]
            if per % gs or per % 8:
                out.fail(TP, f"moe_intermediate_size {m} / MoE TP {moe_tp} = {per} per rank is not a multiple of "
                         f"the int4 group size {gs} (and of 8 packed values)")
    return out


def profile_problems(settings: Settings, view: ConfigView) -> Findings:
    """config.json against the model the profile serves (type, architectures, sizes, quantization), each a
    ``PROFILE`` failure."""
    out = Findings()
    mt = settings.model.model_type
    if mt and view.model_type != mt:
        out.fail(PROFILE, f"model_type is {view.model_type!r}, the profile expects {mt!r}")
    archs = settings.model.architectures
    if archs and view.architectures and not set(archs) & set(view.architectures):
        out.fail(PROFILE, f"architectures {view.architectures} are not the profile's {archs}")
    for key in ("num_hidden_layers", "n_routed_experts", "hidden_size", "vocab_size"):
        want = getattr(settings.model, key)
        got = view.text.get(key)
        if want is not None and got is not None and got != want:
            out.fail(PROFILE, f"{key} is {got}, the profile expects {want}")
    quant = settings.model.quantization
    got_q = (view.quant or {}).get("method")
    if quant and got_q != quant:
        out.fail(PROFILE, f"quantization is {got_q or 'none'}, the profile expects {quant}")
    return out


def shard_problems(view: ConfigView, summary: dict[str, Any]) -> Findings:
    """config.json against the tensors of the shards: layers, experts, packed int4 shapes, the embedding (each a
    ``MISMATCH`` failure)."""
    problems = layer_problems(view, summary)
    if view.family != "generic":
        problems += expert_shape_problems(view, summary)
    hs = view.int_field("hidden_size")
    for pat, v in (summary.get("patterns") or {}).items():
        if pat.endswith("embed_tokens.weight") and hs:
            for shp in v["shapes"]:
                if not shp.endswith(f", {hs}]"):
                    problems.fail(MISMATCH, f"{pat} is {shp}, config hidden_size is {hs}")
    return problems


def remote_code_problems(fact: dict[str, Any]) -> Findings:
    """The remote-code files auto_map names (and what they import relatively) that are missing or unreadable, each
    a ``REMOTE_CODE`` failure; ``details["files"]``: their names (what a download fetches)."""
    remote = fact.get("remote_code") or {}
    code_missing = list(remote.get("missing") or [])
    code_broken = [n for n, f in (remote.get("files") or {}).items() if f.get("error")]
    out = Findings(files=code_missing + code_broken)
    for name in code_missing:
        by = (remote.get("files") or {}).get(name, {}).get("needed_by")
        out.fail(REMOTE_CODE, f"remote-code file {name} " + (f"(imported by {by}) " if by else "named by auto_map ")
                 + "is missing: the server fails to import it after the weights load")
    for name in code_broken:
        out.fail(REMOTE_CODE, f"remote-code file {name} {remote['files'][name]['error']}")
    return out


def description(view: ConfigView) -> str:
    t, q = view.text, view.quant
    desc = (f"{view.model_type}" + (f" (text {view.text_model_type})" if view.text_model_type
                                   and view.text_model_type != view.model_type else "")
            + (f": {t.get('num_hidden_layers')} layers" if "num_hidden_layers" in t else "")
            + (f", {t.get('n_routed_experts')} experts" if "n_routed_experts" in t else "")
            + (f", hidden {t.get('hidden_size')}" if "hidden_size" in t else ""))
    if q and q.get("kind") == "int4-group":
        desc += f", int4 group {q['group_size']}"
    elif q:
        desc += f", {q.get('method')}"
    return desc


class ConfigReading:
    """What is wrong with config.json, as failures by kind (each kind its code and its own fix), and what is only
    noted."""

    def __init__(self, view: ConfigView) -> None:
        self.config = Findings(Finding(Severity.FAIL, MISMATCH, p) for p in view.problems)
        self.warnings = list(view.notes)
        self.tp = Findings()
        self.profile = Findings()
        self.code = Findings(files=[])
        self.checked_against_shards = False
        self.not_compared: str | None = None
        q = view.quant
        if q is not None and q.get("problem"):
            self.config.fail(MISMATCH, q["problem"])
        elif q is not None and q.get("kind") in ("other", "compressed-tensors-other"):
            self.warnings.append(f"quantization {q.get('method')} ({q.get('format')}) is not one the doctor checks "
                                 "against the shards")

    @property
    def problems(self) -> list[Finding]:
        return self.config + self.tp + self.profile + self.code

    def against_shards(self, view: ConfigView, fact: dict[str, Any], summary: dict[str, Any] | None) -> None:
        totals = (fact.get("weights") or {}).get("totals") or {}
        unvalidated = (totals.get("shards") or 0) - (totals.get("shards_ok") or 0)
        if unvalidated > 0:
            # The summary holds only the shards that validated: judged against it, a damaged shard would look
            # like missing layers or experts, and the fix would wrongly be a new config.json.
            self.not_compared = (f"not compared with the shards: {unvalidated} of {totals.get('shards')} shard(s) "
                                 "did not validate (see model.shards)")
            summary = None
        if summary and not self.config:
            self.checked_against_shards = True
            self.config += shard_problems(view, summary)
        elif not summary and not self.not_compared:
            self.warnings.append("no valid shard headers to compare the config with (see model.shards)")


def judge_config(fact: dict[str, Any], read_tensors: Callable[[], Any], settings: Settings) -> Findings:
    """``fact``: the ``model`` fact; ``read_tensors()``: ``model.tensors`` or None, read once the directory and its
    config.json are usable."""
    early = dir_problem(fact, TARGET, settings, cause="model.shards")
    if early is not None:
        return early
    view, err = config_view(fact)
    if view is None:
        return Findings().fail("model.config.unreadable", f"{err} in {fact.get('path')}", Remediation(
            "Re-download config.json from the same revision as the shards.",
            redownload_commands(settings, fact, ["config.json"], TARGET)))
    seen = ConfigReading(view)
    seen.against_shards(view, fact, (read_tensors() or {}).get("summary"))
    seen.tp = tp_problems(settings, view)
    seen.profile = profile_problems(settings, view)
    seen.code = remote_code_problems(fact)
    problems = seen.problems
    out = Findings(family=view.family, model_type=view.model_type, text_model_type=view.text_model_type,
                   quantization=view.quant, quantization_where=view.quant_where, tp=settings.tp,
                   problems=[f.message for f in problems],
                   warnings=seen.warnings, checked_against_shards=seen.checked_against_shards)
    if problems:
        return config_failure(fact, view, seen, settings, out)
    desc = description(view)
    if seen.not_compared:
        out.details["not_compared"] = seen.not_compared
        raise NotJudged.blocked(f"{desc}; TP {settings.tp} divides it; {seen.not_compared}", "model.shards",
                                **out.details)
    if seen.warnings:
        return out.warn("model.config.note", f"{desc}; {seen.warnings[0]}")
    return out.info("model.config.consistent", f"{desc}; consistent with the shards; TP {settings.tp} divides it")


def config_failure(fact: dict[str, Any], view: ConfigView, seen: ConfigReading, settings: Settings,
                   out: Findings) -> Findings:
    """Each problem a finding coded by its kind (config.json against the shards, TP, the profile's model, remote
    code), said in one line (the first, and how many more), with the fix of each kind found."""
    texts: list[str] = []
    commands: list[str] = []
    if seen.code:
        texts.append("Download the model's remote code (the revision of the rest of the model).")
        commands.append(download_command(settings.model.repo, fact.get("path"), seen.code.details["files"]))
    if seen.config:
        texts.append("Use the config.json of the same revision as the shards.")
        commands += redownload_commands(settings, fact, ["config.json"], TARGET)
    if seen.tp:
        sizes = working_tp_sizes(settings, view)
        out.details["working_tp_sizes"] = sizes
        want = int(settings.parallel.tp or 0)
        pick = want if want in sizes else max((s for s in sizes if s <= settings.tp), default=None)
        texts.append(f"TP {settings.tp} does not divide this model; TP sizes that do: "
                     + (", ".join(map(str, sizes)) if sizes else "none up to 64") + ".")
        if pick:
            commands.append(f"k26-doctor check --tp {pick}")
    if seen.profile:
        texts.append(f"This is not the model profile {settings.profile_name} serves: point --model-path at "
                     "that model, or use a profile made for this one.")
    out += seen.problems
    return out.fold("config.json: ", Remediation(" ".join(texts), commands))
