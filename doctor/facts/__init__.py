"""Facts apart from judgments.

Collectors (registered with ``doctor.registry.collector`` in the modules of this package) gather
JSON-serialisable facts from the live host: NVML readings, files, the service interpreter's
packages. Checks read them through ``ctx.fact(name)`` and judge. The same facts, recorded with
``k26-doctor snapshot``, replay any host with ``check --from-snapshot FILE``.

A fact is collected once per run, on first use, shared by every check that needs it (a lock per
fact), under the collector's deadline; an isolated collector runs in a killable child process.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import pkgutil
import re
import socket
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from doctor import __version__
from doctor.registry import COLLECTORS, Collector

SNAPSHOT_KIND = "k26-doctor-snapshot"
SNAPSHOT_SCHEMA_VERSION = 1
_NOT_COLLECTOR_MODULES = {"worker"}


@dataclass
class CollectOptions:
    """What collectors may look at: the resolved settings of this run (JSON-serialisable)."""

    python: str = sys.executable
    model_path: str | None = None
    draft_model_path: str | None = None
    tp: int = 1
    deep: bool = False
    profile: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    verify_cache: bool = True
    verify_cache_dir: str | None = None
    patches_dir: str | None = None
    state_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CollectOptions:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


class FactUnavailable(Exception):
    """A fact could not be had. ``status`` is what a check that needs it becomes.

    ``skip`` when the fact is simply not there to judge (not in a snapshot); ``error`` when its
    collector crashed or ran past its deadline (the gate fails closed).
    """

    def __init__(self, name: str, reason: str, status: str = "error") -> None:
        super().__init__(f"fact {name!r}: {reason}")
        self.name = name
        self.reason = reason
        self.status = status


def load_collectors() -> dict[str, Collector]:
    """Import every collector module of this package (each registers its collectors)."""
    from doctor.registry import LOAD_ERRORS

    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_COLLECTOR_MODULES and not info.name.startswith("_"):
            try:
                importlib.import_module(f"{__name__}.{info.name}")
            except Exception as exc:  # one broken area must not take the others' facts down
                LOAD_ERRORS[f"{__name__}.{info.name}"] = f"{type(exc).__name__}: {exc}"
    return COLLECTORS


class FactStore:
    """Facts of one run: collected live on first use, or replayed from a snapshot."""

    def __init__(self, options: CollectOptions, snapshot: dict[str, Any] | None = None) -> None:
        self.options = options
        self.snapshot = snapshot
        self._values: dict[str, Any] = {}
        self._errors: dict[str, FactUnavailable] = {}
        self._durations: dict[str, float] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        if snapshot is not None:
            for name, value in (snapshot.get("facts") or {}).items():
                if isinstance(value, dict) and "__error__" in value:
                    self._errors[name] = FactUnavailable(name, f"recorded as failed: {value['__error__']}")
                else:
                    self._values[name] = value

    @property
    def replaying(self) -> bool:
        return self.snapshot is not None

    def get(self, name: str) -> Any:
        """The fact's value; raises ``FactUnavailable`` if it cannot be had."""
        if name in self._values:
            return self._values[name]
        if name in self._errors:
            raise self._errors[name]
        if self.snapshot is not None:
            raise FactUnavailable(name, "not recorded in the snapshot", status="skip")
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name in self._values:
                return self._values[name]
            if name in self._errors:
                raise self._errors[name]
            coll = load_collectors().get(name)
            if coll is None:
                raise FactUnavailable(name, "no collector registered for it")
            start = time.monotonic()
            try:
                value = _collect_isolated(coll, self.options) if coll.isolate else coll.func(self.options)
            except FactUnavailable as exc:
                self._errors[name] = exc
                raise
            except Exception as exc:
                err = FactUnavailable(name, f"collector crashed: {type(exc).__name__}: {exc}")
                err.__cause__ = exc
                self._errors[name] = err
                raise err from exc
            finally:
                self._durations[name] = time.monotonic() - start
            self._values[name] = value
            return value

    def seed(self, name: str, value: Any) -> None:
        """Provide a fact's value up front (a recorded reading mixed with live collection, e.g. in tests)."""
        self._errors.pop(name, None)
        self._values[name] = value

    def collect_all(self, names: list[str] | None = None) -> dict[str, Any]:
        """Collect every fact (for ``snapshot``); failures are recorded, never raised."""
        out: dict[str, Any] = {}
        names = names if names is not None else sorted(load_collectors())
        threads = [threading.Thread(target=self._quiet_get, args=(n,), daemon=True) for n in names]
        for t in threads:
            t.start()
        deadline = time.monotonic() + max((COLLECTORS[n].timeout for n in names if n in COLLECTORS), default=5) + 5
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for n in names:
            if n in self._values:
                out[n] = self._values[n]
            elif n in self._errors:
                out[n] = {"__error__": self._errors[n].reason}
            else:
                out[n] = {"__error__": "collector did not finish before the deadline"}
        return out

    def _quiet_get(self, name: str) -> None:
        try:
            self.get(name)
        except FactUnavailable:
            pass
        except Exception:  # pragma: no cover - defensive
            self._errors[name] = FactUnavailable(name, traceback.format_exc(limit=1))

    def durations(self) -> dict[str, float]:
        return dict(self._durations)


def _collect_isolated(coll: Collector, options: CollectOptions) -> Any:
    """Run a collector in a child process of this interpreter, killed at its deadline."""
    from doctor.proc import run

    payload = json.dumps({"name": coll.name, "module": coll.func.__module__, "options": options.to_dict()})
    res = run([sys.executable, "-m", "doctor.facts.worker"], coll.timeout, input=payload,
              env=_worker_env())
    if res.timed_out:
        raise FactUnavailable(coll.name, f"collector hung and was killed after {coll.timeout:g}s")
    if not res.ok:
        raise FactUnavailable(coll.name, f"collector process failed: {res.why()}")
    try:
        doc = json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise FactUnavailable(coll.name, "collector process printed no JSON") from None
    if "error" in doc:
        raise FactUnavailable(coll.name, doc["error"])
    return doc["value"]


def _worker_env() -> dict[str, str]:
    """The worker must import this very doctor and the collector's module, wherever they came from."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    paths = [root] + [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


# -- secrets -------------------------------------------------------------------------------------

# Name-based redaction works on the words of a name, so that HF_TOKEN, DB_PASSWORD and MY_API_KEY are
# secrets while mask_token_id, tokenizer_class, bos_token and num_key_value_heads (model configs) are not.
SECRET_WORDS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY",
                "AUTH", "COOKIE"}
NOT_SECRET_LAST = {"ID", "IDS", "CLASS", "TYPE", "HEADS", "COUNT", "SIZE", "LEN", "LENGTH", "DIM", "LIMIT", "MAX",
                   "MIN", "FILE", "PATH", "DIR", "URL", "ENDPOINT", "PARALLELISM", "NAME", "KIND"}
LOWER_SECRET_NAMES = {"token", "hf_token", "access_token", "auth_token", "api_key", "apikey", "password", "passwd",
                      "secret", "client_secret", "private_key", "secret_key", "access_key", "cookie"}
SECRET_VALUE = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16})\b")
REDACTED = "<redacted>"


def is_secret_name(name: str) -> bool:
    """Environment-style names (upper case) by their words; config-style (lower case) only when well known."""
    words = [w for w in re.split(r"[_\-.]+", name.upper()) if w]
    if not words:
        return False
    if name.upper() == name:  # an environment variable
        if words[-1] in NOT_SECRET_LAST:
            return False
        return any(w in SECRET_WORDS for w in words) or (words[-1] == "KEY" and len(words) > 1)
    low = name.lower()
    return low in LOWER_SECRET_NAMES or low.endswith(("_password", "_secret", "_api_key", "_access_key"))


def redact(value: Any, key: str = "") -> Any:
    """Redact secrets anywhere in a JSON value: values under secret-looking keys, token-like strings."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret_name(k) and v not in (None, "")
                    and not isinstance(v, (dict, list, bool)) else redact(v, k))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str):
        return SECRET_VALUE.sub(REDACTED, value)
    return value


# -- snapshots -----------------------------------------------------------------------------------

def build_snapshot(store: FactStore, note: str = "", names: list[str] | None = None) -> dict[str, Any]:
    """Every fact (or ``names``), with the run's options, redacted."""
    facts = store.collect_all(names)
    opts = store.options.to_dict()
    opts.pop("env", None)  # the environment is recorded (redacted) as the fact "env"
    return redact({
        "kind": SNAPSHOT_KIND,
        "schema_version": SNAPSHOT_SCHEMA_VERSION,
        "doctor_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "synthetic": False,
        "note": note,
        "options": opts,
        "collect_s": {k: round(v, 4) for k, v in store.durations().items()},
        "facts": facts,
    })


class SnapshotError(Exception):
    """The snapshot file cannot be used (invocation error: exit 2)."""


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"snapshot {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != SNAPSHOT_KIND or not isinstance(data.get("facts"), dict):
        raise SnapshotError(f"{path} is not a k26-doctor snapshot (kind {SNAPSHOT_KIND!r} with 'facts')")
    if data.get("schema_version") != SNAPSHOT_SCHEMA_VERSION:
        raise SnapshotError(f"snapshot schema_version {data.get('schema_version')!r} is not supported "
                            f"(this doctor reads {SNAPSHOT_SCHEMA_VERSION})")
    return data
