"""Measure GPU-to-GPU copy bandwidth with torch, in the service's interpreter (``--deep``), one pair at a time
under a hard deadline, so that a copy that hangs fails its pair instead of the whole run.

Run by ``doctor.gpu.facts.collect_p2p_bandwidth`` through ``doctor.core.proc.run_probe`` with a
deadline. Standalone: stdlib only in this process, Python >= 3.8; torch is imported only in its children.

    p2p_bandwidth.py --devices 0,1,2,3 [--size-mib 256] [--iters 20] [--budget-s 180] [--pair-timeout-s 30]

1. A child (``--role devices``) imports torch, checks CUDA, names the devices and measures each
   device's local copy rate (a yardstick), within ``--setup-timeout-s``.
2. For every pair {a, b} a child of its own (``--role pair --pair a,b``) copies a ``size`` buffer
   ``iters`` times a->b, then b->a (``dst.copy_(src)``: the copy engines over NVLink or PCIe, as
   NCCL's P2P path uses) and checks the data. A child that has not answered after
   ``--pair-timeout-s`` is killed and its pair goes to ``failed_pairs`` with ``timed_out: true``:
   that is what a P2P path through a root complex with ACS redirect or a translating IOMMU does
   (the copy never completes). Pairs not started within ``--budget-s`` go to ``skipped_pairs``.

The children stay in this process's process group: when the caller kills this probe at its own
deadline (its whole group), no child outlives it. Prints one JSON object on the last line; ``ok:
false`` with ``error`` when torch or CUDA cannot be used at all.

Test hook: ``K26_DOCTOR_P2P_TEST_HANG=a-b`` (or ``devices``) makes that child sleep instead of
measuring, so the deadline and the kill are exercised with real processes on hosts without a GPU.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HANG_ENV = "K26_DOCTOR_P2P_TEST_HANG"


def _emit(doc):
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _maybe_hang(name):
    if os.environ.get(HANG_ENV) == name:
        time.sleep(3600)


def _timed_copies(torch, dst, src, iters, devices):
    for _ in range(2):  # warm-up: peer mappings, first-touch
        dst.copy_(src, non_blocking=True)
    for d in devices:
        torch.cuda.synchronize(d)
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src, non_blocking=True)
    for d in devices:
        torch.cuda.synchronize(d)
    return time.perf_counter() - start


def _import_torch(out):
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising anything
        out["error"] = f"torch is not importable in {sys.executable}: {type(exc).__name__}: {exc}"
        return None
    out["torch"] = torch.__version__
    out["cuda"] = getattr(torch.version, "cuda", None)
    if not torch.cuda.is_available():
        out["error"] = f"torch {torch.__version__} sees no usable CUDA device (torch.cuda.is_available() is False)"
        return None
    return torch


def _error_text(exc):
    text = str(exc).strip()
    return "{}: {}".format(type(exc).__name__, text.splitlines()[0] if text else "")


def child_devices(args):
    """Child: torch and CUDA usable? device names, local copy rate of each."""
    _maybe_hang("devices")
    out = {"ok": False, "error": None, "torch": None, "cuda": None, "device_count": 0, "devices": [], "local": []}
    torch = _import_torch(out)
    if torch is None:
        _emit(out)
        return 0
    try:
        count = torch.cuda.device_count()
        out["device_count"] = count
        wanted = [int(d) for d in args.devices.split(",") if d.strip()] if args.devices else list(range(count))
        out["missing_devices"] = [d for d in wanted if d >= count or d < 0]
        devices = [d for d in wanted if 0 <= d < count]
        out["devices"] = [{"cuda_index": d, "name": torch.cuda.get_device_name(d)} for d in devices]
        n = args.size_mib * 2**20
        for d in devices:
            src = torch.empty(n, dtype=torch.uint8, device=f"cuda:{d}").fill_(1)
            dst = torch.empty(n, dtype=torch.uint8, device=f"cuda:{d}")
            secs = _timed_copies(torch, dst, src, args.iters, [d])
            out["local"].append({"device": d, "gb_per_s": round(n * args.iters / secs / 1e9, 2),
                                 "seconds": round(secs, 6)})
            del src, dst
        out["ok"] = True
    except Exception as exc:  # CUDA errors (e.g. "system not yet initialized" without fabric manager)
        out["error"] = _error_text(exc)
    _emit(out)
    return 0


def child_pair(args):
    """Child: copies a->b and b->a, with the data checked."""
    a, b = (int(x) for x in args.pair.split(","))
    _maybe_hang(f"{a}-{b}")
    out = {"ok": False, "error": None, "pairs": []}
    torch = _import_torch(out)
    if torch is None:
        _emit(out)
        return 0
    try:
        n = args.size_mib * 2**20
        bufs = {d: (torch.empty(n, dtype=torch.uint8, device=f"cuda:{d}").fill_(d + 1),
                    torch.empty(n, dtype=torch.uint8, device=f"cuda:{d}")) for d in (a, b)}
        for src_dev, dst_dev in ((a, b), (b, a)):
            peer = bool(torch.cuda.can_device_access_peer(src_dev, dst_dev))
            secs = _timed_copies(torch, bufs[dst_dev][1], bufs[src_dev][0], args.iters, [src_dev, dst_dev])
            ok_copy = bool(torch.equal(bufs[dst_dev][1][:4096].cpu(), bufs[src_dev][0][:4096].cpu()))
            out["pairs"].append({"src": src_dev, "dst": dst_dev, "peer_access": peer,
                                 "gb_per_s": round(n * args.iters / secs / 1e9, 2), "seconds": round(secs, 6),
                                 "data_ok": ok_copy})
        out["ok"] = True
    except Exception as exc:
        out["error"] = _error_text(exc)
    _emit(out)
    return 0


def run_child(argv, timeout):
    """Run one child under a hard deadline: (its JSON or None, why it failed or None, timed out)."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        return None, f"could not start {argv[0]}: {exc}", False, 0.0
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=5)
            how = "killed"
        except subprocess.TimeoutExpired:  # stuck in the driver (uninterruptible): SIGKILL lands when it returns
            how = "killed (it had not exited 5 s later: stuck in the driver)"
        return None, f"no answer within {timeout:g} s: {how}", True, time.monotonic() - start
    took = time.monotonic() - start
    for line in reversed(out.decode("utf-8", "replace").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line), None, False, took
            except ValueError:
                break
    tail = err.decode("utf-8", "replace").strip().splitlines()
    return None, "exited with {}{}".format(proc.returncode, ": " + tail[-1] if tail else ""), False, took


def measure_pairs(pairs, args, python=None):
    """Every pair in its own child under ``args.pair_timeout_s``; (measured entries, failed pairs, skipped).
    ``python``: the children's interpreter command (default: this one)."""
    python = list(python or [sys.executable])
    script = os.path.abspath(__file__)
    measured, failed, skipped = [], [], []
    t0 = time.monotonic()
    for a, b in pairs:
        if time.monotonic() - t0 > args.budget_s:
            skipped += [[a, b], [b, a]]
            continue
        argv = [*python, script, "--role", "pair", "--pair", f"{a},{b}",
                "--size-mib", str(args.size_mib), "--iters", str(args.iters)]
        doc, why, timed_out, took = run_child(argv, args.pair_timeout_s)
        if doc is not None and doc.get("ok"):
            measured += doc.get("pairs") or []
            continue
        failed.append({"a": a, "b": b, "timed_out": timed_out, "seconds": round(took, 3),
                       "error": why or (doc or {}).get("error") or "the pair's child measured nothing"})
    return measured, failed, skipped


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="", help="comma-separated CUDA ordinals (default: all)")
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=180.0, help="start no new pair after this")
    ap.add_argument("--pair-timeout-s", type=float, default=30.0, help="deadline of one pair's child")
    ap.add_argument("--setup-timeout-s", type=float, default=60.0, help="deadline of the devices child")
    ap.add_argument("--role", choices=["main", "devices", "pair"], default="main", help=argparse.SUPPRESS)
    ap.add_argument("--pair", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "devices":
        return child_devices(args)
    if args.role == "pair":
        return child_pair(args)
    t0 = time.monotonic()
    out = {"ok": False, "error": None, "python": sys.version.split()[0], "torch": None, "cuda": None,
           "device_count": 0, "devices": [], "size_bytes": args.size_mib * 2**20, "iters": args.iters,
           "pairs": [], "local": [], "skipped_pairs": [], "failed_pairs": [], "pair_timeout_s": args.pair_timeout_s}
    argv_dev = [sys.executable, os.path.abspath(__file__), "--role", "devices", "--devices", args.devices,
                "--size-mib", str(args.size_mib), "--iters", str(args.iters)]
    doc, why, timed_out, _ = run_child(argv_dev, args.setup_timeout_s)
    if doc is None:
        out["error"] = "reading the devices failed: " + str(why)
        out["setup_timed_out"] = timed_out
    else:
        for key in ("torch", "cuda", "device_count", "devices", "local", "missing_devices"):
            if key in doc:
                out[key] = doc[key]
        out["error"] = doc.get("error")
    if doc is not None and doc.get("ok"):
        devices = [d["cuda_index"] for d in out["devices"]]
        pairs = [(a, b) for i, a in enumerate(devices) for b in devices[i + 1:]]
        out["pairs"], out["failed_pairs"], out["skipped_pairs"] = measure_pairs(pairs, args)
        out["ok"] = True
    out["elapsed_s"] = round(time.monotonic() - t0, 3)
    _emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
