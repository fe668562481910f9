"""The model area's facts, typed: a model directory (``model``, ``drafter``: ``describe_dir``), its tensors folded
into patterns (``model.tensors``), the sha256 of its shards (``model.hashes``).

As with ``doctor.gpu.nvml_fact``, one declaration serves twice: the judgements of ``doctor/model/`` are annotated
with these types, and the collectors' ``shape=`` makes the fact store refuse a value without them ("the fact
'model' is malformed: WHERE") before any check reads it. Every key a judgement reads is here, with the type it
relies on.
"""

from __future__ import annotations

from typing import Any, TypedDict


class CodedMessage(TypedDict):
    """One thing wrong with a file, as a fact records it: the reader's defect, a stable code and its message
    (``doctor.model.header.recorded``); the judgement decides what it means."""

    code: str
    message: str


class Access(TypedDict, total=False):
    """Owner, group and mode of a path (``doctor.host.access.ownership``)."""

    path: str
    owner: str
    uid: int
    group: str
    gid: int
    mode: str
    perms: str
    is_dir: bool


class User(TypedDict, total=False):
    user: str
    uid: int
    group: str
    gid: int


class HfMetadata(TypedDict, total=False):
    commit: str | None
    etag: str | None
    timestamp: str | int | float | None


class _Named(TypedDict):
    name: str


class Shard(_Named, total=False):
    """One shard as read: its file, its header's numbers, what the readers found wrong with its bytes (``problems``)
    and whether it is valid (``ok``). What is wrong with the file itself (``exists``, ``dangling``, ``error``) and
    with its size against its header (``parsed``: the header parsed, so ``8 + header_len + data_bytes`` is its
    size when complete) is worded by the judgement (``doctor.model.weights.problems_of``); a snapshot recorded
    before these keys holds those lines among its ``problems``."""

    size: int | None
    allocated: int | None
    symlink: str | None
    blob_sha256: str | None
    exists: bool
    dangling: bool
    error: str | None
    tensors: int
    data_bytes: int
    header_len: int | None
    parsed: bool
    format: str | None
    access: Access | None
    hf_metadata: HfMetadata | None
    ok: bool
    problems: list[CodedMessage]


# The shard a download leftover belongs to ("for": a Python keyword, hence this form).
_LeftoverOf = TypedDict("_LeftoverOf", {"for": "str | None", "size": "int | None"}, total=False)


class Leftover(_LeftoverOf):
    """A leftover of an interrupted download (an aria2 control file, a partial huggingface_hub file)."""

    path: str
    kind: str


class Totals(TypedDict, total=False):
    shards: int
    shards_ok: int
    tensors: int
    data_bytes: int
    file_bytes: int
    index_tensors: int | None


class IndexSummary(TypedDict, total=False):
    path: str
    problems: list[CodedMessage]
    shards: list[str]
    tensors: int
    total_size: int | None


class Weights(TypedDict, total=False):
    layout: str | None
    index: IndexSummary | None
    shards: list[Shard]
    problems: list[CodedMessage]
    leftovers: list[Leftover]
    hf_cache: str | None
    totals: Totals
    stray_safetensors: list[str]


class JsonFile(TypedDict, total=False):
    """A JSON file of the directory read as text (``read_json_file``): parsed by the judgements, never here."""

    present: bool
    text: str
    error: str
    chat_template: dict[str, Any] | None


class TokenizerFiles(TypedDict, total=False):
    tokenizer_config: JsonFile
    files: dict[str, dict[str, Any]]


class Listing(TypedDict, total=False):
    entries: dict[str, dict[str, Any]]
    count: int


class RemoteFile(TypedDict, total=False):
    needed_by: str | None
    present: bool
    error: str
    imports: list[Any]
    relative: list[str]
    moved: list[dict[str, Any]]
    num_reserved_special_tokens: int | None


class RemoteCode(TypedDict, total=False):
    refs: list[str]
    external: list[str]
    files: dict[str, RemoteFile]
    missing: list[str]


class Pattern(TypedDict, total=False):
    shapes: dict[str, int]
    bytes: int
    count: int


class TensorSummary(TypedDict, total=False):
    """The tensors of the shards folded into patterns (layer and expert numbers as ``#``)."""

    patterns: dict[str, Pattern]
    layers: list[int]
    experts_per_layer: dict[str, int]
    max_expert_id: dict[str, int]
    dtypes: dict[str, int]
    dtype_bytes: dict[str, int]


class _Given(TypedDict):
    given: bool


class ModelDir(_Given, total=False):
    """A model directory as the default tier reads it: ``given`` False when no path was set; ``error`` when the
    path cannot be used (with ``access`` and ``user`` for permissions)."""

    path: str | None
    what: str
    exists: bool
    is_dir: bool
    error: str
    access: Access | None
    user: User
    realpath: str
    weights: Weights
    config: JsonFile
    tokenizer: TokenizerFiles
    files: Listing
    remote_code: RemoteCode
    tensors: TensorSummary | None  # the drafter's (small): the target's is its own fact, model.tensors


class TensorsFact(TypedDict, total=False):
    """``summary`` None when the shards could not be read (model.shards says why)."""

    given: bool
    path: str
    summary: TensorSummary | None


class Expected(TypedDict, total=False):
    """The published digest a file is compared with, and where it was found (manifest, HF metadata, HF cache)."""

    sha256: str
    size: int | None
    source: str


class HashedFile(_Named, total=False):
    verdict: str
    size: int
    sha256: str
    cached: bool
    seconds: float
    error: str
    expected: Expected


class HashedDir(_Given, total=False):
    path: str | None
    error: str
    problem: str | None
    files: list[HashedFile]
    manifest: dict[str, Any] | None
    bytes_hashed: int
    seconds: float
    rate_bytes_s: int | float | None
    workers: int | None
    cache: dict[str, Any] | None


class HashesFact(TypedDict, total=False):
    """``collected`` False without --deep (nothing hashed); else one entry per directory."""

    collected: bool
    reason: str
    model: HashedDir
    drafter: HashedDir
