"""What an SGLang server imports at start beyond ``import sglang``: the judgement of the ``runtime`` part of
the ``sglang_import`` fact (imported, ``--deep`` and ``launch``) or of the ``stack`` fact's ``sglang_runtime``
(found on disk, the default tier) against ``doctor/data/sglang_runtime.toml``.

Each rule there was found by starting real SGLang 0.5.23 servers: a DFLASH or DDTREE server on CUDA
stops in its sampling rehearsal without FlashInfer, and again when FlashInfer lacks the sources its JIT
compiles; a Llama/Qwen-family model stops without the CuTe DSL. ``import sglang`` succeeds in each case,
so ``sglang.install`` must look further.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "sglang_runtime.toml"


def rules(path: str | None = None) -> dict[str, Any]:
    return load_toml(path or DATA_FILE)


def probe_rules() -> dict[str, Any]:
    """The rules as the ``stack`` probe takes them (``--sglang-runtime JSON``): the modules to find, the
    directories under each package, DFlash's files. The data file stays the one list."""
    r = rules()
    return {"modules": {"flashinfer": {"module": r["flashinfer"]["module"], "dirs": list(r["flashinfer"]["jit_dirs"])},
                        "cute_dsl": {"module": r["cute_dsl"]["module"]}},
            "dflash": dict(r["dflash"])}


def runtime_problems(runtime: Any, *, algorithm: str | None, architectures: list[str] | None,
                     flashinfer_pin: str | None = None) -> tuple[list[str], list[str], list[str]]:
    """(failures, warnings, fix commands) for the server the profile will start.

    ``runtime`` is the probe's ``runtime`` object; absent (an older snapshot) means nothing to judge here.
    Found on disk (``"from": "files"``), a module counts when its files are there; imported, FlashInfer
    counts when ``import flashinfer.sampling`` succeeded.
    """
    fails: list[str] = []
    warns: list[str] = []
    cmds: list[str] = []
    if not isinstance(runtime, dict):
        return fails, warns, cmds
    r = rules()
    fi_rule, cute_rule = r["flashinfer"], r["cute_dsl"]
    algo = (algorithm or "").upper()
    on_disk = runtime.get("from") == "files"
    fi = runtime.get("flashinfer") if isinstance(runtime.get("flashinfer"), dict) else {}
    if algo in fi_rule["algorithms"]:
        missing_dirs = [d for d, ok in (fi.get("jit_dirs") or {}).items() if not ok]
        why = (f"{algo} verify on CUDA renormalises with {fi_rule['module']} and SGLang JIT-compiles "
               "FlashInfer's modules from its sources at start")
        pin = f"=={flashinfer_pin.lstrip('=')}" if flashinfer_pin else ""
        if not fi.get("found" if on_disk else "importable"):
            fails.append(f"{why}, but {fi_rule['module']} is not installed: {fi.get('error') or 'not found'}"
                         if on_disk else
                         f"{why}, but `import {fi_rule['module']}` fails: {fi.get('error') or 'not installed'}")
            cmds.append(f"pip install '{fi_rule['pip']}{pin}'")
        elif missing_dirs:
            fails.append(f"{why}, but the FlashInfer at {fi.get('package_dir')} lacks "
                         f"{', '.join(missing_dirs)} (a trimmed or partial install)")
            cmds.append(f"pip install --force-reinstall --no-deps '{fi_rule['pip']}{pin}'")
    cute = runtime.get("cute_dsl") if isinstance(runtime.get("cute_dsl"), dict) else {}
    if cute and not cute.get("found"):
        archs = set(architectures or [])
        hit = sorted(archs & set(cute_rule["architectures"]))
        text = (f"the CuTe DSL (`{cute_rule['module']}`) is not {'installed' if on_disk else 'importable'}"
                + (f": {cute['error']}" if cute.get("error") else ""))
        if hit:
            fails.append(f"{text}; {', '.join(hit)} builds SGLang's DualGemm MLP, which imports it on every CUDA start")
            cmds.append(f"pip install '{cute_rule['pip']}'")
        else:
            warns.append(f"{text} (SGLang requires it; this model's start does not import it)")
    return fails, warns, cmds
