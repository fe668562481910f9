"""Profiles, the TOML config file and flags, merged into one ``Settings``: flags > config > profile.

Profiles are data files shipped in ``doctor/profiles/``. A config file has the same tables as a
profile (they override it key by key) plus a ``[doctor]`` table for the run itself::

    [doctor]
    profile = "b300-tp8-ddtree"
    python = "/opt/k26/venv/bin/python"
    ignore = ["gpu.health"]          # reported as warn, never hidden
    skip = ["host.port"]
    timeout = 30
    patches_dir = "/etc/k26-doctor/patches"
    disable_plugins = ["site"]       # plugin entry points not loaded (also $K26_DOCTOR_DISABLE_PLUGINS)

    [model]
    path = "/data/Kimi-K2.6"
"""

from __future__ import annotations

import copy
import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from doctor.core.datafile import DataFileError, read_toml
from doctor.core.profile import ProfileTables

PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"
DEFAULT_PROFILE = "b300-tp8-ddtree"
DEFAULT_CONFIG = "/etc/k26-doctor/config.toml"
CONFIG_ENV = "K26_DOCTOR_CONFIG"
DEFAULT_STATE_DIR = "/var/lib/k26-doctor"
MAX_CONFIG_NUMBER = 1e9  # the profile's sizes and thresholds (GiB, fractions): a billion is none of them
MAX_SECONDS = 7 * 24 * 3600  # a week: no wait, deadline, interval or start of the doctor's is longer (a typo is)
MAX_COUNT = 2**31 - 1  # what a C int holds: every count the doctor passes on (SGLang's flags, systemd's values)
MAX_PARALLEL = 4096  # GPUs of one parallel group: far beyond any cluster's TP x PP x DP


class ConfigError(Exception):
    """Invalid invocation or configuration: exit code 2."""


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def load_profile(name: str) -> dict[str, Any]:
    """A built-in profile by name, or a profile TOML file by path."""
    path = Path(name) if name.endswith(".toml") else PROFILES_DIR / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown profile {name!r}; built-in profiles: {', '.join(profile_names())}")
    return _read_toml(path, "profile")


def _read_toml(path: Path, what: str) -> dict[str, Any]:
    """A profile, config or schema file; one the user gave that cannot be used is an invalid configuration."""
    try:
        return read_toml(path, what)
    except DataFileError as exc:
        raise ConfigError(str(exc)) from None


SCHEMA_PATH = Path(__file__).resolve().parents[1] / "data" / "config_schema.toml"
KIND_WORDS = {"str": "a string", "bool": "true or false", "int": "an integer", "posint": "an integer >= 1",
              "port": "a port number (1-65535)", "number": f"a finite number between 0 and {MAX_CONFIG_NUMBER:.0f}",
              "seconds": f"a finite number of seconds between 0 and {MAX_SECONDS}", "fraction": "a number in (0, 1]",
              "list_str": "a list of strings", "table_scalar": "a table of NAME = value (strings, numbers, booleans)",
              "path": "a non-empty path", "spec": "a version specifier such as \"==2.11.0\"",
              "host": "a host name or address (at most 253 characters, e.g. \"127.0.0.1\")"}


def schema_entries() -> dict[str, tuple[str, Any]]:
    """Dotted key -> (kind, default), from ``doctor/data/config_schema.toml``: a key is ``"kind"``, or
    ``{kind = "kind", default = value}`` (the value a profile that leaves the key out stands for; None: no default).
    ``doctor/core/profile.py``, the typed tables the code reads, is generated from these
    (``scripts/make_profile_types.py``)."""
    out: dict[str, tuple[str, Any]] = {}
    for dotted, entry in (_read_toml(SCHEMA_PATH, "config schema").get("keys") or {}).items():
        kind, default = (entry["kind"], entry.get("default")) if isinstance(entry, dict) else (entry, None)
        if default is not None and not _kind_ok(kind, default):  # a default is a value like any the profile gives
            raise ConfigError(f"config schema {SCHEMA_PATH}: the default of {dotted}, {shown(default)}, is not "
                              f"{KIND_WORDS.get(kind, kind)}")
        out[dotted] = (kind, default)
    return out


def config_schema() -> dict[str, str]:
    """Dotted key -> kind, from ``doctor/data/config_schema.toml``."""
    return {dotted: kind for dotted, (kind, _default) in schema_entries().items()}


def _text_kind_ok(kind: str, value: Any) -> bool:
    """Whether ``value`` suits a text kind (str, a non-blank path, a parseable version spec): kept apart from
    ``_kind_ok`` so its table of kinds stays one flat list."""
    if not isinstance(value, str) or (kind == "path" and not value.strip()):
        return False
    if kind == "spec" and value:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            return False
    return True


def _is_int(value: Any) -> bool:
    """An integer that is not a boolean (TOML's ``true`` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _within(low: float, high: float, *, integer: bool = False, above: bool = False) -> Callable[[Any], bool]:
    """A kind's test for a number in ``[low, high]`` (``low`` excluded with ``above``; an ``int`` with
    ``integer``): one shape for every numeric kind, and ``nan`` fails every bound."""

    def ok(value: Any) -> bool:
        if not (_is_int(value) or (not integer and isinstance(value, float))):
            return False
        return (low < value if above else low <= value) and value <= high

    return ok


def _host_ok(value: Any) -> bool:
    """What a socket can bind and a URL can hold: never a 10 MB string, a path or credentials."""
    return isinstance(value, str) and len(value) <= 253 and not re.search(r"[\s\x00-\x1f\x7f/?#@]", value)


def _list_str_ok(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def env_name_ok(name: Any) -> bool:
    """A name the kernel's environment can hold (``execve`` refuses an empty one, one with ``=`` or a NUL)."""
    return isinstance(name, str) and bool(name) and not re.search(r"[=\x00]", name)


def _table_scalar_ok(value: Any) -> bool:
    return isinstance(value, dict) and all(env_name_ok(k) and isinstance(v, (str, int, float, bool))
                                           for k, v in value.items())


def _nul_in(value: Any) -> bool:
    """Whether a NUL character is anywhere in ``value`` (its strings, a table's names): no path, argument or
    environment value can hold one, and ``execve`` raised ValueError on it at the very end of ``launch``."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_nul_in(v) for v in value)
    if isinstance(value, dict):
        return any(_nul_in(k) or _nul_in(v) for k, v in value.items())
    return False


# kind -> its test: one flat table, so a kind is added in one line. "number" is finite (inf is no deadline and no
# size: int(inf) would crash a reader of it); "seconds" is written into units (TimeoutStartSec=): never 301 digits.
_KIND_TESTS: dict[str, Callable[[Any], bool]] = {
    "host": _host_ok,
    "bool": lambda value: isinstance(value, bool),
    "int": _is_int,
    "posint": _within(1, float("inf"), integer=True),
    "port": _within(1, 65535, integer=True),
    "number": _within(0, MAX_CONFIG_NUMBER),
    "seconds": _within(0, MAX_SECONDS),
    "fraction": _within(0, 1, above=True),
    "list_str": _list_str_ok,
    "table_scalar": _table_scalar_ok,
}


def _kind_ok(kind: str, value: Any) -> bool:
    """Whether ``value`` suits the schema's ``kind``; a kind the table does not know accepts anything."""
    if kind in ("str", "path", "spec"):
        return _text_kind_ok(kind, value)
    test = _KIND_TESTS.get(kind)
    return test(value) if test else True


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a message that names a value (a 10 MB one included)."""
    head = value[: limit * 2] if isinstance(value, (str, bytes)) else value
    text = repr(head)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} long)" if isinstance(value, (str, bytes, list, dict)) else ""
    # a word cut in half keeps at most its first 4 characters: a token cut (a JWT, an AWS key id) no longer has
    # the shape the redaction knows, so what is shown of it must be no more than its public prefix ("eyJh", "AKIA")
    head = re.sub(r"([A-Za-z0-9_+/=.:%-]{4})[A-Za-z0-9_+/=.:%-]+$", r"\1", text[: limit - 12])
    return f"{head}...{size}"


def validate_profile(merged: dict[str, Any], config: dict[str, Any], config_path: str | None,
                     profile_name: str) -> None:
    """Every known key of the merged profile/config has a value of its kind; else ``ConfigError`` (exit 2)
    naming the table, the key, the value and where it came from."""
    schema = config_schema()
    _tables_are_tables(merged, config, config_path, profile_name, schema)
    for dotted, kind in schema.items():
        node: Any = merged
        from_config: Any = config
        for part in dotted.split("."):
            node = node.get(part, MISSING) if isinstance(node, dict) else MISSING
            from_config = from_config.get(part, MISSING) if isinstance(from_config, dict) else MISSING
        if node is MISSING or (_kind_ok(kind, node) and not _nul_in(node)):
            continue
        table, _, key = dotted.rpartition(".")
        where = f"config file {config_path}" if from_config is not MISSING else f"profile {profile_name}"
        if _nul_in(node):
            raise ConfigError(f"invalid configuration: [{table}] {key} in the {where} holds a NUL character: no "
                              "path, argument or environment value can")
        if kind == "table_scalar" and isinstance(node, dict):  # name the entry, never the whole table's values
            bad = next(k for k, v in node.items() if not _kind_ok("table_scalar", {k: v}))
            if not env_name_ok(bad):
                raise ConfigError(f"invalid configuration: [{dotted}] {shown(bad)} in the {where} is no environment "
                                  "variable name (empty, or holding '=')")
            raise ConfigError(f"invalid configuration: [{dotted}] {bad} = {shown(node[bad])} in the {where} must be "
                              "a string, a number or a boolean")
        raise ConfigError(f"invalid configuration: [{table}] {key} = {shown(node)} in the {where} must be "
                          f"{KIND_WORDS.get(kind, kind)}")


def _tables_are_tables(merged: dict[str, Any], config: dict[str, Any], config_path: str | None, profile_name: str,
                       schema: dict[str, str]) -> None:
    """A known table (``[server]``, ``[parallel]``...) given as something else (``server = "x"``, ``parallel = [8]``)
    is refused by name: the typed tables would read it as every key at its default, and in a config it would
    silently replace the whole table of the profile (its ``[server] args`` gone)."""
    tables = sorted({dotted.rpartition(".")[0] for dotted in schema if "." in dotted})
    for table in tables:
        node: Any = merged
        for part in table.split("."):
            node = node.get(part, MISSING) if isinstance(node, dict) else MISSING
        if node is MISSING or isinstance(node, dict):
            continue
        in_config = isinstance(config, dict) and table.split(".")[0] in config
        where = f"config file {config_path}" if in_config else f"profile {profile_name}"
        raise ConfigError(f"invalid configuration: {table} = {shown(node)} in the {where} must be a table "
                          f"([{table}] with its keys)")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` wins key by key; tables merge, everything else (lists too) is replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def setting(default: Any = None, *, factory: Callable[[], Any] | None = None, key: str | None = None,
            flag: str | None = None, help: str = "", kind: str = "str", config: bool = True, collect: bool = False,
            profile_key: str | None = None, high: float | None = None) -> Any:
    """A field of ``Settings`` and everything derived from it: its ``[doctor]`` config key (``config``), its
    command-line flag (``flag``, ``help``), whether collectors see it (``collect``: a ``CollectOptions`` field),
    how a value is checked (``kind``: str, path, bool, list, posint, posfloat, seconds (>= 0), count, not) and
    the profile table that gives its default (``profile_key``), and the largest value a number may take (``high``;
    default: ``MAX_COUNT`` for posint, ``MAX_SECONDS`` for durations). Adding a setting is adding one such field."""
    meta = {"key": key, "flag": flag, "help": help, "kind": kind, "config": config, "collect": collect,
            "profile_key": profile_key, "high": high, "setting": True}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Settings(ProfileTables):
    """Everything a run needs to know, resolved once (flags > config ``[doctor]`` > profile > default); the
    profile's tables are typed attributes (``settings.server.port``: ``doctor.core.profile``, generated from the
    schema). It is also what collectors are given (``CollectOptions`` is this type): ``collected()`` keeps only
    the fields marked ``collect`` (the rest at their defaults), so a fact depends on nothing a snapshot does not
    record (``to_dict``)."""

    config_path: str | None = setting(key="config", config=False, flag="--config", help=(
        "TOML config (default $K26_DOCTOR_CONFIG, else /etc/k26-doctor/config.toml)."))
    profile_name: str = setting(DEFAULT_PROFILE, key="profile", flag="--profile",
                                help=f"Deployment profile (default {DEFAULT_PROFILE}).")
    profile_given: str | None = setting(config=False)  # the profile as given (a name or a file): commands to paste
    model_path: str | None = setting(kind="path", flag="--model-path", help="Target model directory.",
                                     collect=True, profile_key="model.path")
    draft_model_path: str | None = setting(kind="path", flag="--draft-model-path", collect=True,
                                           help="Draft (DFlash) model directory.", profile_key="drafter.path")
    python: str = setting(sys.executable, kind="path", flag="--python", collect=True,
                          help="The service's interpreter (default: this one).")
    tp: int = setting(1, kind="posint", flag="--tp", collect=True, profile_key="parallel.tp", high=MAX_PARALLEL,
                      help="Tensor-parallel size (default: the profile's).")
    only: list[str] = setting(factory=list, kind="list", flag="--only",  # noqa: RUF009 (a field)
                              help="Only checks matching this glob (repeatable).")
    skip: list[str] = setting(factory=list, kind="list", flag="--skip",  # noqa: RUF009 (a field)
                              help="Skip checks matching this glob (repeatable).")
    ignore: list[str] = setting(factory=list, kind="list", flag="--ignore",  # noqa: RUF009 (a field)
                                help="Report a failure of this check as warn (repeatable).")
    deep: bool = setting(False, kind="bool", flag="--deep", collect=True,
                         help="Add the slow checks (hashing, bandwidth).")
    import_sglang: bool = setting(False, kind="bool", flag="--import-sglang", help=(
        "sglang.install imports SGLang for real, as --deep does (launch and the systemd unit always do)."))
    strict: bool = setting(False, kind="bool", flag="--strict", help="Warnings fail too.")
    while_serving: bool = setting(False, kind="bool", flag="--while-serving", help=(
        "The node's server is running: leave out the checks that judge a host before a start (gpu.idle, "
        "host.port, gpu.memory, model.fit; doctor/data/fleet.toml). For periodic runs beside the server."))
    node_pod: bool = setting(False, kind="bool", flag="--node-pod", help=(
        "Runs in a pod of its own beside the server's (the Kubernetes DaemonSet): as --while-serving, and also "
        "leaves out the checks that would judge this pod instead of the server's (host.shm, host.env, "
        "host.exposure). The checks' applies= declarations say which."))
    timeout: float | None = setting(kind="posfloat", flag="--timeout", help="Deadline per check, seconds.")
    verbose: int = setting(0, kind="count", config=False, flag="-v/--verbose", help="Details and tracebacks.")
    from_snapshot: str | None = setting(config=False, flag="--from-snapshot",
                                        help="Judge a recorded snapshot instead of this host.")
    patches_dir: str | None = setting(kind="path", flag="--patches-dir", collect=True,
                                      help="A site directory of patch sets.")
    state_dir: str = setting(DEFAULT_STATE_DIR, kind="path", flag="--state-dir", collect=True,
                             help="Where backups, journals and locks live.")
    verify_cache_dir: str | None = setting(collect=True)
    verify_cache: bool = setting(True, key="no_verify_cache", kind="not", config=False, collect=True,
                                 flag="--no-verify-cache",
                                 help="--deep: hash every file again, ignoring the verification cache.")
    wait_fabric: float | None = setting(kind="seconds", flag="--wait-fabric", help=(
        "Before judging, wait up to SECONDS for every GPU of the TP group to finish NVSwitch fabric registration "
        "(check: no wait unless given; launch: the profile's gpu.fabric_wait_s)."))
    fabric_wait_s: float = setting(0.0, kind="seconds", profile_key="gpu.fabric_wait_s")  # launch's and the unit's wait
    disable_plugins: list[str] = setting(factory=list, kind="list")  # plugin entry points not loaded  # noqa: RUF009 (a field)
    # The server's shape that memory depends on (model.fit's window; the launcher passes them to SGLang):
    context_length: int | None = setting(kind="posint", flag="--context-length", profile_key="server.context_length",
                                         help="The server's --context-length (default: the model's).")
    max_running_requests: int | None = setting(kind="posint", flag="--max-running-requests",
                                               profile_key="server.max_running_requests",
                                               help="The server's --max-running-requests.")
    cuda_graph_max_bs: int | None = setting(kind="posint", flag="--cuda-graph-max-bs",
                                            profile_key="server.cuda_graph_max_bs",
                                            help="The server's decode CUDA graphs' max batch size.")
    kv_tokens_per_request: int | None = setting(kind="posint", flag="--kv-tokens-per-request",
                                                profile_key="server.kv_tokens_per_request",
                                                help="model.fit: KV tokens every running request must find at "
                                                     "once (default: one request at the full context).")
    # Derived, not settings of their own:
    profile: dict[str, Any] = field(default_factory=dict, metadata={"collect": True})  # profile < config tables
    # recorded in a snapshot: a replay of a run that judged the doctor's own interpreter says so as the run did
    python_given: bool = field(default=False, metadata={"collect": True})
    snapshot: dict[str, Any] | None = field(default=None, repr=False)  # with --from-snapshot
    # what collectors see of the environment the doctor runs in (doctor.host.facts.service_env adds what the
    # service will get); recorded in a snapshot as the redacted fact "env", never in its options
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ), repr=False, metadata={"collect": True})

    def get(self, dotted: str, default: Any = None) -> Any:
        """A value of a site's own table by dotted path (a plugin's ``[site] rack``). The doctor's own keys are
        typed attributes of their tables (``settings.gpu.compute_capability``): ``tests/test_architecture.py``
        refuses a dotted lookup of them."""
        node: Any = self.profile
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def value_problem(self) -> str | None:
        """What is wrong with the values a check's ``applies_if`` reads (the profile's keys against their kinds,
        ``tp`` a count), or None: ``resolve`` refuses such values when it loads a config, but settings built
        another way (the doctor as a library, a test, a plugin) reach the runner unchecked, and a predicate must
        never turn a wrong type into "not applicable"."""
        if not (_is_int(self.tp) and 1 <= self.tp <= MAX_PARALLEL):
            return f"tp must be an integer between 1 and {MAX_PARALLEL}, got {shown(self.tp)}"
        if not isinstance(self.profile, dict):
            return f"the profile must be a table, got {shown(self.profile)}"
        try:
            validate_profile(self.profile, {}, None, str(self.profile_name))
        except ConfigError as exc:
            return str(exc)
        return None

    @property
    def world_size(self) -> int:
        """GPUs the service uses: TP x PP x DP (SGLang's EP runs inside the TP group)."""
        return self.tp * int(self.parallel.pp or 1) * int(self.parallel.dp or 1)

    def collected(self) -> Settings:
        """What collectors are given: the fields marked ``collect`` (``COLLECT_FIELDS``), the environment as it is
        now, everything else at its default (a fact depends only on what a snapshot records)."""
        return Settings(**{name: getattr(self, name) for name in COLLECT_FIELDS if name != "env"})

    @classmethod
    def from_settings(cls, settings: Settings) -> Settings:
        """``settings.collected()`` (the name collectors' callers have used since options were a type of their
        own)."""
        return settings.collected()

    def to_dict(self) -> dict[str, Any]:
        """The collectors' fields as JSON (a snapshot's ``options``, an isolated collector's request)."""
        return {name: copy.deepcopy(getattr(self, name)) for name in COLLECT_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        """Collectors' options from ``to_dict``'s JSON (unknown keys, from another version, left out)."""
        return cls(**{k: v for k, v in data.items() if k in COLLECT_FIELDS})


def setting_fields() -> list[Field[Any]]:
    """The fields of ``Settings`` that are settings, in the order their flags are shown."""
    return [f for f in fields(Settings) if f.metadata.get("setting")]


def key_of(f: Field[Any]) -> str:
    return f.metadata.get("key") or f.name


DOCTOR_KEYS = frozenset(key_of(f) for f in setting_fields() if f.metadata["config"])
COLLECT_FIELDS = tuple(f.name for f in fields(Settings) if f.metadata.get("collect"))




def range_words(low: float, high: float, *, integer: bool = False, above: bool = False, unit: str = "") -> str:
    """How a range is said in every message: "an integer between 1 and 64", "a number of seconds between 0
    (excluded) and 604800"."""
    def said(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else f"{x:g}"

    what = "an integer" if integer else f"a number of {unit}" if unit else "a number"
    return f"{what} between {said(low)}{' (excluded)' if above else ''} and {said(high)}"


def number(value: Any, name: str, *, low: float, high: float, integer: bool = False, above: bool = False,
           unit: str = "") -> Any:
    """``value`` read as a number in ``[low, high]`` (``low`` excluded with ``above``; an ``int`` with
    ``integer``); ``ConfigError`` (exit 2) naming ``name`` and its range otherwise. The one reading of every
    number the doctor takes, from a flag (``doctor.commands.options.Number``), the config or the profile:
    ``nan`` compares false with every bound (so it is refused by name), ``inf`` and ``1e300`` are no deadline
    (and overflow every clock they reach: ``time.monotonic() + 1e300`` is an ``OverflowError`` in a thread
    wait), a 400-digit integer is no count."""
    words = range_words(low, high, integer=integer, above=above, unit=unit)
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be {words}, got {shown(value)}")
    try:
        if integer:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            got: Any = int(value.strip()) if isinstance(value, str) else int(value)
        else:
            got = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name} must be {words}, got {shown(value)}") from None
    if got != got or got in (float("inf"), float("-inf")):
        raise ConfigError(f"{name} must be a finite number: {words}, got {shown(value)}")
    if got < low or got > high or (above and got == low):
        raise ConfigError(f"{name} must be {words}, got {shown(value)}")
    return got


def duration(value: Any, name: str, *, positive: bool = True, maximum: float = MAX_SECONDS) -> float:
    """``value`` as a number of seconds: finite, and > 0 (``positive``) or >= 0, at most ``maximum`` (a week);
    ``ConfigError`` (exit 2) otherwise. The one reading of every duration the doctor takes (``--timeout``,
    ``--wait-fabric``, ``wait-ready``/``smoke``/``launch`` timeouts and intervals, ``systemd-unit
    --start-timeout``, the config's): ``number`` with the unit "seconds"."""
    return float(number(value, name, low=0, high=maximum, above=positive, unit="seconds"))


CONFIG_TYPES = {"path": (str,), "str": (str,), "bool": (bool,), "posint": (int,), "posfloat": (int, float),
                "seconds": (int, float)}


def _convert(f: Field[Any], value: Any, source: str = "", config_path: str | None = None) -> Any:
    """A setting's value checked and converted by its kind; ``config_path``: it came from that config file's
    ``[doctor]`` table (so its TOML type is checked too). ``ConfigError`` (exit 2) naming ``source``."""
    kind, name = f.metadata["kind"], key_of(f)
    if value is None:
        return None
    want = CONFIG_TYPES.get(kind)
    if config_path and want and (not isinstance(value, want) or (bool not in want and isinstance(value, bool))):
        raise ConfigError(f"invalid configuration: [doctor] {name} = {value!r} in {config_path} must be "
                          f"{_KIND_WORD.get(kind, kind)}")
    if kind == "path":
        return _path_value(value, source or name)
    if kind == "bool":
        return bool(value)
    if kind == "posint":
        return number(value, source or name, low=1, high=f.metadata.get("high") or MAX_COUNT, integer=True)
    if kind == "seconds":
        return duration(value, source or name, positive=False, maximum=f.metadata.get("high") or MAX_SECONDS)
    if kind == "posfloat":
        return duration(value, source or name, maximum=f.metadata.get("high") or MAX_SECONDS)
    return value


def _path_value(value: Any, label: str) -> str:
    """A path setting's value: never empty (given on purpose, it is a mistake, never "not set") and never holding
    a NUL (no path can: ``execve`` and ``open`` raise ValueError on it)."""
    if not str(value).strip():
        raise ConfigError(f"{label} is empty: give a path, or leave it out")
    if "\x00" in str(value):
        raise ConfigError(f"{label} holds a NUL character: no path can")
    return os.path.expanduser(str(value))


_KIND_WORD = {"path": "a non-empty path (a string)", "str": "a string", "bool": "true or false",
              "posint": "an integer >= 1", "posfloat": "a number of seconds > 0", "seconds": "a number of seconds >= 0",
              "list": "a list of strings"}


def _state_dir_problem(path: str) -> str | None:
    """A state directory that exists but is not a directory is refused (never another one silently)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        from doctor.core.fileio import describe_error

        return f"cannot be used: {describe_error(exc)}"
    if not stat.S_ISDIR(st.st_mode):
        from doctor.core.fileio import kind_of

        return f"is {kind_of(st.st_mode)}, not a directory"
    return None


def _list_setting(name: str, from_cfg: Any, from_flags: Any, config_path: str | None) -> list[str]:
    """A list setting: the config's items then the flags' ones, deduplicated in order (an ignore in the config
    stays ignored); kept apart from ``resolve`` so each kind of setting reads on its own."""
    from_cfg = from_cfg or []
    if not isinstance(from_cfg, list):
        raise ConfigError(f"invalid configuration: [doctor] {name} = {from_cfg!r} in {config_path} must be "
                          "a list of strings (check ids or globs)")
    items = list(from_cfg) + list(from_flags or [])
    if not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{name} must be a list of check ids or globs")
    return list(dict.fromkeys(items))


def _config_path(flags: dict[str, Any], environ: dict[str, str]) -> str | None:
    """The config file of this run: ``--config``, else ``$K26_DOCTOR_CONFIG``, else the default one if present."""
    config_path = flags.get("config") or environ.get(CONFIG_ENV) or None
    if config_path is None and os.path.isfile(DEFAULT_CONFIG):
        config_path = DEFAULT_CONFIG
    return config_path


def _read_config(config_path: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the config's profile tables, its ``[doctor]`` table), read and checked: an unknown ``[doctor]`` key is
    refused by name (a typo never silently leaves a setting at its default)."""
    config: dict[str, Any] = {}
    if config_path:
        if not os.path.lexists(config_path):
            raise ConfigError(f"config file {config_path} does not exist")
        config = _read_toml(Path(config_path), "config file")  # a directory, FIFO or loop: said as such
    doctor_cfg = config.pop("doctor", {}) or {}
    if not isinstance(doctor_cfg, dict):
        raise ConfigError("[doctor] in the config file must be a table")
    unknown = set(doctor_cfg) - DOCTOR_KEYS
    if unknown:
        raise ConfigError(f"unknown key(s) in [doctor]: {', '.join(sorted(unknown))}; "
                          f"known: {', '.join(sorted(DOCTOR_KEYS))}")
    return config, doctor_cfg


def _given(value: Any) -> bool:
    """Whether a flag was given: absent flags come as ``None`` (or an empty repeatable one)."""
    return value not in (None, (), [])


def _pick(flags: dict[str, Any], doctor_cfg: dict[str, Any], name: str, default: Any = None) -> Any:
    """The flag if given, else the ``[doctor]`` key, else ``default``: the one order of precedence."""
    value = flags.get(name)
    if _given(value):
        return value
    if name in doctor_cfg:
        return doctor_cfg[name]
    return default


def _profile_default(f: Field[Any], profile: dict[str, Any]) -> Any:
    """A setting's default: its ``profile_key`` in the merged profile when that holds one, else the field's."""
    default = f.default if f.default is not MISSING else None
    if not f.metadata["profile_key"]:
        return default
    node: Any = profile
    for part in f.metadata["profile_key"].split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node if node is not None else default


def _source_of(f: Field[Any], flags: dict[str, Any], doctor_cfg: dict[str, Any], config_path: str | None) -> str:
    """Where a setting's value came from, as an error about it names it (the flag, the config key, the profile)."""
    name = key_of(f)
    if _given(flags.get(name)):
        return f.metadata["flag"] or name
    if name in doctor_cfg:
        return f"[doctor] {name} in {config_path}"
    if f.metadata["profile_key"]:
        return f"[{f.metadata['profile_key'].replace('.', '] ', 1)} in the profile/config"
    return name


def _field_value(f: Field[Any], flags: dict[str, Any], doctor_cfg: dict[str, Any], profile: dict[str, Any],
                 config_path: str | None) -> Any:
    """One setting's value, resolved by its kind: lists add up, ``not``/``count`` flags exist only on the
    command line, the rest is flag > ``[doctor]`` > profile > default, checked and converted."""
    name, kind = key_of(f), f.metadata["kind"]
    if f.name == "config_path":
        return config_path
    if kind == "list":
        return _list_setting(name, doctor_cfg.get(name), flags.get(name), config_path)
    if kind == "not":
        return not bool(flags.get(name))
    if kind == "count":
        return int(flags.get(name) or 0)
    if not f.metadata["config"]:
        return flags.get(name)
    value = _pick(flags, doctor_cfg, name, _profile_default(f, profile))
    from_config = not _given(flags.get(name)) and name in doctor_cfg
    return _convert(f, value, _source_of(f, flags, doctor_cfg, config_path), config_path if from_config else None)


def resolve(flags: dict[str, Any], environ: dict[str, str] | None = None) -> Settings:
    """Merge profile, config file and command-line flags (flags given as None are absent).

    Every field made with ``setting()`` resolves the same way: the flag if given, else the
    ``[doctor]`` key, else the profile's ``profile_key``, else the default; lists from the config and
    the flags add up (an ignore in the config stays ignored).
    """
    environ = dict(os.environ) if environ is None else environ
    config_path = _config_path(flags, environ)
    config, doctor_cfg = _read_config(config_path)
    profile_name = _pick(flags, doctor_cfg, "profile", DEFAULT_PROFILE)
    if not isinstance(profile_name, str) or not profile_name:
        raise ConfigError(f"invalid configuration: [doctor] profile = {profile_name!r} in {config_path} must be a "
                          f"profile name or a profile file; built-in profiles: {', '.join(profile_names())}")
    profile = deep_merge(load_profile(profile_name), config)
    validate_profile(profile, config, config_path, str(profile_name))
    values = {f.name: _field_value(f, flags, doctor_cfg, profile, config_path) for f in setting_fields()}
    problem = _state_dir_problem(values["state_dir"]) if values.get("state_dir") else None
    if problem:
        raise ConfigError(f"--state-dir {values['state_dir']} {problem}: give a directory (it is created if absent)")
    values["profile_name"] = str(profile.get("name", profile_name))
    values["profile_given"] = str(profile_name)
    values["python_given"] = bool(_pick(flags, doctor_cfg, "python"))
    values["python"] = values["python"] or sys.executable
    return Settings(profile=profile, **values)
