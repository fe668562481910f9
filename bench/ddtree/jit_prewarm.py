#!/usr/bin/env python3
"""Compile FlashInfer's JIT modules a DFLASH/DDTREE server needs before any server starts.

Each speculative server's start-up sampling rehearsal calls FlashInfer's ``top_k_renorm_probs`` /
``top_p_renorm_probs`` (``sglang.kernels.ops.sampling.renorm``), and SGLang imports ``flashinfer.norm`` where
FlashInfer is present: the first call of each compiles its module (about 105 s on a 16-core H200 host),
every later process loads it from the cache (``FLASHINFER_WORKSPACE_BASE``). Compiling them once, while the
session does other work, takes that off every server's start. Prints what it compiled and how long it took.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    import torch

    t0 = time.perf_counter()
    import flashinfer.sampling as fs

    probs = torch.softmax(torch.randn(4, 512, device="cuda"), dim=-1)
    fs.top_k_renorm_probs(probs, torch.full((4,), 8, dtype=torch.int32, device="cuda"))
    fs.top_p_renorm_probs(probs, torch.full((4,), 0.9, dtype=torch.float32, device="cuda"))
    torch.cuda.synchronize()
    print(f"flashinfer.sampling: {time.perf_counter() - t0:.1f} s", flush=True)
    t1 = time.perf_counter()
    try:
        import flashinfer.norm as fn

        x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(256, device="cuda", dtype=torch.bfloat16)
        fn.rmsnorm(x, w)
        fn.fused_add_rmsnorm(x, x.clone(), w)
        torch.cuda.synchronize()
        print(f"flashinfer.norm: {time.perf_counter() - t1:.1f} s", flush=True)
    except Exception as e:  # the servers compile it themselves then
        print(f"flashinfer.norm: not compiled here ({type(e).__name__}: {e})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
