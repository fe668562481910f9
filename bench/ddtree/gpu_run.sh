#!/usr/bin/env bash
# One GPU-host session of the DDTree validation: unpack the payload (bench/ddtree/payload.py), apply the
# repository's DDTree patch set to it with the product (k26-doctor patches apply), build the tiny
# checkpoints, run the servers of PLAN and compare them. Everything it prints and writes lands in $OUT.
# Usage: bash bench/ddtree/gpu_run.sh PLAN [BUDGET_S] [serve_check run options...]
set -uo pipefail
PLAN=${1:?plan}; BUDGET=${2:-480}; shift 2 || shift $#
OUT=${OUT:-/tmp/ddtree-out}; mkdir -p "$OUT"
SITE=/tmp/site PARTS=/tmp/payload-parts
# Archive groups (site, flashinfer, cutlass) may come over several calls while the host is warm: parts
# collect in $PARTS and a group is unpacked once all its parts (listed in .payload/manifest.json) are here.
mkdir -p "$SITE" "$PARTS"
cp -n .payload/*.tar.xz.* "$PARTS"/ 2>/dev/null
for group in site flashinfer cutlass; do
  [ -e "$SITE/.unpacked-$group" ] && continue
  want=$(python3 -c "import json,sys;print(sum(1 for p in json.load(open('.payload/manifest.json'))['parts'] if p.startswith('$group.')))" 2>/dev/null || echo 0)
  have=$(ls "$PARTS"/$group.tar.xz.* 2>/dev/null | wc -l)
  if [ "$want" -gt 0 ] && [ "$have" -eq "$want" ]; then
    cat "$PARTS"/$group.tar.xz.* | xz -d -T0 | tar -x -C "$SITE" && touch "$SITE/.unpacked-$group" && echo "unpacked $group"
  else
    echo "payload group $group: $have of $want parts here"
  fi
done
[ -e "$SITE/.unpacked-site" ] || { echo "no SGLang payload on this host"; exit 3; }
# The CuTe DSL's wheel puts its packages on sys.path with a .pth file, which PYTHONPATH entries do not read.
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
# The Rust radix-tree core in the 0.5.23 wheel is built against torch 2.14 and misreads tensor dtypes
# under torch 2.11 ("insert value must be an int64 tensor, got Int"): SGLang's Python tree core instead.
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
# sglang-kernel 0.4.5 (the newest whose sm90 library resolves against torch 2.11) is below the 0.4.9 SGLang
# 0.5.23 asks for: SGLang's own switch skips that check on this test stack.
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  echo "== host"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
  echo "== patch set (k26-doctor patches apply)"
  python3 -m doctor patches apply --python python3 --set ddtree-0.5.23 --state-dir /tmp/k26state --yes | tail -3
  python3 -m doctor patches status --python python3 --set ddtree-0.5.23 --state-dir /tmp/k26state | tail -1
  python3 -c "import sgl_kernel, sglang; print('sgl_kernel', sgl_kernel.__version__, 'sglang', sglang.__version__)"
  [ -d /tmp/tiny/qwen3 ] || python3 bench/ddtree/make_tiny.py /tmp/tiny
  echo "== servers"
  python3 bench/ddtree/serve_check.py run --plan "$PLAN" --out "$OUT/results.json" --budget-s "$BUDGET" "$@"
  echo "== compare"
  python3 bench/ddtree/serve_check.py compare "$OUT/results.json"
} 2>&1 | tee "$OUT/session.txt"
tar -czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log 2>/dev/null) 2>/dev/null; rm -f "$OUT"/*.log "$OUT"/*.partial.json
