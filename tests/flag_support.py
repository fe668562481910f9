"""What the flag tests share: ``validate_args``'s findings in the form the report lists them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from doctor.sglang.flag_validator import as_dict, validate_args


def validate(table: Any, argv: list[str], removed: dict[str, dict[str, Any]] | None = None) -> list[SimpleNamespace]:
    """``validate_args``'s findings as ``details.problems[]`` lists them: ``severity`` ("error" / "warning"),
    ``flag``, ``message``, ``replacement`` (None when there is none)."""
    return [SimpleNamespace(**{"replacement": None, **as_dict(p)}) for p in validate_args(table, argv, removed)]
