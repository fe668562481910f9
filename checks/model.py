"""Model checks: shards, config, tokenizer, drafter, fit, and the deep sha256 tier.

Each maps the facts ``model``, ``model.tensors``, ``model.tokenizer``, ``drafter``, ``model.hashes`` and ``nvml``
(doctor/model/facts.py, doctor/gpu/facts.py) to the judgements of ``doctor/model/``. The target's and the drafter's
weights are one judgement parameterised by their role (``doctor.model.weights.TARGET`` / ``DRAFTER``), and so are
their deep variants, two instances of one check.
"""

from __future__ import annotations

from collections.abc import Callable

from doctor.core.context import Context
from doctor.core.registry import check
from doctor.core.result import Result
from doctor.model.consistency import judge_config
from doctor.model.drafter import judge_drafter
from doctor.model.fit import judge_fit
from doctor.model.tokenizer_files import judge_tokenizer
from doctor.model.weights import DRAFTER, TARGET, Role, judge_hashes, judge_shards


@check("model.shards", "Model shards: index, headers, completeness, no partial downloads", needs=("model",),
       fixer="model.redownload", timeout=120, failure="node")
def model_shards(ctx: Context) -> Result:
    """Reads model.safetensors.index.json (or model.safetensors) and the header of every shard it names,
    never the data: header length within safetensors' 100 MB limit, UTF-8 JSON, known dtypes, offsets
    contiguous from 0 with no holes or overlaps, bytes = dtype size x shape, file size = 8 + header + data;
    every indexed tensor in the shard the index names, none in two shards, metadata.total_size agreeing.
    Leftovers of interrupted downloads fail it (<shard>.aria2, *.incomplete, also under
    .cache/huggingface/download and the HF cache's blobs/); Git LFS pointer files and dangling symlinks
    are named. Index paths must stay inside the model directory.

    Why: a wrong or partial shard costs a failed start many minutes later (weights load) or garbage output.
    Fix by hand: re-download the named files, e.g. `hf download REPO FILES --local-dir DIR --force-download`,
    or resume them with aria2 (`k26-doctor fix` writes the input file); then run `--deep` to hash them."""
    return Result.of(judge_shards(ctx.fact("model"), TARGET, ctx.settings, ctx.selected))


def deep_check(role: Role, title: str, timeout: float, explain: str) -> Callable[[Context], Result]:
    """The sha256 check of one directory's shards (``--deep``): one check, an instance per role."""

    def hashes(ctx: Context) -> Result:
        return Result.of(judge_hashes(ctx.fact("model.hashes"), role, ctx.settings))

    hashes.__doc__ = explain
    return check(role.deep_check, title, needs=("model.hashes",), deep=True, timeout=timeout,
                 fixer="model.redownload", failure="node")(hashes)


model_shards_deep = deep_check(
    TARGET, "Model shards: sha256 of every shard against manifest / HF metadata", 6 * 3600,
    """Hashes every shard (sha256, files in parallel, large blocks) and compares with, in this order: the
    k26-doctor manifest (`k26-doctor manifest write DIR`), huggingface_hub's local-dir metadata
    (.cache/huggingface/download/<file>.metadata, whose etag is the LFS sha256), the Hugging Face cache's
    blob names. A verification cache keyed by (device, inode, size, mtime_ns, ctime_ns) outside the model
    directory (/var/tmp/k26-doctor-<uid>, a temporary directory kept across reboots) means a restart
    re-hashes only what changed; --no-verify-cache (or K26_DOCTOR_NO_VERIFY_CACHE=1) ignores it.

    Why: headers can be intact while the data is not (an aria2 download with holes, a bit flip, a mixed
    revision). Fix by hand: re-download the mismatching files.""")
model_drafter_deep = deep_check(
    DRAFTER, "Draft model: sha256 of every shard", 3600, """As model.shards.deep, for the draft model directory.""")


@check("model.config", "Model config.json: valid, supported, consistent with the shards and TP",
       needs=("model", "model.tensors"), timeout=120, failure="deployment")
def model_config(ctx: Context) -> Result:
    """Parses config.json as the server will: the kimi_k25 family (KimiK25ForConditionalGeneration) with a
    DeepSeek-V3-like text_config (model_type kimi_k2 or deepseek_v3), plain deepseek_v3, or a generic
    model. Checks field types, the quantization (compressed-tensors pack-quantized int4 with group strategy,
    under text_config or at the top level), that the config agrees with the shards (packed I32 expert
    weights [out, in/8], scales [out, in/group_size], experts per MoE layer = n_routed_experts, layers in
    the shards = num_hidden_layers), TP divisibility (attention heads; experts under EP; int4 groups per
    rank), the profile's expectations (e.g. 61 layers, 384 experts), and that every remote-code file that
    auto_map names (config.json and tokenizer_config.json), and every file those import relatively, is there.

    Why: a config that disagrees with its weights fails at load after minutes, or loads and produces
    garbage; a missing remote-code file fails the import after the weights loaded. Fix by hand: re-download
    config.json from the same revision as the shards; `hf download REPO --include FILE --local-dir DIR` for
    a missing remote-code file."""
    return Result.of(judge_config(ctx.fact("model"), lambda: ctx.optional("model.tensors"), ctx.settings))


@check("model.tokenizer", "Tokenizer and chat template files the server needs", needs=("model", "model.tokenizer"),
       depends=("python.venv",), timeout=200, failure="deployment")
def model_tokenizer(ctx: Context) -> Result:
    """Looks for what the server's tokenizer loads: tokenizer_config.json (valid JSON), the vocabulary
    (tiktoken.model for TikToken tokenizers such as K2.6's, else tokenizer.json / tokenizer.model /
    vocab.json), a chat template (in tokenizer_config.json, chat_template.jinja or chat_template.json), and
    the remote-code modules that auto_map names (config.json and tokenizer_config.json). Says when
    --trust-remote-code is required and fails when the profile turns it off. tiktoken.model is read whole:
    a valid BPE file (base64 token and rank per line, ranks 0..n-1), and n plus the remote code's reserved
    special ids equal to config.json's vocabulary. Then, in the service's interpreter (--python), the
    tokenizer is loaded as SGLang 0.5.23's get_tokenizer does (AutoTokenizer with trust_remote_code; the
    declared class when transformers hands back its generic TokenizersBackend), every special token the
    server's parsers split on (--reasoning-parser / --tool-call-parser kimi_k2: <think>, </think>, the
    tool-call section markers) must be one token with tokenizer_config.json's id and decode back, and the
    chat template must render a request with a tool. The remote code is checked against the installed
    transformers (tokenization_kimi.py's bytes_to_unicode import, gone in transformers 5; releases that
    route kimi_k25 to the generic backend). Without transformers there the load is not judged (skip).

    Why: a missing tokenizer file fails the start after the weights loaded; a missing chat template
    breaks chat completions; a tokenizer that loads with other special-token ids serves reasoning inside
    the answer and unparsed tool calls, with no error anywhere. Fix by hand: download the missing files
    from the model's repository; use the model's current remote code with the transformers SGLang pins.
    A server started with --skip-tokenizer-init loads no tokenizer: then there is nothing to judge (skip)."""
    fact, args = ctx.fact("model"), ctx.server_args[0]
    return Result.of(judge_tokenizer(fact, lambda: ctx.optional("model.tokenizer"), args, ctx.settings))


@check("model.drafter", "Draft model (DFlash): config, shards, consistency with the target",
       needs=("drafter", "model"), fixer="model.redownload", timeout=120, failure="node")
def model_drafter(ctx: Context) -> Result:
    """The DFlash draft model: config.json valid (block_size >= 1; target_layer_ids integers within the
    target's layers and as many as the drafter's fc takes; mask_token_id inside the vocabulary; hidden size
    and vocabulary equal to the target's; the profile's architectures, and ones SGLang runs under the
    profile's --speculative-algorithm: no EAGLE3 drafter under DDTREE, and an EAGLE3 or MTP draft named as what
    it is by its config's keys when its architectures do not say it: eagle_config, num_nextn_predict_layers),
    its shards valid by the same validator as the target's (model.shards), a declared draft vocabulary
    (draft_vocab_size) with its own lm_head.weight of that many rows (without it the server starts and accepts
    no drafted token), target_layer_ids inside the target (an id at or past its layer count: a drafter built
    for a deeper target, "mat1 and mat2 shapes cannot be multiplied" at the first draft step), a
    --speculative-algorithm in [server] args with no draft model given, not the target's own directory; under
    DDTREE the drafter's block against
    --speculative-ddtree-budget (budget >= block - 1) and --attention-backend triton; the attention backend
    the DFlash draft will get (not an MLA-only one, which SGLang silently replaces).

    Why: SGLang rejects an inconsistent drafter only after the target loaded (minutes), or runs it on another
    backend than asked. Fix by hand: use the drafter trained for this target, downloaded whole, at its own
    path; the flags the result names."""
    fact, args = ctx.fact("drafter"), ctx.server_args[0]
    return Result.of(judge_drafter(fact, lambda: ctx.optional("model"), args, ctx.settings, ctx.selected))


@check("model.fit", "Weights per GPU plus headroom fit in GPU memory: the --mem-fraction-static window",
       needs=("nvml", "model", "model.tensors", "drafter"), timeout=120, failure="deployment", applies=("start",))
def model_fit(ctx: Context) -> Result:
    """Computes, before a load that takes many minutes, the --mem-fraction-static values that work, as
    SGLang 0.5.23 accounts memory (``doctor/model/memory.py``, constants in
    ``doctor/data/sglang_memory.toml``): SGLang measures the free memory `pre` before loading, puts the
    target's and the drafter's weights (TP-split tensors / TP, plus what every rank keeps whole: MLA's
    down projections, routers, norms, the vision tower; the drafter's fc and norms) and the KV cache in
    `pre x f`, and leaves `pre x (1 - f)` for the rest: the attention backend's CUDA-graph buffers (with
    DDTree the verify width is budget + 1 tokens per request: Triton's graph logits, KV indices and tree
    mask grow with max_bs x (budget + 1) x context), the graphs' logits buffer, prefill activations,
    the request table, NCCL. f_min is where the KV cache holds what the profile asks (one request at the
    full context, or `kv_tokens_per_request` for every running request; MLA: (kv_lora_rank +
    qk_rope_head_dim) x layers x 2 bytes per token, plus the DFlash drafter's cell); f_max is where the
    outside still fits. Fails when no value works or the weights do not fit; warns when the profile's
    value lies outside the window; reports a recommended value (the largest that leaves the outside its
    room, to 0.01).

    Why: "raise or lower --mem-fraction-static?" is the question SGLang answers only after loading (and
    with a large speculative verify width there may be no answer at all). Fix by hand: set
    [server] mem_fraction_static to the recommended value; lower the context length, max running
    requests, the CUDA graphs' max batch size or the DDTree budget; or use more GPUs."""
    return Result.of(judge_fit(lambda: ctx.fact("nvml"), lambda: ctx.fact("model"),
                               lambda: ctx.optional("model.tensors"), lambda: ctx.optional("drafter"),
                               ctx.server_args, ctx.settings))
