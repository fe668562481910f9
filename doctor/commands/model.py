"""``k26-doctor manifest``: record and verify the sha256 manifest the deep tier compares against first.

    k26-doctor manifest write DIR [--from-hf-metadata] [--force]   # hash (or trust HF etags) and record
    k26-doctor manifest verify DIR                                  # hash and compare, exit 1 on mismatch
    k26-doctor manifest export DIR                                  # sha256sum -c format on stdout
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from doctor.commands.options import Number
from doctor.core.exitcodes import EXIT_FAILED, EXIT_OK
from doctor.model.hashing import default_cache_dir, shard_names, verify_model_hashes
from doctor.model.layout import read_hf_local_metadata
from doctor.model.manifest import MANIFEST_NAME, manifest_text, read_manifest, sha256sum_text


def _cache_opts(func: Any) -> Any:
    func = click.option("--no-cache", is_flag=True, help="Ignore the verification cache (hash everything).")(func)
    func = click.option("--cache-dir", default=None,
                        help="Verification cache directory (default /var/tmp/k26-doctor-<uid>).")(func)
    func = click.option("-j", "--jobs", type=Number(1, 1024, integer=True), default=None,
                        help="Files hashed in parallel (default: cores).")(func)
    return func


@click.group("manifest")
def manifest() -> None:
    """sha256 manifest of a model directory (k26-doctor.manifest.json), used by `check --deep`."""


@manifest.command("write")
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("--output", type=click.Path(dir_okay=False), default=None,
              help=f"Where to write (default DIR/{MANIFEST_NAME}).")
@click.option("--from-hf-metadata", is_flag=True,
              help="Record huggingface_hub's etags (the published sha256) instead of hashing; fails for files "
                   "without one.")
@click.option("--force", is_flag=True, help="Replace an existing manifest.")
@_cache_opts
def write_cmd(model_dir: str, output: str | None, from_hf_metadata: bool, force: bool, no_cache: bool,
              cache_dir: str | None, jobs: int | None) -> int:
    """Hash every shard the index names and record the digests.

    Record only a download you trust (e.g. right after `hf download`, whose etags are the published
    sha256: use --from-hf-metadata to take those without trusting the bytes on disk)."""
    from doctor.core.exitcodes import EXIT_USAGE
    from doctor.core.fileio import atomic_write, describe_error, output_problem

    target = output or os.path.join(model_dir, MANIFEST_NAME)
    problem = output_problem(target)
    if problem:  # a symlink, a device (/dev/full), a FIFO, a directory: refused before hashing anything
        click.echo(f"k26-doctor: {'--output ' if output else ''}{target} {problem}", err=True)
        return EXIT_USAGE
    if os.path.exists(target) and not force:
        raise click.ClickException(f"{target} exists; pass --force to replace it")
    names, problem = shard_names(model_dir)
    if not names:
        raise click.ClickException(f"no shards in {model_dir}: {problem}")
    files: dict[str, dict[str, Any]] = {}
    note = ""
    if from_hf_metadata:
        missing = []
        for n in names:
            meta = read_hf_local_metadata(model_dir, n)
            try:
                size = os.stat(os.path.join(model_dir, n)).st_size
            except OSError:
                size = None
            if meta and meta.get("sha256") and size is not None:
                files[n] = {"size": size, "sha256": meta["sha256"]}
            else:
                missing.append(n)
        if missing:
            raise click.ClickException(f"{len(missing)} file(s) have no huggingface_hub sha256: "
                                       f"{', '.join(missing[:5])}")
        note = "from huggingface_hub local-dir metadata (published etags)"
    else:
        res = verify_model_hashes(model_dir, use_cache=not no_cache, cache_dir=cache_dir, workers=jobs)
        bad = [f for f in res["files"] if f.get("verdict") in ("mismatch", "missing", "error")]
        if bad:
            raise click.ClickException("refusing to record a manifest: " + ", ".join(
                f"{f['name']} ({f.get('verdict')})" for f in bad[:5]))
        files = {f["name"]: {"size": f["size"], "sha256": f["sha256"]} for f in res["files"]}
        note = "hashed by k26-doctor"
        _rate(res)
    try:
        atomic_write(target, manifest_text(files, note).encode(), 0o644)
    except OSError as exc:  # a full disk: an I/O failure of the output, exit 2, the old manifest kept
        click.echo(f"k26-doctor: cannot write {target}: {describe_error(exc)}", err=True)
        return EXIT_USAGE
    click.echo(f"wrote {target} ({len(files)} files)")
    return EXIT_OK


@manifest.command("verify")
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_cache_opts
def verify_cmd(model_dir: str, fmt: str, no_cache: bool, cache_dir: str | None, jobs: int | None) -> int:
    """Hash every shard and compare (manifest > HF metadata > HF cache blob); exit 1 on any mismatch."""
    res = verify_model_hashes(model_dir, use_cache=not no_cache, cache_dir=cache_dir, workers=jobs)
    if fmt == "json":
        click.echo(json.dumps(res, indent=1))
    else:
        for f in res["files"]:
            exp = f.get("expected") or {}
            click.echo(f"{f.get('verdict', '?'):13} {f['name']}" + (f"  ({exp.get('source')})" if exp else ""))
        _rate(res)
    bad = [f for f in res["files"] if f.get("verdict") in ("mismatch", "missing", "error")]
    return EXIT_FAILED if bad or not res["files"] else EXIT_OK


@manifest.command("export")
@click.argument("model_dir", type=click.Path(file_okay=False))
def export_cmd(model_dir: str) -> int:
    """Print the manifest in `sha256sum -c` format (run it from DIR)."""
    man = read_manifest(os.path.join(model_dir, MANIFEST_NAME))
    if not man.ok:
        raise click.ClickException(man.error or f"no {MANIFEST_NAME} in {model_dir}")
    click.echo(sha256sum_text(man.files), nl=False)
    return EXIT_OK


def _rate(res: dict[str, Any]) -> None:
    rate = res.get("rate_bytes_s")
    cache = res.get("cache") or {}
    click.echo(f"hashed {res.get('bytes_hashed', 0) / 1024 ** 3:.2f} GiB in {res.get('seconds')}s"
               + (f" ({rate / 1024 ** 3:.2f} GiB/s)" if rate else "")
               + f"; {cache.get('hits', 0)} from the verification cache"
               + (f" ({cache.get('path') or default_cache_dir()})" if cache.get("used") else " (cache off)"),
               err=True)
