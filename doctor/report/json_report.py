"""The JSON report and its schema (``report.schema.json`` ships beside this module)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


def dumps(report: Any) -> str:
    return json.dumps(report.to_dict(), indent=2, default=str, ensure_ascii=False)

