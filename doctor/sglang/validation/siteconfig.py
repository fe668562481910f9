"""The running configuration a site validation record pins, re-derived from the doctor's facts as the patched
server's ``ddtree_site.running_configuration`` derives it at argument resolution.

Each key from the fact it comes from: the start-up gate's keys (``doctor.sglang.ddtree.server_configuration``);
``ep_size``, ``moe_a2a_backend``, ``attn_cp_size``, ``enable_prefill_cp`` and ``ddtree_budget`` from the server
argv the launcher builds, read as SGLang's parser reads it (its defaults where a flag is absent); ``gpu_name``,
``gpu_count`` and ``driver`` from ``nvml`` (the GPUs the service sees); ``cuda`` (torch's), ``triton``,
``sglang_kernel`` and ``flashinfer`` from ``stack``; ``patch_set`` from the profile and ``patched_files`` (the
installed files the set touches, hashed) from ``sglang_patches``; ``model`` and ``drafter`` from ``ddtree_site``.
A key whose fact is missing is ``unread`` (with why), never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from doctor.core.settings import ConfigError, Settings
from doctor.sglang import ddtree
from doctor.sglang.validation.record import site_keys
from doctor.stack.distributions import installed_dist

SITE_ARGS = {"ep_size": True, "moe_a2a_backend": True, "attn_cp_size": True, "enable_prefill_cp": False,
             "speculative_ddtree_budget": True}
"""The server arguments beyond the gate's that a record pins: argparse ``dest`` -> whether it takes a value."""
ARG_DEFAULTS = {"ep_size": 1, "moe_a2a_backend": "none", "attn_cp_size": 1, "enable_prefill_cp": False,
                "speculative_ddtree_budget": None}
"""SGLang 0.5.23's defaults of ``SITE_ARGS`` (tests/test_ddtree_site_gate.py holds them to its parser)."""
STACK_DISTS = {"triton": "triton", "sglang_kernel": "sglang_kernel", "flashinfer": "flashinfer"}

Reader = Callable[[str], Any]


def argv_site_keys(args: list[str], problem: ConfigError | None, options: Mapping[str, str]
                   ) -> tuple[dict[str, Any], dict[str, str]]:
    keys = ("ep_size", "moe_a2a_backend", "attn_cp_size", "enable_prefill_cp", "ddtree_budget")
    if problem is not None:
        return {}, dict.fromkeys(keys, f"the server arguments cannot be built: {problem}")
    # the budget flag exists only with the patch set applied: the release's option table has it not
    options = {**options, "--speculative-ddtree-budget": "speculative_ddtree_budget"}
    given = {**ARG_DEFAULTS, **ddtree.gate_args(args, options, SITE_ARGS)}
    values: dict[str, Any] = {"moe_a2a_backend": given["moe_a2a_backend"],
                              "enable_prefill_cp": bool(given["enable_prefill_cp"])}
    unread: dict[str, str] = {}
    for key, dest in (("ep_size", "ep_size"), ("attn_cp_size", "attn_cp_size"),
                      ("ddtree_budget", "speculative_ddtree_budget")):
        value = given[dest]
        try:
            values[key] = None if value is None else int(value)
        except ValueError:
            unread[key] = f"--{dest.replace('_', '-')} {value!r} is not an integer (see sglang.flags)"
    return values, unread


def gpu_site_keys(nvml: Any) -> tuple[dict[str, Any], dict[str, str]]:
    keys = ("gpu_name", "gpu_count", "driver")
    if not isinstance(nvml, dict) or not nvml.get("available"):
        return {}, dict.fromkeys(keys, "no GPU reading (the nvml fact; see gpu.driver)")
    devices = [d for d in nvml.get("devices") or [] if isinstance(d, dict)]
    if not devices:
        return {}, dict.fromkeys(keys, "no GPU visible (see gpu.count)")
    return {"gpu_name": devices[0].get("name"), "gpu_count": len(devices),
            "driver": nvml.get("driver_version")}, {}


def gpu_uuids(nvml: Any) -> list[str]:
    devices = nvml.get("devices") if isinstance(nvml, dict) else None
    return [str(d["uuid"]) for d in devices or [] if isinstance(d, dict) and d.get("uuid")]


def stack_site_keys(stack: Any) -> tuple[dict[str, Any], dict[str, str]]:
    keys = ("cuda", *STACK_DISTS)
    if not isinstance(stack, dict) or not stack.get("ok"):
        return {}, dict.fromkeys(keys, "the service's interpreter could not be read (the stack fact)")
    values: dict[str, Any] = {}
    for key, component in STACK_DISTS.items():
        dist = installed_dist(stack, component)
        values[key] = str(dist["version"]) if dist and dist.get("version") else None
    torch = stack.get("torch") if isinstance(stack.get("torch"), dict) else {}
    version_py = torch.get("version_py") if isinstance(torch.get("version_py"), dict) else {}
    values["cuda"] = version_py.get("cuda")
    return values, {}


def patch_site_keys(patches: Any, settings: Settings) -> tuple[dict[str, Any], dict[str, str]]:
    name = str(settings.patches.set or "") or None
    if not isinstance(patches, dict):
        return {"patch_set": name}, {"patched_files": "the installed patched files were not read (sglang_patches)"}
    files = patches.get("files")
    if not isinstance(files, dict) or not files:
        why = patches.get("install_error") or patches.get("set_error") or "no file of the set was hashed"
        return {"patch_set": name}, {"patched_files": f"the installed patched files were not read: {why}"}
    return {"patch_set": name, "patched_files": {str(p): (f or {}).get("sha256") for p, f in sorted(files.items())}}, {}


def model_site_keys(site: Any) -> tuple[dict[str, Any], dict[str, str]]:
    if not isinstance(site, dict):
        return {}, dict.fromkeys(("model", "drafter"), "the model's identity was not read (the ddtree_site fact)")
    values: dict[str, Any] = {}
    unread: dict[str, str] = {}
    for role in ("model", "drafter"):
        ident = site.get(role)
        if isinstance(ident, dict) and ident.get("config_sha256"):
            values[role] = {"config_sha256": ident.get("config_sha256"), "weights_sha256": ident.get("weights_sha256")}
        else:
            unread[role] = f"the {role}'s config.json was not read"
    return values, unread


def site_configuration(read: Reader, planned: tuple[list[str], ConfigError | None], options: Mapping[str, str],
                       settings: Settings) -> tuple[dict[str, Any], dict[str, str]]:
    """Every key of a record's ``configuration``: ``(values, unread)``, each key in one of them."""
    values, unread = ddtree.server_configuration(read, planned, options)
    for part in (argv_site_keys(*planned, options), gpu_site_keys(read("nvml")), stack_site_keys(read("stack")),
                 patch_site_keys(read("sglang_patches"), settings), model_site_keys(read("ddtree_site"))):
        values.update(part[0])
        unread.update(part[1])
    keys = site_keys()
    return {k: values[k] for k in keys if k in values}, {k: unread[k] for k in keys if k in unread}
