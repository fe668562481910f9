"""Re-download plan for damaged model files; never deletes weights.

The plan: write an aria2 input file for the files under the state directory (for sites that
download with aria2); run ``hf download REPO FILES --local-dir <model>/.k26-doctor-download/<time>``
pinned to the revision huggingface_hub recorded for the directory; only when that succeeded, move
the damaged files and their download leftovers aside into ``<model>/.k26-doctor-aside/<time>/``
(same filesystem: renames, nothing copied, nothing deleted) and the new files into place. A stale
``.aria2`` control file next to a shard is moved aside alone only when the shard's sha256 verifies
(``fix --deep``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doctor.core.actions import Action, ActionError, Plan, RunCommand, WriteFile
from doctor.core.context import Context
from doctor.core.fileio import fsync_dir
from doctor.core.registry import fixer
from doctor.core.result import Result
from doctor.model.drafter import IS_TARGET
from doctor.model.layout import HF_LOCAL_META_DIR
from doctor.model.weights import DRAFTER, Role, hash_failures, redownload_files, role_of

ASIDE_DIR = ".k26-doctor-aside"
STAGING_DIR = ".k26-doctor-download"
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
             "# aria2c -x16 -s16 -j6 -c --allow-overwrite=true --auto-file-renaming=false -i {this file}"]
    for name in files:
        lines += [f"{HF_BASE}/{repo}/resolve/{revision}/{name}", f"  dir={model_dir}", f"  out={name}"]
    return "\n".join(lines) + "\n"


def _revision(fact: dict[str, Any]) -> str | None:
    """The commit huggingface_hub recorded for the directory's files, when they all agree."""
    commits = {((s.get("hf_metadata") or {}).get("commit")) for s in (fact.get("weights") or {}).get("shards", [])}
    commits.discard(None)
    commits.discard("")
    return commits.pop() if len(commits) == 1 else None


def hash_verdicts(ctx: Context, role: Role) -> dict[str, str]:
    """sha256 verdicts per file, only under ``--deep`` (planning must not start hours of hashing)."""
    if not ctx.deep:
        return {}
    facts = ctx.optional("model.hashes")
    return {f["name"]: f.get("verdict", "") for f in ((facts or {}).get(role.name) or {}).get("files") or []}


def what_to_fetch(ctx: Context, result: Result, role: Role, fact: dict[str, Any]
                  ) -> tuple[str | None, list[str], list[dict[str, Any]]]:
    """(model dir, files to fetch again, leftovers) for the result's finding: its headers' damaged files and
    download leftovers, or (a deep check) the files whose sha256 is wrong, less those its headers' check plans."""
    if result.id != role.deep_check:
        files, leftovers = redownload_files(fact)
        return fact.get("path"), files, leftovers
    hashed = (ctx.optional("model.hashes") or {}).get(role.name) or {}
    files = hash_failures(hashed)
    first = ctx.results.get(role.check)
    if first is not None and first.status.failed:  # the headers' check already plans what they showed
        planned = redownload_files(fact)[0]
        files = [f for f in files if f not in planned]
    return hashed.get("path"), files, []


def not_into_the_target(model_dir: str | None) -> str:
    """The "drafter" is the target model: downloading the drafter's files into it would mix two models."""
    return (f"--draft-model-path {model_dir} is the target model's directory: point it at the DFlash drafter "
            "instead; nothing is downloaded")


@fixer("model.redownload", "Re-download damaged model files (moved aside, never deleted)",
       needs=("model", "drafter", "model.hashes"))
def plan_redownload(ctx: Context, result: Result) -> Plan:
    """Plan for model.shards / model.shards.deep / model.drafter / model.drafter.deep, when they found damaged
    files (``model.shards.damaged``, ``model.drafter.damaged``) or files whose sha256 is wrong (``*.deep.mismatch``).

    Order matters: the download goes to a staging directory first, so that a failed download (the
    plan stops at the first failing step) leaves the model directory as it was; only then are the
    damaged files and their leftovers moved aside and the new files moved into place."""
    role = role_of(result.id)
    fact = ctx.optional(role.name) or {}
    target = ctx.settings.model_path
    if role is DRAFTER and result.has(IS_TARGET):
        return Plan(notes=[not_into_the_target(fact.get("path") or ctx.settings.draft_model_path)])
    if not result.has(role.damaged, role.mismatch):
        return Plan()
    model_dir, files, leftovers = what_to_fetch(ctx, result, role, fact)
    if not model_dir:
        return Plan()
    if role is DRAFTER and target and os.path.realpath(model_dir) == os.path.realpath(target):
        return Plan(notes=[not_into_the_target(model_dir)])
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    aside = os.path.join(model_dir, ASIDE_DIR, stamp)
    staging = os.path.join(model_dir, STAGING_DIR, stamp)
    stale, partial, files = _leftover_moves(leftovers, hash_verdicts(ctx, role), model_dir, aside, fact, files)
    fetch = list(dict.fromkeys(files))
    repo = role.repo(ctx.settings)
    if not fetch:
        return Plan(stale + partial)
    if not repo:
        # Nothing to download from: moving damaged files aside would only break more.
        return Plan(stale)
    actions = _download_actions(ctx, str(repo), _revision(fact) or "main", model_dir, fetch, staging)
    actions += stale + partial
    actions += _placing_actions(leftovers, fetch, model_dir, aside, staging)
    return Plan(actions)


def _leftover_moves(leftovers: list[dict[str, Any]], verdicts: dict[str, str], model_dir: str, aside: str,
                    fact: dict[str, Any], files: list[str]) -> tuple[list[Action], list[Action], list[str]]:
    """(stale aria2 control files to move aside, partial downloads to move aside, the files still to fetch): an
    aria2 control file beside a shard whose sha256 verifies (``verdicts``) is stale alone, and that shard is
    not fetched again; the control file of a shard to fetch moves aside with it (``_placing_actions``)."""
    stale: list[Action] = []
    partial: list[Action] = []
    for lo in leftovers:
        target = lo.get("for")
        if lo.get("kind") == "aria2" and target and verdicts.get(target) == "match":
            # The shard is whole (sha256 verified): only the control file is stale.
            stale.append(MoveAside(f"move aside the stale {lo['path']} ({target} verifies by sha256)",
                                   src=os.path.join(model_dir, lo["path"]), dst=os.path.join(aside, lo["path"])))
            files = [f for f in files if f != target]
        elif lo.get("kind") != "aria2":
            partial.append(MoveAside(f"move aside the partial download {lo['path']}",
                                     src=_leftover_path(model_dir, lo["path"], fact),
                                     dst=os.path.join(aside, lo["path"].replace("/", "__"))))
    return stale, partial, files


def _download_actions(ctx: Context, repo: str, revision: str, model_dir: str, fetch: list[str],
                      staging: str) -> list[Action]:
    """The aria2 input file (for sites that download with aria2) and the ``hf download`` into the staging
    directory, pinned to ``revision`` unless that is ``main``: the model directory is untouched until it
    succeeds (a plan stops at its first failing step)."""
    key = hashlib.sha256(os.path.abspath(model_dir).encode()).hexdigest()[:12]
    input_path = os.path.join(state_dir(ctx), "downloads", f"aria2-{os.path.basename(model_dir)}-{key}.txt")
    actions: list[Action] = [WriteNewFile(
        f"write an aria2 input file for the {len(fetch)} file(s) (the alternative to hf: "
        f"aria2c -x16 -s16 -j6 -c --allow-overwrite=true -i {input_path})",
        path=input_path, new_text=aria2_input(repo, revision, model_dir, fetch))]
    argv = ["hf", "download", repo, *fetch, "--local-dir", staging]
    if revision != "main":
        argv += ["--revision", revision]
    actions.append(RunCommand(f"download {len(fetch)} file(s) of {repo}@{revision} into a staging directory "
                              "(the model directory is untouched until it succeeds)", argv=argv, timeout=6 * 3600))
    return actions


def _placing_actions(leftovers: list[dict[str, Any]], fetch: list[str], model_dir: str, aside: str,
                     staging: str) -> list[Action]:
    """After the download: the aria2 control files of the replaced files moved aside, then each downloaded file
    moved into place (whatever is in its way kept aside, never deleted)."""
    actions: list[Action] = []
    for lo in leftovers:
        if lo.get("kind") == "aria2" and lo.get("for") in fetch:
            actions.append(MoveAside(f"move aside {lo['path']} (its file is replaced)",
                                     src=os.path.join(model_dir, lo["path"]), dst=os.path.join(aside, lo["path"])))
    for name in fetch:
        actions.append(PlaceDownloaded(f"move the downloaded {name} into place"
                                       + (" (the damaged one kept aside)" if os.path.lexists(
                                           os.path.join(model_dir, name)) else ""),
                                       model_dir=model_dir, name=name, staging=staging, aside=aside))
    return actions


@dataclass
class PlaceDownloaded(Action):
    """Move a freshly downloaded file (and its huggingface_hub metadata) from the staging directory into
    the model directory; whatever is in the way is moved aside first, never deleted."""

    model_dir: str = ""
    name: str = ""
    staging: str = ""
    aside: str = ""

    def _pairs(self) -> list[tuple[str, str, str]]:
        meta = os.path.join(HF_LOCAL_META_DIR, self.name + ".metadata")
        return [(os.path.join(self.staging, self.name), os.path.join(self.model_dir, self.name),
                 os.path.join(self.aside, self.name)),
                (os.path.join(self.staging, meta), os.path.join(self.model_dir, meta), os.path.join(self.aside, meta))]

    def details(self) -> list[str]:
        (src, dst, old), _ = self._pairs()
        lines = []
        if os.path.lexists(dst):
            lines.append(f"$ mkdir -p {shlex.quote(os.path.dirname(old))} && mv -n {shlex.quote(dst)} "
                         f"{shlex.quote(old)}")
        lines.append(f"$ mv -n {shlex.quote(src)} {shlex.quote(dst)}   # and its .cache/huggingface metadata")
        return lines

    def apply(self, backup_dir: Path) -> str:
        (src, dst, old), meta = self._pairs()
        if not os.path.isfile(src):
            raise ActionError(f"the download did not produce {src}; {dst} left as it was")
        for s, d, o in ((src, dst, old), meta):
            if not os.path.lexists(s):
                continue  # no metadata (aria2 download, older huggingface_hub): fine
            try:
                os.makedirs(os.path.dirname(d), exist_ok=True)
                if os.path.lexists(d):
                    if os.path.lexists(o):
                        raise ActionError(f"{o} already exists; not overwriting it")
                    os.makedirs(os.path.dirname(o), exist_ok=True)
                    os.rename(d, o)
                os.rename(s, d)
            except OSError as exc:
                raise ActionError(f"cannot move {s} to {d}: {exc.strerror or exc}") from None
            fsync_dir(Path(d).parent)
        return f"placed {self.name} (previous copy, if any, in {self.aside})"


def _leftover_path(model_dir: str, rel: str, fact: dict[str, Any]) -> str:
    if rel.startswith("blobs/"):
        cache = (fact.get("weights") or {}).get("hf_cache")
        if cache:
            return os.path.join(cache, rel)
    return os.path.join(model_dir, rel)
