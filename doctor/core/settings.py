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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on py310 in tox
    import tomli as tomllib

PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"
DEFAULT_PROFILE = "b300-tp8-ddtree"
DEFAULT_CONFIG = "/etc/k26-doctor/config.toml"
CONFIG_ENV = "K26_DOCTOR_CONFIG"
DOCTOR_KEYS = {"profile", "python", "ignore", "skip", "only", "timeout", "patches_dir", "model_path",
               "draft_model_path", "tp", "strict", "deep", "state_dir", "verify_cache_dir", "disable_plugins"}


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
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {path} is not valid TOML: {exc}") from None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` wins key by key; tables merge, everything else (lists too) is replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class Settings:
    """Everything a run needs to know, resolved once."""

    profile_name: str = DEFAULT_PROFILE
    profile: dict[str, Any] = field(default_factory=dict)  # merged: profile < config tables
    config_path: str | None = None
    python: str = sys.executable
    python_given: bool = False
    model_path: str | None = None
    draft_model_path: str | None = None
    tp: int = 1
    only: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    deep: bool = False
    strict: bool = False
    timeout: float | None = None
    verbose: int = 0
    from_snapshot: str | None = None
    patches_dir: str | None = None
    state_dir: str = "/var/lib/k26-doctor"
    verify_cache_dir: str | None = None
    verify_cache: bool = True
    disable_plugins: list[str] = field(default_factory=list)  # plugin entry-point names not loaded
    snapshot: dict[str, Any] | None = field(default=None, repr=False)  # with --from-snapshot

    def get(self, dotted: str, default: Any = None) -> Any:
        """A profile value by dotted path, e.g. ``settings.get("gpu.compute_capability")``."""
        node: Any = self.profile
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def world_size(self) -> int:
        """GPUs the service uses: TP x PP x DP (SGLang's EP runs inside the TP group)."""
        return self.tp * int(self.get("parallel.pp", 1) or 1) * int(self.get("parallel.dp", 1) or 1)


def resolve(flags: dict[str, Any], environ: dict[str, str] | None = None) -> Settings:
    """Merge profile, config file and command-line flags (flags given as None are absent)."""
    environ = dict(os.environ) if environ is None else environ
    config_path = flags.get("config") or environ.get(CONFIG_ENV) or None
    if config_path is None and os.path.isfile(DEFAULT_CONFIG):
        config_path = DEFAULT_CONFIG
    config: dict[str, Any] = {}
    if config_path:
        if not os.path.isfile(config_path):
            raise ConfigError(f"config file {config_path} does not exist")
        config = _read_toml(Path(config_path), "config file")
    doctor_cfg = config.pop("doctor", {}) or {}
    if not isinstance(doctor_cfg, dict):
        raise ConfigError("[doctor] in the config file must be a table")
    unknown = set(doctor_cfg) - DOCTOR_KEYS
    if unknown:
        raise ConfigError(f"unknown key(s) in [doctor]: {', '.join(sorted(unknown))}; "
                          f"known: {', '.join(sorted(DOCTOR_KEYS))}")

    def pick(name: str, default: Any = None) -> Any:
        value = flags.get(name)
        if value not in (None, (), []):
            return value
        if name in doctor_cfg:
            return doctor_cfg[name]
        return default

    profile_name = pick("profile", DEFAULT_PROFILE)
    profile = deep_merge(load_profile(profile_name), config)
    tp = pick("tp", profile.get("parallel", {}).get("tp", 1))
    try:
        tp = int(tp)
    except (TypeError, ValueError):
        raise ConfigError(f"tp must be an integer, got {tp!r}") from None
    if tp < 1:
        raise ConfigError(f"tp must be >= 1, got {tp}")
    timeout = pick("timeout")
    if timeout is not None:
        try:
            timeout = float(timeout)
        except (TypeError, ValueError):
            raise ConfigError(f"timeout must be a number of seconds, got {timeout!r}") from None
        if timeout <= 0:
            raise ConfigError("timeout must be positive")
    python = pick("python")
    model_path = pick("model_path", profile.get("model", {}).get("path"))
    draft = pick("draft_model_path", profile.get("drafter", {}).get("path"))
    # The lists from config and flags add up: an ignore in the config stays ignored.
    def merged_list(name: str) -> list[str]:
        items = list(doctor_cfg.get(name) or []) + list(flags.get(name) or [])
        if not all(isinstance(i, str) for i in items):
            raise ConfigError(f"{name} must be a list of check ids or globs")
        return list(dict.fromkeys(items))

    return Settings(
        profile_name=str(profile.get("name", profile_name)),
        profile=profile,
        config_path=config_path,
        python=os.path.expanduser(python) if python else sys.executable,
        python_given=bool(python),
        model_path=os.path.expanduser(model_path) if model_path else None,
        draft_model_path=os.path.expanduser(draft) if draft else None,
        tp=tp,
        only=merged_list("only"),
        skip=merged_list("skip"),
        ignore=merged_list("ignore"),
        deep=bool(pick("deep", False)),
        strict=bool(pick("strict", False)),
        timeout=timeout,
        verbose=int(flags.get("verbose") or 0),
        from_snapshot=flags.get("from_snapshot"),
        patches_dir=pick("patches_dir"),
        state_dir=pick("state_dir", "/var/lib/k26-doctor"),
        verify_cache_dir=pick("verify_cache_dir"),
        verify_cache=not bool(flags.get("no_verify_cache")),
        disable_plugins=merged_list("disable_plugins"),
    )
