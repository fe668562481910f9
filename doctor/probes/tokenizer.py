"""Probe: load the model's tokenizer the way SGLang's server does, and try what the service relies on.

Runs under the service's interpreter (``doctor.core.proc.run_probe``), stdlib only at import, Python >= 3.8.
Without transformers it reports what it can (versions, the remote code's imports) and stops.

Loading follows SGLang 0.5.23's ``get_tokenizer`` (sglang/srt/utils/hf_transformers/tokenizer.py,
tokenizer_mode "auto"): ``AutoTokenizer.from_pretrained(path, trust_remote_code=..., use_fast=True,
clean_up_tokenization_spaces=False)``; when transformers hands back its generic ``TokenizersBackend``,
again with ``use_fast=False``, then the class tokenizer_config.json declares (through ``auto_map`` with
remote code). Each step is recorded. Then: every marker (``<think>``, the tool-call section markers...)
is encoded, looked up and decoded; the chat template is rendered with a system and a user message and a
tool. The Hugging Face module cache (where remote code is copied to be imported) is a temporary
directory, removed at the end; nothing is fetched from the network. Prints one JSON object.

Arguments: ``--model DIR``, ``--trust-remote-code 0|1``, ``--markers JSON list``, ``--imports JSON list``
(top-level modules the remote code imports).
"""

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from importlib import util

try:
    from importlib import metadata
except ImportError:  # pragma: no cover - Python < 3.8
    metadata = None

USER_TEXT = "k26-doctor tokenizer probe: what is 2 + 2?"
TOOL_NAME = "k26_doctor_probe_tool"


def version_of(dist):
    if metadata is None:
        return None
    try:
        return metadata.version(dist)
    except Exception:  # PackageNotFoundError, broken metadata
        return None


def found(module):
    try:
        return util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def error_of(exc):
    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else None
    return {"type": type(exc).__name__, "message": str(exc)[:800], "where": where}


def class_of(obj):
    cls = type(obj)
    return {"name": cls.__name__, "module": cls.__module__,
            "bases": [b.__name__ for b in cls.__mro__[1:6]]}


def attempt(steps, how, make, catch=Exception):
    """One step of the load, recorded under ``how`` with the class it gave or its error: the tokenizer, or
    None when the step raised ``catch`` (each step of SGLang's loader is recorded the same way)."""
    try:
        tok = make()
        steps.append({"how": how, "class": class_of(tok)})
        return tok
    except catch as exc:
        steps.append({"how": how, "error": error_of(exc)})
        return None


def load(path, trust, out):
    """SGLang 0.5.23's get_tokenizer, auto mode, step by step."""
    from transformers import AutoTokenizer

    kwargs = {"trust_remote_code": trust, "clean_up_tokenization_spaces": False, "use_fast": True}
    steps = out["load"]["steps"]
    tok = attempt(steps, "AutoTokenizer.from_pretrained(use_fast=True)",
                  lambda: AutoTokenizer.from_pretrained(path, **kwargs))
    if tok is None:
        return None
    if type(tok).__name__ == "TokenizersBackend":
        kwargs["use_fast"] = False
        tok = attempt(steps, "AutoTokenizer.from_pretrained(use_fast=False)",
                      lambda: AutoTokenizer.from_pretrained(path, **kwargs))
        if tok is None:
            return None
    if type(tok).__name__ == "TokenizersBackend":
        declared = declared_class(path, trust, steps)
        if declared is not None:
            chosen = attempt(steps, f"declared class {declared.__name__}.from_pretrained",
                             lambda: declared.from_pretrained(path, **kwargs),
                             (OSError, ValueError, TypeError, ImportError))
            if chosen is not None:  # else SGLang keeps the generic one
                tok = chosen
    return tok


def declared_class(path, trust, steps):
    import transformers

    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return None
    name = config.get("tokenizer_class")
    if not name or name in ("PreTrainedTokenizer", "PreTrainedTokenizerBase"):
        return None
    cls = getattr(transformers, name, None)
    if cls is None and trust:
        ref = (config.get("auto_map") or {}).get("AutoTokenizer")
        if isinstance(ref, (list, tuple)):
            ref = ref[0]
        if ref:
            try:
                from transformers.dynamic_module_utils import get_class_from_dynamic_module

                cls = get_class_from_dynamic_module(ref, path)
            except (OSError, ImportError, ValueError, RuntimeError) as exc:
                steps.append({"how": f"get_class_from_dynamic_module({ref})", "error": error_of(exc)})
    return cls


def try_markers(tok, markers):
    out = {}
    for marker in markers:
        rec = {}
        try:  # the path apply_chat_template(tokenize=True) takes
            rec["ids"] = list(tok(marker, add_special_tokens=False)["input_ids"])
        except Exception as exc:
            rec["encode_error"] = error_of(exc)
        try:  # the plain encode of a raw prompt
            rec["ids_plain"] = list(tok.encode(marker))
        except Exception as exc:
            rec["encode_plain_error"] = error_of(exc)
        try:
            tid = tok.convert_tokens_to_ids(marker)
            rec["token_id"] = tid if isinstance(tid, int) else None
        except Exception as exc:
            rec["lookup_error"] = error_of(exc)
        tid = rec.get("token_id")
        if tid is None and len(rec.get("ids") or []) == 1:
            tid = rec["ids"][0]
        if tid is not None:
            try:
                rec["decoded"] = tok.decode([tid], skip_special_tokens=False)
            except Exception as exc:
                rec["decode_error"] = error_of(exc)
        out[marker] = rec
    return out


def try_template(tok):
    out = {"present": bool(getattr(tok, "chat_template", None))}
    template = getattr(tok, "chat_template", None)
    template_text = template if isinstance(template, str) else json.dumps(template, default=str)
    out["mentions_tools"] = "tools" in (template_text or "")
    messages = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": USER_TEXT}]
    tools = [{"type": "function", "function": {
        "name": TOOL_NAME, "description": "k26-doctor probe tool",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}]
    try:
        text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        out["with_tools"] = True
    except Exception as exc:
        out["tools_error"] = error_of(exc)
        try:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            out["with_tools"] = False
        except Exception as exc2:
            out["error"] = error_of(exc2)
            return out
    if not isinstance(text, str):
        out["error"] = {"type": "TypeError", "message": f"apply_chat_template returned {type(text).__name__}",
                        "where": None}
        return out
    out["chars"] = len(text)
    out["has_user_text"] = USER_TEXT in text
    out["has_tool"] = TOOL_NAME in text
    out["tail"] = text[-160:]
    try:
        ids = tok.encode(text, add_special_tokens=False)
        out["tokens"] = len(ids)
        out["round_trip"] = tok.decode(ids, skip_special_tokens=False) == text
    except Exception as exc:
        out["encode_error"] = error_of(exc)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--trust-remote-code", default="1")
    ap.add_argument("--markers", default="[]")
    ap.add_argument("--imports", default="[]")
    args = ap.parse_args()
    markers = [m for m in json.loads(args.markers) if isinstance(m, str)]
    imports = [m for m in json.loads(args.imports) if isinstance(m, str)]
    out = {"python": sys.executable, "python_version": ".".join(str(v) for v in sys.version_info[:3]),
           "versions": {d: version_of(d) for d in ("transformers", "tokenizers", "tiktoken", "jinja2",
                                                   "huggingface-hub", "sglang")},
           "missing_imports": sorted(m for m in set(imports) if not found(m)),
           "transformers_found": found("transformers"), "seconds": {}}
    if not out["transformers_found"]:
        print(json.dumps(out))
        return
    cache = tempfile.mkdtemp(prefix="k26-doctor-hfmodules-")
    os.environ.update({"HF_MODULES_CACHE": cache, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                       "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false",
                       "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"})
    out["load"] = {"steps": []}
    try:
        # Whatever the remote code prints goes to stderr: stdout carries the JSON only.
        with contextlib.redirect_stdout(sys.stderr):
            start = time.monotonic()
            try:
                import transformers  # noqa: F401 - timed on its own
            except Exception as exc:
                out["load"]["import_error"] = error_of(exc)
                return
            out["seconds"]["import_transformers"] = round(time.monotonic() - start, 3)
            start = time.monotonic()
            tok = load(args.model, args.trust_remote_code == "1", out)
            out["seconds"]["load"] = round(time.monotonic() - start, 3)
            if tok is None:
                return
            out["load"]["ok"] = True
            out["load"]["class"] = class_of(tok)
            for name in ("eos_token", "bos_token", "pad_token", "unk_token"):
                out["load"][name] = getattr(tok, name, None) if isinstance(getattr(tok, name, None), str) else None
            try:
                out["load"]["len"] = len(tok)
            except Exception:
                out["load"]["len"] = None
            start = time.monotonic()
            out["markers"] = try_markers(tok, markers)
            out["chat_template"] = try_template(tok)
            out["seconds"]["use"] = round(time.monotonic() - start, 3)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
