"""Cost of the readings behind gpu.p2p and gpu.fabric.*, against a baseline measured in the same run.

    PYTHONPATH=. python3 bench/bench_gpu_readings.py [--repeat 7] [--output FILE]

Baseline (as bench/bench_gpu.py): the least an isolated NVML reading can cost, a child interpreter that
imports pynvml, initialises NVML and counts the GPUs. Measured, medians of ``--repeat`` runs:

* ``pcie live``: ``doctor.gpu.pcie.read_pcie()`` on this host's sysfs (every NVIDIA GPU, its bridges'
  configuration spaces, the IOMMU);
* ``pcie 8-GPU tree``: the same reader on a synthetic 8-GPU HGX-like sysfs tree in a temporary directory
  (4 switches, 16 bridges with real 4096-byte configuration spaces), so hosts without GPUs measure the
  full work too;
* ``fabric software``: ``read_fabric_software()`` (dpkg-query or rpm, nv-fabricmanager --version,
  systemctl show, /proc scan), as the collector runs it;
* ``fabric poll``: one poll of the fabric wait, the ``nvml`` collector in its isolated child process.

Reported: medians in ms and the ratio to the baseline. Nothing is changed on the host.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from sysfs_tree import ACS_REDIRECT_ON, switched_host  # noqa: E402 (tests/ helper, after the path)
from timing import median_time  # noqa: E402 (bench/timing.py: the script's folder is on sys.path)

from doctor.core.registry import load  # noqa: E402
from doctor.facts.store import CollectOptions  # noqa: E402
from doctor.gpu.fabric import nvml_source  # noqa: E402
from doctor.gpu.fabric_software import read_fabric_software  # noqa: E402
from doctor.gpu.pcie import read_pcie  # noqa: E402

BASELINE = ("import pynvml\ntry:\n    pynvml.nvmlInit(); pynvml.nvmlDeviceGetCount(); pynvml.nvmlShutdown()\n"
            "except pynvml.NVMLError:\n    pass\n")
HGX_BUS = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0",
           "0000:ba:00.0", "0000:db:00.0"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    base = median_time(lambda: subprocess.run([sys.executable, "-c", BASELINE], check=True, capture_output=True,
                                              timeout=60), args.repeat)
    rows: dict[str, float] = {"baseline (isolated NVML init + count)": base}
    rows["pcie live"] = median_time(read_pcie, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        switched_host(Path(tmp) / "sys", HGX_BUS, acs_control=ACS_REDIRECT_ON, group_type="DMA-FQ")
        (Path(tmp) / "proc").mkdir()
        (Path(tmp) / "proc" / "cmdline").write_text("ro intel_iommu=on\n")
        tree = read_pcie(str(Path(tmp) / "sys"), str(Path(tmp) / "proc"))
        assert len(tree["gpus"]) == 8 and len(tree["bridges"]) == 16, tree
        rows["pcie 8-GPU tree"] = median_time(lambda: read_pcie(str(Path(tmp) / "sys"), str(Path(tmp) / "proc")),
                                              args.repeat)
    rows["fabric software"] = median_time(read_fabric_software, args.repeat)
    poll = nvml_source(load(plugins=False).collectors["nvml"], CollectOptions())
    rows["fabric poll (isolated nvml)"] = median_time(poll, args.repeat)
    out = {name: {"ms": round(v * 1000, 2), "x_baseline": round(v / base, 3)} for name, v in rows.items()}
    for name, r in out.items():
        print(f"{name:40s} {r['ms']:9.2f} ms  {r['x_baseline']:7.3f}x baseline")
    if args.output:
        Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
