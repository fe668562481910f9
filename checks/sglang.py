"""Checks of the SGLang area: the install (``sglang.install``), the patch set (``sglang.patches``), the
server flags (``sglang.flags``) and the DDTree worker gate (``sglang.ddtree``).

Each maps the facts of ``doctor.sglang.facts`` (and ``stack`` for the installed distributions) to the judgements
of ``doctor/sglang/``. The flag judgement is ``doctor.sglang.flags.judge_flags``, the same one the launcher uses on
the real argv; patch status is ``doctor.sglang.patching.status.evaluate``.
"""

from __future__ import annotations

from doctor.core.context import Context
from doctor.core.registry import check
from doctor.core.result import Result
from doctor.sglang.ddtree import GATE_APPLIES, judge_gate
from doctor.sglang.flags import judge_server_flags
from doctor.sglang.install import judge_install
from doctor.sglang.patchset import PATCHES_APPLY, judge_patches


@check("sglang.install", "SGLang importable from the service's interpreter, version as the profile pins",
       needs=("stack", "sglang_import"), depends=("python.venv",), timeout=300, failure="deployment")
def sglang_install(ctx: Context) -> Result:
    """Finds SGLang without importing it (package metadata and ``find_spec``) and checks its version against
    the profile's pin. By default that is all from files, in the ``stack`` probe: every ``Requires-Dist`` of
    SGLang installed (``pip check``'s rule: SGLang imports most of them lazily, so ``import sglang`` can succeed
    while the server stops at start on a missing one; one at a version SGLang excludes warns), and what
    the server imports at start beyond ``import sglang`` (``doctor/data/sglang_runtime.toml``, each rule seen
    stopping a real server) found on disk: FlashInfer's ``sampling`` module and the JIT source directories
    DFLASH/DDTREE verify compiles, the CuTe DSL for Llama/Qwen-family MLPs, and DFlash's tree-sampling kernel
    module (without it SGLang silently verifies greedily: warn). Where the start compiles FlashInfer's modules
    (no ``flashinfer-jit-cache`` for the GPU, nothing compiled in the cache), the toolchain exactly: nvcc's
    release (``nvcc --version``) against the ``CUDART_VERSION`` of the ``cuda_runtime_api.h`` the build
    includes (CCCL's cuda_toolkit.h stops a build of nvcc 13.3 with cu13.0 headers: "CUDA compiler and CUDA
    toolkit headers are incompatible"), cuda.h against it, the CUDA major against torch's, a toolkit without
    ``include/cuda_runtime.h`` and a ``CUDA_HOME`` holding a search path (code ``sglang.install.jit_toolchain``).

    Importing SGLang (it imports torch: seconds to a minute) moves to ``--deep``, ``--import-sglang`` and
    ``launch``, which sets it: a wheel can be present with every requirement yet fail to import (a
    dependency's shared library, a mismatched build), and a start that fails there costs the ~20 minutes
    the weights take to load, so the gate before a start pays for the real import; the systemd unit's
    ExecStartPre passes ``--import-sglang`` for the same reason. A recording without the on-disk reading
    is judged from its import. Fix by hand: ``pip install 'sglang==<pin>'`` (and what the failure names)
    in the service's venv.
    """
    return Result.of(judge_install(ctx.fact("stack"), lambda: ctx.fact("sglang_import"), ctx.settings))


@check("sglang.patches", "Every patch of the profile's SGLang patch set applied, none drifted",
       needs=("sglang_patches",), depends=("python.venv",), tags=("sglang", "patches"),
       fixer="sglang.patches.apply", timeout=60, failure="deployment", applies_if=PATCHES_APPLY)
def sglang_patches(ctx: Context) -> Result:
    """Hashes every file the profile's patch set (`[patches] set`, from `sglang_patches/<set>/` or the
    site's `patches_dir`) touches in the service interpreter's SGLang, without importing SGLang,
    and compares each with the manifest: pristine (RECORD's hash), applied (the post-image),
    drifted (neither: a hand edit, another SGLang build) or missing.

    Why: the DDTree deployment needs these patches; a missing one fails late (at server start or
    at the first tree verify), a drifted one silently runs code nobody reviewed.

    Fix: `k26-doctor patches status` shows each file; `k26-doctor patches apply` applies the set
    atomically (backups, journal, all or nothing); a drifted file is refused unless `--force`.
    `k26-doctor patches revert` puts RECORD's bytes back. By hand: `pip install --force-reinstall
    --no-deps sglang==VERSION`, then apply.
    """
    return Result.of(judge_patches(ctx.fact("sglang_patches"), ctx.settings))


@check("sglang.flags", "Every server flag is one the installed SGLang accepts", needs=("sglang_flags",),
       depends=("python.venv",), tags=("sglang", "launch"), failure="deployment")
def sglang_flags(ctx: Context) -> Result:
    """Reads the flags the service interpreter's SGLang accepts from its sources (the annotated
    fields of ``sglang/srt/arg_groups/fields/`` in 0.5.2x, ``add_argument`` calls in older releases;
    nothing is imported) and replays argparse on the command ``k26-doctor launch`` would run: the
    profile's flags, its ``[server] args``; and a ``--speculative-algorithm`` that runs a separate draft model
    (DFLASH, DDTREE, EAGLE3) without ``--speculative-draft-model-path`` (``sglang.flags.no_draft_model``:
    SGLang stops at argument resolution, "DFLASH speculative decoding requires setting
    --speculative-draft-model-path").

    Why: SGLang parses its flags only after seconds to minutes of imports, then exits with status 2:
    0.5.20 removed ``--cuda-graph-max-bs`` and argparse calls it an "ambiguous option"; a DDTree flag
    is "unrecognized" when the patch set is not applied. Under systemd that becomes a restart loop.
    Fix by hand: use the replacement flag named in the result (`k26-doctor launch --dry-run` shows the
    command), or apply the patch set (`k26-doctor patches apply`).
    """
    return Result.of(judge_server_flags(ctx.fact("sglang_flags"), *ctx.server_args))


@check("sglang.ddtree", "DDTREE will be accepted by the patched SGLang (site validation record gate)",
       needs=("env", "stack", "nvml", "sglang_patches", "ddtree_site"), failure="deployment", applies_if=GATE_APPLIES)
def ddtree_gate(ctx: Context) -> Result:
    """When the profile launches `--speculative-algorithm DDTREE`, judges what the patched SGLang's start-up gate
    will judge at argument resolution: DDTREE starts only on a site validation record that `k26-doctor validate`
    wrote on this host (`<state_dir>/ddtree/validated/*.json`) whose every key equals the running configuration:
    SGLang's version and torch's release and CUDA, triton, sglang-kernel and FlashInfer (`stack`), TP size,
    attention backend, decode CUDA graphs, the overlap scheduler, EP size, the MoE all-to-all backend, attention
    CP, prefill CP and the DDTree budget (the server arguments `launch` builds, read as SGLang's parser reads
    them), the GPUs' name, count, compute capability and driver (`nvml`), the installed files of the patch set
    (`sglang_patches`), and the model's and drafter's identity (`ddtree_site`). The service's environment is read
    for SGLANG_DDTREE_UNVALIDATED_WORKER (the blanket opt-in, for validation runs).

    An exact record: pass, naming it (warn when it says DDTREE was lossless but not faster than DFLASH, naming
    DFLASH). Otherwise fail with every key that differs from the nearest record (`ddtree_budget 32 (validated:
    16)`, `torch 2.14.1 (validated: 2.11.0)` after an upgrade), or "no site validation record"; a record edited by
    hand (its integrity hash), copied from another host (machine id, GPU UUIDs) or unreadable is refused, named
    with why. With the opt-in: warn, saying whether a record holds. A key whose fact is missing is not judged, and
    the check is then never a pass.
    Fix: run `k26-doctor validate --profile PROFILE` on this host (the remediation names the command), or serve
    DFLASH (server.speculative_algorithm = "DFLASH").
    """
    return Result.of(judge_gate(ctx.optional, ctx.server_args, ctx.settings, ctx.know("ddtree_gate")))
