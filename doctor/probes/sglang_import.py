"""Probe: import SGLang under the service's interpreter and ask for its DFlash tree-sampling kernel.

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
    out["ok"] = True
    print(json.dumps(out))


if __name__ == "__main__":
    main()
