"""Every command's --help reads the same through the CLI's redacting streams: a help text holds no secret, so
redaction must leave it whole (click's ``--api-key TEXT`` once printed as ``--api-key <redacted>``, its
columns broken), and every metavar says what the value is (an accept length is no SECONDS)."""

from __future__ import annotations

import click
from click.testing import CliRunner

from doctor.cli import cli
from doctor.facts.redaction import redact_text


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # (a lazy group loads each command when asked for it)
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*prefix, name))
        else:
            out.append((*prefix, name))
    return out


def test_help_texts_survive_redaction_and_name_their_values() -> None:
    runner = CliRunner()
    seen = 0
    for path in _commands(cli):
        res = runner.invoke(cli, [*path, "--help"], prog_name="k26-doctor")
        assert res.exit_code == 0, (path, res.output)
        assert redact_text(res.output) == res.output, (path, [ln for ln in res.output.splitlines()
                                                              if redact_text(ln) != ln])
        seen += 1
    assert seen > 15
    smoke = runner.invoke(cli, ["smoke", "--help"]).output
    assert "--api-key TEXT" in smoke and "--fail-below NUMBER" in smoke and "--timeout SECONDS" in smoke
    unit = " ".join(runner.invoke(cli, ["systemd-unit", "--help"]).output.split())
    assert "(the value of --api-key)" in unit, unit  # once printed as "-- --api-key"
