"""Re-download plan for damaged model files; never deletes weights.

The plan: move the damaged files (and the download leftovers that belong to them) aside into
``<model dir>/.k26-doctor-aside/<time>/`` (same filesystem: a rename, nothing copied, nothing
deleted), write an aria2 input file for the same files under the state directory (for sites that
download with aria2), and run ``hf download REPO FILES --local-dir DIR --force-download`` pinned to
the revision the directory came from when huggingface_hub recorded it. A stale ``.aria2`` control file
next to a shard is moved aside alone only when the shard's sha256 verifies (``fix --deep``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doctor.context import Context
from doctor.facts import FactUnavailable
from doctor.registry import fixer
from doctor.result import Result
from fixes.actions import Action, ActionError, RunCommand, WriteFile, fsync_dir

ASIDE_DIR = ".k26-doctor-aside"
HF_BASE = "https://huggingface.co"


@dataclass
class MoveAside(Action):
    """Rename a file into a directory (created) on the same filesystem; never overwrites."""

    src: str = ""
    dst: str = ""

    def details(self) -> list[str]:
        return [f"$ mkdir -p {shlex.quote(os.path.dirname(self.dst))} && mv -n {shlex.quote(self.src)} "
                f"{shlex.quote(self.dst)}"]

    def apply(self, backup_dir: Path) -> str:
        if not os.path.lexists(self.src):
            if os.path.lexists(self.dst):
                return f"{self.src} was already moved to {self.dst}"
            raise ActionError(f"{self.src} is gone; nothing moved")
        if os.path.lexists(self.dst):
            raise ActionError(f"{self.dst} already exists; not overwriting it")
        try:
            os.makedirs(os.path.dirname(self.dst), exist_ok=True)
            os.rename(self.src, self.dst)
        except OSError as exc:
            raise ActionError(f"cannot move {self.src}: {exc.strerror or exc}") from None
        fsync_dir(Path(self.dst).parent)
        return f"moved {self.src} -> {self.dst}"


@dataclass
class WriteNewFile(WriteFile):
    """``WriteFile`` whose parent directory is created first (a state directory on first use)."""

    def apply(self, backup_dir: Path) -> str:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        except OSError as exc:
            raise ActionError(f"cannot create {os.path.dirname(self.path)}: {exc.strerror or exc}") from None
        return super().apply(backup_dir)


def state_dir(ctx: Context) -> str:
    """The configured state directory when writable (or creatable), else ~/.local/state/k26-doctor."""
    base = ctx.settings.state_dir or "/var/lib/k26-doctor"
    probe = base
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and os.access(probe, os.W_OK):
        return base
    return os.path.join(os.path.expanduser("~"), ".local", "state", "k26-doctor")


def aria2_input(repo: str, revision: str, model_dir: str, files: list[str]) -> str:
    """An aria2c input file (``aria2c -i FILE``): one URL per file with its dir and out options."""
    lines = [f"# k26-doctor: re-download {len(files)} file(s) of {repo}@{revision} into {model_dir}",
             "# aria2c -x16 -s16 -j6 -c --auto-file-renaming=false -i {this file}"]
    for name in files:
        lines += [f"{HF_BASE}/{repo}/resolve/{revision}/{name}", f"  dir={model_dir}", f"  out={name}"]
    return "\n".join(lines) + "\n"


def _revision(fact: dict[str, Any]) -> str | None:
    """The commit huggingface_hub recorded for the directory's files, when they all agree."""
    commits = {((s.get("hf_metadata") or {}).get("commit")) for s in (fact.get("weights") or {}).get("shards", [])}
    commits.discard(None)
    commits.discard("")
    return commits.pop() if len(commits) == 1 else None


def _hash_verdicts(ctx: Context, which: str) -> dict[str, str]:
    """sha256 verdicts per file, only under ``--deep`` (planning must not start hours of hashing)."""
    if not ctx.deep:
        return {}
    try:
        facts = ctx.fact("model.hashes")
    except FactUnavailable:
        return {}
    return {f["name"]: f.get("verdict", "") for f in ((facts or {}).get(which) or {}).get("files") or []}


def _files_from(result: Result) -> tuple[str | None, list[str], list[dict[str, Any]]]:
    """(model dir, files to fetch again, leftovers) from a failing result's details."""
    d = result.details or {}
    if "weights" in d and isinstance(d["weights"], dict):  # model.drafter
        w = d["weights"]
        return d.get("path") or w.get("path"), list(w.get("redownload") or []), list(w.get("leftovers") or [])
    if "mismatch" in d:  # *.deep
        names = [m["name"] for m in d.get("mismatch") or []] + list(d.get("missing") or [])
        names += [e["name"] for e in d.get("errors") or []]
        return d.get("path"), names, []
    return d.get("path"), list(d.get("redownload") or []), list(d.get("leftovers") or [])


@fixer("model.redownload", "Re-download damaged model files (moved aside, never deleted)")
def plan_redownload(ctx: Context, result: Result) -> list[Action]:
    """Plan for model.shards / model.shards.deep / model.drafter / model.drafter.deep."""
    which = "drafter" if result.id.startswith("model.drafter") else "model"
    model_dir, files, leftovers = _files_from(result)
    if not model_dir:
        return []
    try:
        fact = ctx.fact(which)
    except FactUnavailable:
        fact = {}
    if result.id.endswith(".deep"):  # model.shards already plans what its headers showed
        first = ctx.results.get("model.shards" if which == "model" else "model.drafter")
        if first is not None and first.status.failed:
            prev = _files_from(first)[1]
            files = [f for f in files if f not in prev]
    verdicts = _hash_verdicts(ctx, which)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    aside = os.path.join(model_dir, ASIDE_DIR, stamp)
    actions: list[Action] = []
    fetch: list[str] = []
    for lo in leftovers:
        target = lo.get("for")
        if lo.get("kind") == "aria2" and target and verdicts.get(target) == "match":
            # The shard is whole (sha256 verified): only the control file is stale.
            actions.append(MoveAside(f"move aside the stale {lo['path']} ({target} verifies by sha256)",
                                     src=os.path.join(model_dir, lo["path"]),
                                     dst=os.path.join(aside, os.path.basename(lo["path"]))))
            files = [f for f in files if f != target]
        elif lo.get("kind") != "aria2":
            actions.append(MoveAside(f"move aside the partial download {lo['path']}",
                                     src=_leftover_path(model_dir, lo["path"], fact),
                                     dst=os.path.join(aside, lo["path"].replace("/", "__"))))
    for lo in leftovers:
        if lo.get("kind") == "aria2" and lo.get("for") in files:
            actions.append(MoveAside(f"move aside {lo['path']} (its shard is re-downloaded)",
                                     src=os.path.join(model_dir, lo["path"]),
                                     dst=os.path.join(aside, lo["path"])))
    for name in files:
        if name == "model.safetensors.index.json" or os.path.lexists(os.path.join(model_dir, name)):
            if os.path.lexists(os.path.join(model_dir, name)):
                actions.append(MoveAside(f"move the damaged {name} aside (kept, not deleted)",
                                         src=os.path.join(model_dir, name), dst=os.path.join(aside, name)))
        fetch.append(name)
    repo = ctx.expect(f"{which}.repo")
    if fetch and repo:
        revision = _revision(fact) or "main"
        key = hashlib.sha256(os.path.abspath(model_dir).encode()).hexdigest()[:12]
        input_path = os.path.join(state_dir(ctx), "downloads", f"aria2-{os.path.basename(model_dir)}-{key}.txt")
        actions.append(WriteNewFile(f"write an aria2 input file for the {len(fetch)} file(s) (alternative to hf: "
                                    f"aria2c -x16 -s16 -j6 -c -i {input_path})",
                                    path=input_path, new_text=aria2_input(str(repo), revision, model_dir, fetch)))
        argv = ["hf", "download", str(repo), *fetch, "--local-dir", model_dir, "--force-download"]
        if revision != "main":
            argv += ["--revision", revision]
        actions.append(RunCommand(f"re-download {len(fetch)} file(s) of {repo} with huggingface_hub", argv=argv,
                                  timeout=6 * 3600))
    elif fetch:
        # Without the repository there is nothing to download from: moving files aside would only break more.
        return [a for a in actions if "stale" in a.summary]
    return actions


def _leftover_path(model_dir: str, rel: str, fact: dict[str, Any]) -> str:
    if rel.startswith("blobs/"):
        cache = (fact.get("weights") or {}).get("hf_cache")
        if cache:
            return os.path.join(cache, rel)
    return os.path.join(model_dir, rel)
