"""Probe: what torch was built for, read by importing torch in this child process only.

``torch.version.cuda`` (the CUDA runtime torch was built with) and ``torch._C._cuda_getArchFlags()``
(the targets compiled into it) are only known after ``import torch``, which the doctor never does
itself: CUDA state poisons fork, and a broken driver can hang. With ``--deep`` it also runs a small
matmul on every visible GPU and compares it with the CPU result. Stdlib + torch, Python >= 3.8.
"""

import json
import sys
import time
import warnings


def deep_matmul(torch, count):
    """A 256x256 fp16 matmul on each GPU against a float32 CPU reference."""
    results = []
    torch.manual_seed(0)
    a = torch.randn(256, 256)
    b = torch.randn(256, 256)
    ref = a @ b
    for i in range(count):
        entry = {"index": i}
        start = time.monotonic()
        try:
            dev = torch.device("cuda", i)
            out = (a.to(dev, torch.float16) @ b.to(dev, torch.float16)).float()
            torch.cuda.synchronize(dev)
            err = float((out.cpu() - ref).abs().max())
            entry.update(ok=err < 0.5, max_abs_err=err)
        except Exception as exc:  # "no kernel image is available for execution on the device" lands here
            entry.update(ok=False, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:500]}")
        entry["seconds"] = round(time.monotonic() - start, 3)
        results.append(entry)
    return results


def main():
    deep = "--deep" in sys.argv[1:]
    out = {"ok": False}
    start = time.monotonic()
    try:
        import torch
    except Exception as exc:
        out["error"] = f"import torch failed: {type(exc).__name__}: {exc}"
        out["missing_module"] = getattr(exc, "name", None)
        print(json.dumps(out))
        return
    out["import_s"] = round(time.monotonic() - start, 3)
    out["version"] = torch.__version__
    out["file"] = getattr(torch, "__file__", None)
    out["cuda"] = torch.version.cuda
    out["hip"] = getattr(torch.version, "hip", None)
    flags = None
    get_flags = getattr(torch._C, "_cuda_getArchFlags", None)
    if get_flags is not None:
        raw = get_flags()
        flags = raw.split() if isinstance(raw, str) else list(raw or [])
    out["arch_flags"] = flags
    out["ok"] = True
    try:
        # torch reports a driver too old for its runtime as a warning from is_available(): keep the text
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["cuda_available"] = bool(torch.cuda.is_available())
        out["cuda_warnings"] = [str(w.message).strip()[:500] for w in caught]
        out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
        out["devices"] = [{"index": i, "name": torch.cuda.get_device_name(i),
                           "capability": list(torch.cuda.get_device_capability(i))}
                          for i in range(out["device_count"])]
    except Exception as exc:
        out["cuda_error"] = f"{type(exc).__name__}: {exc}"
        out.setdefault("cuda_available", False)
        out.setdefault("devices", [])
    if deep and out.get("device_count"):
        out["matmul"] = deep_matmul(torch, out["device_count"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
