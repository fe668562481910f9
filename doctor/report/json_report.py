"""The JSON report and its schema (``report.schema.json`` ships beside this module)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


def dumps(report: Any, ascii_only: bool = False) -> str:
    """The report as JSON, secrets redacted; ``ascii_only`` for a stream that cannot encode UTF-8."""
    from doctor.facts.redaction import redact

    return json.dumps(redact(report.to_dict()), indent=2, default=str, ensure_ascii=ascii_only)

