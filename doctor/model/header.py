"""Validate one safetensors file from its header and its size alone.

A safetensors file is ``u64 little-endian N`` + ``N bytes of JSON`` + the tensor data. Everything a
loader will later trip over can be judged from those first ``8 + N`` bytes and ``stat``: the header
length (safetensors refuses more than 100 MB), UTF-8 JSON, known dtypes, offsets contiguous from 0
without holes or overlaps and ``bytes == dtype size x elements``. The data itself is never read (that is the
deep tier's sha256), so a 9 GB shard costs one small read.

What the reader finds wrong with the bytes it read is recorded as a ``Defect`` (``problem(code, message)``), never
raised: a hostile file is a fact like any other. It judges nothing it can leave to the judgement: whether the file
is as long as its header says (``file size == 8 + N + data``) is a comparison of the numbers the fact records, made
by ``doctor.model.weights.size_problem`` (so a replayed snapshot is judged by today's rule); the reader only keeps
``HeaderReport.complete`` for what it must decide at once (a shard that is not complete adds nothing to the tensor
summary).
"""

from __future__ import annotations

import errno
import json
import math
import operator
import os
import struct
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, NamedTuple

from doctor.core.fileio import NotRegularFile, open_regular

# The limit of the reference implementation (safetensors' MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"
# Bits per element of every dtype the safetensors format defines (0.4 .. 0.8).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}


class Defect(NamedTuple):
    """What a reader found wrong with a file it read (a fact: the model fact records it as a ``CodedMessage``):
    a stable code and the reader's words. It is no finding: ``doctor.model.weights`` judges the shards."""

    code: str
    message: str


def problem(code: str, message: str) -> Defect:
    """One thing wrong with a file as read: a stable code (for fixers and tests) and a message for people."""
    return Defect(code, message)


def recorded(found: Defect) -> dict[str, str]:
    """A file's defect as the model fact records it (``doctor.model.dir_fact.CodedMessage``)."""
    return {"code": found.code, "message": found.message}


@dataclass
class HeaderReport:
    """What one shard's header says, and what is wrong with the bytes read (``problems`` empty and ``complete``:
    valid)."""

    path: str
    size: int | None = None
    header_len: int | None = None
    # name -> {"dtype", "shape", "data_offsets"} exactly as parsed (valid headers only)
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    data_bytes: int = 0
    problems: list[Defect] = field(default_factory=list)
    parsed: bool = False  # the header parsed and its entries are valid: data_bytes is where the data ends

    def expected_size(self) -> int | None:
        """The file's size when it holds exactly what its header describes (8 + N + data); None unparsed."""
        if not self.parsed or self.header_len is None:
            return None
        return 8 + self.header_len + self.data_bytes

    @property
    def complete(self) -> bool:
        """The file is as long as its header says (or that cannot be told: not parsed, size unknown)."""
        want = self.expected_size()
        return want is None or self.size is None or self.size == want

    @property
    def ok(self) -> bool:
        return not self.problems and self.complete

    def fail(self, code: str, message: str) -> HeaderReport:
        self.problems.append(problem(code, message))
        return self


def _os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def read_header(path: str | os.PathLike[str]) -> HeaderReport:
    """Read and validate the header of the safetensors file at ``path`` (one open, two reads)."""
    path = os.fspath(path)
    rep = HeaderReport(path)
    try:
        with open_regular(path) as fh:  # a FIFO or a device is refused, never waited on
            st = os.fstat(fh.fileno())
            rep.size = st.st_size
            head = fh.read(8)
            if head.startswith(LFS_POINTER_PREFIX[:8]):
                head += fh.read(200)
                if head.startswith(LFS_POINTER_PREFIX):
                    return rep.fail("lfs_pointer", f"is a Git LFS pointer file ({st.st_size} bytes), not the "
                                    "weights: the repository was cloned without `git lfs` (download it instead)")
            if len(head) < 8:
                return rep.fail("truncated", f"is {st.st_size} bytes: too short for a safetensors header "
                                "(truncated or empty download)")
            (n,) = struct.unpack("<Q", head[:8])
            if n > MAX_HEADER_BYTES:  # (random bytes read as a length: said in words, never recorded as a number
                # past what a reading may hold, which would make the whole model fact malformed for every check)
                return rep.fail("header_too_large", f"header length {n} exceeds safetensors' limit of "
                                f"{MAX_HEADER_BYTES} bytes (not a safetensors file, or corrupt)")
            rep.header_len = n
            if n < 2:
                return rep.fail("header_invalid", f"header length {n} is too small for a JSON object "
                                "(zero-filled file: an incomplete preallocated download?)")
            if 8 + n > st.st_size:
                return rep.fail("truncated", f"file is {st.st_size} bytes but its header alone needs {8 + n}: "
                                "truncated download")
            raw = fh.read(n)
    except NotRegularFile as exc:
        return rep.fail("not_a_file", exc.strerror)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):  # access, not damage: a chmod, never a download
            return rep.fail("permission", f"cannot be read: {_os_reason(exc)}")
        return rep.fail("unreadable", f"cannot be read: {_os_reason(exc)}")
    if len(raw) < n:
        return rep.fail("truncated", "file shrank while being read (still being written?)")
    return validate_header_bytes(raw, rep)


def validate_header_bytes(raw: bytes, rep: HeaderReport) -> HeaderReport:
    """Validate the JSON header ``raw``; once it parses, ``rep.parsed`` and ``rep.complete`` (its data against
    ``rep.size``, the file's size, if known)."""
    if raw[:1] != b"{":
        if raw.strip(b"\x00") == b"":
            return rep.fail("header_invalid", "header is all zero bytes (an incomplete preallocated download?)")
        return rep.fail("header_invalid", "header does not start with '{': not a safetensors file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return rep.fail("header_invalid", f"header is not valid UTF-8 (byte {exc.start})")
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        pos = f" at char {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
        return rep.fail("header_invalid", f"header is not valid JSON: {msg}{pos}")
    if not isinstance(doc, dict):
        return rep.fail("header_invalid", "header JSON is not an object")
    meta = doc.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            rep.fail("header_invalid", "__metadata__ must map strings to strings")
        else:
            rep.metadata = meta
    end = _fast_valid_end(doc)
    if end is None:
        end = _slow_validate(doc, rep)
        if end is None:
            return rep
    rep.tensors = doc
    rep.data_bytes = end
    rep.parsed = True  # the file's size against 8 + N + data is the judgement's (doctor.model.weights.size_problem)
    return rep


def _shape_ok(shape: tuple[Any, ...]) -> bool:
    return all(type(d) is int and d >= 0 for d in shape)


def _fast_valid_end(doc: dict[str, Any]) -> int | None:
    """The end of the data when every entry is valid and contiguous, else None (then ``_slow_validate``
    finds and words the problem). Works on whole columns so that 200k tensors cost C loops, not Python."""
    if not doc:
        return 0
    try:
        return _columns_end(list(doc.values()))
    except (KeyError, TypeError, ValueError):
        return None


def _columns_end(vals: list[Any]) -> int | None:
    raw_shapes = [v["shape"] for v in vals]
    offs = [v["data_offsets"] for v in vals]
    if set(map(type, raw_shapes)) != {list} or set(map(type, offs)) != {list} or set(map(len, offs)) != {2}:
        return None
    dtypes = [v["dtype"] for v in vals]
    if set(map(type, dtypes)) != {str} or not set(dtypes) <= DTYPE_BITS.keys():
        return None
    shapes = list(map(tuple, raw_shapes))
    begins = [o[0] for o in offs]
    ends = [o[1] for o in offs]
    if set(map(type, begins)) != {int} or set(map(type, ends)) != {int}:
        return None
    sizes: dict[tuple[str, tuple[Any, ...]], int] = {}
    for key in set(zip(dtypes, shapes, strict=True)):
        dtype, shape = key
        if not _shape_ok(shape):
            return None
        bits = DTYPE_BITS[dtype] * math.prod(shape)
        if bits % 8:
            return None
        sizes[key] = bits // 8
    lengths = list(map(operator.sub, ends, begins))
    if list(map(sizes.__getitem__, zip(dtypes, shapes, strict=True))) != lengths:
        return None
    # Contiguous from 0 without sorting: the data must start at 0, the sizes must add up to the end,
    # and every tensor must begin where a non-empty tensor ends (or at 0). Then there is no gap, and
    # with no gap, sizes adding up to the span leave no room for an overlap.
    end = max(ends)
    if min(begins) != 0 or sum(lengths) != end:
        return None
    starts = set(compress(ends, lengths))
    starts.add(0)
    if not starts.issuperset(begins):
        return None
    return end


def _slow_validate(doc: dict[str, Any], rep: HeaderReport) -> int | None:
    """Entry by entry, naming the tensor and what is wrong; returns the data end or None."""
    entries: list[tuple[int, int, str]] = []
    bad = 0
    for name, info in doc.items():
        why = _tensor_problem(info)
        code = "tensor_invalid"
        if why is None:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            bits = math.prod(shape) * DTYPE_BITS[dtype]
            if bits % 8:
                why = f"{math.prod(shape)} x {dtype} is not a whole number of bytes"
            elif end - begin != bits // 8:
                code = "dtype_shape_mismatch"
                why = (f"{dtype}{list(shape)} needs {bits // 8} bytes, its offsets [{begin}, {end}] hold "
                       f"{end - begin}")
            else:
                entries.append((begin, end, name))
        if why:
            bad += 1
            if bad <= 5:
                rep.fail(code, f"tensor {name!r}: {why}")
    if bad > 5:
        rep.fail("tensor_invalid", f"... and {bad - 5} more invalid tensor entries")
    if bad:
        return None
    entries.sort()
    pos = 0
    for begin, end, name in entries:
        if begin != pos:
            kind = "overlap" if begin < pos else "hole"
            what = (f"overlaps the previous tensor (starts at {begin}, previous data ends at {pos})" if begin < pos
                    else f"leaves a hole: starts at {begin}, previous data ends at {pos}")
            rep.fail(f"offsets_{kind}", f"tensor {name!r} {what}")
            return None
        pos = end
    return pos


def _tensor_problem(info: Any) -> str | None:
    """Why a header entry is not a valid tensor description, or None."""
    if not isinstance(info, dict):
        return "entry is not an object"
    dtype = info.get("dtype")
    if not isinstance(dtype, str):
        return "dtype missing"
    if dtype not in DTYPE_BITS:
        return f"unknown dtype {dtype!r}"
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return f"shape {shape!r} is not a list of non-negative integers"
    offs = info.get("data_offsets")
    if (not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs)
            or offs[0] < 0 or offs[1] < offs[0]):
        return f"data_offsets {offs!r} is not [begin, end] with 0 <= begin <= end"
    return None
