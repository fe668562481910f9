"""Compile FlashInfer's JIT modules into the cache the service will use (run under the service's interpreter).

Started by ``k26-doctor launch`` in parallel with its checks (``doctor.service.prewarm``), never by ``check``.
Argument: the module names (``sampling``, ``norm``). Each is built the way the server's first call builds it:
``flashinfer.jit.<name>.gen_<name>_module().build_and_load()``: a module already in the cache is only loaded. The
GPU is not touched: ``launch`` hides the devices and names the architecture (``FLASHINFER_CUDA_ARCH_LIST``), so the
checks that run meanwhile (gpu.idle) see no process of ours on a GPU. Prints one JSON object on its last line:
``{"modules": [{"module", "ok", "seconds", "error"}]}``; exit 0 even when a module fails (the launch goes on).
Standard library only at import (the service's environment does not have k26-doctor).
"""

import importlib
import json
import sys
import time


def build(name):
    start = time.perf_counter()
    try:
        mod = importlib.import_module("flashinfer.jit." + name)
        spec = getattr(mod, "gen_" + name + "_module")()
        spec.build_and_load()
        return {"module": name, "ok": True, "seconds": round(time.perf_counter() - start, 2), "error": None}
    except BaseException as exc:  # a failed build is reported; the server compiles it itself then
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"module": name, "ok": False, "seconds": round(time.perf_counter() - start, 2),
                "error": (type(exc).__name__ + ": " + str(exc))[-2000:]}


def main(argv):
    out = []
    for name in argv:
        result = build(name)
        out.append(result)
        sys.stderr.write("prewarm {}: {} in {:.1f} s\n".format(name, "ok" if result["ok"] else "failed",
                                                              result["seconds"]))
        sys.stderr.flush()
    print(json.dumps({"modules": out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
