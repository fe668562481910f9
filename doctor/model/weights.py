"""The weights of a model directory: one judgement for the target (model.shards, with model.shards.deep) and the
draft model (the shards of model.drafter, with model.drafter.deep), parameterised by its ``Role``.

Headers (the ``model`` / ``drafter`` facts' ``weights``): every shard valid, complete, where the index says, no
partial downloads left. sha256 (``model.hashes``, --deep): every shard against a published digest (a k26-doctor
manifest, huggingface_hub's metadata, the HF cache's blob names). Every fix fits its cause: damaged files are
downloaded again (``model.redownload``), files the service's user cannot read need a chmod/chown (named with owner
and mode), never a download; sparse files are hashed by the deep check of the same directory.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.host.access import access_fix, describe
from doctor.model.layout import redownload_argv

GIB = 1024 ** 3
MANIFEST_FILE = "k26-doctor.manifest.json"
INDEX_FILE = "model.safetensors.index.json"
SPARSE_MIN_BYTES = 64 * 1024 ** 2
LEFTOVER_WHAT = {"aria2": "aria2 control file: that download did not finish",
                 "incomplete": "partial huggingface_hub download", "part": "partial download",
                 "partial": "partial download"}


@dataclass(frozen=True)
class Role:
    """Which directory: the target model or the draft model, with everything that differs between them."""

    name: str  # the fact (``model`` / ``drafter``) and the profile table (``[model]`` / ``[drafter]``)
    flag: str  # the command-line flag that gives the path
    check: str  # the check that judges the headers of its shards
    deep_check: str  # the check that hashes them
    missing: str  # what a run without the path says

    def repo(self, settings: Settings) -> str | None:
        """The profile's repository of this model (``[model] repo`` / ``[drafter] repo``)."""
        return (settings.model if self.name == "model" else settings.drafter).repo

    @property
    def damaged(self) -> str:
        """The finding the re-download fixer acts on: files to fetch again."""
        return f"{self.check}.damaged"

    @property
    def mismatch(self) -> str:
        return f"{self.deep_check}.mismatch"


TARGET = Role("model", "--model-path", "model.shards", "model.shards.deep",
              "no model path: pass --model-path or set [model] path")
DRAFTER = Role("drafter", "--draft-model-path", "model.drafter", "model.drafter.deep",
               "no draft model path: pass --draft-model-path or set [drafter] path")
ROLES = {r.name: r for r in (TARGET, DRAFTER)}


def role_of(check_id: str) -> Role:
    """The role a check of the model area judges (model.drafter* judge the draft model)."""
    return DRAFTER if check_id.startswith("model.drafter") else TARGET


def drafter_required(settings: Settings) -> bool:
    """The profile's server drafts (DFLASH, DDTREE, ...): a draft model is then a required input."""
    return bool(settings.server.speculative_algorithm)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 1024 ** 2:.1f} MiB"


def dir_problem(fact: dict[str, Any], role: Role, settings: Settings, cause: str | None = None) -> Findings | None:
    """The finding for a directory that cannot be judged further, else None.

    A required directory that is not given, or that cannot be read, fails (an empty or missing input is never a
    pass); a draft model the profile does not use is not judged. Checks other than the one that judges the
    directory itself (model.shards for the target) name that one as their ``cause``, so the report says it once."""
    path = fact.get("path")
    if not fact.get("given"):
        if role is DRAFTER and not drafter_required(settings):
            raise NotJudged.inapplicable(f"profile {settings.profile_name} uses no draft model")
        out = Findings().fail(f"{role.check}.no_path", role.missing, Remediation(
            f"Give {role.flag} DIR, or set it once in the config ([{role.name}] path = \"DIR\")."))
    elif fact.get("error"):
        access = fact.get("access")
        out = Findings(path=path)
        if access and "permission" in str(fact["error"]):
            out.details["access"] = access
            out.fail(f"{role.check}.unreadable", f"{role.name} path {path} {fact['error']}: {describe(access)}",
                     access_fix([access], "read", fact.get("user")))
        else:
            out.fail(f"{role.check}.bad_path", f"{role.name} path {path} {fact['error']}",
                     Remediation(f"Point {role.flag} at the downloaded model directory.",
                                 [shlex.join(["ls", "-la", str(path)])]))
    else:
        return None
    out.cause = cause
    return out


def redownload_commands(settings: Settings, fact: dict[str, Any], files: list[str], role: Role) -> list[str]:
    repo = role.repo(settings)
    path = fact.get("path") or "MODEL_DIR"
    if not files:
        return []
    if not repo:
        return [f"# set [{role.name}] repo in the config to get the exact download command"]
    argv, note = redownload_argv(str(repo), str(path), files)
    return [shlex.join(argv)] + ([f"# {note}"] if note else [])


def deep_command(role: Role, path: Any) -> str:
    """The command that hashes this directory's shards: the deep check of *this* directory, with its own flag."""
    return shlex.join(["k26-doctor", "check", "--deep", "--only", role.deep_check, role.flag, str(path)])


def has_reference(fact: dict[str, Any], shard: dict[str, Any]) -> bool:
    """Whether a published sha256 for ``shard`` is recorded here (what the deep check compares with): a
    k26-doctor manifest, huggingface_hub's local-dir metadata (an LFS etag), or an HF cache blob name."""
    if MANIFEST_FILE in ((fact.get("files") or {}).get("entries") or {}):
        return True
    etag = str((shard.get("hf_metadata") or {}).get("etag") or "")
    return bool(shard.get("blob_sha256") or (len(etag) == 64 and all(c in "0123456789abcdef" for c in etag)))


def digest_commands(settings: Settings, fact: dict[str, Any], role: Role, names: list[str]) -> list[str]:
    """What settles shards that have no published digest recorded: ``hf download`` into the same directory
    hashes the files already there against the Hub's sha256, records it and fetches only what differs;
    then the deep check; a manifest only for a download verified another way."""
    path = str(fact.get("path") or "MODEL_DIR")
    repo = role.repo(settings)
    cmds = []
    if repo:
        cmds.append(shlex.join(["hf", "download", str(repo), *names, "--local-dir", path]))
    else:
        cmds.append(f"# set [{role.name}] repo in the config: `hf download REPO FILES --local-dir DIR` then records "
                    "the published sha256")
    cmds.append(deep_command(role, path))
    cmds.append(shlex.join(["k26-doctor", "manifest", "write", path]) + "    # only for a download verified "
                "another way")
    return cmds


def is_sparse(shard: dict[str, Any]) -> bool:
    """Far fewer bytes allocated than the file's size: unwritten holes (weights compress poorly, so even
    compressing filesystems allocate most of a real shard)."""
    size, alloc = shard.get("size"), shard.get("allocated")
    return bool(size and alloc is not None and size >= SPARSE_MIN_BYTES and alloc < size // 2)


MAX_LINES_PER_SHARD = 8  # what is said of one shard (doctor.model.scan records at most this many defects)
# What the readers found against the index (doctor.model.index.cross_check): said after what is wrong with the file
AGAINST_INDEX = ("tensor_wrong_shard", "tensor_missing", "tensor_unindexed")


def file_problem(shard: dict[str, Any]) -> dict[str, str] | None:
    """What is wrong with the file itself, from what the fact recorded of it (``exists``, ``dangling``, ``error``):
    missing, a dangling symlink, unreadable; None when it was read."""
    error = shard.get("error")
    if shard.get("exists") is False:
        return {"code": "missing", "message": "is missing" + (f" ({error})" if error else "")}
    if shard.get("dangling"):
        return {"code": "dangling_symlink", "message": f"is a dangling symlink (-> {shard.get('symlink')})"}
    if error:
        return {"code": "unreadable", "message": f"cannot be read: {error}"}
    return None


def size_problem(shard: dict[str, Any]) -> dict[str, str] | None:
    """A shard whose size is not what its header accounts for (8 + header + the data its tensors span): truncated,
    or trailing bytes; None when it is, or when the header did not parse (``parsed``: the reader's fact)."""
    size, header_len, data = shard.get("size"), shard.get("header_len"), shard.get("data_bytes")
    if not shard.get("parsed") or size is None or header_len is None or data is None:
        return None
    want = 8 + header_len + data
    if size < want:
        return {"code": "truncated", "message": f"file is {size} bytes, header says {want} "
                f"({want - size} bytes missing): truncated download"}
    if size > want:
        return {"code": "trailing_bytes", "message": f"file is {size} bytes, header accounts for {want} "
                f"({size - want} extra bytes): corrupt or an unfinished download"}
    return None


def problems_of(shard: dict[str, Any]) -> list[dict[str, str]]:
    """Everything wrong with one shard, in the order it is said: the file itself, what its bytes say, its size
    against its header, what the index says of it. The first and the third are judged here from what the fact
    recorded, so that a replayed snapshot is judged by today's rules; a snapshot made before the fact recorded
    them (no ``parsed``, no ``exists``) holds them among its defects already."""
    recorded = list(shard.get("problems") or [])
    at = next((i for i, p in enumerate(recorded) if p.get("code") in AGAINST_INDEX), len(recorded))
    size = size_problem(shard)
    said = [file_problem(shard), *recorded[:at], size, *recorded[at:]]
    return [p for p in said if p is not None][:MAX_LINES_PER_SHARD]


class ShardReading:
    """The shards of a directory fact sorted by what is wrong with them: damaged, unreadable (permissions only),
    the directory's own problems and the leftovers of interrupted downloads; each as a line for people."""

    def __init__(self, fact: dict[str, Any]) -> None:
        w = fact.get("weights") or {}
        self.weights = w
        self.bad = sorted((s for s in w.get("shards", []) if not s.get("ok")), key=lambda s: s["name"])
        self.problems = {s["name"]: problems_of(s) for s in self.bad}
        self.denied = [s for s in self.bad if self.problems[s["name"]]
                       and all(p.get("code") == "permission" for p in self.problems[s["name"]])]
        self.damaged = [s for s in self.bad if s not in self.denied]
        self.general = list(w.get("problems") or [])
        self.leftovers = list(w.get("leftovers") or [])
        said = self.said()
        self.kinds = [kind for kind, _ in said]  # what each line is about: its finding's code (``damaged``)
        self.lines: list[str] = [line for _, line in said]

    def said(self) -> list[tuple[str, str]]:
        """(kind, line) of everything wrong, in the order it is said: the directory's own problems, then the bad
        shards (without an index, the shards first: the files found stand in for them), then the leftovers."""
        general = [("directory", p["message"]) for p in self.general]
        shards = [("unreadable" if s in self.denied else "damaged", self.line(s)) for s in self.bad]
        said = shards + general if self.weights.get("layout") == "none" else general + shards
        return said + [("leftover" if lo.get("for") else "stray", f"{lo['path']}: "
                        f"{LEFTOVER_WHAT.get(lo['kind'], 'download leftover')}") for lo in self.leftovers]

    def line(self, shard: dict[str, Any]) -> str:
        """One bad shard as said: its name, what is wrong with it, and owner and mode when it is only unreadable."""
        said = "; ".join(p["message"] for p in self.problems[shard["name"]] or [{"message": "invalid"}])
        access = f" ({describe(shard['access'])})" if shard in self.denied and shard.get("access") else ""
        return f"{shard['name']}: {said}{access}"

    def redownload(self) -> list[str]:
        """The files to fetch again: damaged shards, the shards of leftovers, the index when it is the problem."""
        redo = sorted({s["name"] for s in self.damaged} | {lo["for"] for lo in self.leftovers if lo.get("for")})
        codes = {p.get("code") for p in self.general}
        if codes & {"index_missing", "index_invalid", "index_dangling"} or (self.general
                                                                           and self.weights.get("layout") == "index"):
            redo = [INDEX_FILE, *redo]  # the index is wrong (names a path outside, unreadable...)
        return redo


def redownload_files(fact: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """What the re-download fixer fetches for a directory fact, and the download leftovers it moves aside."""
    seen = ShardReading(fact)
    return seen.redownload(), seen.leftovers


def judge_weights(fact: dict[str, Any], role: Role, settings: Settings, selected: frozenset[str]) -> Findings:
    """The shards of ``fact`` (a directory the caller found usable: ``dir_problem``). ``selected``: the run's
    checks (under --deep with the deep check of this directory selected, sparse shards are its to judge)."""
    seen = ShardReading(fact)
    w, path = seen.weights, fact.get("path")
    totals = w.get("totals") or {}
    out = Findings(path=path, layout=w.get("layout"), hf_cache=w.get("hf_cache"), totals=totals,
                   bad_shards=[{"name": s["name"], "problems": seen.problems[s["name"]] or s.get("problems")}
                               for s in seen.bad],
                   problems=seen.general, leftovers=seen.leftovers)
    if seen.denied:
        out.details["unreadable"] = [{"name": s["name"], "access": s.get("access")} for s in seen.denied]
    if w.get("stray_safetensors"):
        out.details["stray_safetensors"] = w["stray_safetensors"]
    sparse_shards = [s for s in w.get("shards", []) if s.get("ok") and is_sparse(s)]
    sparse = sorted(s["name"] for s in sparse_shards)
    if sparse:
        out.details["sparse_shards"] = sparse
    if seen.lines:
        return damaged(fact, role, settings, seen, out)
    if sparse and settings.deep and role.deep_check in selected:
        out.details["sparse_judged_by"] = role.deep_check
    elif sparse:
        return sparse_warning(fact, role, settings, sparse_shards, out)
    n = totals.get("shards", 0)
    note = f"; {len(sparse)} sparse, hashed by {role.deep_check}" if sparse else ""
    return out.info(f"{role.check}.valid", f"{n} shard{'s' if n != 1 else ''}, {totals.get('tensors', 0):,} tensors, "
                    f"{fmt_bytes(totals.get('data_bytes'))}: headers valid"
                    + (", index consistent" if w.get("layout") == "index" else "") + ", no partial downloads" + note)


def judge_shards(fact: dict[str, Any], role: Role, settings: Settings, selected: frozenset[str]) -> Findings:
    """The check of a directory's shards: the directory usable, then its weights."""
    return dir_problem(fact, role, settings) or judge_weights(fact, role, settings, selected)


def sparse_warning(fact: dict[str, Any], role: Role, settings: Settings, sparse_shards: list[dict[str, Any]],
                   out: Findings) -> Findings:
    sparse = sorted(s["name"] for s in sparse_shards)
    path = fact.get("path")
    shown = ", ".join(sparse[:3]) + ("..." if len(sparse) > 3 else "")
    head = (f"{len(sparse)} shard(s) are sparse files (holes where data should be): {shown}; an interrupted "
            "aria2/segmented download leaves holes")
    if all(has_reference(fact, s) for s in sparse_shards):
        rem = Remediation("Hash them against the published sha256 recorded here:", [deep_command(role, path)])
    else:
        rem = Remediation("No published sha256 is recorded here to hash them against (no manifest, no "
                          "huggingface_hub metadata). `hf download` into the same directory hashes the files "
                          "already there against the Hub's sha256, records it, and fetches only what differs:",
                          digest_commands(settings, fact, role, sparse))
    return out.warn(f"{role.check}.sparse", head, rem)


def damaged(fact: dict[str, Any], role: Role, settings: Settings, seen: ShardReading, out: Findings) -> Findings:
    """Shards damaged or unreadable, leftovers, a broken index: a finding each, said in one line (the first, and how
    many more) with one remediation."""
    redo = seen.redownload()
    out.details["redownload"] = redo
    reader = (fact.get("user") or {}).get("user") or "this user"
    n_shards = (seen.weights.get("totals") or {}).get("shards", 0)
    head = ""
    if seen.damaged:
        head = f"{len(seen.damaged)} of {n_shards} shards damaged" + (
            f", {len(seen.denied)} unreadable by {reader}" if seen.denied else "") + ": "
    elif seen.denied:
        head = f"{len(seen.denied)} of {n_shards} shards unreadable by {reader}: "
    text = ("Re-download the damaged files (never mix revisions). `k26-doctor fix` plans it; by hand:"
            if redo else "Move the download leftovers named above out of the model directory (`k26-doctor fix` "
            "plans it)." if seen.leftovers else "")
    commands = redownload_commands(settings, fact, redo, role)
    if seen.denied:
        access = access_fix([s["access"] for s in seen.denied if s.get("access")]
                            or [{"path": str(fact.get("path")), "is_dir": True}], "read", fact.get("user"))
        text = (text + " " if text else "") + access.text
        commands += access.commands
    # Each line its own finding, coded by what the fixers do about it: a re-download (the damaged shards, the
    # shards of leftovers, the index when it is wrong), access (unreadable), nothing automatic (a stray leftover).
    index_redone = bool(redo) and redo[0] == INDEX_FILE
    codes = {"damaged": role.damaged, "leftover": role.damaged, "unreadable": f"{role.check}.unreadable",
             "directory": role.damaged if index_redone else f"{role.check}.invalid",
             "stray": f"{role.check}.leftover"}
    for kind, line in zip(seen.kinds, seen.lines, strict=True):
        out.fail(codes[kind], line)
    return out.fold(head, Remediation(text, commands))


# -- the deep tier: sha256 of every shard ------------------------------------------------------------------

VERDICTS = ("match", "mismatch", "no_reference", "missing", "error")


def hash_failures(fact: dict[str, Any]) -> list[str]:
    """The files whose sha256 is wrong, missing or unreadable: what the re-download fixer fetches for a deep check."""
    return [f["name"] for v in ("mismatch", "missing", "error") for f in fact.get("files") or []
            if f.get("verdict") == v]


def hashed_dir(facts: dict[str, Any], role: Role, settings: Settings) -> dict[str, Any]:
    """The ``model.hashes`` entry of this directory, when it was hashed; else why it is not judged or fails."""
    if facts.get("collected") is False:
        raise NotJudged.inapplicable(f"shards {facts.get('reason', 'not hashed')}: run with --deep")
    fact = facts.get(role.name) or {"given": False}
    if not fact.get("given"):
        if role is DRAFTER and not drafter_required(settings):
            raise NotJudged.inapplicable(f"profile {settings.profile_name} uses no draft model")
    return fact


def judge_hashes(facts: dict[str, Any], role: Role, settings: Settings) -> Findings:
    """The deep tier's verdict for one directory: every shard's sha256 against its published digest."""
    fact = hashed_dir(facts, role, settings)
    unhashable = _unhashable(fact, role)
    if unhashable is not None:
        return unhashable
    files = fact.get("files") or []
    by = {v: [f for f in files if f.get("verdict") == v] for v in VERDICTS}
    out = _hash_details(fact, by)
    if by["mismatch"] or by["missing"] or by["error"]:
        return mismatched(fact, by, role, settings, out)
    return _none_wrong(fact, by, role, settings, out)


def _unhashable(fact: dict[str, Any], role: Role) -> Findings | None:
    """The failure of a directory with nothing hashed (no path, a bad one, no shards), else None."""
    if not fact.get("given"):
        return Findings().fail(f"{role.deep_check}.no_path", role.missing)
    if fact.get("error"):
        return Findings().fail(f"{role.deep_check}.bad_path", f"{role.name} path {fact.get('path')} {fact['error']}")
    if not fact.get("files"):
        return Findings().fail(f"{role.deep_check}.no_shards", f"no shards to hash in {fact.get('path')}: "
                               f"{fact.get('problem') or 'no index'}")
    return None


def _hash_details(fact: dict[str, Any], by: dict[str, list[dict[str, Any]]]) -> Findings:
    """The findings' details: the counts per verdict, the files that are wrong or unverified, the rate, the cache
    and the manifest (what a fixer and a reader of the JSON report act on)."""
    return Findings(path=fact.get("path"), counts={k: len(v) for k, v in by.items()},
                    mismatch=[{"name": f["name"], "sha256": f.get("sha256"), "expected": f.get("expected")}
                              for f in by["mismatch"]],
                    missing=[f["name"] for f in by["missing"]],
                    errors=[{"name": f["name"], "error": f.get("error")} for f in by["error"]],
                    unverified=[f["name"] for f in by["no_reference"]], bytes_hashed=fact.get("bytes_hashed"),
                    seconds=fact.get("seconds"), rate_bytes_s=fact.get("rate_bytes_s"), cache=fact.get("cache"),
                    manifest=fact.get("manifest"))


def _none_wrong(fact: dict[str, Any], by: dict[str, list[dict[str, Any]]], role: Role, settings: Settings,
                out: Findings) -> Findings:
    """No file wrong: all match, or some (a warning) or all (not judged: nothing was compared) have no reference
    digest, with how a published digest is obtained."""
    rate = fact.get("rate_bytes_s")
    speed = f" at {rate / GIB:.2f} GiB/s" if rate else ""
    cached = (fact.get("cache") or {}).get("hits") or 0
    tail = f" ({fmt_bytes(fact.get('bytes_hashed'))} hashed{speed}, {cached} from the verification cache)"
    unverified = out.details["unverified"]
    settle = Remediation(
        "What settles it is a published sha256: `hf download` into the same directory hashes the files already "
        "there against the Hub's sha256, records it (.cache/huggingface) and fetches only what differs; then "
        "run this check again. Without network: a manifest written where the download verified "
        "(`k26-doctor manifest write DIR` there, copied here).",
        digest_commands(settings, fact, role, unverified if len(unverified) <= 8 else []))
    if by["no_reference"] and not by["match"]:
        raise NotJudged.missing(f"{len(fact.get('files') or [])} files hashed but nothing to compare with: no "
                                "k26-doctor manifest, no huggingface_hub metadata, not a Hugging Face cache" + tail,
                                settle, **out.details)
    if by["no_reference"]:
        return out.warn(f"{role.deep_check}.unverified", f"{len(by['match'])} files match, {len(by['no_reference'])} "
                        f"have no reference digest: {', '.join(unverified[:5])}" + tail, settle)
    return out.info(f"{role.deep_check}.match", f"all {len(by['match'])} files match their sha256" + tail)


def mismatched(fact: dict[str, Any], by: dict[str, list[dict[str, Any]]], role: Role, settings: Settings,
               out: Findings) -> Findings:
    parts = []
    if by["mismatch"]:
        srcs = sorted({(f.get("expected") or {}).get("source", "?") for f in by["mismatch"]})
        shown = ", ".join(f["name"] for f in by["mismatch"][:5]) + ("..." if len(by["mismatch"]) > 5 else "")
        parts.append(f"{len(by['mismatch'])} sha256 mismatch ({', '.join(srcs)}): {shown}")
    if by["missing"]:
        parts.append(f"{len(by['missing'])} missing: " + ", ".join(out.details["missing"][:5]))
    if by["error"]:
        parts.append(f"{len(by['error'])} unreadable: " + ", ".join(f["name"] for f in by["error"][:5]))
    fix = Remediation("These files are not what was published: re-download them.",
                      redownload_commands(settings, fact, hash_failures(fact), role))
    for part in parts:
        out.fail(role.mismatch, part, fix)
    return out
