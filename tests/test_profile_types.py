"""The typed tables of the profile (``doctor/core/profile.py``) are the schema's: generated from
``doctor/data/config_schema.toml`` by scripts/make_profile_types.py, with the schema's defaults, type hints that
hold for every validated value, and the same answers the dotted lookup gave."""

from __future__ import annotations

import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from file_modules import load_file

from doctor.core import profile
from doctor.core import settings as settings_module
from doctor.core.settings import ConfigError, Settings, profile_names, resolve, schema_entries

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make_profile_types.py"


def maker() -> Any:
    return load_file(SCRIPT, "make_profile_types", register=False)


def hint(table: str, key: str) -> Any:
    cls = type(getattr(Settings(), table))
    return typing.get_type_hints(getattr(cls, key).fget)["return"]


def test_the_module_is_what_the_script_writes_from_the_schema() -> None:
    assert maker().render() == Path(profile.__file__).read_text(encoding="utf-8"), (
        "doctor/core/profile.py is stale: python scripts/make_profile_types.py")
    assert maker().main(["--check"]) == 0


def test_a_key_added_to_the_schema_is_drift(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) \
        -> None:
    mod = maker()
    entries = {**schema_entries(), "server.grace_s": ("seconds", 30)}
    monkeypatch.setattr(mod, "schema", lambda: entries)
    text = mod.render()
    assert "    def grace_s(self) -> float:\n        return self.value(\"grace_s\", 30)\n" in text
    assert mod.main(["--check"]) == 1 and "is stale" in capsys.readouterr().err


def test_every_schema_key_is_a_typed_attribute_with_its_default() -> None:
    empty = Settings(profile={})
    for dotted, (kind, default) in schema_entries().items():
        table, sep, key = dotted.partition(".")
        if not sep:
            continue
        assert getattr(getattr(empty, table), key) == default, dotted
        want = {"str": str, "path": str, "spec": str, "host": str, "bool": bool, "int": int, "posint": int,
                "port": int, "number": float, "seconds": float, "fraction": float, "list_str": list[str],
                "table_scalar": dict[str, str | int | float | bool]}[kind]
        assert hint(table, key) == (want if default is not None else want | None), dotted
    assert set(profile.TABLES).isdisjoint(f.name for f in fields(Settings)), "a table would hide a setting"


@pytest.mark.parametrize("name", profile_names())
def test_the_typed_view_of_each_profile_answers_as_the_dotted_lookup_did(name: str) -> None:
    """Every built-in profile, resolved: each typed value is what ``settings.get(dotted, schema default)`` gives,
    and of the type its hint says (a number kind may hold an int: TOML's ``20`` is a float's value)."""
    settings = resolve({"profile": name}, environ={})
    seen = 0
    for dotted, (_kind, default) in schema_entries().items():
        table, sep, key = dotted.partition(".")
        if not sep:
            continue
        value = getattr(getattr(settings, table), key)
        assert value == settings.get(dotted, default), dotted
        if value is None:
            continue
        seen += 1
        hinted = hint(table, key)
        want = typing.get_args(hinted) if isinstance(hinted, types.UnionType) else (hinted,)
        origins = tuple(typing.get_origin(w) or w for w in want if w is not type(None))
        assert isinstance(value, origins) or (float in origins and isinstance(value, int)), (dotted, value)
    assert seen >= 15, "the profiles set most keys"


def test_a_default_not_of_its_kind_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = tmp_path / "schema.toml"
    schema.write_text('[keys]\n"server.port" = { kind = "port", default = 70000 }\n')
    monkeypatch.setattr(settings_module, "SCHEMA_PATH", schema)
    with pytest.raises(ConfigError, match=r"the default of server.port, 70000, is not a port number"):
        schema_entries()


def test_a_table_that_is_not_a_table_reads_as_defaults() -> None:
    odd = Settings(profile={"server": 5, "gpu": {"nvswitch": True}})
    assert (odd.server.port, odd.server.host, odd.gpu.nvswitch, odd.gpu.min_nvlinks) == (30000, "127.0.0.1", True, 0)
    assert Settings(profile=None).parallel.pp == 1  # type: ignore[arg-type]


def test_a_wrong_value_is_still_refused_when_the_config_loads(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[smoke]\nfail_accept_length_below = "1.5"\n')
    with pytest.raises(ConfigError, match=r"\[smoke\] fail_accept_length_below = '1.5' .* must be a finite number"):
        resolve({"config": str(cfg)}, environ={})
    cfg.write_text("[server]\nport = 31000\n[smoke]\nwarn_accept_length_below = 2\n")
    settings = resolve({"config": str(cfg)}, environ={})
    assert (settings.server.port, settings.smoke.warn_accept_length_below) == (31000, 2)
