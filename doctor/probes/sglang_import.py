"""Probe: import SGLang under the service's interpreter and ask for its DFlash tree-sampling kernel.

Also reports what a server imports at start beyond ``import sglang`` (doctor/data/sglang_runtime.toml):
FlashInfer's sampling module and its JIT source directories, the CuTe DSL (``cutlass.cute``). Found,
not imported, where finding is enough: importing the CuTe DSL loads a 190 MB compiler library.

A wheel can be present yet unimportable (a missing or mismatched dependency); only importing it
tells. ``sglang.srt.speculative.dflash_utils.is_dflash_sampling_verify_available()`` says whether
DFlash can verify by sampling; without its kernel SGLang silently falls back to greedy verification.
Runs in its own child process with a deadline. Stdlib + sglang, Python >= 3.8.
"""

import json
import time
import traceback


def failure(exc):
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {"error": f"{type(exc).__name__}: {str(exc).strip()[:1000]}",
            "missing_module": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
            "traceback_tail": "".join(tb[-3:])[-2000:]}


def runtime_deps():
    """What the server imports later: FlashInfer (imported: a broken install fails only on import) with its
    JIT directories, and whether the CuTe DSL's ``cutlass.cute`` can be found."""
    import importlib
    import importlib.util
    import os

    out = {}
    fi = {"module": "flashinfer.sampling"}
    try:
        importlib.import_module("flashinfer.sampling")
        fi["importable"] = True
    except BaseException as exc:
        fi["importable"] = False
        fi.update(failure(exc))
    try:
        spec = importlib.util.find_spec("flashinfer")
        root = os.path.dirname(spec.origin) if spec is not None and spec.origin else None
    except BaseException:
        root = None
    fi["package_dir"] = root
    if root:
        fi["jit_dirs"] = {d: os.path.isdir(os.path.join(root, d)) for d in
                          ("data/csrc", "data/include", "data/cutlass/include", "data/cccl/cub")}
    out["flashinfer"] = fi
    cute = {"module": "cutlass.cute"}
    try:
        cute["found"] = importlib.util.find_spec("cutlass.cute") is not None
    except BaseException as exc:  # a namespace-only `cutlass` raises here
        cute["found"] = False
        cute["error"] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
    out["cute_dsl"] = cute
    return out


def main():
    out = {"ok": False, "imported": False}
    start = time.monotonic()
    try:
        import sglang
    except BaseException as exc:  # SystemExit from a dependency's import is a failure too
        out.update(failure(exc))
        out["import_s"] = round(time.monotonic() - start, 3)
        print(json.dumps(out))
        return
    out["import_s"] = round(time.monotonic() - start, 3)
    out["imported"] = True
    out["version"] = getattr(sglang, "__version__", None)
    out["file"] = getattr(sglang, "__file__", None)
    dflash = {"module": "sglang.srt.speculative.dflash_utils"}
    try:
        from sglang.srt.speculative import dflash_utils
        fn = getattr(dflash_utils, "is_dflash_sampling_verify_available", None)
        if fn is None:
            dflash["available"] = None
            dflash["error"] = "dflash_utils has no is_dflash_sampling_verify_available()"
        else:
            dflash["available"] = bool(fn())
    except BaseException as exc:
        dflash.update(failure(exc))
        dflash["available"] = None
    out["dflash"] = dflash
    out["runtime"] = runtime_deps()
    out["ok"] = True
    print(json.dumps(out))


if __name__ == "__main__":
    main()
