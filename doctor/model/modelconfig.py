"""Reading a model's config.json the way the server will: family, text config, quantization.

Families served: ``kimi_k25`` (KimiK25ForConditionalGeneration) whose ``text_config`` is DeepSeek-V3-like
(its model_type reads ``kimi_k2`` or ``deepseek_v3``), plain ``deepseek_v3``/``kimi_k2``, and generic
models (only what applies to any decoder: sizes, heads, vocabulary).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DSV3_TEXT_TYPES = ("kimi_k2", "deepseek_v3")
# Fields a DeepSeek-V3-like text config must carry, as positive integers.
DSV3_INT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "n_routed_experts",
                   "moe_intermediate_size", "num_experts_per_tok", "kv_lora_rank", "qk_rope_head_dim",
                   "qk_nope_head_dim", "v_head_dim")
GENERIC_INT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


@dataclass
class ConfigView:
    """What a config.json says, flattened to the text model; ``problems`` are fatal, ``notes`` are not."""

    family: str = "generic"  # kimi_k25 | deepseek_v3 | generic
    model_type: str | None = None
    text_model_type: str | None = None
    architectures: list[str] = field(default_factory=list)
    text: dict[str, Any] = field(default_factory=dict)
    quant: dict[str, Any] | None = None
    quant_where: str | None = None  # "text_config" | "top level"
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def int_field(self, name: str) -> int | None:
        v = self.text.get(name)
        return v if type(v) is int else None


def json_data(entry: dict[str, Any] | None) -> Any:
    """The parsed JSON of a file fact ``{"present", "text"}`` (None when absent or invalid). Facts keep
    JSON files as text so that snapshot redaction, which blanks values under secret-looking keys such
    as ``mask_token_id``, cannot alter them."""
    if not entry or "text" not in entry:
        return None
    try:
        return json.loads(entry["text"])
    except (ValueError, RecursionError):
        return None


def json_object(entry: dict[str, Any] | None, name: str) -> tuple[dict[str, Any], str | None]:
    """A JSON file fact that must hold an object: ``(data, None)``, or ``({}, problem)`` when the file is
    missing, unreadable (the collector's error, naming it) or not a JSON object. The one wording of these
    for every JSON file a check requires (``name``: the file's name, as the user knows it)."""
    entry = entry or {}
    if not entry.get("present"):
        return {}, f"{name} is missing"
    if entry.get("error"):
        return {}, str(entry["error"])
    data = json_data(entry)
    if not isinstance(data, dict):
        return {}, f"{name} is not a JSON object"
    return data, None


def is_pos_int(v: Any) -> bool:
    return type(v) is int and v > 0


def read_config(cfg: Any) -> ConfigView:
    """Interpret a parsed config.json (any JSON value; never raises)."""
    view = ConfigView()
    if not isinstance(cfg, dict):
        view.problems.append(f"config.json is a JSON {type(cfg).__name__}, not an object")
        return view
    _identity(cfg, view)
    text = _text_part(cfg, view)
    view.text = text if isinstance(text, dict) else {}
    _fields(view)
    # Quantization: under text_config (K2.x) or at the top level.
    for where, src in (("text_config", view.text if view.text is not cfg else None), ("top level", cfg)):
        if isinstance(src, dict) and src.get("quantization_config") is not None:
            view.quant = parse_quant(src["quantization_config"])
            view.quant_where = where
            break
    return view


def _identity(cfg: dict[str, Any], view: ConfigView) -> None:
    """``model_type`` and ``architectures``, each of the type the loaders expect."""
    mt = cfg.get("model_type")
    view.model_type = mt if isinstance(mt, str) else None
    if mt is not None and not isinstance(mt, str):
        view.problems.append(f"model_type is {mt!r}, not a string")
    archs = cfg.get("architectures")
    if archs is not None:
        if isinstance(archs, list) and all(isinstance(a, str) for a in archs):
            view.architectures = list(archs)
        else:
            view.problems.append(f"architectures is {archs!r}, not a list of class names")


def _text_part(cfg: dict[str, Any], view: ConfigView) -> Any:
    """The part that describes the language model, and the family: kimi_k25 (and any model with a
    ``text_config``, save deepseek_v3) keeps it under ``text_config``; DeepSeek-V3's text types at the top level."""
    if view.model_type == "kimi_k25" or (isinstance(cfg.get("text_config"), dict) and view.model_type != "deepseek_v3"):
        tc = cfg.get("text_config")
        text: Any = tc
        if not isinstance(tc, dict):
            view.problems.append(f"model_type {view.model_type} needs a text_config object "
                                 f"(found {type(tc).__name__})")
            text = {}
        view.family = "kimi_k25" if view.model_type == "kimi_k25" else "generic"
        ttype = text.get("model_type")
        view.text_model_type = ttype if isinstance(ttype, str) else None
        if view.family == "kimi_k25" and view.text_model_type not in DSV3_TEXT_TYPES:
            view.problems.append(f"text_config.model_type is {ttype!r}; kimi_k25 expects one of "
                                 f"{', '.join(DSV3_TEXT_TYPES)}")
        return text
    if view.model_type in DSV3_TEXT_TYPES:
        view.family = "deepseek_v3"
        view.text_model_type = view.model_type
    return cfg


def _fields(view: ConfigView) -> None:
    """The integer fields the family needs (missing, or not positive), the optional non-negative ones, and the
    experts each token is routed to against the experts there are."""
    fields = DSV3_INT_FIELDS if view.family in ("kimi_k25", "deepseek_v3") else GENERIC_INT_FIELDS
    for name in fields:
        if name not in view.text:
            if view.family != "generic":
                view.problems.append(f"{_where(view)}{name} is missing")
            continue
        if not is_pos_int(view.text[name]):
            view.problems.append(f"{_where(view)}{name} is {view.text[name]!r}, not a positive integer")
    for name in ("first_k_dense_replace", "num_nextn_predict_layers", "n_shared_experts"):
        v = view.text.get(name)
        if v is not None and (type(v) is not int or v < 0):
            view.problems.append(f"{_where(view)}{name} is {v!r}, not a non-negative integer")
    k, n = view.int_field("num_experts_per_tok"), view.int_field("n_routed_experts")
    if k and n and k > n:
        view.problems.append(f"num_experts_per_tok {k} exceeds n_routed_experts {n}")


def _where(view: ConfigView) -> str:
    return "text_config." if view.family == "kimi_k25" else ""


def parse_quant(qc: Any) -> dict[str, Any]:
    """Summarize a quantization_config: method, format, and for int4 groups: bits, group_size, symmetric."""
    if not isinstance(qc, dict):
        return {"method": None, "problem": f"quantization_config is a {type(qc).__name__}, not an object"}
    method = qc.get("quant_method")
    out: dict[str, Any] = {"method": method if isinstance(method, str) else None, "format": qc.get("format")}
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            out["problem"] = "compressed-tensors config has no config_groups"
            return out
        schemes = []
        for gname, g in groups.items():
            w = g.get("weights") if isinstance(g, dict) else None
            if not isinstance(w, dict):
                out["problem"] = f"config_groups.{gname}.weights is missing"
                return out
            schemes.append({"group": gname, "num_bits": w.get("num_bits"), "type": w.get("type"),
                            "strategy": w.get("strategy"), "group_size": w.get("group_size"),
                            "symmetric": w.get("symmetric")})
        out["schemes"] = schemes
        s = schemes[0]
        int4_group = s["type"] == "int" and s["num_bits"] == 4 and s["strategy"] == "group"
        if qc.get("format") == "pack-quantized" and int4_group:
            gs = s["group_size"]
            if not is_pos_int(gs):
                out["problem"] = f"group strategy with group_size {gs!r}"
            else:
                out.update(kind="int4-group", bits=4, group_size=gs, symmetric=s["symmetric"])
        else:
            out["kind"] = "compressed-tensors-other"
    elif method == "fp8":
        out["kind"] = "fp8"
    elif method is None:
        out["problem"] = "quantization_config has no quant_method"
    else:
        out["kind"] = "other"
    return out
