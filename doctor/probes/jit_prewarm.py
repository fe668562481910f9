"""Compile FlashInfer's JIT modules into the cache the service will use (run under the service's interpreter).

Started by ``k26-doctor launch`` while its checks run (``doctor.service.prewarm``), never by ``check``.
Arguments: ``--deadline SECONDS`` then the module names (``sampling``, ``norm``). Each is built the way the
server's first call builds it, ``flashinfer.jit.<name>.gen_<name>_module().build_and_load()`` (a module already in
the cache is only loaded), all of them at once (one nvcc per source file: a module alone leaves most cores idle).
FlashInfer holds a file lock per module while it builds, so a server that needs a module being built waits for it
and loads it rather than building it again. At the deadline the probe stops its whole process group (ninja, and
through ninja the compilers: its lock is released, the server builds what is missing), so a hung compiler never
holds a start.
The GPU is not touched: ``launch`` hides the devices and names the architecture (``FLASHINFER_CUDA_ARCH_LIST``).
Prints one JSON object on its last line: ``{"modules": [{"module", "ok", "seconds", "error"}]}`` (``"absent": true``
when FlashInfer is not installed: nothing to compile); exit 0 even when a module fails (the launch goes on).
Standard library only at import (the service's environment does not have k26-doctor).
"""

import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time


def spec_of(name):
    mod = importlib.import_module("flashinfer.jit." + name)
    return getattr(mod, "gen_" + name + "_module")()


def build(name, spec, results):
    start = time.perf_counter()
    try:
        spec.build_and_load()
        results[name] = {"module": name, "ok": True, "seconds": round(time.perf_counter() - start, 2), "error": None}
    except BaseException as exc:  # a failed build is reported; the server compiles it itself then
        results[name] = {"module": name, "ok": False, "seconds": round(time.perf_counter() - start, 2),
                         "error": (type(exc).__name__ + ": " + str(exc))[-2000:]}


GRACE_S = 3.0  # between SIGTERM and SIGKILL of the group: ninja stops its compilers (their own process groups)


def expire(_signum, _frame):
    """The deadline: SIGTERM to the group first (ninja runs each compiler in a process group of its own and kills
    those on SIGTERM; a SIGKILL would leave them compiling), then SIGKILL to whatever is left of it."""
    sys.stderr.write("prewarm: deadline reached: stopping (the server builds what is missing)\n")
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    group = os.getpgid(0)
    try:
        os.killpg(group, signal.SIGTERM)
    except OSError:
        pass
    time.sleep(GRACE_S)
    os.killpg(group, signal.SIGKILL)


def main(argv):
    deadline = None
    if len(argv) >= 2 and argv[0] == "--deadline":
        deadline, argv = float(argv[1]), argv[2:]
    if deadline is not None and os.getpgid(0) == os.getpid():  # only a group of its own is ours to kill
        signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, max(0.01, deadline))
    if importlib.util.find_spec("flashinfer") is None:  # nothing to compile: the server does not use it either
        print(json.dumps({"modules": [], "absent": True}), flush=True)
        return 0
    results, threads = {}, []
    for name in argv:  # imported one after the other: the builds run at once
        try:
            spec = spec_of(name)
        except BaseException as exc:
            results[name] = {"module": name, "ok": False, "seconds": 0.0,
                             "error": (type(exc).__name__ + ": " + str(exc))[-2000:]}
            continue
        t = threading.Thread(target=build, args=(name, spec, results), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    out = [results[n] for n in argv if n in results]
    for r in out:
        sys.stderr.write("prewarm {}: {} in {:.1f} s\n".format(r["module"], "ok" if r["ok"] else "failed",
                                                               r["seconds"]))
    sys.stderr.flush()
    print(json.dumps({"modules": out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
