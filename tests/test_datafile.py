"""The one TOML reader (``doctor.core.datafile.read_toml``): a file that cannot be used is one clear line
naming the file (and, for a parse error, where tomllib stopped), never a traceback; each caller keeps its
exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_doctor

from doctor.core.datafile import DataFileError, load_toml, read_toml
from doctor.core.settings import ConfigError, load_profile
from doctor.service.diagnose import SignatureError, load_signatures


def test_reads_a_table(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[a]\nb = "ü"\n', encoding="utf-8")
    assert read_toml(good) == {"a": {"b": "ü"}}
    assert load_toml(str(good)) == {"a": {"b": "ü"}}


def test_malformed_names_file_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('ok = 1\nkey = = 2\n')
    with pytest.raises(DataFileError) as info:
        read_toml(bad, "config file")
    msg = str(info.value)
    assert msg.startswith(f"config file {bad} is not valid TOML: ")
    assert "line 2" in msg and "column" in msg
    assert info.value.path == bad and "line 2" in info.value.reason


def test_missing_file(tmp_path: Path) -> None:
    gone = tmp_path / "nope.toml"
    with pytest.raises(DataFileError, match=r"cannot read signatures file .*nope\.toml: No such file or directory"):
        read_toml(gone, "signatures file")
    with pytest.raises(DataFileError, match="cannot read data file"):
        load_toml(gone)


def test_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="cannot read data file"):
        read_toml(tmp_path)


def test_not_utf8_names_the_byte_and_line(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.toml"
    latin.write_bytes('a = 1\nname = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(DataFileError) as info:
        read_toml(latin)
    assert str(info.value) == (f"data file {latin} is not valid TOML: "
                               "byte 0xe9 is not UTF-8 (at line 2, column 12)")


def test_errors_are_not_cached(tmp_path: Path) -> None:
    later = tmp_path / "later.toml"
    with pytest.raises(DataFileError):
        load_toml(later)
    later.write_text("x = 1\n")
    assert load_toml(later) == {"x": 1}


def test_callers_keep_their_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe = 1\n")
    with pytest.raises(ConfigError, match=r"profile .*bad\.toml is not valid TOML: byte 0xff"):
        load_profile(str(bad))
    with pytest.raises(SignatureError, match=r"signatures file .*bad\.toml is not valid TOML"):
        load_signatures([bad])
    with pytest.raises(SignatureError, match=r"cannot read signatures file .*missing\.toml"):
        load_signatures([tmp_path / "missing.toml"])


@pytest.mark.parametrize("content", [b"[doctor\nprofile = 3", b"[doctor]\nprofile = \"\xff\"\n"])
def test_cli_bad_config_is_one_line_exit_2(tmp_path: Path, content: bytes) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_bytes(content)
    out = run_doctor("check", "--config", str(cfg))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"config file {cfg} is not valid TOML" in out.stderr and "line " in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cli_bad_signatures_is_one_line_exit_2(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("nothing\n")
    sigs = tmp_path / "sigs.toml"
    sigs.write_text("[[signature]\n")
    out = run_doctor("diagnose", str(log), "--signatures", str(sigs))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"signatures file {sigs} is not valid TOML" in out.stderr and "line 1" in out.stderr
    assert "Traceback" not in out.stderr
