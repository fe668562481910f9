"""``k26-doctor env``: the host in a few lines for a bug report (redacted), with the profile's verdict."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from doctor.commands.options import guarded, settings_from, settings_options
from doctor.core.exitcodes import EXIT_OK


@click.command("env", context_settings={"help_option_names": ["-h", "--help"]})
@settings_options("config", "profile", "model_path", "draft_model_path", "python", "tp", "from_snapshot",
                  "patches_dir", "state_dir", report=False)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@guarded
def env(flags: dict[str, Any], fmt: str) -> int:
    """A short, paste-ready, redacted summary: driver, CUDA, GPUs and topology, torch/triton/SGLang/kernel
    versions, the environment that matters, and the profile's verdict (the default checks run once)."""
    from doctor.app import run
    from doctor.report.environment import collect_summary, render_summary

    settings = settings_from(flags)
    report, ctx = run(settings)
    data = collect_summary(report, ctx.facts, live=not settings.from_snapshot)
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(render_summary(data))
    return EXIT_OK
