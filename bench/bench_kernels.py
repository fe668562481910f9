"""Benchmark: stack.kernels' scan of a whole installed stack vs ``cuobjdump --list-elf`` over the same files.

The scan (probe ``kernels``: interpreter start, every distribution's RECORD, every shared object's
and cubin's headers, the libtorch ABI) must take under 2 s for a whole stack. The baseline is NVIDIA's
own listing of the same GPU files, one ``cuobjdump --list-elf`` per file, run once (it inflates every
image: minutes). The same pass checks that both name the same SASS architectures in every file
(cuobjdump omits the family suffix of SASS: ``sm_100f`` is compared as ``sm_100``).

    python3 bench/bench_kernels.py [--python PY | --site DIR ...] [--runs 5] [--cuobjdump PATH] [--no-baseline]

Without ``--python``/``--site`` it scans the test suite's real wheels (torch 2.11.0, sglang-kernel
0.4.10, flashinfer-cubin 0.4.1), fetched into the test wheel cache on first use.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from doctor.core import proc  # noqa: E402
from doctor.stack.fatbin import arch_key  # noqa: E402


def probe_once(python: str, sites: list[str]) -> tuple[float, dict]:
    env = dict(os.environ)
    if sites:
        env["PYTHONPATH"] = os.pathsep.join(sites)
    start = time.monotonic()
    data, res = proc.run_probe(python, "kernels", [], timeout=600, env=env)
    wall = time.monotonic() - start
    if data is None or not data.get("ok"):
        raise SystemExit(f"probe failed: {res.why() if data is None else data.get('error')}")
    return wall, data


def cuobjdump_elf(tool: str, path: str) -> tuple[float, list[str]]:
    start = time.monotonic()
    res = subprocess.run([tool, "--list-elf", path], capture_output=True, text=True, timeout=1800)
    names = set(re.findall(r"\.(sm_\d+[af]?)\.cubin$", res.stdout, re.M))
    return time.monotonic() - start, sorted(names, key=arch_key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the service's interpreter (its sys.path is scanned)")
    ap.add_argument("--site", action="append", default=[], help="site-packages dirs to scan (PYTHONPATH)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cuobjdump", default=None)
    ap.add_argument("--no-baseline", action="store_true")
    args = ap.parse_args()
    sites = list(args.site)
    if not sites and args.python == sys.executable:
        import kernel_wheels

        sites = [str(kernel_wheels.torch_site()), str(kernel_wheels.kernel_site()), str(kernel_wheels.cubin_site())]
    walls, scans = [], []
    data: dict = {}
    for _ in range(args.runs):
        wall, data = probe_once(args.python, sites)
        walls.append(wall)
        scans.append(data["scan_s"])
    files = [(p["location"], p["name"], f) for p in data["packages"] for f in p["files"] if f["sass"] or f["ptx"]]
    print(f"stack: {len(data['distributions'])} distributions, {data['files_read']} shared objects and cubins read, "
          f"{len(files)} with GPU code in {sum(1 for p in data['packages'] if p['files'])} packages")
    for p in data["packages"]:
        if p["files"]:
            print(f"  {p['name']} {p['version']}: {len(p['files'])} files; ABI missing: "
                  f"{sum(len(v) for v in (p.get('abi') or {}).get('missing', {}).values())} symbols")
    print(f"probe (interpreter start + scan), {args.runs} runs: median {statistics.median(walls):.3f} s "
          f"(min {min(walls):.3f}, max {max(walls):.3f}); scan alone median {statistics.median(scans):.3f} s")
    if args.no_baseline:
        return
    tool = args.cuobjdump
    if tool is None:
        import kernel_wheels

        tool = str(kernel_wheels.cuobjdump())
    total, agree, differ = 0.0, 0, []
    for location, name, f in files:
        took, names = cuobjdump_elf(tool, os.path.join(location, f["path"]))
        total += took
        ours = sorted({s[:-1] if s.endswith("f") else s for s in f["sass"]}, key=arch_key)
        if ours == names:
            agree += 1
        else:
            differ.append({"package": name, "path": f["path"], "ours": f["sass"], "cuobjdump": names})
    median = statistics.median(walls)
    print(f"cuobjdump --list-elf over the same {len(files)} files, once: {total:.1f} s; "
          f"ratio probe/cuobjdump {median / total:.4f} (cuobjdump {total / median:.0f}x slower)")
    print(f"SASS lists agree in {agree} of {len(files)} files" + (f"; differ: {json.dumps(differ[:10])}" if differ
                                                                   else ""))


if __name__ == "__main__":
    main()
