"""Tokenizer files of the Kimi K2.x layout for replicas (a test fixture, not shipped): a valid
``tiktoken.model`` and a tokenizer_config.json whose special tokens sit where Kimi's do.

Kimi K2.x has 163,584 base BPE tokens and 256 reserved ids after them (vocabulary 163,840); the
named ones are listed in tokenizer_config.json's ``added_tokens_decoder``. A replica with another
vocabulary size keeps the same offsets from its own base (``vocab_size - 256``), so a small replica
is consistent in the same way as the real model.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from typing import Any

RESERVED = 256
# Offset from the first special id (163584 in Kimi K2.x) -> token. The tool-call markers and
# <think>/</think> are the ones SGLang's kimi_k2 parsers split the output on.
KIMI_SPECIAL_OFFSETS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
    18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
    22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
}
_CACHE: dict[int, bytes] = {}


def _tokens(n: int) -> Iterator[bytes]:
    """``n`` tokens a byte-pair merge reaches: every byte, then two- and three-byte strings over a
    printable alphabet, each longer one after its prefix."""
    yield from (bytes([b]) for b in range(256))
    alphabet = b" etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCMFWYPVBGKJQXZ0123456789.,:;!?'\"-_()[]{}<>/\\|@#$%^&*+=~`"
    made = 256
    for a in alphabet:
        for b in alphabet:
            if made >= n:
                return
            yield bytes([a, b])
            made += 1
    for a in alphabet:
        for b in alphabet:
            for c in alphabet:
                if made >= n:
                    return
                yield bytes([a, b, c])
                made += 1
    raise ValueError(f"this generator makes at most {made} tokens")


def tiktoken_bpe_bytes(n: int) -> bytes:
    """A valid tiktoken BPE file of ``n`` (>= 256) tokens."""
    if n < 256:
        raise ValueError("a byte-level BPE has at least the 256 single bytes")
    return b"".join(base64.b64encode(tok) + b" %d\n" % rank for rank, tok in enumerate(_tokens(n)))


def kimi_tokenizer_config(base: int) -> dict[str, Any]:
    """tokenizer_config.json of the Kimi layout for ``base`` BPE tokens (no chat template)."""
    decoder = {str(base + off): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                                 "single_word": False, "special": True}
               for off, tok in sorted(KIMI_SPECIAL_OFFSETS.items())}
    return {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                                      "<|im_middle|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False, "model_max_length": 262144,
        "tokenizer_class": "TikTokenTokenizer",
    }


def write_kimi_vocab(model_dir: str, vocab_size: int) -> int:
    """Write ``tiktoken.model`` (``vocab_size - 256`` ranks) and tokenizer_config.json; returns the base."""
    base = vocab_size - RESERVED
    if base < 256:
        raise ValueError(f"vocab_size {vocab_size} leaves fewer than 256 base tokens")
    if base not in _CACHE:
        _CACHE[base] = tiktoken_bpe_bytes(base)
    with open(os.path.join(model_dir, "tiktoken.model"), "wb") as fh:
        fh.write(_CACHE[base])
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(kimi_tokenizer_config(base), fh, indent=2)
    return base
