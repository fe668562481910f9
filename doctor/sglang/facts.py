"""Facts about the service's SGLang.

``sglang_import``: SGLang imported for real under the service interpreter (probe ``sglang_import``),
and whether DFlash's sampling kernel is available.
``sglang_flags``: every flag the service's SGLang accepts, read from its sources (``doctor.sglang.flags``);
the table is part of the fact, so a snapshot replays it.

``sglang_patches``: where the service interpreter's SGLang lives (found by the probe
``doctor/probes/site_packages.py``, which only reads ``sys.path``), its version and RECORD, and
the sha256 of every file the profile's patch set touches (hashed here, in the doctor's process),
plus any interrupted patch run's journal. ``checks.sglang`` judges it with
``doctor.sglang.patching.status.evaluate``, so a snapshot replays the verdict.
"""

from __future__ import annotations

from typing import Any

from doctor.core.registry import collector
from doctor.facts.shape import NUM, anything, mapping, opt
from doctor.facts.store import CollectOptions
from doctor.sglang.flags import flags_fact
from doctor.sglang.patching import locate, manifest, status
from doctor.stack.facts import RUNTIME
from doctor.stack.service_probe import PROBE_SHAPE, probe_service


def patches_dir_of(opts: Any) -> str | None:
    """The site's patch-set directory: ``--patches-dir``/``[doctor] patches_dir`` when the options carry
    it, else ``[patches] dir`` of the merged profile/config."""
    return getattr(opts, "patches_dir", None) or ((opts.profile or {}).get("patches") or {}).get("dir") or None


# What the sglang checks read of these facts (doctor.facts.shape); the recorded manifest is validated by
# doctor.sglang.patching.manifest, the flag table by doctor.sglang.flag_reader, when they are judged.
PATCHES_SHAPE = {
    "python": opt(str), "set_name": opt(str), "patches_dir": opt(str), "state_dir": opt(str), "no_set": opt(bool),
    "set_error": opt(str), "install_error": opt(str), "site_packages": opt(str),
    "set": opt({"name": opt(str), "directory": opt(str), "manifest": anything}),
    "sglang": opt({"version": opt(str)}), "journal": opt(dict), "last_run": opt(dict), "journal_error": opt(str),
    "files": opt(mapping({"sha256": opt(str), "exists": opt(bool), "error": opt(str), "record": opt(str),
                          "in_record": opt(bool), "not_a_file": opt(bool)})),
}
IMPORT_SHAPE = {**PROBE_SHAPE, "imported": opt(bool), "missing_module": opt(str), "traceback_tail": opt(str),
                "version": opt(str), "import_s": opt(NUM), "runtime": opt(RUNTIME),
                "dflash": opt({"available": opt(bool), "error": opt(str)})}
FLAGS_SHAPE = {"python": opt(str), "found": opt(bool), "version": opt(str), "package_dir": opt(str),
               "probe_error": opt(str), "error": opt(str), "table": opt(dict)}


@collector("sglang_patches", timeout=40, shape=PATCHES_SHAPE)
def collect_sglang_patches(opts: Any) -> dict[str, Any]:
    """The profile's SGLang patch set vs the installed files: hashes, RECORD, version, journal."""
    set_name = str(((opts.profile or {}).get("patches") or {}).get("set") or "")
    out: dict[str, Any] = {"python": opts.python, "set_name": set_name, "patches_dir": patches_dir_of(opts),
                           "state_dir": getattr(opts, "state_dir", None)}
    if not set_name:
        out["no_set"] = True
        return out
    try:
        pset = manifest.resolve(set_name, patches_dir_of(opts))
    except manifest.ManifestError as exc:
        out["set_error"] = str(exc)
        return out
    out["set"] = {"name": pset.name, "directory": str(pset.directory), "manifest": pset.to_dict()}
    try:
        found = locate.locate(opts.python)
    except locate.LocateError as exc:
        out["install_error"] = str(exc)
        return out
    obs = status.observe(pset, found.installed, getattr(opts, "state_dir", None), found.package_root)
    out.update(obs)
    out["probe"] = {k: found.probe.get(k) for k in ("python", "python_version", "prefix", "package_dirs")}
    return out


SGLANG_TIMEOUT = 240.0
@collector("sglang_import", timeout=SGLANG_TIMEOUT + 5, shape=IMPORT_SHAPE)
def collect_sglang_import(opts: CollectOptions) -> dict[str, Any]:
    """SGLang imported under the service interpreter; whether DFlash's sampling kernel is available."""
    return probe_service(opts, "sglang_import", [], SGLANG_TIMEOUT)




@collector("sglang_flags", timeout=45, shape=FLAGS_SHAPE)
def collect_sglang_flags(opts: CollectOptions) -> dict[str, Any]:
    """The server flags the service interpreter's SGLang accepts (from its sources, not imported)."""
    return flags_fact(opts.python, opts.env)


IDENTITY_SHAPE = opt({"config_sha256": opt(str), "weights_sha256": opt(str)})
SITE_SHAPE = {"state_dir": opt(str), "dir": opt(str), "error": opt(str),
              "records": [{"path": str, "error": opt(str), "record": opt(dict)}],
              "host": {"machine_id": opt(str), "hostname": opt(str)},
              "model": IDENTITY_SHAPE, "drafter": IDENTITY_SHAPE}


@collector("ddtree_site", timeout=20, shape=SITE_SHAPE)
def collect_ddtree_site(opts: Any) -> dict[str, Any]:
    """The DDTree site validation records under the state directory (each read whole: its format, integrity and
    key checked, ``doctor.sglang.validation.record``), this host's identity, and the model's and drafter's
    identities as a record pins them (config.json, the safetensors index or headers)."""
    from doctor.sglang.validation.record import host_identity, model_identity, read_records

    state_dir = getattr(opts, "state_dir", None)
    found = read_records(state_dir)
    host = host_identity([])
    return {"state_dir": state_dir, "dir": found.get("dir"), "error": found.get("error"), "records": found["records"],
            "host": {"machine_id": host["machine_id"], "hostname": host["hostname"]},
            "model": model_identity(opts.model_path) if opts.model_path else None,
            "drafter": model_identity(opts.draft_model_path) if opts.draft_model_path else None}
