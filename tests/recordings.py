"""The recorded hosts of tests/fixtures (every ``k26-doctor snapshot`` file there) and how each is judged: the
golden verdicts replay them (tests/test_golden_verdicts.py), the fact fuzz mutates them (tests/test_fact_shapes.py).
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
RECORDED_STACK = "recorded-stack"  # a config holding the [stack] pins the snapshot recorded (recorded_stack_config)
# The config each recording is judged with (paths relative to tests/fixtures/snapshots).
CONFIGS = {"h200x1-all-facts.json": RECORDED_STACK, "hosts/model-healthy.json": "hosts/small-model.toml",
           "hosts/model-damaged.json": "hosts/small-model.toml", "hosts/model-config.json": "hosts/small-model.toml"}


def recordings() -> list[Path]:
    """Every snapshot file under tests/fixtures (the converted and the raw reference recordings included)."""
    out = []
    for path in sorted((ROOT / "tests" / "fixtures").rglob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict) and doc.get("kind") == "k26-doctor-snapshot":
            out.append(path)
    return out


def name_of(path: Path) -> str:
    return path.relative_to(SNAPS).as_posix()


def recorded_stack_config(where: Path) -> Path:
    """h200x1-all-facts.json is judged under the [stack] pins it was recorded with (test_snapshot_replay_real)."""
    stack = json.loads((SNAPS / "h200x1-all-facts.json").read_text())["options"]["profile"]["stack"]
    path = where / "recorded-stack.toml"
    path.write_text("[stack]\n" + "".join(f'{k} = "{v}"\n' for k, v in stack.items()))
    return path


def config_for(path: Path, where: Path) -> str | None:
    """The --config a recording is judged with, written under ``where`` when it is made for the run."""
    name = CONFIGS.get(name_of(path))
    if name is None:
        return None
    return str(recorded_stack_config(where)) if name == RECORDED_STACK else str(SNAPS / name)
