"""tiktoken BPE files (``tiktoken.model``): read and validated without tiktoken (tests write them with
``tests/model_replica_tokenizer.py``).

The format, as ``tiktoken.load.load_tiktoken_bpe`` reads it: one ``<base64 token> <rank>`` per line.
Kimi's remote tokenizer takes the number of ranks as the number of base tokens and puts its special
tokens right after them, so ranks must be unique and run from 0 without gaps, and tokens must be
unique: a file cut short by a download moves every special token's id.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from typing import Any

from doctor.core.fileio import open_regular

MAX_BYTES = 64 * 1024 * 1024
MAX_PROBLEMS = 5
_B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_BAD_PAD = re.compile(rb"=[^= ]|===")  # padding only at a token's end, at most two
_SINGLE = re.compile(rb"(?:^| )([A-Za-z0-9+/]{2}==)(?= |$)")  # the base64 of a one-byte token


def _well_formed(data: bytes, fields: list[bytes]) -> bool:
    """Two fields a line, base64 then digits: checked at C speed over the whole file."""
    lines = data.splitlines()  # as tiktoken.load reads it: empty lines are skipped, nothing else is
    if len(fields) != 2 * (len(lines) - lines.count(b"")):
        return False
    tokens, ranks = fields[0::2], fields[1::2]
    if b"".join(tokens).translate(None, _B64) or not b"".join(ranks).isdigit():
        return False
    joined = b" ".join(tokens)
    return _BAD_PAD.search(joined) is None and all(n % 4 == 0 for n in set(map(len, tokens)))


def read_tiktoken_bpe(path: str) -> dict[str, Any]:
    """``{"ok", "tokens", "max_rank", "bytes", "problems": [...]}``; never raises."""
    out: dict[str, Any] = {"ok": False, "tokens": 0, "max_rank": None, "problems": []}
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            out["bytes"] = size
            if size > MAX_BYTES:
                out["problems"].append(f"{os.path.basename(path)} is {size} bytes: larger than any BPE vocabulary")
                return out
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        out["problems"].append(f"cannot read {os.path.basename(path)}: {exc.strerror or exc}")
        return out
    if data.startswith(b"version https://git-lfs"):
        out["problems"].append(f"{os.path.basename(path)} is a Git LFS pointer, not the file (git lfs pull, or "
                               "download it with hf download)")
        return out
    fields = data.split()
    if not fields:
        out["problems"].append(f"{os.path.basename(path)} holds no tokens")
        return out
    if not _well_formed(data, fields):
        out["problems"] = _first_bad_lines(data)
        return out
    tokens, ranks = fields[0::2], fields[1::2]
    rank_set = set(map(int, ranks))
    out["tokens"] = len(tokens)
    out["max_rank"] = max(rank_set) if rank_set else None
    problems: list[str] = out["problems"]
    if len(set(tokens)) != len(tokens):  # canonical base64: equal text <=> equal bytes
        problems += [p for p in _first_bad_lines(data) if "twice" in p] or ["a token appears twice"]
    elif len(rank_set) != len(ranks):
        problems.append("a rank appears twice")
    elif min(rank_set) != 0 or max(rank_set) != len(ranks) - 1:
        problems.append(f"ranks run from {min(rank_set)} to {max(rank_set)} over {len(ranks)} tokens: not 0..n-1 "
                        "without gaps (the special tokens' ids would shift)")
    elif len(tokens) >= 256 and len(set(_SINGLE.findall(b" ".join(tokens)))) < 256:
        problems.append("not every single byte is a token: text with such a byte cannot be encoded")
    out["ok"] = not problems
    return out


def _first_bad_lines(data: bytes) -> list[str]:
    """The slow walk, line by line, that names the first problems."""
    problems: list[str] = []
    ranks: set[int] = set()
    tokens: set[bytes] = set()
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            problems.append(f"line {lineno}: expected '<base64 token> <rank>', got {len(parts)} fields")
        else:
            try:
                token = base64.b64decode(parts[0], validate=True)
                rank = int(parts[1])
            except (binascii.Error, ValueError):
                problems.append(f"line {lineno}: not a base64 token and an integer rank")
            else:
                if rank in ranks:
                    problems.append(f"line {lineno}: rank {rank} appears twice")
                if token in tokens:
                    problems.append(f"line {lineno}: token {token!r} appears twice")
                ranks.add(rank)
                tokens.add(token)
        if len(problems) >= MAX_PROBLEMS:
            break
    return problems or ["not a tiktoken BPE file"]
