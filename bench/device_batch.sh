#!/usr/bin/env bash
# The whole project's GPU work in one batched call on a lent NVIDIA machine (device time is scarce).
#   bash bench/device_batch.sh tests|benches [OUTDIR]    (SKIP_CHECKS=1: tests only, no snapshot or check)
# tests:   every gpu-marked test, a full snapshot, the default tier of `check` (timed), --deep torch.arch.
# benches: bench_gpu, bench_stack (floor: import torch), model shards on a sparse K2.6 replica, deep hashing.
# Each step has its own deadline so one hang cannot eat the others. Needs the SGLang 0.5.23 wheel in .whl/
# for the DDTree kernel test (carry .whl).
set -u
TIMEFORMAT="wall %R s"
MODE=${1:-tests}
OUTDIR=${2:-${OUT:-./device-out}}
mkdir -p "$OUTDIR"
PY=${PY:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 NO_COLOR=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export K26_GPU_PYTHON=$PY K26_SGLANG_WHEEL=$(ls "$PWD"/.whl/sglang-0.5.23-*.whl 2>/dev/null | head -1)
step() { echo "== $* ($(date +%T))"; }
if [ "$MODE" = tests ]; then
  step env; nvidia-smi -L; "$PY" -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
  step pytest -m gpu
  # One file per process: a test that makes a CUDA context in the runner must not make the GPU look busy
  # to the next file's gpu.idle test.
  for f in tests/test_gpu_live.py tests/test_model_gpu.py tests/test_stack_gpu.py tests/test_ddtree_gpu.py; do
    timeout 200 "$PY" -m pytest -q -p no:cacheprovider -n 0 -rs -m gpu "$f" 2>&1 | tee -a "$OUTDIR/pytest-gpu.txt" | tail -8
  done
  [ -n "${SKIP_CHECKS:-}" ] && { step done; exit 0; }
  step snapshot
  time timeout 90 "$PY" -m doctor snapshot --profile h200-tp8 --tp 1 \
    --note "real: lent nvidia-h200 machine (1x H200), all facts, recorded by bench/device_batch.sh" \
    --output "$OUTDIR/h200x1-all-facts.json"
  step "check default tier, h200-tp8 --tp 1 (timed, twice)"
  for i in 1 2; do time timeout 90 "$PY" -m doctor check --profile h200-tp8 --tp 1 --format json \
    --output "$OUTDIR/check-h200-tp1-$i.json" > "$OUTDIR/check-h200-tp1-$i.txt"; echo "rc=$?"; done
  cat "$OUTDIR/check-h200-tp1-2.txt"
  step "check --deep torch.arch/gpu on the default profile b300 (expect arch/count failures)"
  time timeout 120 "$PY" -m doctor check --deep --only 'torch.*' --only 'gpu.*' --only cuda.compat -v | tail -40
else
  step bench_gpu
  timeout 90 "$PY" bench/bench_gpu.py --profile h200-tp8 --tp 1 --repeat 5 --python "$PY" | tail -15
  step bench_stack
  timeout 150 "$PY" bench/bench_stack.py --python "$PY" --runs 3 --cli 2>&1 | tail -15
  step "model: sparse K2.6 replica, model.* on one H200 (fit must fail), shard bench"
  timeout 150 "$PY" bench/bench_model_shards.py --dir /tmp/k26-replica --runs 3 2>&1 | tail -12
  time timeout 60 "$PY" -m doctor check --only 'model.*' --model-path /tmp/k26-replica --profile h200-tp8 --tp 1 \
    --skip model.drafter -v 2>&1 | tail -30
  step "deep hashing on $(nproc) cores"
  timeout 300 "$PY" bench/bench_model_deep.py --dir /tmp/k26-deep --files 32 --mib 128 --runs 5 2>&1 | tail -15
fi
step done
