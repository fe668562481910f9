"""The DDTree start-up gate (sglang.ddtree), judged before a start as the patched SGLang judges it at argument
resolution: ``--speculative-algorithm DDTREE`` starts only on a site validation record of this host whose every
key equals the running configuration (``k26-doctor validate`` writes it; ``doctor.sglang.validation``; the
server reads the one ``SGLANG_DDTREE_SITE_RECORD`` names, or every record of that directory), or in any
configuration with SGLANG_DDTREE_UNVALIDATED_WORKER=1 (exactly ``1``: validation runs), else it stops with
``NotImplementedError``. The patch set's ``validated`` list (``ddtree_worker.VALIDATED``) says where the set
itself was shown; it no longer opens the gate on its own.

The configuration is what the patched ``ddtree_worker.server_configuration`` computes, each key from the facts it
comes from: ``sglang`` (SGLang's version) and ``torch`` (its release, without ``+cuXXX``) from the ``stack`` fact
of the service's interpreter; ``tp_size``, ``attention_backend``, ``cuda_graph`` (neither
``--disable-cuda-graph`` nor ``--disable-decode-cuda-graph``) and ``overlap_schedule`` (no
``--disable-overlap-schedule``) from the server arguments the launcher builds, read as argparse reads them;
``compute_capability`` of GPU 0 the service sees from ``nvml``. A key whose fact is missing is not judged, and
the gate is then never a pass.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from typing import Any

from doctor.core.registry import Applicability
from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import ConfigError, Settings
from doctor.gpu import group, links
from doctor.sglang.facts import patches_dir_of
from doctor.sglang.flag_history import load_history
from doctor.sglang.patching import manifest
from doctor.stack.distributions import has_sglang, installed_dist

GATE = "SGLANG_DDTREE_UNVALIDATED_WORKER"

CONFIG_KEYS = ("sglang", "tp_size", "attention_backend", "cuda_graph", "overlap_schedule", "compute_capability",
               "torch")
"""What a validated configuration pins: the patched ``ddtree_worker.CONFIG_KEYS``, in its order (the server's
refusal lists them so; tests/test_ddtree_gate_check.py keeps the two equal)."""

GATE_ARGS = {"tp_size": True, "attention_backend": True, "disable_cuda_graph": False,
             "disable_decode_cuda_graph": False, "disable_overlap_schedule": False}
"""The server arguments ``server_configuration`` reads: argparse ``dest`` -> whether the flag takes a value."""

ARGV_KEYS = ("tp_size", "attention_backend", "cuda_graph", "overlap_schedule")
NOT_INSTALLED = ("sglang", "torch")  # None there: the service's interpreter has no such distribution

Reader = Callable[[str], Any]  # a declared fact by name, None when not recorded (``ctx.optional``)


def gate_args(args: list[str], options: Mapping[str, str], wanted: Mapping[str, bool] | None = None
              ) -> dict[str, Any]:
    """The ``GATE_ARGS`` (or ``wanted``: dest -> takes a value) an argv sets, as SGLang's argparse parser reads
    them: an option string of the release
    (``options``: option -> dest, aliases such as ``--tensor-parallel-size`` included), ``--opt=value``, a unique
    prefix (``allow_abbrev``); the last one of a dest wins. A switch is True when given."""
    table = GATE_ARGS if wanted is None else wanted
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("--"):
            continue
        name, eq, inline = arg.partition("=")
        dest = options.get(name)
        if dest is None:
            hits = [o for o in options if o.startswith(name)]
            dest = options[hits[0]] if len(hits) == 1 else None
        if dest not in table:
            continue
        if not table[dest]:
            if not eq:  # argparse refuses a value given to a switch ("ignored explicit argument"): sglang.flags
                out[dest] = True
        elif eq:
            out[dest] = inline
        elif i < len(args):
            out[dest] = args[i]
            i += 1
    return out


def release_options(pset: manifest.PatchSet) -> dict[str, str]:
    """The option strings of the newest SGLang release the set is made for (``doctor/data/sglang_flag_history.json``;
    DDTREE exists only with the set applied, and another release differs in ``sglang`` anyway)."""
    history = load_history()
    supported = [r for r in history.releases if pset.supports(r)]
    return history.options_at((supported or list(history.releases))[-1])


def argv_keys(args: list[str], problem: ConfigError | None, options: Mapping[str, str]
              ) -> tuple[dict[str, Any], dict[str, str]]:
    """``tp_size``, ``attention_backend``, ``cuda_graph``, ``overlap_schedule`` of the server argv, as
    ``server_configuration`` computes them from the parsed arguments (SGLang's defaults where a flag is absent:
    TP 1, no backend, graphs and the overlap scheduler on); ``problem``: why the argv cannot be built."""
    if problem is not None:
        return {}, dict.fromkeys(ARGV_KEYS, f"the server arguments cannot be built: {problem}")
    given = gate_args(args, options)
    values: dict[str, Any] = {"attention_backend": given.get("attention_backend"),
                              "cuda_graph": not (given.get("disable_cuda_graph") or
                                                 given.get("disable_decode_cuda_graph")),
                              "overlap_schedule": not given.get("disable_overlap_schedule")}
    unread: dict[str, str] = {}
    try:
        values["tp_size"] = (int(given["tp_size"]) if "tp_size" in given else 1) or 1
    except ValueError:
        unread["tp_size"] = f"--tp-size {given['tp_size']!r} is not an integer (see sglang.flags)"
    return values, unread


def stack_keys(stack: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """``sglang`` and ``torch`` as the server reads them (``sglang._version``; ``torch.__version__`` up to its
    ``+``), from the ``stack`` fact: SGLang's distribution metadata, ``torch/version.py`` (else torch's metadata).
    None: not installed."""
    if stack is None:
        return {}, dict.fromkeys(NOT_INSTALLED, "the stack fact is not recorded")
    if not isinstance(stack, dict) or not stack.get("ok"):
        why = stack.get("error") if isinstance(stack, dict) else None
        return {}, dict.fromkeys(NOT_INSTALLED, f"the service's interpreter could not be read ({why or 'no reading'}"
                                                "; see python.venv)")
    values: dict[str, Any] = {}
    unread: dict[str, str] = {}
    sglang = installed_dist(stack, "sglang")
    if has_sglang(stack) is False:
        values["sglang"] = None
    elif sglang and sglang.get("version"):
        values["sglang"] = str(sglang["version"])
    else:
        unread["sglang"] = "SGLang is on the path without distribution metadata to read its version from"
    torch = stack.get("torch") if isinstance(stack.get("torch"), dict) else {}
    version_py = torch.get("version_py") if isinstance(torch.get("version_py"), dict) else {}
    version = version_py.get("__version__") or (installed_dist(stack, "torch") or {}).get("version")
    if not torch and installed_dist(stack, "torch") is None:
        values["torch"] = None
    elif version:
        values["torch"] = str(version).split("+", 1)[0]
    else:
        unread["torch"] = "torch's version was not read (torch/version.py, its metadata)"
    return values, unread


def gpu_key(nvml: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """``compute_capability``: ``"major.minor"`` of GPU 0 the service sees (``torch.cuda.get_device_capability()``
    in the launching process), from ``nvml``."""
    if not isinstance(nvml, dict):
        return {}, {"compute_capability": "no GPU reading is recorded (the nvml fact)"}
    if not nvml.get("available"):
        return {}, {"compute_capability": "NVML is not available (see gpu.driver)"}
    devices = links.group(nvml, 1)
    if not devices:
        return {}, {"compute_capability": "no GPU visible (see gpu.count)"}
    first = devices[0]
    cc = group.compute_capability(first.get("compute_capability"))
    if cc is None:
        return {}, {"compute_capability": f"the compute capability of {group.label(first)} was not read"}
    return {"compute_capability": f"{cc[0]}.{cc[1]}"}, {}


def server_configuration(read: Reader, planned: tuple[list[str], ConfigError | None], options: Mapping[str, str]
                         ) -> tuple[dict[str, Any], dict[str, str]]:
    """The configuration the patched server will compute: ``(values, unread)``, every key of ``CONFIG_KEYS`` in
    one of them (``unread``: why it cannot be known from the facts)."""
    values: dict[str, Any] = {}
    unread: dict[str, str] = {}
    for part in (stack_keys(read("stack")), argv_keys(*planned, options), gpu_key(read("nvml"))):
        values.update(part[0])
        unread.update(part[1])
    return {k: values[k] for k in CONFIG_KEYS if k in values}, {k: unread[k] for k in CONFIG_KEYS if k in unread}


def validated_entry(config: Mapping[str, Any], table: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    """The first entry whose every ``CONFIG_KEYS`` value equals ``config``'s (the patched ``validated_entry``)."""
    for entry in table:
        if all(k in entry and entry[k] == config.get(k) for k in CONFIG_KEYS):
            return entry
    return None


def shown(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "(auto)" if key == "attention_backend" else "not installed" if key in NOT_INSTALLED else "none"
    return str(value)


def differences(values: Mapping[str, Any], entry: Mapping[str, Any]) -> list[str]:
    """``tp_size 8 (validated: 1)`` for every key read that differs from the entry."""
    return [f"{k} {shown(k, values[k])} (validated: {shown(k, entry.get(k))})"
            for k in CONFIG_KEYS if k in values and (k not in entry or entry[k] != values[k])]


def nearest(values: Mapping[str, Any], table: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    """The entry the keys read differ least from (the first of equals), None for an empty table."""
    return min(table, key=lambda e: len(differences(values, e))) if table else None


def entry_label(entry: Mapping[str, Any]) -> str:
    """Where an entry was shown: ``2026-12-01 on NVIDIA H200 (driver ...), run validate-graph-4 (call 4)``."""
    gpu = str(entry.get("gpu") or "an unnamed GPU").split(",")[0]
    run = str(entry.get("run") or "no run named").split(":")[0]
    return f"{entry.get('date') or 'undated'} on {gpu}, run {run}"


def describe(config: Mapping[str, Any]) -> str:
    """A configuration as the server's refusal lists it (``sglang='0.5.23', tp_size=1, ...``)."""
    return ", ".join(f"{k}={config.get(k)!r}" for k in CONFIG_KEYS)


def refusal(config: Mapping[str, Any], table: tuple[dict[str, Any], ...], set_name: str) -> str:
    """The patched ``check_ddtree_worker_available``'s message for ``config`` (every key known)."""
    listed = "; ".join(describe(e) for e in table) if table else "none yet"
    return (f"DDTREE: this revision of the {set_name} patch set starts only in a configuration validated inside a "
            f"real server (VALIDATED in speculative/ddtree_worker.py: {listed}); this one is not "
            f"({describe(config)}). Serve with --speculative-algorithm DFLASH, or set {GATE}=1 only to validate it "
            "on a real host (compare outputs with a non-speculative server).")


def not_judged(unread: Mapping[str, str]) -> str:
    """``sglang, torch (the stack fact is not recorded); compute_capability (...)``: keys grouped by reason."""
    by_reason: dict[str, list[str]] = {}
    for key, why in unread.items():
        by_reason.setdefault(why, []).append(key)
    return "; ".join(f"{', '.join(keys)} ({why})" for why, keys in by_reason.items())


def patch_set(settings: Settings) -> manifest.PatchSet:
    """The profile's patch set, whose ``validated`` lists what the patched server starts without the opt-in."""
    name = str(settings.patches.set or "")
    if not name:
        raise NotJudged.missing("the profile launches DDTREE but names no patch set ([patches] set): no validated "
                                "configurations to judge it against (DDTREE exists only with the DDTree patch set)",
                                "Set [patches] set = \"ddtree-0.5.23\" in the config.")
    try:
        return manifest.resolve(name, patches_dir_of(settings))
    except manifest.ManifestError as exc:
        raise NotJudged.blocked(f"the validated configurations of patch set {name!r} cannot be read: {exc}",
                                "sglang.patches") from None


def validate_command(settings: Settings) -> str:
    """The command that makes this profile's record on this host."""
    argv = ["k26-doctor", "validate"]
    if settings.config_path:
        argv += ["--config", str(settings.config_path)]
    argv += ["--profile", str(settings.profile_given or settings.profile_name)]
    return shlex.join(argv)


def site_records(site: Any, nvml: Any) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The records of the ``ddtree_site`` fact that hold on this host (each with its ``path``), and those refused
    with why (unreadable, not of the format, edited by hand, made on another host or with other GPUs)."""
    from doctor.sglang.validation.record import host_problem
    from doctor.sglang.validation.siteconfig import gpu_uuids

    if not isinstance(site, dict):
        return [], []
    host = {**(site.get("host") or {}), "gpu_uuids": gpu_uuids(nvml)}
    valid: list[dict[str, Any]] = []
    refused_records: list[dict[str, str]] = []
    for item in site.get("records") or []:
        record = item.get("record") if isinstance(item, dict) else None
        why = item.get("error") if isinstance(item, dict) else "not a record"
        if record is not None and why is None:
            why = host_problem(record, host)
        if why is not None or not isinstance(record, dict):
            refused_records.append({"path": str(item.get("path")), "why": str(why)})
        else:
            valid.append({**record, "path": str(item.get("path"))})
    return valid, refused_records


def record_label(record: Mapping[str, Any]) -> str:
    """``/var/lib/k26-doctor/ddtree/validated/ab12.json (2026-12-02, pass)``."""
    return f"{record.get('path')} ({str(record.get('date') or 'undated')[:10]}, {record.get('outcome')})"


def _gate_value(env: Any) -> Any:
    """The gate variable's value in the recorded environment, None where it is not set or not recorded: kept apart
    from ``judge_gate`` so the gate's reading of its facts stays short."""
    return env["vars"].get(GATE) if isinstance(env, dict) and isinstance(env.get("vars"), dict) else None


def _records_folder(site: Any, settings: Settings) -> str:
    """The folder the site records were read from, else where they are written for this state directory: kept
    apart from ``judge_gate`` so the gate's reading of its facts stays short."""
    from doctor.sglang.validation.record import records_dir

    folder = (site or {}).get("dir") if isinstance(site, dict) else None
    return folder or str(records_dir(settings.state_dir))


def launches_ddtree(settings: Settings) -> bool:
    """The gate is judged only where the profile launches DDTREE: another algorithm never meets it."""
    return str(settings.server.speculative_algorithm or "").upper() == "DDTREE"


def _not_ddtree(settings: Settings) -> str:
    algo = str(settings.server.speculative_algorithm or "").upper()
    return f"the profile launches {algo or 'no speculative algorithm'}, not DDTREE"


GATE_APPLIES = Applicability(launches_ddtree, _not_ddtree)  # sglang.ddtree's applies_if


def gate_knowledge(settings: Settings) -> tuple[manifest.PatchSet, dict[str, str]]:
    """What the gate is judged against, read once per run (``Context.know("ddtree_gate")``): the profile's patch
    set (its ``validated`` list; ``NotJudged`` when the profile names none or it cannot be read) and the option
    strings of its SGLang release (how the server's parser reads the argv)."""
    pset = patch_set(settings)
    return pset, release_options(pset)


def judge_gate(read: Reader, planned: tuple[list[str], ConfigError | None], settings: Settings,
               knowledge: tuple[manifest.PatchSet, Mapping[str, str]]) -> Findings:
    """``read(name)``: the ``env``, ``stack``, ``nvml``, ``sglang_patches`` and ``ddtree_site`` facts, None where
    not recorded; ``planned``: the server arguments the launcher builds and why they cannot be built
    (``launcher.planned_args``); ``knowledge``: ``gate_knowledge``'s answer (read once per run, not here). The
    gate opens on a site validation record of this host whose every key equals the running configuration's
    (``doctor.sglang.validation``), or with the opt-in. Judged where the profile launches DDTREE
    (``GATE_APPLIES``, declared on the check)."""
    from doctor.sglang.validation.record import differences as record_differences
    from doctor.sglang.validation.record import nearest as nearest_record
    from doctor.sglang.validation.siteconfig import site_configuration

    pset, options = knowledge
    values, unread = site_configuration(read, planned, options, settings)
    env = read("env")
    value = _gate_value(env)
    site = read("ddtree_site")
    valid, refused_records = site_records(site, read("nvml"))
    match = None if unread else next((r for r in valid if r.get("configuration") == values), None)
    near = match or nearest_record(values, valid)
    differs = record_differences(values, near.get("configuration") or {}) if near is not None else []
    out = Findings(variable=GATE, value=value if isinstance(env, dict) else "not recorded", patch_set=pset.name,
                   configuration=values, not_judged=unread, records_dir=_records_folder(site, settings),
                   records=[{"path": r["path"], "date": r.get("date"), "outcome": r.get("outcome")} for r in valid],
                   refused_records=refused_records, validate=validate_command(settings))
    if match is not None:
        out.details["record"] = match["path"]
    elif near is not None:
        out.details.update(nearest=near["path"], differs=differs)
    if value == "1":
        return opted_in(out, match, differs, unread, near is not None)
    if match is not None:
        return validated(out, match)
    if near is not None and not differs:  # every key read matches a record; the others are not known
        raise NotJudged.missing(f"DDTREE's start-up gate not judged: {not_judged(unread)}; the keys read match the "
                                f"record {record_label(near)}", **out.details)
    return refused(out, differs, unread, has_sglang(read("stack")) is False, env_state(env, value), pset.name,
                   settings, near, refused_records)


def validated(out: Findings, record: Mapping[str, Any]) -> Findings:
    """An exact record of this host: DDTREE starts; a lossless-but-not-faster record says DFLASH is faster."""
    worth = ((record.get("figures") or {}).get("worth") or {})
    if record.get("outcome") == "lossless-not-faster":
        at = worth.get("vs_dflash_at_concurrency")
        return out.warn("sglang.ddtree.not_faster",
                        f"DDTREE starts (record {record_label(record)}), but it was lossless and NOT faster than "
                        f"DFLASH here: {at}x DFLASH's tokens/s at {worth.get('concurrency')}",
                        Remediation("Serve DFLASH, the faster choice on this host: server.speculative_algorithm = "
                                    "\"DFLASH\" in the config (or validate another budget: --budgets)."))
    return out.info("sglang.ddtree.validated", f"DDTREE starts without the opt-in: this exact configuration was "
                    f"validated on this host (record {record_label(record)})")


def env_state(env: Any, value: Any) -> str:
    """The opt-in variable as the service's environment has it, in words (it is not ``1`` here)."""
    if not isinstance(env, dict):
        return f"{GATE}=1 not recorded (the env fact)"
    if value is None:
        return f"{GATE}=1 not set"
    return f"{GATE}={value!r} set, which the gate does not take (exactly 1 opens it)"


def opted_in(out: Findings, record: Mapping[str, Any] | None, differs: list[str], unread: Mapping[str, str],
             any_record: bool) -> Findings:
    """The opt-in is set: the server starts DDTREE whatever the configuration; say whether a record holds."""
    head = f"{GATE}=1: the patched SGLang starts DDTREE in any configuration, validated or not"
    if record is not None:
        return out.warn("sglang.ddtree.opted_in", f"{head}; this one is validated ({record_label(record)}): the "
                        "opt-in is not needed",
                        f"Remove {GATE}=1 from the service's environment: the gate then opens on the record alone "
                        "and refuses, at start, any configuration that differs from it.")
    if not any_record:
        state = "no record of this host holds for this one: none made yet"
    elif differs:
        state = f"no record of this host holds for this one: {', '.join(differs)}"
    else:
        state = f"whether a record holds is not judged: {not_judged(unread)}"
    return out.warn("sglang.ddtree.opted_in", f"{head}; {state}",
                    f"The opt-in is for validation runs only: `{out.details.get('validate')}` proves this "
                    "configuration on this host and writes the record that opens the gate without it.")


def refused(out: Findings, differs: list[str], unread: Mapping[str, str], no_sglang: bool, gate: str,
            set_name: str, settings: Settings, near: Mapping[str, Any] | None,
            refused_records: list[dict[str, str]]) -> Findings:
    """No record of this host holds for this configuration, no opt-in: the server stops at argument resolution,
    after its imports. Without SGLang at all that comes first."""
    command = str(out.details.get("validate"))
    bad = "; ".join(f"{r['path']} refused: {r['why']}" for r in refused_records[:3])
    if near is None:
        what = (f"no site validation record of this host under {out.details.get('records_dir')}"
                + (f" ({bad})" if bad else ""))
    else:
        what = f"this configuration differs from the nearest record {record_label(near)}: {', '.join(differs)}"
        if bad:
            what += f" ({bad})"
    tail = f"; not judged: {not_judged(unread)}" if unread and near is not None else ""  # (details: not_judged)
    if no_sglang:
        summary = f"DDTREE needs SGLang with the {set_name} patch set (not installed), and {what}"
        first = f"Install SGLang and apply the {set_name} patch set (sglang.install, sglang.patches). Then: "
    else:
        summary = (f"the patched SGLang refuses DDTREE at start: it opens only on a site validation record of this "
                   f"exact configuration, and {what}{tail}; {gate}")
        first = ""
    return out.fail(
        "sglang.ddtree.refused", summary,
        Remediation(f"{first}Prove DDTREE in this configuration on this host: `{command}` starts the base, DFLASH and "
                    "DDTREE servers one after another as `launch` would, compares their outputs (greedy identity, "
                    "the sampled distribution, refusals) and speed, and writes the record that opens the gate "
                    "(its cost is the server starts; it says the expected duration first). Or serve the DFlash "
                    "chain: server.speculative_algorithm = \"DFLASH\" in the config.",
                    [command]))
