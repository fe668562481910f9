"""The tokenizer as the server will load it: its files, its remote code, and a load in the service's
interpreter (``doctor/probes/tokenizer.py``), judged here.

SGLang loads the tokenizer after the weights (minutes into a start) and splits the model's output on
special tokens: with ``--reasoning-parser kimi_k2`` on ``<think>``/``</think>``, with
``--tool-call-parser kimi_k2`` on the tool-call section markers. A tokenizer that loads but gives those
markers other ids, splits them into pieces or decodes them to something else serves answers with the
reasoning inside and tool calls unparsed, without any error. So the fact holds, beside the files:

* ``tiktoken.model`` read and validated (``doctor.model.tiktoken_bpe``), its size against the
  vocabulary in config.json and the reserved special ids of the remote code;
* tokenizer_config.json's special tokens (``added_tokens_decoder``: the ids the model was trained with);
* the remote code (``doctor.model.remote_code``): files present, imports;
* the probe's load, step by step as SGLang does it, each marker encoded, looked up and decoded, and the
  chat template rendered.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doctor.core.datafile import load_toml
from doctor.core.fileio import kind_of, read_capped
from doctor.core.proc import run_probe
from doctor.core.result import Findings, NotJudged, Remediation
from doctor.model.remote_code import auto_map_refs, compat_table, download_command, scan_remote_code
from doctor.model.tiktoken_bpe import read_tiktoken_bpe

if TYPE_CHECKING:
    from packaging.version import Version

MARKERS_FILE = Path(__file__).resolve().parents[1] / "data" / "tokenizer_markers.toml"
PROBE_TIMEOUT_S = 120.0
MAX_JSON_BYTES = 8 * 1024 * 1024
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json",
                   "merges.txt", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json")
MAX_SPECIAL_PROBED = 64
GENERIC_BACKEND = "TokenizersBackend"


@functools.lru_cache(maxsize=2)
def parser_markers(path: Path = MARKERS_FILE) -> dict[str, dict[str, list[str]]]:
    """``{"reasoning_parser": {"kimi_k2": [...]}, "tool_call_parser": {...}}``."""
    data = load_toml(path)
    return {kind: {name: list(v.get("markers") or []) for name, v in table.items()}
            for kind, table in data.items() if isinstance(table, dict)}


def parsers_from_args(args: list[Any]) -> dict[str, str]:
    """``--reasoning-parser X`` / ``--tool-call-parser=Y`` in a server argv."""
    out: dict[str, str] = {}
    items = [str(a) for a in args]
    for i, arg in enumerate(items):
        name, eq, value = arg.partition("=")
        key = {"--reasoning-parser": "reasoning_parser", "--tool-call-parser": "tool_call_parser"}.get(name)
        if key:
            if eq:
                out[key] = value
            elif i + 1 < len(items):
                out[key] = items[i + 1]
    return out


def required_markers(parsers: dict[str, str]) -> dict[str, list[str]]:
    """Marker -> the parsers that split on it."""
    table = parser_markers()
    out: dict[str, list[str]] = {}
    for kind, name in parsers.items():
        for marker in table.get(kind, {}).get(name, []):
            out.setdefault(marker, []).append(f"--{kind.replace('_', '-')} {name}")
    return out


def _read_json(path: str) -> tuple[Any, str | None]:
    try:
        return json.loads(read_capped(path, MAX_JSON_BYTES, "a tokenizer config")), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{os.path.basename(path)} {exc.strerror}" if (exc.strerror or "").startswith("is ") else \
            f"{os.path.basename(path)}: {exc.strerror or exc}"
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"{os.path.basename(path)}: {exc}"


def blocking_files(model_dir: str, remote: dict[str, Any]) -> list[str]:
    """The tokenizer's files (and remote code) that exist but are not regular files, in words
    (``tokenizer.json is a FIFO (named pipe)``): a load in the service's interpreter would block on them."""
    out = []
    for name in [*TOKENIZER_FILES, "config.json", *(remote.get("files") or {})]:  # AutoConfig reads config.json
        try:
            mode = os.stat(os.path.join(model_dir, name)).st_mode
        except (OSError, ValueError):
            continue
        if not stat.S_ISREG(mode):
            out.append(f"{name} is {kind_of(mode)}")
    return out


def special_tokens(tokenizer_config: Any) -> dict[str, int]:
    """``added_tokens_decoder`` as ``{content: id}``."""
    out: dict[str, int] = {}
    decoder = tokenizer_config.get("added_tokens_decoder") if isinstance(tokenizer_config, dict) else None
    for key, entry in (decoder or {}).items():
        content = entry.get("content") if isinstance(entry, dict) else None
        try:
            tid = int(key)
        except (TypeError, ValueError):
            continue
        if isinstance(content, str):
            out[content] = tid
    return out


def tokenizer_fact(opts: Any) -> dict[str, Any]:
    """Files, remote code and the probe's load of the target model's tokenizer (``opts``: CollectOptions)."""
    path = opts.model_path
    if not path:
        return {"given": False}
    if not os.path.isdir(path):
        return {"given": True, "path": path, "error": "is not a directory"}
    out: dict[str, Any] = {"given": True, "path": path}
    tc, err = _read_json(os.path.join(path, "tokenizer_config.json"))
    out["tokenizer_config_error"] = err
    out["special_tokens"] = special_tokens(tc)
    out["tokenizer_class"] = tc.get("tokenizer_class") if isinstance(tc, dict) else None
    vocab = os.path.join(path, "tiktoken.model")
    out["tiktoken"] = read_tiktoken_bpe(vocab) if os.path.lexists(vocab) else None
    refs = auto_map_refs(tc.get("auto_map") if isinstance(tc, dict) else None)
    out["remote_code"] = scan_remote_code(path, refs)
    profile = opts.profile if isinstance(getattr(opts, "profile", None), dict) else {}
    server_args = (profile.get("server") or {}).get("args") or []
    out["parsers"] = parsers_from_args(server_args if isinstance(server_args, list) else [])
    trust = (profile.get("model") or {}).get("trust_remote_code", True) is not False
    out["trust_remote_code"] = trust
    markers = list(required_markers(out["parsers"]))
    for content in sorted(out["special_tokens"], key=out["special_tokens"].get):
        if content not in markers and len(markers) < MAX_SPECIAL_PROBED:
            markers.append(content)
    blocking = blocking_files(path, out["remote_code"])
    if blocking:  # transformers would open it and wait (a FIFO) or read a device: the probe is not started
        out["probe"] = {"probe_failed": True, "python": opts.python,
                        "error": f"not run: {blocking[0]}, which the tokenizer load would open"}
        return out
    imports = sorted({m for f in out["remote_code"]["files"].values() for m in f.get("imports", [])})
    args = ["--model", path, "--trust-remote-code", "1" if trust else "0", "--markers", json.dumps(markers),
            "--imports", json.dumps(imports)]
    data, res = run_probe(opts.python, "tokenizer", args, timeout=PROBE_TIMEOUT_S, env=getattr(opts, "env", None))
    out["probe"] = data if data is not None else {"probe_failed": True, "error": res.why(), "python": opts.python}
    return out


# -- judging ---------------------------------------------------------------------------------------

def problem(into: Findings, code: str, message: str, fix: str = "", commands: list[str] | None = None) -> None:
    """One thing the tokenizer's files or load get wrong (``fix``: what to do; ``commands``: exactly)."""
    into.fail(f"model.tokenizer.{code}", message, Remediation(fix, list(commands or [])))


def warning(into: Findings, code: str, message: str, fix: str = "") -> None:
    into.warn(f"model.tokenizer.{code}", message, Remediation(fix) if fix else None)


def _version(text: Any) -> Version | None:
    from packaging.version import InvalidVersion, Version  # (imported where used: `list` never needs it)

    try:
        return Version(str(text)) if text else None
    except InvalidVersion:
        return None


def _in_range(version: Version | None, spec: str) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return version is not None and version in SpecifierSet(spec)
    except InvalidSpecifier:
        return False


def judge_files(fact: dict[str, Any], vocab_size: int | None, repo: str | None, *,
                named_reported: bool = False) -> Findings:
    """The file-level part: tiktoken.model valid and as large as the vocabulary says, the special tokens
    inside the reserved ids, remote-code files present (``named_reported``: leave out the files auto_map
    names itself, which the caller reports)."""
    v = Findings()
    tk = fact.get("tiktoken")
    remote = fact.get("remote_code") or {}
    redo = functools.partial(download_command, repo, fact.get("path"))
    if tk is not None and not tk.get("ok"):
        problem(v, "tiktoken_invalid", "tiktoken.model: " + "; ".join(tk.get("problems") or ["invalid"]),
                                  "Re-download tiktoken.model from the model's repository.",
                                  [redo(["tiktoken.model"])])
    elif tk is not None:
        v.details["base_tokens"] = tk["tokens"]
        _judge_vocab(tk["tokens"], _reserved_ids(remote), vocab_size, fact.get("special_tokens") or {}, redo, v)
    _judge_remote_files(remote, named_reported, redo, v)
    return v


def _reserved_ids(remote: dict[str, Any]) -> int | None:
    """The special ids the remote code reserves after tiktoken.model's tokens (the first file that says), or None:
    the vocabulary's size and the special tokens' ids are judged against it."""
    return next((f.get("num_reserved_special_tokens") for f in (remote.get("files") or {}).values()
                 if f.get("num_reserved_special_tokens")), None)


def _judge_vocab(base: int, reserved: int | None, vocab_size: int | None, specials: dict[str, int],
                 redo: Callable[[list[str]], str], v: Findings) -> None:
    """A valid tiktoken.model against config.json's vocabulary and tokenizer_config.json's special ids: files of
    different revisions move every special token's id, which nothing else notices until the output is wrong."""
    if vocab_size and reserved and base + reserved != vocab_size:
        problem(v, "vocab_size",
            f"tiktoken.model has {base:,} tokens; with the remote code's {reserved} reserved special ids the "
            f"vocabulary is {base + reserved:,}, config.json says {vocab_size:,}: every special token's id moves",
            "tiktoken.model and config.json come from different revisions: re-download both.",
            [redo(["tiktoken.model", "config.json", "tokenizer_config.json"])])
    limit = base + (reserved or 256)
    outside = sorted((tid, tok) for tok, tid in specials.items() if not base <= tid < limit)
    if outside and reserved:
        shown = ", ".join(f"{tok} ({tid})" for tid, tok in outside[:4])
        problem(v, "special_ids",
            f"tokenizer_config.json gives {len(outside)} special token(s) ids outside the reserved range "
            f"{base}..{limit - 1} after tiktoken.model's tokens: {shown}",
            "tokenizer_config.json and tiktoken.model come from different revisions: re-download both.",
            [redo(["tiktoken.model", "tokenizer_config.json"])])


def _judge_remote_files(remote: dict[str, Any], named_reported: bool, redo: Callable[[list[str]], str],
                        v: Findings) -> None:
    """Remote-code modules missing (one another imports always; one auto_map names only where the caller does not
    report those itself) or unreadable: the tokenizer load would fail on either."""
    for name in remote.get("missing") or []:
        by = (remote.get("files") or {}).get(name, {}).get("needed_by")
        if by or not named_reported:
            problem(v, "remote_code_missing", f"remote-code module {name} " + (f"(imported by {by}) " if by else
                                                                       "named by auto_map ") + "is missing",
                                      "Download it from the model's repository (the same revision):", [redo([name])])
    for name, rec in (remote.get("files") or {}).items():
        if rec.get("error"):
            problem(v, "remote_code_unreadable", f"{name}: {rec['error']}",
                    "Re-download it from the model's repository.", [redo([name])])


def judge_load(fact: dict[str, Any], model_type: str | None, repo: str | None, v: Findings) -> Findings:
    """The load part, added to ``v``: what the probe saw, against tokenizer_config.json's ids and the parsers'
    markers. A probe that failed raises ``NotJudged.failing``, a service interpreter without transformers
    ``NotJudged.missing`` (what ``v`` found stays in ``v``); ``v.details["loaded_as"]``: the class it loads as."""
    probe = fact.get("probe") or {}
    if probe.get("probe_failed"):
        raise NotJudged.failing(f"the tokenizer probe under {probe.get('python')} failed: {probe.get('error')}")
    versions = probe.get("versions") or {}
    tf_version = _version(versions.get("transformers"))
    v.details.update(transformers=versions.get("transformers"), tiktoken=versions.get("tiktoken"),
                     python=probe.get("python"))
    _judge_versions(fact, model_type, tf_version, functools.partial(download_command, repo, fact.get("path")), v)
    _judge_imports(probe, v)
    load = probe.get("load") or {}
    steps = load.get("steps") or []
    v.details["load_steps"] = steps
    if load.get("import_error") or not load.get("ok"):
        _load_failed(probe, load, steps, v)
        return v
    _judge_class(fact, load.get("class") or {}, steps, v)
    _judge_markers(fact, probe, v)
    _judge_template(probe, v)
    return v


def _judge_versions(fact: dict[str, Any], model_type: str | None, tf_version: Version | None,
                    redo: Callable[[list[str]], str], v: Findings) -> None:
    """The installed transformers against the remote code (an import from a place that release no longer has)
    and against the backend routing rules of ``tokenizer_compat.toml`` (a model type sent past its tokenizer)."""
    remote = fact.get("remote_code") or {}
    for name, rec in (remote.get("files") or {}).items():
        for hit in rec.get("moved") or []:
            if tf_version is not None and tf_version >= _version(hit["gone_from"]):
                problem(v, "remote_code_transformers",
                    f"{name} line {hit['line']} imports {hit['name']} from {hit['module']}, which transformers "
                    f"{hit['gone_from']} and later no longer have (installed: {tf_version}); the tokenizer cannot load",
                    f"Use the model repository's current {name} (it must import {hit['name']} from "
                    f"{hit.get('now_in')} when the old place is gone), or a transformers older than "
                    f"{hit['gone_from']} if the installed SGLang allows it.", [redo([name])])
    for rule in compat_table().get("backend_routing", []):
        if model_type in rule.get("model_types", []) and _in_range(tf_version, rule.get("transformers", "")):
            warning(v, "backend_routing",
                f"transformers {tf_version} routes model type {model_type} past its remote tokenizer to the generic "
                f"{GENERIC_BACKEND}, whose special-token ids are wrong", rule.get("fix", ""))


def _judge_imports(probe: dict[str, Any], v: Findings) -> None:
    """transformers importable (else the load was not tried: not judged), and the modules the remote code
    imports installed."""
    missing_mods = probe.get("missing_imports") or []
    if not probe.get("transformers_found"):
        others = [m for m in missing_mods if m != "transformers"]
        raise NotJudged.missing(f"transformers is not importable from {probe.get('python')}: the tokenizer load was "
                                "not tried (SGLang cannot start there either; sglang.install judges the install)"
                                + (f"; the remote code also imports {', '.join(others)}, missing there"
                                   if others else ""))
    if missing_mods:
        problem(v, "missing_imports",
            f"the remote code imports {', '.join(missing_mods)}, not installed in {probe.get('python')}",
            "Install them into the service's environment:",
            [f"{shlex.quote(str(probe.get('python')))} -m pip install {' '.join(missing_mods)}"])


def _load_failed(probe: dict[str, Any], load: dict[str, Any], steps: list[dict[str, Any]], v: Findings) -> None:
    """A load that failed: transformers itself does not import, or the tokenizer does not load as SGLang loads it
    (the last step's error; remote code asks for --trust-remote-code)."""
    if load.get("import_error"):
        err = load["import_error"]
        problem(v, "transformers_broken", f"import transformers fails in {probe.get('python')}: {err['type']}: "
                                  f"{err['message']}", "Repair the service environment's transformers install.")
        return
    err = next((s["error"] for s in reversed(steps) if s.get("error")), {"type": "?", "message": "no tokenizer"})
    text = f"{err['type']}: {err['message']}"
    fix = "Fix what the error names; the server fails the same way, after the weights loaded."
    if "trust_remote_code" in err["message"] or "requires you to execute" in err["message"]:
        fix = "The tokenizer is remote code: pass --trust-remote-code (profile [model] trust_remote_code = true)."
    problem(v, "load_fails", f"loading the tokenizer as SGLang does fails: {text}"
                              + (f" (at {err['where']})" if err.get("where") else ""), fix)


def _judge_class(fact: dict[str, Any], cls: dict[str, Any], steps: list[dict[str, Any]], v: Findings) -> None:
    """The class the tokenizer loads as: transformers' generic backend in place of the model's (wrong special-token
    ids), or only SGLang's fallback saving plain AutoTokenizer from it."""
    module = str(cls.get("module") or "")
    v.details["loaded_as"] = (f"{cls.get('name')} (remote code {module.rsplit('.', 1)[-1]}.py)"
                   if module.startswith("transformers_modules.") else f"{module}.{cls.get('name')}")
    first = steps[0].get("class", {}).get("name") if steps and steps[0].get("class") else None
    if cls.get("name") == GENERIC_BACKEND:
        problem(v, "generic_backend",
            f"the tokenizer loads as transformers' generic {GENERIC_BACKEND}, not the model's "
            f"{fact.get('tokenizer_class') or 'tokenizer class'}: special-token ids differ from the model's",
            "Use a transformers release that honours the remote tokenizer (see the warnings), and keep "
            "--trust-remote-code.")
    elif first == GENERIC_BACKEND:
        warning(v, "plain_autotokenizer",
            f"plain AutoTokenizer gives the generic {GENERIC_BACKEND} here; SGLang's loader falls back to "
            f"{cls.get('name')}, but other tools that load this model with AutoTokenizer get wrong ids")


def _judge_markers(fact: dict[str, Any], probe: dict[str, Any], v: Findings) -> None:
    """The markers the probe encoded and decoded against tokenizer_config.json: a wrong one the server's parsers
    rely on fails (tool calls and reasoning would not be parsed), any other special token only warns."""
    required = required_markers(fact.get("parsers") or {})
    specials = fact.get("special_tokens") or {}
    seen = probe.get("markers") or {}
    bad_required: list[str] = []
    bad_other: list[str] = []
    for marker, rec in seen.items():
        why = _marker_problem(marker, rec, specials.get(marker))
        if why:
            (bad_required if marker in required else bad_other).append(f"{marker} {why}")
    for marker in required:
        if marker not in specials:
            bad_required.append(f"{marker} is not a special token of this tokenizer (tokenizer_config.json)")
    v.details["markers_checked"] = sorted(seen)
    v.details["markers_required"] = required
    _report_markers(required, bad_required, bad_other, v)


def _marker_problem(marker: str, rec: dict[str, Any], want: int | None) -> str | None:
    """What is wrong with one marker as the probe saw it (``want``: its id in tokenizer_config.json, None where it
    is not a special token there), or None: it must encode to that one id (or to one token), and decode back."""
    ids, plain = rec.get("ids"), rec.get("ids_plain")
    if rec.get("encode_error") or rec.get("lookup_error"):
        return (rec.get("encode_error") or rec.get("lookup_error"))["message"]
    if want is not None and (ids != [want] or (plain is not None and plain != [want])):
        return f"encodes to {ids if ids != [want] else plain}, tokenizer_config.json says [{want}]"
    if want is None and (not ids or len(ids) != 1):
        return f"is not one token (encodes to {ids})"
    if rec.get("decoded") != marker:
        return f"decodes to {rec.get('decoded')!r}"
    return None


def _report_markers(required: dict[str, Any], bad_required: list[str], bad_other: list[str], v: Findings) -> None:
    """The wrong markers as findings, the first three of each kind shown."""
    if bad_required:
        parsers = sorted({p for m in required for p in required[m]})
        problem(v, "markers",
            f"{len(bad_required)} marker(s) the server's parsers ({', '.join(parsers)}) rely on are wrong: "
            + "; ".join(bad_required[:3]) + (" ..." if len(bad_required) > 3 else ""),
            "The tokenizer files and the remote code must be the model's, with a transformers that loads them "
            "as the model's class.")
    if bad_other:
        warning(v, "other_specials", f"{len(bad_other)} other special token(s) do not round-trip: "
                                  + "; ".join(bad_other[:3]) + (" ..." if len(bad_other) > 3 else ""))


def _judge_template(probe: dict[str, Any], v: Findings) -> None:
    tmpl = probe.get("chat_template") or {}
    v.details["chat_template"] = {k: tmpl.get(k) for k in ("present", "with_tools", "chars", "tokens", "round_trip")}
    if not tmpl.get("present"):
        problem(v, "no_chat_template", "the loaded tokenizer has no chat template: /v1/chat/completions fails",
                                  "Download chat_template.jinja (or tokenizer_config.json with chat_template).")
        return
    if tmpl.get("error"):
        err = tmpl["error"]
        problem(v, "chat_template_fails", f"the chat template does not render: {err['type']}: {err['message']}",
                                  "Re-download the chat template from the model's repository.")
        return
    if not tmpl.get("has_user_text"):
        problem(v, "chat_template_no_user", "the rendered chat template does not contain the user's message")
    if tmpl.get("mentions_tools") and not tmpl.get("has_tool"):
        why = tmpl.get("tools_error", {}).get("message") if tmpl.get("tools_error") else "the tool is not in the prompt"
        warning(v, "tools_dropped", f"the chat template names tools but a request with a tool renders without it: "
                f"{why}")
    if tmpl.get("round_trip") is False:
        warning(v, "no_round_trip", "the rendered prompt does not decode back to the same text")
