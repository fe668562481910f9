"""The DDTree site validation record: what ``k26-doctor validate`` writes when DDTREE passed on this host, and
what opens the DDTREE gate (the doctor's ``sglang.ddtree`` and the patched server's ``ddtree_site.py``).

The format is defined once, as data: ``doctor/data/ddtree_site_record.schema.json`` (a JSON Schema; ``shape``
checks a record against its ``required``, ``type``, ``const``, ``enum`` and ``pattern`` here, without a
dependency). A record lives at ``<state_dir>/ddtree/validated/<key>.json``, ``key`` being the first 16 hex
digits of the sha256 of its ``configuration``'s canonical JSON; ``integrity`` is the sha256 of the whole
record's canonical JSON without it (a hand edit is seen), ``host`` names the host it was made on (the sha256 of
``/etc/machine-id``, the hostname, the GPUs' UUIDs: a record copied from another host is refused).

``model_identity`` is computed identically by the doctor and by the server (the patch set's
``ddtree_site.model_identity``; tests/test_ddtree_site_record.py keeps the two equal).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import struct
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from doctor.core.fileio import atomic_write, describe_error, read_capped, read_or_none

KIND = "k26-doctor-ddtree-site-record"
SCHEMA_VERSION = 1
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "data" / "ddtree_site_record.schema.json"
RECORD_ENV = "SGLANG_DDTREE_SITE_RECORD"
"""The variable ``launch`` sets to the matching record's path; the patched server opens the gate on it alone."""
MAX_RECORD = 4 << 20
MAX_HEADER = 100 << 20  # a safetensors header larger than this is not one


@cache
def schema() -> dict[str, Any]:
    """The record's JSON Schema (package data)."""
    return json.loads(read_capped(SCHEMA_FILE, 1 << 20, "the record schema"))


def site_keys() -> tuple[str, ...]:
    """Every key of a record's ``configuration``, in the schema's order."""
    return tuple(schema()["properties"]["configuration"]["required"])


SERVER_ONLY_SKIPS = ("patch_set",)
"""Keys the patched server does not re-derive (the set's name; its content is ``patched_files``)."""


def records_dir(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / "ddtree" / "validated"


def canonical(value: Any) -> bytes:
    """The canonical JSON every hash here is taken over: sorted keys, no spaces, ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def config_key(configuration: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(dict(configuration))).hexdigest()[:16]


def integrity_of(record: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical({k: v for k, v in record.items() if k != "integrity"})).hexdigest()


def seal(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its ``key`` and ``integrity``."""
    out = {k: v for k, v in record.items() if k != "integrity"}
    out["key"] = config_key(out["configuration"])
    out["integrity"] = integrity_of(out)
    return out


# ------------------------------------------------------------------------------------------------ shape


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _type_ok(value: Any, kinds: str | list[str]) -> bool:
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind != "integer" and isinstance(value, _TYPES[kind]) and (kind == "boolean" or not isinstance(value, bool)):
            return True
    return False


def _check_object(value: dict[str, Any], node: Mapping[str, Any], where: str, problems: list[str]) -> None:
    """An object's required keys, then each key against its property's schema (or ``additionalProperties``):
    kept apart from ``_check`` so each kind of node is checked on its own."""
    props = node.get("properties") or {}
    for key in node.get("required") or ():
        if key not in value:
            problems.append(f"{where}.{key} is missing")
    for key, sub in value.items():
        if key in props:
            _check(sub, props[key], f"{where}.{key}", problems)
        elif node.get("additionalProperties") is False:
            problems.append(f"{where}.{key} is not a key of the format")
        elif isinstance(node.get("additionalProperties"), dict):
            _check(sub, node["additionalProperties"], f"{where}.{key}", problems)


def _check(value: Any, node: Mapping[str, Any], where: str, problems: list[str]) -> None:
    if "$ref" in node:
        node = schema()["$defs"][node["$ref"].rsplit("/", 1)[1]]
    if "const" in node and value != node["const"]:
        problems.append(f"{where} is {value!r}, not {node['const']!r}")
        return
    if "enum" in node and value not in node["enum"]:
        problems.append(f"{where} is {value!r}, not one of {', '.join(map(str, node['enum']))}")
        return
    if "type" in node and not _type_ok(value, node["type"]):
        problems.append(f"{where} is {type(value).__name__}, not {node['type']}")
        return
    if "pattern" in node and isinstance(value, str) and not re.search(node["pattern"], value):
        problems.append(f"{where} {value!r} does not match {node['pattern']}")
    if isinstance(value, dict):
        _check_object(value, node, where, problems)
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, sub in enumerate(value):
            _check(sub, node["items"], f"{where}[{i}]", problems)


def shape_problems(record: Any) -> list[str]:
    """What in ``record`` does not follow the schema ([] for a well-formed record)."""
    problems: list[str] = []
    _check(record, schema(), "record", problems)
    return problems


# ------------------------------------------------------------------------------------------------ identities


def sha256_file(path: str | os.PathLike[str], limit: int = 64 << 20) -> str | None:
    data = read_or_none(path, limit)
    return hashlib.sha256(data).hexdigest() if data is not None else None


def safetensors_header(path: Path) -> bytes | None:
    """The JSON header of a safetensors file (its first 8 bytes: the header's length, little-endian)."""
    try:
        with open_regular_binary(path) as fh:
            head = fh.read(8)
            if len(head) != 8:
                return None
            (size,) = struct.unpack("<Q", head)
            if size > MAX_HEADER:
                return None
            return fh.read(size)
    except OSError:
        return None


def open_regular_binary(path: Path) -> Any:
    from doctor.core.fileio import open_regular

    return open_regular(path)


def model_identity(path: str | os.PathLike[str] | None) -> dict[str, str | None]:
    """``{"config_sha256", "weights_sha256"}`` of a model directory: config.json's sha256, and the sha256 of
    ``model.safetensors.index.json``, else of every ``*.safetensors`` file's name and header in name order
    (``name NUL header NUL``). Cheap (no weight is read) and computed the same way by the patched server."""
    if not path:
        return {"config_sha256": None, "weights_sha256": None}
    root = Path(path)
    index = root / "model.safetensors.index.json"
    weights = sha256_file(index)
    if weights is None:
        try:
            shards = sorted(p.name for p in root.iterdir() if p.name.endswith(".safetensors"))
        except OSError:
            shards = []
        if shards:
            h = hashlib.sha256()
            for name in shards:
                header = safetensors_header(root / name)
                h.update(name.encode() + b"\0" + (header if header is not None else b"<unreadable>") + b"\0")
            weights = h.hexdigest()
    return {"config_sha256": sha256_file(root / "config.json"), "weights_sha256": weights}


def machine_id() -> str | None:
    """The sha256 of /etc/machine-id (systemd's host identity; the id itself is not written anywhere)."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        data = read_or_none(path, 4096)
        if data and data.strip():
            return hashlib.sha256(data.strip()).hexdigest()
    return None


def normal_uuid(uuid: Any) -> str:
    """A GPU UUID as NVML writes it and as torch does (``GPU-`` prefix dropped, lower case; the patched server
    compares the GPUs only where torch's UUIDs read as UUIDs)."""
    text = str(uuid).strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def host_identity(gpu_uuids: Sequence[str]) -> dict[str, Any]:
    return {"machine_id": machine_id(), "hostname": socket.gethostname(),
            "gpu_uuids": sorted(normal_uuid(u) for u in gpu_uuids)}


# ------------------------------------------------------------------------------------------------ files


def write_record(state_dir: str | os.PathLike[str], record: dict[str, Any]) -> Path:
    """Seal and write the record atomically (tmp + fsync + rename: on a full disk nothing is half-written and
    an earlier record of the key stays whole). Raises ``OSError`` (worded by ``describe_error``)."""
    sealed = seal(record)
    problems = shape_problems(sealed)
    if problems:
        raise ValueError("the record does not follow its format: " + "; ".join(problems))
    target = records_dir(state_dir) / f"{sealed['key']}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, json.dumps(sealed, indent=1, sort_keys=True).encode() + b"\n", 0o644)
    return target


def read_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"path", "record"}`` or ``{"path", "error"}``: unreadable, not JSON, not of the format, edited by hand
    (integrity), named for another key. Never raises for the file's content."""
    out: dict[str, Any] = {"path": str(path)}
    try:
        data = read_capped(path, MAX_RECORD, "a site validation record")
    except OSError as exc:
        out["error"] = f"unreadable: {describe_error(exc)}"
        return out
    try:
        record = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        out["error"] = f"not JSON ({exc})"
        return out
    problems = shape_problems(record)
    if problems:
        out["error"] = "not a site validation record: " + "; ".join(problems[:3])
        return out
    if record["integrity"] != integrity_of(record):
        out["error"] = ("its content does not match its integrity hash: edited after `k26-doctor validate` wrote it "
                        "(validate again instead of editing)")
        return out
    if record["key"] != config_key(record["configuration"]) or Path(path).stem != record["key"]:
        out["error"] = f"its key {record['key']} does not match its configuration or its file name"
        return out
    out["record"] = record
    return out


def read_records(state_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Every record under the state directory: ``{"dir", "records": [read_record(...)], "error"}``."""
    if not state_dir:
        return {"dir": None, "records": [], "error": "no state directory"}
    folder = records_dir(state_dir)
    out: dict[str, Any] = {"dir": str(folder), "records": []}
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json") and not p.name.startswith("."))
    except FileNotFoundError:
        return out
    except OSError as exc:
        out["error"] = f"{folder}: {describe_error(exc)}"
        return out
    out["records"] = [read_record(folder / name) for name in names[:256]]
    return out


# ------------------------------------------------------------------------------------------------ matching


def shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {str(v)[:12] if v else v}" for k, v in sorted(value.items())) + "}"
    return str(value)


def differences(running: Mapping[str, Any], validated: Mapping[str, Any], keys: Sequence[str] | None = None
                ) -> list[str]:
    """``ddtree_budget 32 (validated: 16)`` for every key that differs; a file map names the files."""
    out = []
    for key in keys if keys is not None else site_keys():
        if key not in running:
            continue
        mine, theirs = running.get(key), validated.get(key)
        if mine == theirs:
            continue
        if isinstance(mine, dict) and isinstance(theirs, dict) and key == "patched_files":
            changed = sorted(p for p in set(mine) | set(theirs) if mine.get(p) != theirs.get(p))
            out.append(f"patched_files: {', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''} changed")
        elif isinstance(mine, dict) and isinstance(theirs, dict):
            changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            out.append(f"{key} {', '.join(changed)} differ (another {key} or its files changed)")
        else:
            out.append(f"{key} {shown(mine)} (validated: {shown(theirs)})")
    return out


def host_problem(record: Mapping[str, Any], host: Mapping[str, Any]) -> str | None:
    """Why the record was not made on this host (None: it was): machine id, else hostname; the GPUs' UUIDs."""
    theirs = record.get("host") or {}
    if theirs.get("machine_id") and host.get("machine_id"):
        if theirs["machine_id"] != host["machine_id"]:
            return (f"it was made on another host ({theirs.get('hostname')}, another /etc/machine-id): a record "
                    "holds only for the host that made it")
    elif theirs.get("hostname") != host.get("hostname"):
        return f"it was made on host {theirs.get('hostname')!r}, this is {host.get('hostname')!r}"
    mine = sorted(normal_uuid(u) for u in host.get("gpu_uuids") or [])
    if mine and sorted(theirs.get("gpu_uuids") or []) != mine:
        return "it was made with other GPUs (their UUIDs differ from the ones the service sees)"
    return None


def nearest(running: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The record whose configuration differs from ``running`` in the fewest keys (the newest of equals)."""
    if not records:
        return None
    ordered = sorted(records, key=lambda r: str(r.get("date") or ""), reverse=True)
    return min(ordered, key=lambda r: len(differences(running, r.get("configuration") or {})))
