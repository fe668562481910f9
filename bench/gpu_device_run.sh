#!/usr/bin/env bash
# Everything the GPU area runs on a lent GPU machine, in one batch (device time is scarce).
#   bash bench/gpu_device_run.sh [OUTDIR]     (OUTDIR defaults to $OUT, else ./gpu-run-out)
# Records a real snapshot (facts nvml + p2p_bandwidth), runs the GPU checks live, the GPU tests,
# and bench/bench_gpu.py. Each step has its own deadline so one hang cannot eat the others.
set -u
TIMEFORMAT="wall %R s"
OUTDIR=${1:-${OUT:-./gpu-run-out}}
mkdir -p "$OUTDIR"
PY=${PY:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { echo "== $* ($(date +%T))"; }
{
  step nvidia-smi; timeout 30 nvidia-smi; timeout 30 nvidia-smi topo -m; timeout 30 nvidia-smi nvlink -s
  timeout 30 nvidia-smi -q | grep -i -A6 -E 'fabric|persistence|mig mode|remapp|clocks event'
  "$PY" -c 'import pynvml, sys; print(pynvml.__file__, sys.version)'; "$PY" -m pip show nvidia-ml-py | head -2
  cat /proc/driver/nvidia/version; systemctl is-active nvidia-fabricmanager; nv-fabricmanager --version
} > "$OUTDIR/smi.txt" 2>&1
step snapshot
timeout 120 "$PY" -m doctor snapshot --profile h200-tp8 --deep --fact nvml --fact p2p_bandwidth \
  --note "real: lent nvidia-h200 machine (1x H200), recorded with bench/gpu_device_run.sh" \
  --output "$OUTDIR/${SNAPSHOT_NAME:-h200x1-real.json}"
step check tp8
time timeout 60 "$PY" -m doctor check --only 'gpu.*' --profile h200-tp8 -v \
  --format json --output "$OUTDIR/check-tp8.json"
step check tp1 deep
time timeout 120 "$PY" -m doctor check --only 'gpu.*' --profile h200-tp8 --tp 1 --deep -v
step pytest
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -n 0 -rs tests/test_gpu_*.py 2>&1 | tee "$OUTDIR/pytest-gpu.txt" | tail -25
step bench
timeout 120 "$PY" bench/bench_gpu.py --profile h200-tp8 --tp 1 --repeat 5 --deep --python "$PY" \
  --output "$OUTDIR/bench.json" | head -40
step done
