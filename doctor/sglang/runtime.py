"""What an SGLang server imports at start beyond ``import sglang``: the judgement of the ``runtime`` part of
the ``sglang_import`` fact (imported, ``--deep`` and ``launch``) or of the ``stack`` fact's ``sglang_runtime``
(found on disk, the default tier) against ``doctor/data/sglang_runtime.toml``.

Each rule there was found by starting real SGLang 0.5.23 servers: a DFLASH or DDTREE server on CUDA
stops in its sampling rehearsal without FlashInfer, and again when FlashInfer lacks the sources its JIT
compiles; a Llama/Qwen-family model stops without the CuTe DSL. ``import sglang`` succeeds in each case,
so ``sglang.install`` must look further.

Each problem is a ``Finding`` with a code of its kind (below), its own fix commands with it, so that a fixer
can act on one kind; ``doctor.sglang.install`` says them as the check's one verdict.
"""

from __future__ import annotations

import re
from typing import Any

from doctor.core.datafile import load_toml
from doctor.core.result import Finding, Findings, Remediation, Severity
from doctor.stack.service_probe import SGLANG_RUNTIME_FILE

# One path for the rules: the stack probe, below this area, hands them to the probe (``probe_rules``).
DATA_FILE = SGLANG_RUNTIME_FILE


# What the server imports at start (fail; the CuTe DSL warns where this model's start does not import it):
RUNTIME_FLASHINFER = "sglang.install.runtime.flashinfer"  # FlashInfer not installed, or not importable
RUNTIME_FLASHINFER_SOURCES = "sglang.install.runtime.flashinfer_sources"  # installed without the sources its JIT needs
RUNTIME_CUTE_DSL = "sglang.install.runtime.cute_dsl"  # the CuTe DSL not installed, or not importable
# FlashInfer's JIT, where the start compiles its module (fail), and where its kernels come from (info):
JIT_NVCC = "sglang.install.jit_nvcc"  # no nvcc to compile with
JIT_TOOLCHAIN = "sglang.install.jit_toolchain"  # the toolkit it would compile with is wrong (toolchain_problems)
JIT_NINJA = "sglang.install.jit_ninja"  # no ninja on the service's PATH
JIT_CACHE = "sglang.install.jit_cache"  # the JIT cache is not writable
JIT_READY = "sglang.install.jit_ready"  # precompiled, compiled already, or compilable at start: where from


def _commands(*commands: str) -> Remediation:
    """A problem's fix commands; the check's one remediation says the words (``doctor.sglang.install``)."""
    return Remediation("", list(commands))


def rules(path: str | None = None) -> dict[str, Any]:
    return load_toml(path or DATA_FILE)


def runtime_problems(runtime: Any, *, algorithm: str | None, architectures: list[str] | None,
                     flashinfer_pin: str | None = None) -> Findings:
    """What the server the profile will start lacks of what it imports at start: one finding per problem.

    ``runtime`` is the probe's ``runtime`` object; absent (an older snapshot) means nothing to judge here.
    Found on disk (``"from": "files"``), a module counts when its files are there; imported, FlashInfer
    counts when ``import flashinfer.sampling`` succeeded.
    """
    if not isinstance(runtime, dict):
        return Findings()
    r = rules()
    on_disk = runtime.get("from") == "files"
    found = Findings(_flashinfer_runtime(r["flashinfer"], (algorithm or "").upper(), _part(runtime, "flashinfer"),
                                         on_disk, flashinfer_pin))
    found.extend(_cute_runtime(r["cute_dsl"], _part(runtime, "cute_dsl"), on_disk, architectures))
    return found


def _part(doc: dict[str, Any], key: str) -> dict[str, Any]:
    """``doc[key]`` when it is an object, else an empty one: a recorded fact may hold anything there."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def _flashinfer_runtime(fi_rule: dict[str, Any], algo: str, fi: dict[str, Any], on_disk: bool,
                        flashinfer_pin: str | None) -> list[Finding]:
    """FlashInfer for a server whose speculative algorithm needs it at start: absent (or not importable), or
    installed without the source directories its JIT compiles from."""
    if algo not in fi_rule["algorithms"]:
        return []
    missing_dirs = [d for d, ok in (fi.get("jit_dirs") or {}).items() if not ok]
    why = (f"{algo} verify on CUDA renormalises with {fi_rule['module']} and SGLang JIT-compiles "
           "FlashInfer's modules from its sources at start")
    pin = f"=={flashinfer_pin.lstrip('=')}" if flashinfer_pin else ""
    if not fi.get("found" if on_disk else "importable"):
        return [Finding(Severity.FAIL, RUNTIME_FLASHINFER,
                        f"{why}, but {fi_rule['module']} is not installed: {fi.get('error') or 'not found'}"
                        if on_disk else
                        f"{why}, but `import {fi_rule['module']}` fails: {fi.get('error') or 'not installed'}",
                        _commands(f"pip install '{fi_rule['pip']}{pin}'"))]
    if missing_dirs:
        return [Finding(Severity.FAIL, RUNTIME_FLASHINFER_SOURCES,
                        f"{why}, but the FlashInfer at {fi.get('package_dir')} lacks {', '.join(missing_dirs)} "
                        "(a trimmed or partial install)",
                        _commands(f"pip install --force-reinstall --no-deps '{fi_rule['pip']}{pin}'"))]
    return []


def _cute_runtime(cute_rule: dict[str, Any], cute: dict[str, Any], on_disk: bool, architectures: list[str] | None
                  ) -> list[Finding]:
    """The CuTe DSL missing: a failure for a model whose start imports it, a warning otherwise (SGLang requires
    it, this start does not reach it)."""
    if not cute or cute.get("found"):
        return []
    hit = sorted(set(architectures or []) & set(cute_rule["architectures"]))
    text = (f"the CuTe DSL (`{cute_rule['module']}`) is not {'installed' if on_disk else 'importable'}"
            + (f": {cute['error']}" if cute.get("error") else ""))
    if hit:
        return [Finding(Severity.FAIL, RUNTIME_CUTE_DSL,
                        f"{text}; {', '.join(hit)} builds SGLang's DualGemm MLP, which imports it on every CUDA start",
                        _commands(f"pip install '{cute_rule['pip']}'"))]
    return [Finding(Severity.WARN, RUNTIME_CUTE_DSL,
                    f"{text} (SGLang requires it; this model's start does not import it)")]


def _digits(text: Any) -> str:
    """The digits of a compute capability, an architecture or a CUDA version: "10.3" and "sm_103a" -> "103"."""
    return re.sub(r"\D", "", str(text or ""))


def _same_release(installed: str | None, flashinfer: str | None) -> bool:
    """FlashInfer's own rule (flashinfer/jit/env.py): the jit-cache version equals FlashInfer's, or adds
    only a CUDA local version (``0.7.2+cu130``). A mismatched cache is ignored and the kernels compile."""
    return bool(installed and flashinfer) and (installed == flashinfer or str(installed).startswith(f"{flashinfer}+"))


def header_release(macro: Any) -> str | None:
    """``CUDART_VERSION`` / ``CUDA_VERSION`` as a release: 13000 -> "13.0", 12080 -> "12.8"."""
    return f"{macro // 1000}.{macro % 1000 // 10}" if type(macro) is int and macro > 0 else None


def nvcc_pip(release: str) -> str:
    """The wheel of NVIDIA's nvcc for a CUDA release (``nvidia-cuda-nvcc`` from CUDA 13, ``-cu12`` before)."""
    major = release.split(".")[0]
    return f"'nvidia-cuda-nvcc{'-cu' + major if major.isdigit() and int(major) < 13 else ''}=={release}.*'"


def toolchain_problems(nvcc: dict[str, Any], torch_cuda: str | None) -> Findings:
    """What is wrong with the toolkit a JIT build would use (code ``JIT_TOOLCHAIN``, each with its fix), from the
    ``nvcc`` the stack probe found: a ``CUDA_HOME`` that is a search path, a toolkit without
    ``include/cuda_runtime.h``, nvcc's release against the ``CUDART_VERSION`` of the ``cuda_runtime_api.h`` it would
    include (CCCL's cuda_toolkit.h stops the build: "CUDA compiler and CUDA toolkit headers are incompatible",
    nvcc 13.3 with cu13.0 headers), and the CUDA major against torch's (the modules link torch's CUDA runtime). A
    key a recording lacks is not judged."""
    found = Findings()

    def problem(message: str, command: str) -> None:
        found.fail(JIT_TOOLCHAIN, message, _commands(command))

    home, include = nvcc.get("home"), nvcc.get("include")
    if nvcc.get("found_by") == "CUDA_HOME/CUDA_PATH" and isinstance(home, str) and (":" in home or not home.strip()):
        problem(f"CUDA_HOME/CUDA_PATH is {home!r}, a search path: FlashInfer and tvm-ffi read one toolkit directory "
                "from it", "# set CUDA_HOME to one toolkit directory (the one holding bin/nvcc and "
                "include/cuda_runtime.h)")
    if not nvcc.get("exists"):
        return found
    if nvcc.get("cuda_runtime_h") is False:
        problem(f"the toolkit at {home} has bin/nvcc but no {include}/cuda_runtime.h (a compiler without the CUDA "
                f"runtime's headers; looked in {', '.join(nvcc.get('includes') or [str(include)])})",
                "# point CUDA_HOME at a whole CUDA toolkit, or install the runtime headers beside this nvcc")
    release, headers = nvcc.get("release"), header_release(nvcc.get("cudart_version"))
    if release and headers and release != headers:
        problem(f"nvcc {release} ({nvcc.get('nvcc')}) with CUDA {headers} headers ({include}/cuda_runtime_api.h "
                "CUDART_VERSION): the build stops at \"CUDA compiler and CUDA toolkit headers are incompatible\"",
                f"pip install {nvcc_pip(headers)}" if "site-packages" in str(home) else
                f"# point CUDA_HOME at one toolkit whose nvcc and headers are both CUDA {headers} or both {release}")
    driver_api = header_release(nvcc.get("cuda_version"))
    if headers and driver_api and driver_api != headers:
        problem(f"{include} mixes two CUDA releases: cuda.h is {driver_api}, cuda_runtime_api.h {headers}",
                f"# reinstall one CUDA release's headers into {include}")
    built_for = release or headers
    if built_for and torch_cuda and built_for.split(".")[0] != str(torch_cuda).split(".")[0]:
        problem(f"the toolkit is CUDA {built_for}, torch is built for CUDA {torch_cuda}: FlashInfer's modules would "
                "link another CUDA major's runtime than torch's",
                f"# install the CUDA {str(torch_cuda).split('.')[0]} toolkit (torch's) and point CUDA_HOME at it")
    return found


def flashinfer_jit_problems(fact: Any, distributions: Any, *, algorithm: str | None,
                            compute_capability: str | None, torch_cuda: str | None) -> Findings:
    """FlashInfer's JIT for the server the profile starts: a failure per thing a compile at start lacks (each of
    its kind: ``JIT_NVCC``, ``JIT_TOOLCHAIN``, ``JIT_NINJA``, ``JIT_CACHE``), else one ``JIT_READY`` note saying
    where the kernels come from; nothing when the start does not call it.

    A DFLASH/DDTREE server on CUDA calls FlashInfer's sampling module during its start-up rehearsal. It
    comes from an AOT ``flashinfer-jit-cache`` of FlashInfer's version (a provider per GPU architecture
    since 0.7: ``flashinfer-jit-cache-sm90a``...), or from an earlier compile in the cache; otherwise the
    start compiles it, which needs nvcc, ``ninja`` on PATH and a writable cache: a host without the CUDA
    toolkit stops there, after the weights loaded. ``fact`` is the stack probe's ``flashinfer_jit``."""
    r = rules()["flashinfer"]
    if (algorithm or "").upper() not in r["algorithms"] or not isinstance(fact, dict):
        return Findings()
    want = _digits(compute_capability)
    ready = (_precompiled(fact.get("version"), distributions, want)
             or _compiled(fact, r["jit_module"], want))
    if ready:
        return Findings().info(JIT_READY, ready)
    found = _build_problems(fact, r, algorithm, want, torch_cuda)
    if found:
        return found
    nvcc = _part(fact, "nvcc")
    headers = header_release(nvcc.get("cudart_version"))
    return found.info(JIT_READY, f"the first start compiles FlashInfer's {r['jit_module']} module with "
                      f"{nvcc.get('nvcc')} ({nvcc.get('release') or 'release ?'}"
                      + (f", CUDA {headers} headers" if headers else "") + f") into {fact.get('cache_dir')}")


def _precompiled(fi_ver: Any, distributions: Any, want: str) -> str | None:
    """The note when an AOT ``flashinfer-jit-cache`` of FlashInfer's release holds this GPU's kernels: the one
    wheel before 0.7, the provider of this architecture since; ``None`` when none does."""
    dists = distributions if isinstance(distributions, dict) else {}
    shim = (dists.get("flashinfer-jit-cache") or {}).get("version")
    if not _same_release(shim, fi_ver):
        return None
    providers = {k: (v or {}).get("version") for k, v in dists.items() if k.startswith("flashinfer-jit-cache-sm")}
    if not providers:  # before 0.7 one wheel held every architecture
        return f"FlashInfer's kernels come precompiled from flashinfer-jit-cache {shim}"
    mine = sorted(k for k, v in providers.items()
                  if _same_release(v, fi_ver) and _digits(k.rsplit("-sm", 1)[1]) == want)
    return f"FlashInfer's kernels come precompiled from {mine[0]} {providers[mine[0]]}" if mine else None


def _compiled(fact: dict[str, Any], module: str, want: str) -> str | None:
    """The note when an earlier start compiled the module for this GPU into the cache; ``None`` otherwise.
    FlashInfer names the directory by the architectures it built for: ``<archs>/<module>``, archs "90a" or
    "100a_103a"."""
    compiled = [c for c in fact.get("compiled") or [] if str(c).endswith(f"/{module}")
                and (not want or want in {_digits(a) for a in str(c).split("/", 1)[0].split("_")})]
    if not compiled:
        return None
    return f"FlashInfer's {module} module is compiled in {fact.get('cache_dir')}/{fact.get('version')}/{compiled[0]}"


def _build_problems(fact: dict[str, Any], r: dict[str, Any], algorithm: str | None, want: str,
                    torch_cuda: str | None) -> Findings:
    """What a start that must compile the module lacks: nvcc, a sound toolkit, ``ninja`` on PATH, a writable
    cache; each failure says why the start compiles, and the AOT cache is offered first wherever the compiler is
    the problem."""
    fi_ver, module = fact.get("version"), r["jit_module"]
    index = r["jit_cache_index"].format(cuda=_digits(torch_cuda)[:3] or "130")
    package = f"'{r['jit_cache_pip']}=={fi_ver}'" if fi_ver else r["jit_cache_pip"]
    aot = f"pip install {package} --index-url {index}"
    why = (f"{algorithm} compiles FlashInfer's {module} module at start (no {r['jit_cache_pip']} {fi_ver or ''} "
           f"for sm_{want or '?'}, nothing compiled in {fact.get('cache_dir')})")
    found = Findings()
    nvcc = _part(fact, "nvcc")
    if not nvcc.get("exists"):
        found.fail(JIT_NVCC, f"{why}, but there is no nvcc at {nvcc.get('nvcc')} (via {nvcc.get('found_by')})",
                   _commands(aot, "# or install the CUDA toolkit and set CUDA_HOME in the service's environment"))
    for tool in toolchain_problems(nvcc, torch_cuda):
        found.fail(tool.code, f"{why}, but {tool.message}", _commands(aot, *(tool.fix.commands if tool.fix else [])))
    for code, (text, cmd) in ((JIT_NINJA, _ninja_problem(fact)), (JIT_CACHE, _cache_problem(fact))):
        if text:
            found.fail(code, f"{why}, but {text}", _commands(cmd))
    return found


def _ninja_problem(fact: dict[str, Any]) -> tuple[str, str]:
    """(what is wrong, its fix) when ``ninja`` is not on the service's PATH (``("", "")`` when it is); one
    beside the interpreter is named, since a unit that puts that directory first fixes it."""
    if fact.get("ninja"):
        return "", ""
    beside = fact.get("ninja_beside_python")
    if beside:
        return (f"`ninja` is not on the service's PATH ({beside} is, beside the interpreter: its bin directory is "
                "not on PATH)", f"# add {beside.rsplit('/', 1)[0]} to the service's PATH (a unit from `k26-doctor "
                "systemd-unit` puts it first)")
    return "`ninja` is not on the service's PATH", "pip install ninja"


def _cache_problem(fact: dict[str, Any]) -> tuple[str, str]:
    """(what is wrong, its fix) when the JIT cache cannot be written by the service's user (``("", "")`` when it
    can)."""
    if fact.get("writable"):
        return "", ""
    return (f"{fact.get('writable_checked')} is not writable for this user (the cache {fact.get('cache_dir')}, "
            f"from {fact.get('base_from')})", "# set SGLANG_CACHE_DIR (or FLASHINFER_WORKSPACE_BASE) to a writable "
            "directory")
