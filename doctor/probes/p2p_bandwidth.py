"""Measure GPU-to-GPU copy bandwidth with torch, in the service's interpreter (``--deep``).

Run by ``doctor.gpu.facts.collect_p2p_bandwidth`` through ``doctor.core.proc.run_probe`` with a
deadline. Standalone: stdlib at import time, torch imported inside ``main``; Python >= 3.8.

    p2p_bandwidth.py --devices 0,1,2,3 [--size-mib 256] [--iters 20] [--budget-s 120]

For every ordered pair (src, dst) of the given CUDA ordinals it copies a ``size`` buffer
``iters`` times (``dst.copy_(src)``, the copy engines over NVLink or PCIe, as NCCL's P2P path
uses) and reports bytes moved per second, one direction. It also reports each device's local
copy rate as a yardstick. Prints one JSON object on the last line; ``ok: false`` with ``error``
when torch or CUDA cannot be used.
"""

import argparse
import json
import sys
import time


def _emit(doc):
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="", help="comma-separated CUDA ordinals (default: all)")
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=120.0, help="stop measuring new pairs after this")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    out = {"ok": False, "error": None, "python": sys.version.split()[0], "torch": None, "cuda": None,
           "device_count": 0, "devices": [], "size_bytes": args.size_mib * 2**20, "iters": args.iters,
           "pairs": [], "local": [], "skipped_pairs": []}
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising anything
        out["error"] = f"torch is not importable in {sys.executable}: {type(exc).__name__}: {exc}"
        _emit(out)
        return 0
    out["torch"] = torch.__version__
    out["cuda"] = getattr(torch.version, "cuda", None)
    try:
        if not torch.cuda.is_available():
            out["error"] = f"torch {torch.__version__} sees no usable CUDA device (torch.cuda.is_available() is False)"
            _emit(out)
            return 0
        count = torch.cuda.device_count()
        out["device_count"] = count
        devices = [int(d) for d in args.devices.split(",") if d.strip()] if args.devices else list(range(count))
        missing = [d for d in devices if d >= count or d < 0]
        devices = [d for d in devices if 0 <= d < count]
        out["devices"] = [{"cuda_index": d, "name": torch.cuda.get_device_name(d)} for d in devices]
        if missing:
            out["missing_devices"] = missing
        n = out["size_bytes"]  # uint8 elements
        bufs = {}
        for d in devices:
            bufs[d] = (torch.empty(n, dtype=torch.uint8, device=f"cuda:{d}").fill_(1),
                       torch.empty(n, dtype=torch.uint8, device=f"cuda:{d}"))
        for d in devices:
            src, dst = bufs[d]
            secs = _timed_copies(torch, dst, src, args.iters, [d])
            out["local"].append({"device": d, "gb_per_s": round(n * args.iters / secs / 1e9, 2),
                                 "seconds": round(secs, 6)})
        for src_dev in devices:
            for dst_dev in devices:
                if src_dev == dst_dev:
                    continue
                if time.monotonic() - t0 > args.budget_s:
                    out["skipped_pairs"].append([src_dev, dst_dev])
                    continue
                peer = bool(torch.cuda.can_device_access_peer(src_dev, dst_dev))
                secs = _timed_copies(torch, bufs[dst_dev][1], bufs[src_dev][0], args.iters, [src_dev, dst_dev])
                ok_copy = bool(torch.equal(bufs[dst_dev][1][:4096].cpu(), bufs[src_dev][0][:4096].cpu()))
                out["pairs"].append({"src": src_dev, "dst": dst_dev, "peer_access": peer,
                                     "gb_per_s": round(n * args.iters / secs / 1e9, 2), "seconds": round(secs, 6),
                                     "data_ok": ok_copy})
        out["ok"] = True
    except Exception as exc:  # CUDA errors (e.g. "system not yet initialized" without fabric manager)
        out["error"] = "{}: {}".format(type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    out["elapsed_s"] = round(time.monotonic() - t0, 3)
    _emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
