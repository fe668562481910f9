"""Hostile input, round two: each class a hostile user found, at its root.

- two outputs of one command that are one file (same path, a link, a hardlink) are refused before anything is
  written, and so is a set of outputs one of which cannot be written (``--timer`` and its ``NAME.timer``);
- every numeric option has one parser with a real range: ``1e300``, ``nan``, ``inf``, negative and 400-digit
  values are exit 2 naming the option and its range, never a traceback or a 301-digit ``TimeoutStartSec=``;
- secrets survive no spelling: a URL's credentials after path normalisation (``https:/user:tok@host``), a secret
  refused for its newline, a secret cut in half by a message that shortens a value, an AWS temporary key id;
- foreign text (a server's body and status line, a log line, a file name, an environment value) reaches the
  terminal with its control characters escaped;
- answers say what they mean: a size limit in the unit it has, a file name with a newline in ``sha256sum``'s own
  escaping, a FIFO or a directory where a patch target should be named as what it is (never "drifted",
  never ``--force``);
- ``--help`` is not redacted into nonsense at any terminal width.

Real parts: real servers on 127.0.0.1, real FIFOs, links and hardlinks, ``sha256sum -c``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import click
import pytest
from hostile_support import cli_run, http_answer, raw_server

pytestmark = pytest.mark.timeout(120)
DOCTOR = ("--doctor", "/usr/bin/true")
KEY = "UnitKey9191zz"


# -- one output-path planner ------------------------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["same", "dotted", "hardlink"])
def test_two_outputs_that_are_one_file_are_refused_before_anything_is_written(tmp_path: Path, spelling: str) -> None:
    target = tmp_path / "unit.service"
    target.write_text("kept\n")
    (tmp_path / "sub").mkdir()
    other = {"same": str(target), "dotted": str(tmp_path / "sub" / ".." / "unit.service"),
             "hardlink": str(tmp_path / "hard.service")}[spelling]
    if spelling == "hardlink":
        os.link(target, other)
    code, out, err = cli_run("systemd-unit", *DOCTOR, "--secrets-file", str(target), "--output", other, "--",
                             "--api-key", KEY)
    assert code == 2 and "same file" in err, (code, err)
    assert target.read_text() == "kept\n" and KEY not in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["unit.service", "sub"] + (
        ["hard.service"] if spelling == "hardlink" else []))


def test_a_timer_whose_timer_file_cannot_be_written_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "k26-check.timer").mkdir()  # where NAME.timer must go: a directory
    code, _, err = cli_run("systemd-unit", "--timer", *DOCTOR, "--output", str(tmp_path / "k26-check.service"))
    assert code == 2 and "k26-check.timer" in err and "directory" in err, err
    assert not (tmp_path / "k26-check.service").exists()


# -- one numeric parser -------------------------------------------------------------------------------------
NUMERIC = [
    ("smoke", "--url", "http://127.0.0.1:9", "--timeout"),
    ("smoke", "--url", "http://127.0.0.1:9", "--requests"),
    ("smoke", "--url", "http://127.0.0.1:9", "--fail-below"),
    ("check", "--only", "host.port", "--timeout"),
    ("check", "--only", "host.port", "--tp"),
    ("check", "--only", "host.port", "--context-length"),
    ("slurm-health", "--dry-run", "--scontrol-timeout"),
    ("wait-ready", "--url", "http://127.0.0.1:9/health", "--timeout"),
    ("wait-ready", "--url", "http://127.0.0.1:9/health", "--interval"),
    ("wait-ready", "--url", "http://127.0.0.1:9/health", "--pid"),
    ("systemd-unit", *DOCTOR, "--start-timeout"),
    ("systemd-unit", "--timer", *DOCTOR, "--interval"),
    ("launch", "--dry-run", "--wait-timeout"),
    ("manifest", "verify", "/nonexistent-model", "--jobs"),
]


@pytest.mark.parametrize("value", ["1e300", "nan", "inf", "-1", "9" * 400])
@pytest.mark.parametrize("argv", NUMERIC, ids=lambda a: f"{a[0]}{a[-1]}")
def test_every_numeric_option_refuses_what_is_out_of_its_range(argv: tuple[str, ...], value: str) -> None:
    code, out, err = cli_run(*argv, value)
    assert code == 2, (code, out[-300:], err[-600:])
    assert argv[-1] in err and "between" in err, err  # the option and its range
    assert "Traceback" not in err and "internal error" not in err and "9" * 40 not in out + err


def test_every_numeric_option_of_every_command_uses_the_one_parser() -> None:
    from doctor.cli import cli
    from doctor.commands.options import Number

    numeric = (click.types.IntParamType, click.types.FloatParamType, click.types._NumberRangeBase)
    seen = 0

    def walk(cmd: click.Command, path: str) -> None:
        nonlocal seen
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), f"{path} {name}")  # type: ignore[arg-type]
        for p in cmd.params:
            if getattr(p, "count", False):  # -v -v: a flag counted by click, no value to parse
                continue
            if isinstance(p.type, Number):
                seen += 1
                assert p.type.low is not None and p.type.high is not None, (path, p.name)
            assert not isinstance(p.type, numeric), f"{path} {p.opts}: {p.type!r} is not doctor's Number"

    walk(cli, "k26-doctor")
    assert seen >= 20


def test_a_start_timeout_is_written_as_systemd_reads_it(tmp_path: Path) -> None:
    code, out, err = cli_run("systemd-unit", *DOCTOR, "--start-timeout", "604800")
    assert code == 0, err
    assert "TimeoutStartSec=604800\n" in out


# -- secrets ---------------------------------------------------------------------------------------------
TOKEN = "Tok3nSecret8080"


@pytest.mark.parametrize("spelling", [
    f"https://user:{TOKEN}@host/x", f"https:/user:{TOKEN}@host/x", f"/tmp/w/https:/user:{TOKEN}@host/x",
    f"HTTPS://user:{TOKEN}@host", f"https:///user:{TOKEN}@host", f"https:\\\\user:{TOKEN}@host",
    f"https%3A%2F%2Fuser%3A{TOKEN}%40host", f"//user:{TOKEN}@host/x", f"git+ssh://user:{TOKEN}@host/x",
])
def test_url_credentials_are_redacted_in_every_spelling(spelling: str) -> None:
    from doctor.facts.redaction import redact_text

    assert TOKEN not in redact_text(spelling) and "host" in redact_text(spelling)


def test_a_url_given_as_a_path_keeps_its_credentials_hidden_after_normalisation() -> None:
    url = f"https://user:{TOKEN}@host/venv/bin/python"
    code, out, err = cli_run("check", "--python", url, "--only", "python.venv", "-v")
    assert code in (1, 2) and TOKEN not in out + err, out
    code, out, err = cli_run("snapshot", "--python", url, "--fact", "env")
    assert TOKEN not in out + err


def test_a_drain_reason_every_user_reads_holds_no_credential_and_no_control_character() -> None:
    from doctor.service.slurm import drain_reason

    summary = f"/srv/k26/https:/user:{TOKEN}@host/venv/bin/python does not exist\x1b]0;t\x07"
    reason = drain_reason("k26-doctor:", [("python.venv", summary)], 256)
    assert TOKEN not in reason and raw_controls(reason) == [] and "python.venv" in reason, reason


def test_a_secret_refused_for_its_newline_is_not_quoted(tmp_path: Path) -> None:
    code, out, err = cli_run("systemd-unit", *DOCTOR, "--secrets-file", str(tmp_path / "s.env"), "--",
                             "--api-key", "Secr3tHead\nSecr3tTail")
    assert code == 2 and "newline" in err, err
    assert "Secr3t" not in out + err and not (tmp_path / "s.env").exists()


JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJrMjYtZG9jdG9yIn0.c2lnbmF0dXJlLXBhcnQtMTIzNDU2"


@pytest.mark.parametrize("bad", ["BAD = [1]\n", "", "[server]\nport = 'x'\n"])
def test_a_config_environment_table_never_shows_its_secrets(tmp_path: Path, bad: str) -> None:
    cfg = tmp_path / "k26.toml"
    cfg.write_text(f'[server.env]\nA = "x"\nMY_VAR = "{JWT}"\nAWS = "AKIAIOSFODNN7EXAMPLE"\n'
                   f'AWS_TMP = "ASIAIOSFODNN7EXAMPLE"\n{bad}')
    code, out, err = cli_run("snapshot", "--config", str(cfg), "--fact", "env")
    assert code in (0, 2), err
    for part in ("eyJhbGciOiJIUzI1NiJ9", "IOSFODNN7", "c2lnbmF0dXJl"):
        assert part not in out + err, (part, err[-400:])


# -- foreign text -----------------------------------------------------------------------------------------
HOSTILE = "\x1b]0;owned\x07\x1b[2J\rFAKE PASS\x08\x08\x9b31m"


def raw_controls(text: str) -> list[str]:
    """Control characters a terminal acts on, outside the doctor's own colours (there are none: NO_COLOR)."""
    return sorted({c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0})


def test_a_server_body_reaches_the_terminal_escaped() -> None:
    body = json.dumps({"error": {"message": HOSTILE}}).encode().replace(b"\\u001b", b"\x1b").replace(
        b"\\r", b"\r").replace(b"\\b", b"\x08").replace(b"\\u0007", b"\x07")
    with raw_server(http_answer("500 Internal Server Error", body)) as url:
        for fmt in ("text", "json"):
            code, out, err = cli_run("smoke", "--url", url, "--timeout", "5", "--format", fmt)
            assert code == 1 and raw_controls(out + err) == [], repr(out + err)
    with raw_server(b"HTTP/1.1 " + HOSTILE.encode() + b"\r\n\r\n") as url:
        code, out, err = cli_run("wait-ready", "--url", url + "/health", "--timeout", "1.5", "--interval", "0.5")
        assert code == 1 and raw_controls(out + err) == [], repr(err)


def test_log_lines_file_names_and_environment_values_reach_the_terminal_escaped(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"RuntimeError: CUDA error: out of memory {HOSTILE}\nFailed to initialize NVML{HOSTILE}\n")
    code, out, err = cli_run("diagnose", str(log))
    assert code in (0, 1) and raw_controls(out + err) == [], repr(out)
    model = tmp_path / f"model{HOSTILE}"
    code, out, err = cli_run("check", "--model-path", str(model), "--only", "model.config", "-v")
    assert code in (1, 2) and raw_controls(out + err) == [], repr(out)
    snap = json.loads((Path(__file__).parent / "fixtures" / "snapshots" / "gpuless-fresh-venv.json").read_text())
    snap["facts"]["env"]["vars"]["CUDA_VISIBLE_DEVICES"] = HOSTILE  # as the host would have recorded it
    (tmp_path / "snap.json").write_text(json.dumps(snap))
    code, out, err = cli_run("env", "--from-snapshot", str(tmp_path / "snap.json"))
    assert code in (0, 1) and "CUDA_VISIBLE_DEVICES=\\x1b]0;owned" in out and raw_controls(out + err) == [], \
        repr(out)
    # on a colour terminal the doctor's own colours pass; a foreign sequence (conceal) is escaped where it enters
    concealed = tmp_path / "model\x1b[8mhidden"
    code, out, err = cli_run("check", "--model-path", str(concealed), "--only", "model.config", "-v",
                             env={"NO_COLOR": None, "FORCE_COLOR": "1"})
    assert "\x1b[8m" not in out + err and "\\x1b[8mhidden" in out and "\x1b[0m" in out, repr(out)


def test_reports_written_to_files_carry_no_control_character(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    model = tmp_path / f"model{HOSTILE}"
    for fmt in ("text", "json", "junit"):
        out = tmp_path / f"report.{fmt}"
        code, _, err = cli_run("check", "--model-path", str(model), "--only", "model.config", "--format", fmt,
                               "--output", str(out))
        text = out.read_text()
        assert code == 1 and raw_controls(text) == [], (fmt, repr(text[:400]), err)
        if fmt == "json":
            assert any(str(model) in r["summary"] for r in json.loads(text)["results"])  # reads back the same
        if fmt == "junit":
            ET.fromstring(text)  # still XML


def test_the_terminal_safe_renderer() -> None:
    from doctor.core.printable import printable

    assert printable("a\x1b]0;t\x07b\rc\x08\x9b") == "a\\x1b]0;t\\x07b\\rc\\x08\\u009b"
    assert printable("two\nlines\ttab", lines=True) == "two\nlines\ttab"
    assert printable("two\nlines") == "two\\nlines"
    assert printable("plain ünïcode") == "plain ünïcode"


# -- answers that say what they mean ----------------------------------------------------------------------
def test_a_health_answer_too_large_names_the_real_limit() -> None:
    with raw_server(http_answer("200 OK", b"x" * 9000)) as url:
        code, _, err = cli_run("wait-ready", "--url", url + "/health", "--timeout", "1", "--interval", "0.5")
    assert code == 1 and "larger than 4 KiB" in err and "0 MiB" not in err, err


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="no sha256sum")
def test_a_file_name_with_a_newline_is_exported_as_sha256sum_escapes_it(tmp_path: Path) -> None:
    from doctor.model.manifest import MANIFEST_NAME, manifest_text

    names = {"plain.safetensors": b"one", "new\nline.safetensors": b"two", "back\\slash.safetensors": b"three"}
    files = {}
    for name, data in names.items():
        (tmp_path / name).write_bytes(data)
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (tmp_path / MANIFEST_NAME).write_text(manifest_text(files, "test"))
    code, out, _ = cli_run("manifest", "export", str(tmp_path))
    assert code == 0 and len(out.splitlines()) == 3, repr(out)
    res = subprocess.run(["sha256sum", "-c", "--strict", "-"], input=out, text=True, capture_output=True,
                         cwd=tmp_path, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
    (tmp_path / "new\nline.safetensors").write_bytes(b"changed")
    res = subprocess.run(["sha256sum", "-c", "-"], input=out, text=True, capture_output=True, cwd=tmp_path,
                         timeout=30)
    assert res.returncode == 1 and "FAILED" in res.stdout  # it checks the file it names, not another


def test_a_fifo_or_directory_where_a_patch_target_is_is_named_as_what_it_is(tmp_path: Path) -> None:
    from conftest import make_context

    from doctor.sglang.patching import manifest
    from doctor.sglang.patching.record import installed_in
    from doctor.sglang.patching.status import evaluate, observe
    from doctor.sglang.patchset import judge_patches

    sp = tmp_path / "site-packages"
    info = sp / "sglang-0.5.23.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    (info / "RECORD").write_text("")
    pset = manifest.resolve("t-0.5.23", str(Path(__file__).parent / "fixtures" / "patchsets"))
    kinds = {}
    for i, path in enumerate(sorted(pset.chains())):
        target = sp / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if i % 3 == 0:
            os.mkfifo(target)
            kinds[path] = "FIFO"
        elif i % 3 == 1:
            target.mkdir()
            kinds[path] = "directory"
        else:
            target.symlink_to("/dev/null")
            kinds[path] = "character device"
    fact = observe(pset, installed_in(sp))
    ev = evaluate(fact)
    for f in ev.files:
        assert f.state == "not a file" and kinds[f.path] in f.note, (f.path, f.state, f.note)
    ctx = make_context({"profile": "b300-tp8-ddtree"})
    found = judge_patches({**fact, "set_name": pset.name}, ctx.settings)
    finding = found[0]
    assert "drifted" not in finding.message and "FIFO" in finding.message, finding.message
    assert finding.fix is not None and not any("--force" in c and "apply" in c for c in finding.fix.commands)
    assert "--force" not in finding.fix.text


# -- help ---------------------------------------------------------------------------------------------------
def test_no_help_at_any_width_is_touched_by_redaction() -> None:
    from doctor.cli import cli
    from doctor.facts.redaction import redact_text

    group_ctx = click.Context(cli)
    for name in cli.list_commands(group_ctx):
        cmd = cli.get_command(group_ctx, name)
        assert cmd is not None
        commands = [cmd] + ([cmd.get_command(group_ctx, n) for n in cmd.list_commands(group_ctx)]
                            if isinstance(cmd, click.Group) else [])
        for sub in commands:
            for width in range(40, 141, 1 if name == "systemd-unit" else 9):
                text = sub.get_help(click.Context(sub, info_name=name, terminal_width=width,
                                                  max_content_width=width))
                assert redact_text(text) == text, (name, width, [ln for ln in text.splitlines()
                                                                 if ln not in redact_text(text).splitlines()])
    code, out, _ = cli_run("systemd-unit", "--help", env={"COLUMNS": "100"})
    assert code == 0 and "<redacted>" not in out and "--api-key)" in out.replace("\n", " ").replace(" ", "")
