"""Compile FlashInfer's JIT modules into the cache the service will use (run under the service's interpreter).

Started by ``k26-doctor launch`` while its checks run (``doctor.service.prewarm``), never by ``check``.
Arguments: ``--deadline SECONDS`` then the module names: FlashInfer's (``sampling``, ``norm``) and SGLang's
DDTree kernels (``sglang.speculative_tree``, ``sglang.speculative_sampling.<vec_size>``: ``SglangJit``). Each
FlashInfer module is built the way the
server's first call builds it, ``flashinfer.jit.<name>.gen_<name>_module().build_and_load()`` (a module already in
the cache is only loaded), all of them at once, one process per module (``--one NAME``: this file again, in this
process group), each with its ninja's jobs bounded by the cores shared between them (``MAX_JOBS``, which
FlashInfer passes to ninja as ``-j``; a module has two or three sources, so the longest module's time is the
prewarm's). FlashInfer 0.7.2 holds a file lock per module while it builds (``JitSpec.build_and_load``:
``FileLock(<cached_ops>/tmp/<name>.lock)``, then a second look for the built module), so a server that needs a
module being built waits for it and loads it rather than building it again. At the deadline the probe stops its
whole process group (its module processes, their ninja, and through ninja the compilers: the locks are released,
the server builds what is missing), so a hung compiler never holds a start.
The GPU is not touched: ``launch`` hides the devices and names the architecture (``FLASHINFER_CUDA_ARCH_LIST``).
Prints one JSON object on its last line: ``{"modules": [{"module", "ok", "seconds", "error", "began_s", "ended_s"}],
"flashinfer_absent", "wall_s"}`` (``began_s``/``ended_s``: each build's span from the prewarm's start; ``wall_s``: the
prewarm's own time, start to end, which is not the time until ``launch`` reads it)
(``"absent": true`` when FlashInfer is not installed and nothing else was asked: nothing to compile); exit 0 even when
a module fails (the launch goes on).
Standard library only at import (the service's environment does not have k26-doctor).
"""

import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

SGLANG = "sglang."  # SGLang's own JIT modules: sglang.speculative_tree, sglang.speculative_sampling.<vec_size>


def spec_of(name):
    if name.startswith(SGLANG):
        return SglangJit(name)
    mod = importlib.import_module("flashinfer.jit." + name)
    return getattr(mod, "gen_" + name + "_module")()


def named_arch():
    """(major, minor) of the architecture ``launch`` names (FLASHINFER_CUDA_ARCH_LIST "9.0" or "9.0a")."""
    first = (os.environ.get("FLASHINFER_CUDA_ARCH_LIST") or "").replace(",", " ").split()
    if not first:
        raise RuntimeError("no architecture named (FLASHINFER_CUDA_ARCH_LIST)")
    major, minor = first[0].split(".")
    return int(major), int("".join(ch for ch in minor if ch.isdigit()))


class SglangJit:
    """A DDTree tree-verify kernel module of SGLang's JIT (``load_jit``), built as the server's start-up builds it
    (``warm_verify_kernels``: the tree module, and the sampling module for the target's vocabulary, deterministic)
    for the named architecture instead of the device's (``override_jit_cuda_arch``: no device here). SGLang's cache
    publishes a build by a rename, with no lock: a server that gets there first builds it too, nothing breaks."""

    def __init__(self, name):
        self.name = name

    def build_and_load(self):
        from sglang.kernels.jit.utils.arch import override_jit_cuda_arch

        major, minor = named_arch()
        with override_jit_cuda_arch(major, minor):
            if self.name == SGLANG + "speculative_tree":
                from sglang.kernels.ops.speculative.tree import _jit_tree_module

                _jit_tree_module()
            elif self.name.startswith(SGLANG + "speculative_sampling."):
                from sglang.kernels.ops.speculative.sampling import _jit_sampling_module

                _jit_sampling_module(int(self.name.rsplit(".", 1)[1]), True)
            else:
                raise ValueError("not a module the prewarm knows: " + self.name)


def build(name, spec, results):
    """Build one module; its result carries the wall-clock times of its build (``began``, ``ended``: epoch seconds),
    so the parent can say when each module was done, measured from its own start, whatever order it reads them in."""
    began, start = time.time(), time.perf_counter()
    try:
        spec.build_and_load()
        results[name] = {"module": name, "ok": True, "seconds": round(time.perf_counter() - start, 2), "error": None}
    except BaseException as exc:  # a failed build is reported; the server compiles it itself then
        results[name] = {"module": name, "ok": False, "seconds": round(time.perf_counter() - start, 2),
                         "error": (type(exc).__name__ + ": " + str(exc))[-2000:]}
    results[name].update(began=round(began, 3), ended=round(time.time(), 3))


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


def build_one(name):
    """``--one NAME``: this module alone, its result as one JSON line."""
    results = {}
    try:
        build(name, spec_of(name), results)
    except BaseException as exc:
        results[name] = {"module": name, "ok": False, "seconds": 0.0,
                         "error": (type(exc).__name__ + ": " + str(exc))[-2000:]}
    print(json.dumps(results[name]), flush=True)
    return 0


def jobs_each(count):
    """Ninja's jobs per module: the cores this process may use, shared (MAX_JOBS when the service sets it)."""
    given = os.environ.get("MAX_JOBS")
    if given and given.isdigit():
        return given
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return str(max(1, cores // max(1, count)))


def last_json(text):
    for line in reversed((text or "").strip().splitlines()):
        if line.strip().startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def build_all(argv, env):
    """One process per module, all at once, in this process group (the deadline stops them all): their results in
    the order asked."""
    children, results = {}, {}
    for name in argv:
        started = time.perf_counter()
        try:
            children[name] = (subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one", name], env=env,
                                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE), started)
        except OSError as exc:
            results[name] = {"module": name, "ok": False, "seconds": 0.0, "error": "cannot start: " + str(exc)}
    for name, (child, started) in children.items():
        out, _ = child.communicate()
        got = last_json(out.decode("utf-8", "replace"))
        results[name] = got if isinstance(got, dict) and got.get("module") == name else {
            "module": name, "ok": False, "seconds": round(time.perf_counter() - started, 2),
            "error": f"its process exited with status {child.returncode} without a result"}
    return [results[n] for n in argv if n in results]


def spans(out, t0):
    """Each build's span from the prewarm's start ``t0`` (``began_s`` > 0: its process's start and imports), said
    on stderr, one line per module."""
    for r in out:
        for key in ("began", "ended"):
            if isinstance(r.get(key), (int, float)):
                r[key + "_s"] = round(r.pop(key) - t0, 2)
        sys.stderr.write("prewarm {}: {} in {:.1f} s (built {}-{} s after the prewarm's start)\n".format(
            r["module"], "ok" if r["ok"] else "failed", r["seconds"], r.get("began_s"), r.get("ended_s")))
    sys.stderr.flush()
    return out


def main(argv):
    deadline = None
    if len(argv) == 2 and argv[0] == "--one":
        return build_one(argv[1])
    if len(argv) >= 2 and argv[0] == "--deadline":
        deadline, argv = float(argv[1]), argv[2:]
    if deadline is not None and os.getpgid(0) == os.getpid():  # only a group of its own is ours to kill
        signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, max(0.01, deadline))
    flashinfer_absent = importlib.util.find_spec("flashinfer") is None
    if flashinfer_absent:  # FlashInfer's modules: the server does not use them either
        argv = [n for n in argv if n.startswith(SGLANG)]
        if not argv:
            print(json.dumps({"modules": [], "absent": True}), flush=True)
            return 0
    env = dict(os.environ, MAX_JOBS=jobs_each(len(argv)))
    t0 = time.time()
    out = spans(build_all(argv, env), t0)
    print(json.dumps({"modules": out, "jobs_each": env["MAX_JOBS"], "flashinfer_absent": flashinfer_absent,
                      "wall_s": round(time.time() - t0, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
