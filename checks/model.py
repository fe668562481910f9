"""Model checks: shards, config, tokenizer, drafter, fit, and the deep sha256 tier.

Everything here is a pure function of the facts ``model``, ``model.tensors``, ``drafter``,
``model.hashes`` and ``nvml`` (doctor/model/facts.py, doctor/gpu/facts.py).
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from doctor.core.context import Context
from doctor.core.registry import check
from doctor.core.result import Remediation, Result
from doctor.core.settings import ConfigError
from doctor.facts.store import FactUnavailable, MalformedFact
from doctor.host.access import access_fix, describe
from doctor.model import memory
from doctor.model.drafter import DraftFinding, judge_pairing, same_directory
from doctor.model.layout import redownload_argv
from doctor.model.modelconfig import ConfigView, is_pos_int, json_data, json_object, read_config
from doctor.model.remote_code import download_command, named_module_problems
from doctor.model.tokenizer import TokenizerVerdict, judge_files, judge_load
from doctor.service.launcher import build_server_args

NO_MODEL_PATH = "no model path: pass --model-path or set [model] path"
NO_DRAFT_PATH = "no draft model path: pass --draft-model-path or set [drafter] path"
GIB = 1024 ** 3
LEFTOVER_WHAT = {"aria2": "aria2 control file: that download did not finish",
                 "incomplete": "partial huggingface_hub download", "part": "partial download",
                 "partial": "partial download"}


# -- shared -----------------------------------------------------------------------------------------

def drafter_required(ctx: Context) -> bool:
    """The profile's server drafts (DFLASH, DDTREE, ...): a draft model is then a required input."""
    return bool(ctx.expect("server.speculative_algorithm"))


def _dir_problem(ctx: Context, fact: dict[str, Any], what: str, cause: str | None = None) -> Result | None:
    """The result for a directory fact that cannot be judged further, else None.

    A required directory that is not given, or that cannot be read, fails (an empty or missing input
    is never a pass). Checks other than the one that judges the directory itself (model.shards for the
    target) name that one as their ``cause``, so the report says it once."""
    path = fact.get("path")
    flag = "--model-path" if what == "model" else "--draft-model-path"
    if not fact.get("given"):
        if what == "drafter" and not drafter_required(ctx):
            return Result.skipped(f"profile {ctx.settings.profile_name} uses no draft model")
        res = Result.failed(NO_MODEL_PATH if what == "model" else NO_DRAFT_PATH,
                            Remediation(f"Give {flag} DIR, or set it once in the config ([{what}] path = \"DIR\")."))
    elif fact.get("error"):
        access = fact.get("access")
        if access and "permission" in str(fact["error"]):
            res = Result.failed(f"{what} path {path} {fact['error']}: {describe(access)}",
                                access_fix([access], "read", fact.get("user")), path=path, access=access)
        else:
            res = Result.failed(f"{what} path {path} {fact['error']}",
                                Remediation(f"Point {flag} at the downloaded model directory.",
                                            [shlex.join(["ls", "-la", str(path)])]), path=path)
    else:
        return None
    res.cause = cause
    return res


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 1024 ** 2:.1f} MiB"


def _redownload_commands(ctx: Context, fact: dict[str, Any], files: list[str], repo_key: str) -> list[str]:
    repo = ctx.expect(repo_key)
    path = fact.get("path") or "MODEL_DIR"
    if not files:
        return []
    if not repo:
        return [f"# set [{repo_key.split('.')[0]}] repo in the config to get the exact download command"]
    argv, note = redownload_argv(str(repo), str(path), files)
    return [shlex.join(argv)] + ([f"# {note}"] if note else [])


DEEP_CHECKS = {"model": ("model.shards.deep", "--model-path"), "drafter": ("model.drafter.deep", "--draft-model-path")}
MANIFEST_FILE = "k26-doctor.manifest.json"


def deep_command(what: str, path: Any) -> str:
    """The command that hashes this directory's shards: the deep check of *this* directory, with its own flag."""
    check_id, flag = DEEP_CHECKS[what]
    return shlex.join(["k26-doctor", "check", "--deep", "--only", check_id, flag, str(path)])


def has_reference(fact: dict[str, Any], shard: dict[str, Any]) -> bool:
    """Whether a published sha256 for ``shard`` is recorded here (what the deep check compares with): a
    k26-doctor manifest, huggingface_hub's local-dir metadata (an LFS etag), or an HF cache blob name."""
    if MANIFEST_FILE in ((fact.get("files") or {}).get("entries") or {}):
        return True
    etag = str((shard.get("hf_metadata") or {}).get("etag") or "")
    return bool(shard.get("blob_sha256") or (len(etag) == 64 and all(c in "0123456789abcdef" for c in etag)))


def settle_commands(ctx: Context, fact: dict[str, Any], what: str, names: list[str]) -> list[str]:
    """What settles shards that have no published digest recorded: ``hf download`` into the same directory
    hashes the files already there against the Hub's sha256, records it and fetches only what differs;
    then the deep check; a manifest only for a download verified another way."""
    path = str(fact.get("path") or "MODEL_DIR")
    repo = ctx.expect(f"{what}.repo")
    cmds = []
    if repo:
        cmds.append(shlex.join(["hf", "download", str(repo), *names, "--local-dir", path]))
    else:
        cmds.append(f"# set [{what}] repo in the config: `hf download REPO FILES --local-dir DIR` then records "
                    "the published sha256")
    cmds.append(deep_command(what, path))
    cmds.append(shlex.join(["k26-doctor", "manifest", "write", path]) + "    # only for a download verified "
                "another way")
    return cmds


def judge_weights(ctx: Context, fact: dict[str, Any], what: str, repo_key: str) -> Result:
    """model.shards and the shard part of model.drafter: one verdict over the ``weights`` of a dir fact.

    Every fix fits its cause: damaged files are downloaded again; files the service's user cannot read
    need a chmod/chown (named with owner and mode), never a download; sparse files are hashed by the
    deep check of the same directory (under ``--deep`` that check judges them, so no warning here)."""
    w = fact.get("weights") or {}
    path = fact.get("path")
    totals = w.get("totals") or {}
    bad = sorted((s for s in w.get("shards", []) if not s.get("ok")), key=lambda s: s["name"])
    denied = [s for s in bad if s.get("problems") and all(p.get("code") == "permission" for p in s["problems"])]
    damaged = [s for s in bad if s not in denied]
    general = list(w.get("problems") or [])
    leftovers = list(w.get("leftovers") or [])
    lines: list[str] = [p["message"] for p in general]
    shard_lines = [f"{s['name']}: " + "; ".join(p["message"] for p in s.get("problems") or [{"message": "invalid"}])
                   + (f" ({describe(s['access'])})" if s in denied and s.get("access") else "") for s in bad]
    # no index: the files found stand in for the shards, and what is wrong with them is said first
    lines = shard_lines + lines if w.get("layout") == "none" else lines + shard_lines
    for lo in leftovers:
        lines.append(f"{lo['path']}: {LEFTOVER_WHAT.get(lo['kind'], 'download leftover')}")
    details: dict[str, Any] = {
        "path": path, "layout": w.get("layout"), "hf_cache": w.get("hf_cache"), "totals": totals,
        "bad_shards": [{"name": s["name"], "problems": s.get("problems")} for s in bad],
        "problems": general, "leftovers": leftovers,
    }
    if denied:
        details["unreadable"] = [{"name": s["name"], "access": s.get("access")} for s in denied]
    if w.get("stray_safetensors"):
        details["stray_safetensors"] = w["stray_safetensors"]
    sparse_shards = [s for s in w.get("shards", []) if s.get("ok") and _is_sparse(s)]
    sparse = sorted(s["name"] for s in sparse_shards)
    if sparse:
        details["sparse_shards"] = sparse
    deep_id = DEEP_CHECKS[what][0]
    if not lines and sparse and ctx.deep and deep_id in ctx.selected:
        details["sparse_judged_by"] = deep_id
    elif not lines and sparse:
        shown = ", ".join(sparse[:3]) + ("..." if len(sparse) > 3 else "")
        head = (f"{len(sparse)} shard(s) are sparse files (holes where data should be): {shown}; an interrupted "
                "aria2/segmented download leaves holes")
        if all(has_reference(fact, s) for s in sparse_shards):
            rem = Remediation("Hash them against the published sha256 recorded here:", [deep_command(what, path)])
        else:
            rem = Remediation("No published sha256 is recorded here to hash them against (no manifest, no "
                              "huggingface_hub metadata). `hf download` into the same directory hashes the files "
                              "already there against the Hub's sha256, records it, and fetches only what differs:",
                              settle_commands(ctx, fact, what, sparse))
        return Result.warned(head, rem, **details)
    if not lines:
        n = totals.get("shards", 0)
        note = f"; {len(sparse)} sparse, hashed by {deep_id}" if sparse else ""
        return Result.passed(f"{n} shard{'s' if n != 1 else ''}, {totals.get('tensors', 0):,} tensors, "
                             f"{_fmt_bytes(totals.get('data_bytes'))}: headers valid"
                             + (", index consistent" if w.get("layout") == "index" else "")
                             + ", no partial downloads" + note, **details)
    redo = sorted({s["name"] for s in damaged} | {lo["for"] for lo in leftovers if lo.get("for")})
    codes = {p.get("code") for p in general}
    if codes & {"index_missing", "index_invalid", "index_dangling"} or (general and w.get("layout") == "index"):
        redo = ["model.safetensors.index.json", *redo]  # the index is wrong (names a path outside, unreadable...)
    details["redownload"] = redo
    first = lines[0]
    more = f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""
    reader = (fact.get("user") or {}).get("user") or "this user"
    n_shards = totals.get("shards", 0)
    head = ""
    if damaged:
        head = f"{len(damaged)} of {n_shards} shards damaged" + (f", {len(denied)} unreadable by {reader}"
                                                                   if denied else "") + ": "
    elif denied:
        head = f"{len(denied)} of {n_shards} shards unreadable by {reader}: "
    text = ("Re-download the damaged files (never mix revisions). `k26-doctor fix` plans it; by hand:"
            if redo else "Move the download leftovers named above out of the model directory (`k26-doctor fix` "
            "plans it)." if leftovers else "")
    commands = _redownload_commands(ctx, fact, redo, repo_key)
    if denied:
        access = access_fix([s["access"] for s in denied if s.get("access")] or [{"path": str(path), "is_dir": True}],
                            "read", fact.get("user"))
        text = (text + " " if text else "") + access.text
        commands += access.commands
    return Result.failed(head + first + more, Remediation(text, commands), **details)


SPARSE_MIN_BYTES = 64 * 1024 ** 2


def _is_sparse(shard: dict[str, Any]) -> bool:
    """Far fewer bytes allocated than the file's size: unwritten holes (weights compress poorly, so even
    compressing filesystems allocate most of a real shard)."""
    size, alloc = shard.get("size"), shard.get("allocated")
    return bool(size and alloc is not None and size >= SPARSE_MIN_BYTES and alloc < size // 2)


def _optional(ctx: Context, name: str) -> Any:
    """The fact, or None when it is not there; a malformed one still fails the check (one rule, every area)."""
    try:
        return ctx.fact(name)
    except MalformedFact:
        raise
    except FactUnavailable:
        return None


# -- model.shards ---------------------------------------------------------------------------------

@check("model.shards", "Model shards: index, headers, completeness, no partial downloads", needs=("model",),
       fixer="model.redownload", timeout=120)
def model_shards(ctx: Context) -> Result:
    """Reads model.safetensors.index.json (or model.safetensors) and the header of every shard it names,
    never the data: header length within safetensors' 100 MB limit, UTF-8 JSON, known dtypes, offsets
    contiguous from 0 with no holes or overlaps, bytes = dtype size x shape, file size = 8 + header + data;
    every indexed tensor in the shard the index names, none in two shards, metadata.total_size agreeing.
    Leftovers of interrupted downloads fail it (<shard>.aria2, *.incomplete, also under
    .cache/huggingface/download and the HF cache's blobs/); Git LFS pointer files and dangling symlinks
    are named. Index paths must stay inside the model directory.

    Why: a wrong or partial shard costs a failed start many minutes later (weights load) or garbage output.
    Fix by hand: re-download the named files, e.g. `hf download REPO FILES --local-dir DIR --force-download`,
    or resume them with aria2 (`k26-doctor fix` writes the input file); then run `--deep` to hash them."""
    fact = ctx.fact("model")
    early = _dir_problem(ctx, fact, "model")
    if early is not None:
        return early
    return judge_weights(ctx, fact, "model", "model.repo")


# -- deep tier ------------------------------------------------------------------------------------

def judge_hashes(ctx: Context, which: str) -> Result:
    facts = ctx.fact("model.hashes")
    if isinstance(facts, dict) and facts.get("collected") is False:
        return Result.skipped(f"shards {facts.get('reason', 'not hashed')}: run with --deep")
    fact = (facts or {}).get(which) or {"given": False}
    if not fact.get("given"):
        if which == "drafter" and not drafter_required(ctx):
            return Result.skipped(f"profile {ctx.settings.profile_name} uses no draft model")
        return Result.failed(NO_MODEL_PATH if which == "model" else NO_DRAFT_PATH)
    if fact.get("error"):
        return Result.failed(f"{which} path {fact.get('path')} {fact['error']}")
    files = fact.get("files") or []
    if not files:
        return Result.failed(f"no shards to hash in {fact.get('path')}: {fact.get('problem') or 'no index'}")
    by = {v: [f for f in files if f.get("verdict") == v] for v in ("match", "mismatch", "no_reference",
                                                                     "missing", "error")}
    rate = fact.get("rate_bytes_s")
    details = {"path": fact.get("path"), "counts": {k: len(v) for k, v in by.items()},
               "mismatch": [{"name": f["name"], "sha256": f.get("sha256"), "expected": f.get("expected")}
                            for f in by["mismatch"]],
               "missing": [f["name"] for f in by["missing"]],
               "errors": [{"name": f["name"], "error": f.get("error")} for f in by["error"]],
               "unverified": [f["name"] for f in by["no_reference"]],
               "bytes_hashed": fact.get("bytes_hashed"), "seconds": fact.get("seconds"), "rate_bytes_s": rate,
               "cache": fact.get("cache"), "manifest": fact.get("manifest")}
    bad = by["mismatch"] + by["missing"] + by["error"]
    if bad:
        names = [f["name"] for f in bad]
        parts = []
        if by["mismatch"]:
            srcs = sorted({(f.get("expected") or {}).get("source", "?") for f in by["mismatch"]})
            shown = ", ".join(f["name"] for f in by["mismatch"][:5]) + ("..." if len(by["mismatch"]) > 5 else "")
            parts.append(f"{len(by['mismatch'])} sha256 mismatch ({', '.join(srcs)}): {shown}")
        if by["missing"]:
            parts.append(f"{len(by['missing'])} missing: " + ", ".join(details["missing"][:5]))
        if by["error"]:
            parts.append(f"{len(by['error'])} unreadable: " + ", ".join(f["name"] for f in by["error"][:5]))
        repo_key = "model.repo" if which == "model" else "drafter.repo"
        return Result.failed("; ".join(parts),
                             Remediation("These files are not what was published: re-download them.",
                                         _redownload_commands(ctx, fact, names, repo_key)), **details)
    hashed = _fmt_bytes(fact.get("bytes_hashed"))
    speed = f" at {rate / GIB:.2f} GiB/s" if rate else ""
    cached = (fact.get("cache") or {}).get("hits") or 0
    tail = f" ({hashed} hashed{speed}, {cached} from the verification cache)"
    settle = Remediation(
        "What settles it is a published sha256: `hf download` into the same directory hashes the files already "
        "there against the Hub's sha256, records it (.cache/huggingface) and fetches only what differs; then "
        "run this check again. Without network: a manifest written where the download verified "
        "(`k26-doctor manifest write DIR` there, copied here).",
        settle_commands(ctx, fact, which, details["unverified"] if len(details["unverified"]) <= 8 else []))
    if by["no_reference"] and not by["match"]:
        return Result.not_judged(f"{len(files)} files hashed but nothing to compare with: no k26-doctor manifest, "
                                 "no huggingface_hub metadata, not a Hugging Face cache" + tail, settle, **details)
    if by["no_reference"]:
        return Result.warned(f"{len(by['match'])} files match, {len(by['no_reference'])} have no reference "
                             f"digest: {', '.join(details['unverified'][:5])}" + tail, settle, **details)
    return Result.passed(f"all {len(by['match'])} files match their sha256" + tail, **details)


@check("model.shards.deep", "Model shards: sha256 of every shard against manifest / HF metadata",
       needs=("model.hashes",), deep=True, timeout=6 * 3600, fixer="model.redownload")
def model_shards_deep(ctx: Context) -> Result:
    """Hashes every shard (sha256, files in parallel, large blocks) and compares with, in this order: the
    k26-doctor manifest (`k26-doctor manifest write DIR`), huggingface_hub's local-dir metadata
    (.cache/huggingface/download/<file>.metadata, whose etag is the LFS sha256), the Hugging Face cache's
    blob names. A verification cache keyed by (device, inode, size, mtime_ns, ctime_ns) outside the model
    directory (/var/tmp/k26-doctor-<uid>, a temporary directory kept across reboots) means a restart
    re-hashes only what changed; --no-verify-cache (or K26_DOCTOR_NO_VERIFY_CACHE=1) ignores it.

    Why: headers can be intact while the data is not (an aria2 download with holes, a bit flip, a mixed
    revision). Fix by hand: re-download the mismatching files."""
    return judge_hashes(ctx, "model")


@check("model.drafter.deep", "Draft model: sha256 of every shard", needs=("model.hashes",), deep=True,
       timeout=3600, fixer="model.redownload")
def model_drafter_deep(ctx: Context) -> Result:
    """As model.shards.deep, for the draft model directory."""
    return judge_hashes(ctx, "drafter")


# -- model.config ---------------------------------------------------------------------------------

def _config_view(fact: dict[str, Any]) -> tuple[ConfigView | None, str | None]:
    cfg = fact.get("config") or {}
    if not cfg.get("present"):
        return None, "config.json is missing"
    if cfg.get("error"):
        return None, cfg["error"]
    return read_config(json_data(cfg)), None


def _expert_shape_problems(view: ConfigView, summary: dict[str, Any]) -> list[str]:
    """int4 pack-quantized experts: packed I32 [out, in/8], scales [out, in/group_size]."""
    out: list[str] = []
    q = view.quant or {}
    h, m = view.int_field("hidden_size"), view.int_field("moe_intermediate_size")
    pats = summary.get("patterns") or {}
    packed = {p: v for p, v in pats.items() if p.endswith(".weight_packed") and ".experts.#." in p}
    if q.get("kind") != "int4-group":
        if packed:
            out.append(f"the shards hold int4 packed expert weights ({len(packed)} patterns) but config.json "
                       "has no compressed-tensors int4 quantization_config")
        return out
    if not packed:
        if any(".experts.#." in p for p in pats):
            out.append("config.json says int4 pack-quantized, but the expert weights in the shards are not packed "
                       "(no *.weight_packed)")
        return out
    gs = q["group_size"]
    if not (h and m):
        return out
    dims = {"gate_proj": (m, h), "up_proj": (m, h), "down_proj": (h, m), "w1": (m, h), "w3": (m, h), "w2": (h, m)}
    for pat, v in packed.items():
        proj = pat.rsplit(".", 2)[-2]
        if proj not in dims:
            continue
        o, i = dims[proj]
        want_p = f"I32{[o, i // 8]}"
        got = list(v["shapes"])
        if got != [want_p]:
            out.append(f"{pat}: shards hold {', '.join(got)}, config (hidden {h}, moe_intermediate {m}, int4) "
                       f"implies {want_p}")
        spat = pat[: -len("weight_packed")] + "weight_scale"
        sv = pats.get(spat)
        if sv is None:
            out.append(f"{spat} is missing from the shards (int4 needs scales)")
            continue
        want_s = [o, i // gs]
        gots = [s for s in sv["shapes"] if not s.endswith(str(want_s))]
        if gots:
            implied = ""
            try:
                shape = [int(x) for x in gots[0].split("[", 1)[1].rstrip("]").split(",")]
                if len(shape) == 2 and shape[1]:
                    implied = f" (group size {i // shape[1]} in the shards)"
            except ValueError:
                pass
            out.append(f"{spat}: shards hold {', '.join(gots)}, config group_size {gs} implies {want_s}{implied}")
    return out


def _layer_problems(view: ConfigView, summary: dict[str, Any]) -> list[str]:
    out: list[str] = []
    n_layers = view.int_field("num_hidden_layers")
    layers = summary.get("layers") or []
    if not n_layers or not layers:
        return out
    nextn = view.text.get("num_nextn_predict_layers") if type(view.text.get("num_nextn_predict_layers")) is int else 0
    have = set(layers)
    missing = sorted(set(range(n_layers)) - have)
    extra = sorted(x for x in have if x >= n_layers + nextn)
    if missing:
        out.append(f"config has num_hidden_layers={n_layers} but the shards lack layer(s) {_ranges(missing)}")
    if extra:
        out.append(f"config has num_hidden_layers={n_layers} but the shards hold layer(s) {_ranges(extra)}")
    n_exp = view.int_field("n_routed_experts")
    per = summary.get("experts_per_layer") or {}
    if n_exp and per:
        wrong = {int(k): v for k, v in per.items() if v != n_exp and int(k) < n_layers}
        if wrong:
            ex = ", ".join(f"layer {k}: {v}" for k, v in sorted(wrong.items())[:4])
            out.append(f"config has n_routed_experts={n_exp}; the shards differ: {ex}"
                       + (" ..." if len(wrong) > 4 else ""))
        first_dense = view.text.get("first_k_dense_replace", 0)
        first_dense = first_dense if type(first_dense) is int else 0
        freq = view.text.get("moe_layer_freq", 1)
        freq = freq if type(freq) is int and freq > 0 else 1
        want_moe = {i for i in range(first_dense, n_layers) if (i - first_dense) % freq == 0}
        lacking = sorted(want_moe - {int(k) for k in per})
        if lacking and len(lacking) < len(want_moe):
            out.append(f"MoE layer(s) {_ranges(lacking)} have no experts in the shards")
    return out


def _ranges(nums: list[int]) -> str:
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


def working_tp_sizes(ctx: Context, view: ConfigView) -> list[int]:
    """TP sizes (up to 64) that divide this model under the profile's EP: heads, experts, int4 groups."""
    return sorted(t for t in TP_CANDIDATES if not _tp_problems(ctx, view, t))


def _tp_problems(ctx: Context, view: ConfigView, tp: int | None = None) -> list[str]:
    out: list[str] = []
    tp = ctx.settings.tp if tp is None else tp
    ep = ctx.expect("parallel.ep", 1)
    ep = ep if type(ep) is int and ep > 0 else 1
    heads = view.int_field("num_attention_heads")
    if heads and heads % tp:
        out.append(f"num_attention_heads={heads} is not divisible by TP {tp}")
    n_exp = view.int_field("n_routed_experts")
    if ep > 1:
        if tp % ep:
            out.append(f"TP {tp} is not a multiple of EP {ep}")
        if n_exp and n_exp % ep:
            out.append(f"n_routed_experts={n_exp} is not divisible by EP {ep}")
    moe_tp = max(1, tp // ep)
    m = view.int_field("moe_intermediate_size")
    if m and moe_tp > 1:
        if m % moe_tp:
            out.append(f"moe_intermediate_size={m} is not divisible by the MoE TP size {moe_tp}")
        elif (view.quant or {}).get("kind") == "int4-group":
            per = m // moe_tp
            gs = view.quant["group_size"]  # type: ignore[index]
            if per % gs or per % 8:
                out.append(f"moe_intermediate_size {m} / MoE TP {moe_tp} = {per} per rank is not a multiple of "
                           f"the int4 group size {gs} (and of 8 packed values)")
    return out


def _profile_problems(ctx: Context, view: ConfigView) -> list[str]:
    out: list[str] = []
    mt = ctx.expect("model.model_type")
    if mt and view.model_type != mt:
        out.append(f"model_type is {view.model_type!r}, the profile expects {mt!r}")
    archs = ctx.expect("model.architectures")
    if archs and view.architectures and not set(archs) & set(view.architectures):
        out.append(f"architectures {view.architectures} are not the profile's {archs}")
    for key in ("num_hidden_layers", "n_routed_experts", "hidden_size", "vocab_size"):
        want = ctx.expect(f"model.{key}")
        got = view.text.get(key)
        if want is not None and got is not None and got != want:
            out.append(f"{key} is {got}, the profile expects {want}")
    quant = ctx.expect("model.quantization")
    got_q = (view.quant or {}).get("method")
    if quant and got_q != quant:
        out.append(f"quantization is {got_q or 'none'}, the profile expects {quant}")
    return out


@check("model.config", "Model config.json: valid, supported, consistent with the shards and TP",
       needs=("model", "model.tensors"), timeout=120)
def model_config(ctx: Context) -> Result:
    """Parses config.json as the server will: the kimi_k25 family (KimiK25ForConditionalGeneration) with a
    DeepSeek-V3-like text_config (model_type kimi_k2 or deepseek_v3), plain deepseek_v3, or a generic
    model. Checks field types, the quantization (compressed-tensors pack-quantized int4 with group strategy,
    under text_config or at the top level), that the config agrees with the shards (packed I32 expert
    weights [out, in/8], scales [out, in/group_size], experts per MoE layer = n_routed_experts, layers in
    the shards = num_hidden_layers), TP divisibility (attention heads; experts under EP; int4 groups per
    rank), the profile's expectations (e.g. 61 layers, 384 experts), and that every remote-code file that
    auto_map names (config.json and tokenizer_config.json), and every file those import relatively, is there.

    Why: a config that disagrees with its weights fails at load after minutes, or loads and produces
    garbage; a missing remote-code file fails the import after the weights loaded. Fix by hand: re-download
    config.json from the same revision as the shards; `hf download REPO --include FILE --local-dir DIR` for
    a missing remote-code file."""
    fact = ctx.fact("model")
    early = _dir_problem(ctx, fact, "model", cause="model.shards")
    if early is not None:
        return early
    view, err = _config_view(fact)
    if view is None:
        return Result.failed(f"{err} in {fact.get('path')}",
                             Remediation("Re-download config.json from the same revision as the shards.",
                                         _redownload_commands(ctx, fact, ["config.json"], "model.repo")))
    problems = list(view.problems)
    warnings = list(view.notes)
    q = view.quant
    if q is not None and q.get("problem"):
        problems.append(q["problem"])
    elif q is not None and q.get("kind") in ("other", "compressed-tensors-other"):
        warnings.append(f"quantization {q.get('method')} ({q.get('format')}) is not one the doctor checks "
                        "against the shards")
    tensors = _optional(ctx, "model.tensors")
    summary = (tensors or {}).get("summary")
    consistency_checked = False
    totals = (fact.get("weights") or {}).get("totals") or {}
    unvalidated = (totals.get("shards") or 0) - (totals.get("shards_ok") or 0)
    not_compared = None
    if unvalidated > 0:
        # The summary holds only the shards that validated: judged against it, a damaged shard would look
        # like missing layers or experts, and the fix would wrongly be a new config.json.
        not_compared = (f"not compared with the shards: {unvalidated} of {totals.get('shards')} shard(s) did not "
                        "validate (see model.shards)")
        summary = None
    if summary and not problems:
        consistency_checked = True
        problems += _layer_problems(view, summary)
        if view.family != "generic":
            problems += _expert_shape_problems(view, summary)
        hs = view.int_field("hidden_size")
        for pat, v in (summary.get("patterns") or {}).items():
            if pat.endswith("embed_tokens.weight") and hs:
                for shp in v["shapes"]:
                    if not shp.endswith(f", {hs}]"):
                        problems.append(f"{pat} is {shp}, config hidden_size is {hs}")
    elif not summary and not not_compared:
        warnings.append("no valid shard headers to compare the config with (see model.shards)")
    tp_problems = _tp_problems(ctx, view)
    profile_problems = _profile_problems(ctx, view)
    remote = fact.get("remote_code") or {}
    code_missing = list(remote.get("missing") or [])
    code_broken = [n for n, f in (remote.get("files") or {}).items() if f.get("error")]
    code_problems: list[str] = []
    for name in code_missing:
        by = (remote.get("files") or {}).get(name, {}).get("needed_by")
        code_problems.append(f"remote-code file {name} " + (f"(imported by {by}) " if by else "named by auto_map ")
                             + "is missing: the server fails to import it after the weights load")
    code_problems += [f"remote-code file {n} {remote['files'][n]['error']}" for n in code_broken]
    config_problems = list(problems)
    problems = config_problems + tp_problems + profile_problems + code_problems
    t = view.text
    desc = (f"{view.model_type}" + (f" (text {view.text_model_type})" if view.text_model_type
                                   and view.text_model_type != view.model_type else "")
            + (f": {t.get('num_hidden_layers')} layers" if "num_hidden_layers" in t else "")
            + (f", {t.get('n_routed_experts')} experts" if "n_routed_experts" in t else "")
            + (f", hidden {t.get('hidden_size')}" if "hidden_size" in t else ""))
    if q and q.get("kind") == "int4-group":
        desc += f", int4 group {q['group_size']}"
    elif q:
        desc += f", {q.get('method')}"
    details = {"family": view.family, "model_type": view.model_type, "text_model_type": view.text_model_type,
               "quantization": q, "quantization_where": view.quant_where, "tp": ctx.settings.tp,
               "problems": problems, "warnings": warnings, "checked_against_shards": consistency_checked}
    if problems:
        texts: list[str] = []
        commands: list[str] = []
        if code_problems:
            texts.append("Download the model's remote code (the revision of the rest of the model).")
            commands.append(download_command(ctx.expect("model.repo"), fact.get("path"), code_missing + code_broken))
        if config_problems:
            texts.append("Use the config.json of the same revision as the shards.")
            commands += _redownload_commands(ctx, fact, ["config.json"], "model.repo")
        if tp_problems:
            sizes = working_tp_sizes(ctx, view)
            details["working_tp_sizes"] = sizes
            want = int(ctx.expect("parallel.tp", 0) or 0)
            pick = want if want in sizes else max((s for s in sizes if s <= ctx.settings.tp), default=None)
            texts.append(f"TP {ctx.settings.tp} does not divide this model; TP sizes that do: "
                         + (", ".join(map(str, sizes)) if sizes else "none up to 64") + ".")
            if pick:
                commands.append(f"k26-doctor check --tp {pick}")
        if profile_problems:
            texts.append(f"This is not the model profile {ctx.settings.profile_name} serves: point --model-path at "
                         "that model, or use a profile made for this one.")
        return Result.failed(f"config.json: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1
                                                               else ""),
                             Remediation(" ".join(texts), commands), **details)
    if not_compared:
        details["not_compared"] = not_compared
        return Result.blocked(f"{desc}; TP {ctx.settings.tp} divides it; {not_compared}", "model.shards", **details)
    if warnings:
        return Result.warned(f"{desc}; {warnings[0]}", None, **details)
    return Result.passed(f"{desc}; consistent with the shards; TP {ctx.settings.tp} divides it", **details)


# -- model.tokenizer ------------------------------------------------------------------------------

def _auto_map_modules(auto_map: Any) -> list[str]:
    refs: list[str] = []
    if isinstance(auto_map, dict):
        for v in auto_map.values():
            for ref in (v if isinstance(v, list) else [v]):
                if isinstance(ref, str) and "." in ref:
                    refs.append(ref)
    return refs


@check("model.tokenizer", "Tokenizer and chat template files the server needs", needs=("model",),
       depends=("python.venv",), timeout=200)
def model_tokenizer(ctx: Context) -> Result:
    """Looks for what the server's tokenizer loads: tokenizer_config.json (valid JSON), the vocabulary
    (tiktoken.model for TikToken tokenizers such as K2.6's, else tokenizer.json / tokenizer.model /
    vocab.json), a chat template (in tokenizer_config.json, chat_template.jinja or chat_template.json), and
    the remote-code modules that auto_map names (config.json and tokenizer_config.json). Says when
    --trust-remote-code is required and fails when the profile turns it off. tiktoken.model is read whole:
    a valid BPE file (base64 token and rank per line, ranks 0..n-1), and n plus the remote code's reserved
    special ids equal to config.json's vocabulary. Then, in the service's interpreter (--python), the
    tokenizer is loaded as SGLang 0.5.23's get_tokenizer does (AutoTokenizer with trust_remote_code; the
    declared class when transformers hands back its generic TokenizersBackend), every special token the
    server's parsers split on (--reasoning-parser / --tool-call-parser kimi_k2: <think>, </think>, the
    tool-call section markers) must be one token with tokenizer_config.json's id and decode back, and the
    chat template must render a request with a tool. The remote code is checked against the installed
    transformers (tokenization_kimi.py's bytes_to_unicode import, gone in transformers 5; releases that
    route kimi_k25 to the generic backend). Without transformers there the load is not judged (skip).

    Why: a missing tokenizer file fails the start after the weights loaded; a missing chat template
    breaks chat completions; a tokenizer that loads with other special-token ids serves reasoning inside
    the answer and unparsed tool calls, with no error anywhere. Fix by hand: download the missing files
    from the model's repository; use the model's current remote code with the transformers SGLang pins.
    A server started with --skip-tokenizer-init loads no tokenizer: then there is nothing to judge (skip)."""
    fact = ctx.fact("model")
    early = _dir_problem(ctx, fact, "model", cause="model.shards")
    if early is not None:
        return early
    try:
        args, _ = build_server_args(ctx.settings, placeholders=True)
    except ConfigError:
        args = []
    if "--skip-tokenizer-init" in args:
        return Result.skipped("the server runs with --skip-tokenizer-init: it loads no tokenizer "
                              "(requests carry input_ids)", server_flag="--skip-tokenizer-init")
    tok = fact.get("tokenizer") or {}
    files = tok.get("files") or {}
    problems: list[str] = []
    notes: list[str] = []
    dangling = [n for n, v in files.items() if isinstance(v, dict) and v.get("dangling")]
    problems += [f"{n} is {'a symlink loop' if files[n].get('loop') else 'a dangling symlink'}" for n in dangling]
    problems += [f"{n} is {v['kind']}, not a regular file" for n, v in files.items() if isinstance(v, dict)
                 and v.get("kind")]
    tc = tok.get("tokenizer_config") or {}
    data, problem = json_object(tc, "tokenizer_config.json")
    if not tc.get("present"):  # tokenizer.json alone is enough
        if "tokenizer.json" not in files:
            problems.append("tokenizer_config.json is missing (and there is no tokenizer.json)")
    elif problem:
        problems.append(problem)
    cls = data.get("tokenizer_class") if isinstance(data.get("tokenizer_class"), str) else ""
    refs = _auto_map_modules(data.get("auto_map"))
    cfg = json_data(fact.get("config"))
    cfg_refs = _auto_map_modules(cfg.get("auto_map")) if isinstance(cfg, dict) else []
    tiktoken = "tiktoken" in cls.lower() or any("tiktoken" in r.lower() or "tokenization_kimi" in r for r in refs)
    if tiktoken:
        if "tiktoken.model" not in files:
            problems.append(f"tokenizer {cls or 'TikToken'} needs tiktoken.model, which is missing")
    elif not any(n in files for n in ("tokenizer.json", "tokenizer.model", "vocab.json")) and data:
        problems.append("no vocabulary file (tokenizer.json, tokenizer.model, vocab.json or tiktoken.model)")
    if "vocab.json" in files and "merges.txt" not in files and "tokenizer.json" not in files:
        problems.append("vocab.json without merges.txt (BPE needs both)")
    has_template = bool(tc.get("chat_template")) or "chat_template.jinja" in files or "chat_template.json" in files
    if not has_template and data:
        problems.append("no chat template (chat_template in tokenizer_config.json, chat_template.jinja or "
                        "chat_template.json): chat completions will fail")
    remote = refs + cfg_refs
    notes += [f"auto_map {ref} loads code from another repository at start (needs network)" for ref in remote
              if "--" in ref]
    module_problems, missing_mods = named_module_problems(fact.get("remote_code") or {})
    problems += module_problems
    trc = ctx.expect("model.trust_remote_code")
    needs_trc = bool(remote)
    if needs_trc and trc is False:
        problems.append("auto_map means the server needs --trust-remote-code, but the profile sets "
                        "model.trust_remote_code = false")
    details: dict[str, Any] = {"tokenizer_class": cls or None, "files": files, "auto_map": remote,
                               "trust_remote_code_required": needs_trc, "chat_template": has_template, "notes": notes}
    load = _tokenizer_load(ctx, fact)
    details.update(load.details, loaded_as=load.loaded_as)
    commands = _redownload_commands(ctx, fact, sorted(set(missing_mods)), "model.repo")
    fix = "Download the missing tokenizer files from the model's repository."
    if load.problems and not problems:
        fix = load.problems[0].fix or fix
    problems += [f.message for f in load.problems]
    commands += [c for f in load.problems for c in f.commands if c not in commands]
    if problems:
        return Result.failed(f"tokenizer: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1
                                                             else ""),
                             Remediation(fix, commands), problems=problems, **details)
    summary = (f"{cls or 'tokenizer'}: " + ("tiktoken.model, " if tiktoken else "") + "chat template present"
               + ("; needs --trust-remote-code" + (" (profile sets it)" if trc else "") if needs_trc else ""))
    if load.probe_error:
        return Result.errored(f"{summary}; {load.probe_error}")
    if load.not_judged:
        return Result.not_judged(f"{summary}; {load.not_judged}", **details)
    summary += (f"; loads as {load.loaded_as} (transformers {load.details.get('transformers')}), "
                f"{len(load.details.get('markers_checked') or [])} special tokens round-trip, chat template renders")
    notes += [f.message for f in load.warnings]
    if needs_trc and trc is None:
        return Result.warned(summary + "; the profile does not say whether trust_remote_code is on",
                             "Set [model] trust_remote_code = true and pass --trust-remote-code.", **details)
    if notes:
        rem = next((f.fix for f in load.warnings if f.fix), None)
        return Result.warned(f"{summary}; {notes[0]}", rem, **details)
    return Result.passed(summary, **details)


def _tokenizer_load(ctx: Context, fact: dict[str, Any]) -> TokenizerVerdict:
    """The tokenizer loaded in the service's interpreter (fact ``model.tokenizer``), judged with the files."""
    tok = _optional(ctx, "model.tokenizer")
    if not isinstance(tok, dict) or not tok.get("given"):
        return TokenizerVerdict(not_judged="the tokenizer load was not collected (fact model.tokenizer)")
    view, _ = _config_view(fact)
    verdict = judge_files(tok, view.int_field("vocab_size") if view else None, ctx.expect("model.repo"),
                          named_reported=True)
    return judge_load(tok, view.model_type if view else None, ctx.expect("model.repo"), verdict)


# -- model.drafter --------------------------------------------------------------------------------

@check("model.drafter", "Draft model (DFlash): config, shards, consistency with the target",
       needs=("drafter", "model"), fixer="model.redownload", timeout=120)
def model_drafter(ctx: Context) -> Result:
    """The DFlash draft model: config.json valid (block_size >= 1; target_layer_ids integers within the
    target's layers and as many as the drafter's fc takes; mask_token_id inside the vocabulary; hidden size
    and vocabulary equal to the target's; the profile's architectures, and ones SGLang runs under the
    profile's --speculative-algorithm: no EAGLE3 drafter under DDTREE), its shards valid by the same validator
    as the target's (model.shards), not the target's own directory; under DDTREE the drafter's block against
    --speculative-ddtree-budget (budget >= block - 1) and --attention-backend triton; the attention backend
    the DFlash draft will get (not an MLA-only one, which SGLang silently replaces).

    Why: SGLang rejects an inconsistent drafter only after the target loaded (minutes), or runs it on another
    backend than asked. Fix by hand: use the drafter trained for this target, downloaded whole, at its own
    path; the flags the result names."""
    fact = ctx.fact("drafter")
    early = _dir_problem(ctx, fact, "drafter")
    if early is not None:
        return early
    if same_directory(fact, _optional(ctx, "model") or {}):
        repo = ctx.expect("drafter.repo") or "<drafter repo>"
        return Result.failed(f"the draft model path {fact.get('path')} is the target model's directory: the server "
                             "would load the target itself as its drafter",
                             Remediation("Point --draft-model-path ([drafter] path) at the drafter's own directory; "
                                         "download it if it is not there:",
                                         [shlex.join(["hf", "download", str(repo), "--local-dir", "<drafter dir>"])]),
                             path=fact.get("path"), realpath=fact.get("realpath"))
    weights = judge_weights(ctx, fact, "drafter", "drafter.repo")
    problems: list[str] = []
    d, problem = json_object(fact.get("config"), "config.json")
    if problem:
        problems.append(problem)
    target = _optional(ctx, "model") or {}
    tview = None
    if target.get("given") and not target.get("error"):
        tview, _ = _config_view(target)
    dfl = d.get("dflash_config") if isinstance(d.get("dflash_config"), dict) else {}

    def get(key: str) -> Any:
        return dfl.get(key, d.get(key))

    details: dict[str, Any] = {"path": fact.get("path"), "weights": weights.details}
    if d:
        archs = d.get("architectures")
        want_archs = ctx.expect("drafter.architectures")
        if want_archs and (not isinstance(archs, list) or not set(want_archs) & set(archs)):
            problems.append(f"architectures {archs!r} are not the profile's {want_archs}")
        bs = get("block_size")
        if bs is not None and not is_pos_int(bs):
            problems.append(f"block_size is {bs!r}; it must be an integer >= 1")
        nl = d.get("num_hidden_layers")
        if nl is not None and not is_pos_int(nl):
            problems.append(f"num_hidden_layers is {nl!r}, not a positive integer")
        t_layers = tview.int_field("num_hidden_layers") if tview else None
        t_hidden = tview.int_field("hidden_size") if tview else None
        t_vocab = tview.int_field("vocab_size") if tview else None
        ids = get("target_layer_ids")
        if ids is not None:
            if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
                problems.append(f"target_layer_ids is {ids!r}, not a non-empty list of integers")
            elif t_layers:
                out = [i for i in ids if i < 0 or i >= t_layers]
                if out:
                    problems.append(f"target_layer_ids {out} are outside the target's {t_layers} layers "
                                    f"(0..{t_layers - 1})")
        vocab = d.get("vocab_size")
        mtid = get("mask_token_id")
        if mtid is not None:
            limit = t_vocab or (vocab if is_pos_int(vocab) else None)
            if type(mtid) is not int or mtid < 0:
                problems.append(f"mask_token_id is {mtid!r}, not a non-negative integer")
            elif limit and mtid >= limit:
                problems.append(f"mask_token_id {mtid} is outside the vocabulary ({limit} tokens)")
        hs = d.get("hidden_size")
        if t_hidden and hs != t_hidden:
            problems.append(f"hidden_size is {hs!r}, the target's is {t_hidden}")
        if t_vocab and vocab is not None and vocab != t_vocab:
            problems.append(f"vocab_size is {vocab!r}, the target's is {t_vocab}")
        details.update(block_size=bs, target_layer_ids=ids, mask_token_id=mtid, hidden_size=hs, vocab_size=vocab,
                       target_checked=tview is not None)
    pairing = _pairing(ctx, d, tview, fact) if d else []
    problems += [f.message for f in pairing if f.severity == "fail"]
    warnings = [f.message for f in pairing if f.severity == "warn"]
    details.update(problems=problems, warnings=warnings)
    if problems or weights.status.failed:
        first = problems[0] if problems else weights.summary
        n = len(problems) + (1 if weights.status.failed and problems else 0)
        fixes = [f for f in pairing if f.severity == "fail"]
        rem = weights.remediation or (Remediation(fixes[0].fix, [c for f in fixes for c in f.commands])
                                      if fixes and len(fixes) == len(problems) else
                                      Remediation("Use the DFlash drafter trained for this target model."))
        return Result.failed(f"drafter: {first}" + (f" (+{n - 1} more)" if n > 1 else ""), rem, **details)
    if warnings:
        fix = next(f.fix for f in pairing if f.severity == "warn")
        return Result.warned(f"drafter: {warnings[0]}" + (f" (+{len(warnings) - 1} more)" if len(warnings) > 1 else ""),
                             Remediation(fix), **details)
    note = "" if tview is not None else " (target config unavailable: consistency not checked)"
    name = ", ".join(d.get("architectures") or ["drafter"])
    if weights.status.value == "warn":
        return Result.warned(f"{name}: {weights.summary}", weights.remediation, **details)
    summ = weights.summary.split(":")[0]
    if weights.details.get("sparse_judged_by"):
        summ += f" ({len(weights.details['sparse_shards'])} sparse, hashed by {weights.details['sparse_judged_by']})"
    res_cls = Result.passed if tview is not None else Result.warned
    return res_cls(f"{name}: {summ}, config consistent with the target{note}", **details)


def _pairing(ctx: Context, draft: dict[str, Any], tview: ConfigView | None, fact: dict[str, Any]) -> list[DraftFinding]:
    """The drafter against the target's config and the server command (doctor.model.drafter)."""
    try:
        args, _ = build_server_args(ctx.settings, placeholders=True)
    except ConfigError:
        args = []  # sglang.flags names the broken server settings
    budget = ctx.expect("server.ddtree_budget")
    return judge_pairing(draft, target_archs=tview.architectures if tview else [],
                         target_is_mla=bool(tview and tview.int_field("kv_lora_rank")),
                         target_hidden=tview.int_field("hidden_size") if tview else None,
                         draft_tensors=fact.get("tensors"), algorithm=ctx.expect("server.speculative_algorithm"),
                         server_args=args, budget=budget if type(budget) is int else None)


# -- model.fit ------------------------------------------------------------------------------------

def split_bytes(summary: dict[str, Any] | None, total: int) -> tuple[int, int]:
    """(sharded, replicated) bytes of the target under TP (``doctor.model.memory.split_weights``)."""
    w = memory.split_weights((summary or {}).get("patterns"), total, 1)
    return w.sharded, w.replicated


def kv_bytes_per_token(view: ConfigView | None, tp: int, kv_dtype: Any = None) -> int | None:
    """KV cache bytes per token on one GPU (``doctor.model.memory.kv_cell``): MLA caches one latent of
    kv_lora_rank + qk_rope_head_dim per layer on every TP rank; others K and V per KV head, split over TP."""
    g = memory.geometry(view.text) if view is not None else None
    if g is None:
        return None
    return memory.kv_cell(g, tp, 1 if isinstance(kv_dtype, str) and "fp8" in kv_dtype else 2)


def _fraction_given(args: list[str], ctx: Context) -> float | None:
    f = memory.parse_server_args(args).get("mem_fraction")
    if f is None:
        f = ctx.expect("server.mem_fraction_static")
    return float(f) if isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1 else None


def _largest(items: dict[str, int], n: int = 3) -> str:
    top = sorted(items.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in top)


@check("model.fit", "Weights per GPU plus headroom fit in GPU memory: the --mem-fraction-static window",
       needs=("nvml", "model", "model.tensors", "drafter"), timeout=120)
def model_fit(ctx: Context) -> Result:
    """Computes, before a load that takes many minutes, the --mem-fraction-static values that work, as
    SGLang 0.5.23 accounts memory (``doctor/model/memory.py``, constants in
    ``doctor/data/sglang_memory.toml``): SGLang measures the free memory `pre` before loading, puts the
    target's and the drafter's weights (TP-split tensors / TP, plus what every rank keeps whole: MLA's
    down projections, routers, norms, the vision tower; the drafter's fc and norms) and the KV cache in
    `pre x f`, and leaves `pre x (1 - f)` for the rest: the attention backend's CUDA-graph buffers (with
    DDTree the verify width is budget + 1 tokens per request: Triton's graph logits, KV indices and tree
    mask grow with max_bs x (budget + 1) x context), the graphs' logits buffer, prefill activations,
    the request table, NCCL. f_min is where the KV cache holds what the profile asks (one request at the
    full context, or `kv_tokens_per_request` for every running request; MLA: (kv_lora_rank +
    qk_rope_head_dim) x layers x 2 bytes per token, plus the DFlash drafter's cell); f_max is where the
    outside still fits. Fails when no value works or the weights do not fit; warns when the profile's
    value lies outside the window; reports a recommended value (the largest that leaves the outside its
    room, to 0.01).

    Why: "raise or lower --mem-fraction-static?" is the question SGLang answers only after loading (and
    with a large speculative verify width there may be no answer at all). Fix by hand: set
    [server] mem_fraction_static to the recommended value; lower the context length, max running
    requests, the CUDA graphs' max batch size or the DDTree budget; or use more GPUs."""
    try:
        nvml = ctx.fact("nvml")
    except FactUnavailable as exc:
        return Result.not_judged(f"no GPU facts: {exc.reason}")
    if not isinstance(nvml, dict) or not nvml.get("available"):
        why = (nvml or {}).get("error") if isinstance(nvml, dict) else None
        return Result.blocked(f"no GPU facts (NVML unavailable{': ' + why if why else ''})", "gpu.driver")
    devices = [d for d in nvml.get("devices") or [] if isinstance(d, dict) and isinstance(d.get("memory"), dict)]
    if not devices:
        return Result.blocked("NVML reports no GPU memory (no visible GPUs)", "gpu.count")
    fact = ctx.fact("model")
    early = _dir_problem(ctx, fact, "model", cause="model.shards")
    if early is not None:
        return early
    totals = (fact.get("weights") or {}).get("totals") or {}
    total = totals.get("data_bytes") or 0
    if not total or totals.get("shards_ok") != totals.get("shards"):
        return Result.blocked("cannot size the weights: shards are not all valid (see model.shards)", "model.shards")
    c = memory.constants()
    tp = ctx.settings.tp
    world = ctx.settings.world_size
    summary = (_optional(ctx, "model.tensors") or {}).get("summary")
    target_w = memory.split_weights((summary or {}).get("patterns"), total, tp)
    draft = _optional(ctx, "drafter") or {}
    draft_total = ((draft.get("weights") or {}).get("totals") or {}).get("data_bytes") or 0
    draft_w = memory.split_weights((draft.get("tensors") or {}).get("patterns"), draft_total, tp, draft=True)
    weights = target_w.per_gpu + (draft_w.per_gpu if draft_total else 0)
    view, _ = _config_view(fact)
    tgeom = memory.geometry(view.text) if view is not None else None
    dcfg = json_data(draft.get("config")) if draft.get("given") else None
    dgeom = memory.geometry(dcfg) if isinstance(dcfg, dict) else None
    dflash = (dcfg.get("dflash_config") if isinstance(dcfg, dict) else None) or {}
    block = dflash.get("block_size", (dcfg or {}).get("block_size") if isinstance(dcfg, dict) else None)
    try:
        args = build_server_args(ctx.settings, placeholders=True)[0]
        args_note = None
    except ConfigError as exc:
        args, args_note = [], f"server arguments unreadable ({exc}): SGLang's defaults assumed"
    used = devices[:world]
    rows = []
    overhead = memory.runtime_overhead(tp, int(ctx.expect("parallel.pp", 1) or 1), c)
    for dev in used:
        mem = dev["memory"]
        tot, free = int(mem.get("total") or 0), int(mem.get("free") or 0)
        rows.append({"index": dev.get("index"), "name": dev.get("name"), "total": tot, "free": free,
                     "pre": max(0, free - overhead)})
    worst = min(rows, key=lambda r: r["pre"])
    gpu = f"GPU {worst['index']} ({worst['name']}, {_fmt_bytes(worst['total'])})"
    f = _fraction_given(args, ctx)
    details: dict[str, Any] = {
        "weights_total": total, "sharded": target_w.sharded, "replicated": target_w.replicated,
        "drafter": draft_total, "drafter_per_gpu": draft_w.per_gpu if draft_total else 0,
        "per_gpu_weights": weights, "tp": tp, "mem_fraction_static": f, "devices": rows,
        "runtime_overhead": overhead, "pre": worst["pre"]}
    notes = [n for n in (args_note,) if n]
    if len(used) < world:
        notes.append(f"only {len(used)} GPUs visible for a world size of {world}")
    rem_more = Remediation("Use more GPUs (a larger TP), a profile for larger GPUs, or a smaller drafter.",
                           ["nvidia-smi --query-gpu=index,memory.total,memory.used --format=csv"])
    held = worst["total"] - worst["free"]
    busy = f" (other processes hold {_fmt_bytes(held)} of it now: see gpu.idle)" if held > 2 * GIB else ""
    if f is not None and weights >= worst["pre"] * f:
        more = ", and even all of its free memory" if weights >= worst["pre"] else ""
        return Result.failed(f"{_fmt_bytes(weights)} of weights per GPU (TP{tp}"
                             f"{' + drafter' if draft_total else ''}) exceed the static pool "
                             f"{_fmt_bytes(worst['pre'] * f)} ({f:g} x {_fmt_bytes(worst['pre'])} free now) of "
                             f"{gpu}{more}{busy}", rem_more, notes=notes, **details)
    if weights >= worst["pre"]:
        return Result.failed(f"{_fmt_bytes(weights)} of weights per GPU exceed the {_fmt_bytes(worst['pre'])} "
                             f"SGLang would find free on {gpu}{busy}", rem_more, notes=notes, **details)
    if tgeom is None:
        return Result.warned(f"{_fmt_bytes(weights)} of weights per GPU fit in {_fmt_bytes(worst['pre'])} on {gpu}; "
                             "the KV cache and the graph buffers cannot be sized: config.json lacks the attention "
                             "geometry (see model.config)", None, notes=notes, **details)
    shape = memory.server_shape(args, tgeom, gpu_gib=min(r["total"] for r in rows) / GIB,
                                draft_block=block if is_pos_int(block) else None, c=c)
    notes += shape.notes
    speculative_draft = shape.algorithm in memory.DFLASH_FAMILY and dgeom is not None
    cell = memory.kv_cell(tgeom, tp, shape.kv_bytes) + (memory.kv_cell(dgeom, tp, shape.kv_bytes)
                                                        if speculative_draft else 0)
    requests = shape.max_running_requests
    per_request = ctx.settings.kv_tokens_per_request
    need = shape.context_len
    if per_request and requests:
        need = max(need, requests * per_request)
    if requests and shape.algorithm != "NONE":
        need += requests * 2 * shape.verify_width  # the per-step KV reservation of speculative decoding
    min_kv = ctx.expect("model.min_kv_cache_gib")
    if isinstance(min_kv, (int, float)) and not isinstance(min_kv, bool) and min_kv > 0:
        need = max(need, math.ceil(min_kv * GIB / cell))
    outside = memory.outside_pool(tgeom, shape, draft=dgeom if speculative_draft else None,
                                  sms=memory.sm_count(worst["name"], c), c=c)
    if not requests:
        kv_guess = max(1, int(worst["pre"] * (f or 0.85) - weights) // cell)
        requests = memory.auto_max_running(kv_guess, shape.context_len, c)
    outside["request table"] = memory.req_to_token_bytes(shape, requests, c)
    win = memory.window(pre=worst["pre"], weights=weights, cell=cell, need_tokens=need, outside=outside,
                        per_token_outside=int(c["eager"]["bytes_per_kv_token"]))
    details.update(window=win.to_dict(), shape=vars(shape), kv_bytes_per_token=cell, kv_tokens_needed=need,
                   sglang_reserve=memory.sglang_reserve(shape, tgeom.mla, c), recommended=win.recommended,
                   f_min=win.f_min, f_max=win.f_max, notes=notes)
    span = f"[{win.f_min:.3f}, {win.f_max:.3f}]"
    f_out = f if f is not None else win.f_max
    outside_now = dict(outside, **{"static input buffers": win.outside_at(f_out) - sum(outside.values())})
    details["window"]["outside_at_f"] = outside_now
    what = (f"{_fmt_bytes(weights)} weights + KV for {need:,} tokens ({_fmt_bytes(win.need_kv)}) inside, "
            f"{_fmt_bytes(win.outside_at(f_out))} outside ({_largest(outside_now)})")
    set_cmd = (["# [server] mem_fraction_static = " + f"{win.recommended:g}"] if win.recommended else [])
    if win.empty:
        return Result.failed(
            f"no --mem-fraction-static works on {gpu}: it needs >= {win.f_min:.3f} for {what.split(' inside')[0]} "
            f"but <= {win.f_max:.3f} for {_fmt_bytes(win.outside_at(win.f_max))} outside the pool "
            f"({_largest(outside_now)})",
            Remediation("Lower the context length, --max-running-requests, the CUDA graphs' max batch size or the "
                        "DDTree budget; or use more GPUs.",
                        ["k26-doctor check --only model.fit -v --context-length N --max-running-requests R"]),
            **details)
    kv_at = win.kv_tokens(f) if f is not None else None
    details["kv_tokens"] = kv_at
    if f is None:
        auto = memory.sglang_auto_fraction(shape, tgeom.mla, worst["total"], c)
        details["sglang_auto_fraction"] = auto
        verdict = (f"SGLang would pick {auto:.3f}: inside" if win.f_min <= auto <= win.f_max
                   else f"SGLang would pick {auto:.3f}: outside it")
        return Result.warned(f"window {span}, recommended {win.recommended:g}; mem_fraction_static not set, "
                             f"{verdict} ({what})",
                             Remediation("Set the fraction in the profile or config:", set_cmd), **details)
    if f < win.f_min:
        return Result.warned(f"mem_fraction_static {f:g} is below the window {span}: a KV cache of "
                             f"{kv_at:,} tokens where {need:,} are needed (context {shape.context_len:,}"
                             f"{', ' + str(requests) + ' requests' if per_request else ''}); "
                             f"recommended {win.recommended:g} on {gpu}",
                             Remediation("Raise it (or lower the context length):", set_cmd), **details)
    if f > win.f_max:
        left = worst["pre"] * (1 - f)
        return Result.warned(f"mem_fraction_static {f:g} is above the window {span}: it leaves "
                             f"{_fmt_bytes(left)} outside the pool where {_fmt_bytes(win.outside_at(f))} are "
                             f"needed ({_largest(outside_now)}): out of memory at CUDA-graph capture or the first long "
                             f"prefill; recommended {win.recommended:g} on {gpu}",
                             Remediation("Lower it (or the CUDA graphs' max batch size / the DDTree budget):",
                                         set_cmd), **details)
    return Result.passed(f"mem_fraction_static {f:g} inside the window {span} (recommended {win.recommended:g}): "
                         f"{_fmt_bytes(weights)} of weights per GPU + KV for {kv_at:,} tokens "
                         f"({need:,} needed), {_fmt_bytes(worst['pre'] * (1 - f))} left outside for "
                         f"{_fmt_bytes(win.outside_at(f))} on the tightest GPU", **details)
