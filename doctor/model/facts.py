"""Facts about the target model directory (``--model-path``) and the DFlash drafter (``--draft-model-path``).

``model`` / ``drafter``: the directory as a loader will see it: per-shard header verdicts and counts
(never the 208k tensor names), download leftovers, config.json, the tokenizer's files.
``model.tensors``: the target's tensors folded into patterns (shapes, layers, experts per layer),
what ``model.config`` and ``model.fit`` compare with config.json.
``model.tokenizer``: the tokenizer's files, its remote code, and its load in the service's interpreter
(``doctor.model.tokenizer``), what ``model.tokenizer`` judges.
``model.hashes``: the deep tier: sha256 of every shard against the expected digests.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

from doctor.core.fileio import describe_error, kind_of, read_capped
from doctor.core.registry import collector
from doctor.facts.shape import mapping, opt, required
from doctor.host.access import current_user, ownership
from doctor.model.dir_fact import HashesFact, ModelDir, TensorsFact
from doctor.model.hashing import verify_model_hashes
from doctor.model.modelconfig import json_data
from doctor.model.remote_code import auto_map_refs, scan_remote_code
from doctor.model.scan import scan_weights, tensor_summary
from doctor.model.tokenizer import TOKENIZER_FILES, tokenizer_fact

MAX_JSON_BYTES = 4 * 1024 * 1024
MAX_LISTED_FILES = 400


def read_json_file(path: str) -> dict[str, Any]:
    """``{"present": bool, "text": the JSON}`` or ``{"present": ..., "error": why}``; never raises.

    The JSON is kept as text, not as a parsed object: snapshot redaction blanks values under keys
    that look secret, and configs are full of them (``mask_token_id``, ``num_key_value_heads``)."""
    name = os.path.basename(path)
    try:
        raw = read_capped(path, MAX_JSON_BYTES, "a config")  # a FIFO or a device: refused, never waited on
    except FileNotFoundError:
        if os.path.islink(path):
            return {"present": True, "error": f"{name} is a dangling symlink"}
        return {"present": False}
    except OSError as exc:
        return {"present": True, "error": f"{name} {exc.strerror}" if exc.strerror and exc.strerror.startswith("is ")
                else f"cannot read {name}: {exc.strerror or exc}"}
    try:
        text = raw.decode("utf-8")
        json.loads(text)
        return {"present": True, "text": text}
    except UnicodeDecodeError as exc:
        return {"present": True, "error": f"{os.path.basename(path)} is not UTF-8 (byte {exc.start})"}
    except json.JSONDecodeError as exc:
        return {"present": True, "error": f"{os.path.basename(path)} is not valid JSON: {exc.msg} "
                                          f"(line {exc.lineno}, column {exc.colno})"}
    except RecursionError:
        return {"present": True, "error": f"{os.path.basename(path)} is nested too deeply"}


def list_files(model_dir: str) -> dict[str, Any]:
    """Top-level entries other than shards: name -> {size, kind} (bounded)."""
    out: dict[str, Any] = {}
    count = 0
    try:
        with os.scandir(model_dir) as it:
            for entry in it:
                count += 1
                if entry.name.endswith(".safetensors") or len(out) >= MAX_LISTED_FILES:
                    continue
                try:
                    st = entry.stat(follow_symlinks=True)
                    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
                    out[entry.name] = {"size": st.st_size if kind == "file" else None, "kind": kind}
                except OSError:
                    out[entry.name] = {"size": None, "kind": "dangling" if entry.is_symlink() else "unreadable"}
    except OSError:
        pass
    return {"entries": out, "count": count}


def tokenizer_facts(model_dir: str) -> dict[str, Any]:
    """tokenizer_config.json (without the chat template's text) and which tokenizer files exist."""
    cfg = read_json_file(os.path.join(model_dir, "tokenizer_config.json"))
    data = json_data(cfg)
    if isinstance(data, dict):
        # Keep what is judged, not the template's text nor the special-token table.
        tmpl = data.pop("chat_template", None)
        data.pop("added_tokens_decoder", None)
        cfg["text"] = json.dumps({k: v for k, v in data.items() if len(json.dumps(v, default=str)) < 4096})
        cfg["chat_template"] = ({"kind": type(tmpl).__name__, "chars": len(json.dumps(tmpl))}
                                if tmpl is not None else None)
    present: dict[str, dict[str, Any]] = {}
    for name in TOKENIZER_FILES:
        p = os.path.join(model_dir, name)
        try:
            st = os.stat(p)
        except OSError as exc:
            if os.path.islink(p):  # a link to nothing, or a loop of links: never "missing"
                present[name] = {"dangling": True, **({"loop": True} if exc.errno == errno.ELOOP else {})}
            continue
        present[name] = {"size": st.st_size}
        if not stat.S_ISREG(st.st_mode):
            present[name]["kind"] = kind_of(st.st_mode)
    return {"tokenizer_config": cfg, "files": present}


def describe_dir(path: str | None, *, what: str) -> dict[str, Any]:
    """Everything the default tier judges about one model directory."""
    if not path:
        return {"given": False, "path": None}
    out: dict[str, Any] = {"given": True, "path": path, "what": what}
    try:
        st = os.stat(path)
    except FileNotFoundError:
        out.update(exists=False, error="does not exist" + (" (dangling symlink)" if os.path.islink(path) else ""))
        return out
    except OSError as exc:
        out.update(exists=False, error=f"cannot be accessed: {describe_error(exc)}")
        return out
    out["exists"] = True
    if not stat.S_ISDIR(st.st_mode):
        out.update(is_dir=False, error="is not a directory")
        return out
    out["is_dir"] = True
    if not os.access(path, os.R_OK | os.X_OK):
        out.update(error="is not readable (permissions)", access=ownership(path), user=current_user())
        return out
    out["user"] = current_user()
    out["realpath"] = os.path.realpath(path)
    out["weights"] = scan_weights(path)
    out["config"] = read_json_file(os.path.join(path, "config.json"))
    out["tokenizer"] = tokenizer_facts(path)
    out["files"] = list_files(path)
    refs = [r for entry in (out["config"], out["tokenizer"]["tokenizer_config"]) for r in auto_map_refs(
        json_data(entry).get("auto_map") if isinstance(json_data(entry), dict) else None)]
    out["remote_code"] = scan_remote_code(path, list(dict.fromkeys(refs)))  # every auto_map file, both configs
    return out


def _summary_for(path: str | None) -> dict[str, Any]:
    if not path or not os.path.isdir(path):
        return {"given": bool(path), "summary": None}
    from doctor.model.index import INDEX_NAME, SINGLE_NAME, read_index

    if os.path.exists(os.path.join(path, INDEX_NAME)):
        idx = read_index(os.path.join(path, INDEX_NAME))
        names = idx.shards
    else:
        names = [SINGLE_NAME]
    return {"given": True, "path": path, "summary": tensor_summary(path, names)}


@collector("model", timeout=120, shape=ModelDir)
def collect_model(opts: Any) -> ModelDir:
    """The target model directory: shards (headers), index, leftovers, config.json, tokenizer files."""
    return describe_dir(opts.model_path, what="model")


_ERROR = opt({"type": required(str), "message": required(str), "where": opt(str)})
_CLASS = opt({"name": opt(str), "module": opt(str)})
TOKENIZER_SHAPE = {
    "given": bool, "path": opt(str), "error": opt(str), "special_tokens": opt(mapping(int)),
    "tokenizer_class": opt(str), "tiktoken": opt({"ok": opt(bool), "tokens": int, "problems": opt([str])}),
    "remote_code": opt({"files": opt(mapping({
        "needed_by": opt(str), "error": opt(str), "num_reserved_special_tokens": opt(int),
        "moved": opt([{"line": (int, str), "name": str, "module": str, "gone_from": str, "now_in": opt(str)}])})),
        "missing": opt([str])}),
    "parsers": opt(mapping(opt(str))), "trust_remote_code": opt(bool),
    "probe": opt({"probe_failed": opt(bool), "python": opt(str), "error": opt(str), "versions": opt(mapping(opt(str))),
                  "missing_imports": opt([str]), "transformers_found": opt(bool),
                  "load": opt({"ok": opt(bool), "steps": opt([{"error": _ERROR, "how": opt(str), "class": _CLASS}]),
                               "class": _CLASS, "import_error": _ERROR}),
                  "markers": opt(mapping({"ids": opt([int]), "ids_plain": opt([int]), "encode_error": _ERROR,
                                          "lookup_error": _ERROR, "decoded": opt(str)})),
                  "chat_template": opt({"present": opt(bool), "error": _ERROR, "has_user_text": opt(bool),
                                        "mentions_tools": opt(bool), "has_tool": opt(bool), "tools_error": _ERROR,
                                        "round_trip": opt(bool)})}),
}


@collector("model.tokenizer", timeout=150, shape=TOKENIZER_SHAPE)
def collect_model_tokenizer(opts: Any) -> dict[str, Any]:
    """The target's tokenizer loaded in the service's interpreter as SGLang loads it (doctor.model.tokenizer)."""
    return tokenizer_fact(opts)


@collector("drafter", timeout=60, shape=ModelDir)
def collect_drafter(opts: Any) -> ModelDir:
    """The draft model directory, as ``model``, plus its tensor summary (small)."""
    out = describe_dir(opts.draft_model_path, what="drafter")
    if out.get("weights"):
        out["tensors"] = _summary_for(opts.draft_model_path).get("summary")
    return out


@collector("model.tensors", timeout=120, shape=TensorsFact)
def collect_model_tensors(opts: Any) -> TensorsFact:
    """The target's tensors folded into patterns: dtypes and shapes, layers, experts per MoE layer."""
    return _summary_for(opts.model_path)


@collector("model.hashes", timeout=6 * 3600, shape=HashesFact)
def collect_model_hashes(opts: Any) -> HashesFact:
    """sha256 of every shard of the target and the drafter (``--deep``), with the expected digests.

    Without ``--deep`` (e.g. ``snapshot``) nothing is hashed: hours of reading are never a side effect."""
    if not getattr(opts, "deep", False):
        return {"collected": False, "reason": "not hashed without --deep"}
    no_cache = os.environ.get("K26_DOCTOR_NO_VERIFY_CACHE", "") not in ("", "0") or not getattr(
        opts, "verify_cache", True)
    cache_dir = getattr(opts, "verify_cache_dir", None)
    out: dict[str, Any] = {}
    for key, path in (("model", opts.model_path), ("drafter", opts.draft_model_path)):
        if not path:
            out[key] = {"given": False}
        elif not os.path.isdir(path):
            out[key] = {"given": True, "path": path, "error": "not a directory"}
        else:
            out[key] = verify_model_hashes(path, use_cache=not no_cache, cache_dir=cache_dir)
    return out


_RESIDENT = {"path": opt(str), "files": int, "bytes": int, "resident_bytes": opt(int), "method": opt(str),
             "error": opt(str), "layers": opt(int)}
RESIDENCY_SHAPE = {"target": _RESIDENT, "drafter": _RESIDENT, "meminfo": mapping(int)}


@collector("weights_resident", timeout=60, isolate=True, shape=RESIDENCY_SHAPE)
def collect_weights_resident(opts: Any) -> dict[str, Any]:
    """How much of the target's and the drafter's shards is in the page cache (``mincore(2)``: nothing is read,
    nothing evicted), their layer counts, and /proc/meminfo: the start plan's weights part."""
    from doctor.model.residency import Residency, layers, meminfo, model_residency

    res = Residency()
    out: dict[str, Any] = {"meminfo": meminfo()}
    for key, path in (("target", opts.model_path), ("drafter", opts.draft_model_path)):
        out[key] = dict(model_residency(path, res), layers=layers(path))
    return out
