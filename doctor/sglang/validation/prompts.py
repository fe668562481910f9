"""The prompts of a validation: the shipped text prompts (``doctor/data/validate_prompts.json``, sent as text:
the server's own tokenizer, K2.6's with ``trust_remote_code``) or a file of the operator's, text or token ids
(``--skip-tokenizer-init`` servers, such as the trained pair: ``bench/ddtree/make_trained.py --prompts``).

A prompt file is JSON: ``{"greedy": [...], "sampled": [...]}`` (each a list of strings or of lists of token ids;
``sampled``: contexts whose next tokens branch, the first one is the sampled test's), ``{"prompts": [...]}``
(one list for both) or a plain list.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from doctor.core.fileio import describe_error, read_capped
from doctor.core.settings import ConfigError

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "validate_prompts.json"
MAX_FILE = 64 << 20


def _valid(items: Any) -> tuple[list[Any], str | None]:
    if not isinstance(items, list) or not items:
        return [], "an empty or missing list"
    if all(isinstance(p, str) and p for p in items):
        return items, None
    if all(isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p)
           for p in items):
        return items, None
    return [], "neither a list of strings nor a list of lists of non-negative token ids"


def load(path: str | None) -> dict[str, Any]:
    """``{"greedy", "sampled", "kind": "text"|"ids", "source", "digest"}``; ``ConfigError`` (exit 2) for a file
    that cannot be read or holds no prompts."""
    source = path or str(SHIPPED)
    try:
        data = json.loads(read_capped(source, MAX_FILE, "a prompt file"))
    except OSError as exc:
        raise ConfigError(f"--prompts {source}: {describe_error(exc)}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--prompts {source}: not JSON ({exc})") from None
    if isinstance(data, list):
        data = {"prompts": data}
    if not isinstance(data, dict):
        raise ConfigError(f"--prompts {source}: a JSON object or list of prompts, not {type(data).__name__}")
    greedy_raw = data.get("greedy", data.get("prompts"))
    sampled_raw = data.get("sampled", greedy_raw)
    greedy, why = _valid(greedy_raw)
    if why:
        raise ConfigError(f"--prompts {source}: its greedy prompts are {why}")
    sampled, why = _valid(sampled_raw)
    if why:
        raise ConfigError(f"--prompts {source}: its sampled prompts are {why}")
    kinds = {"text" if isinstance(p, str) else "ids" for p in greedy + sampled}
    if len(kinds) != 1:
        raise ConfigError(f"--prompts {source}: mixes text and token-id prompts")
    digest = hashlib.sha256(json.dumps([greedy, sampled], sort_keys=True).encode()).hexdigest()
    return {"greedy": greedy, "sampled": sampled, "kind": kinds.pop(), "source": source, "digest": digest}


def take(pool: list[Any], n: int, offset: int = 0) -> list[Any]:
    """``n`` prompts from ``offset`` on, cycling the pool."""
    return [pool[(offset + i) % len(pool)] for i in range(n)]
