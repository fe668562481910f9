#!/usr/bin/env bash
# One short device session: the host/stack readings issue 14 asks for on real hardware, the deep-hashing
# and default-tier ratios measured there, then a real SGLang 0.5.23 server (the tiny DeepSeek-V3 target of
# bench/ddtree, no speculation) with `k26-doctor smoke` and its GPU test against it. Steps are ordered by
# value and each has its own deadline, so a session cut short still returns what ran; everything lands in
# $OUT (at most 8 files come back).
#   bash bench/device_session.sh            carry: .payload/site.tar.xz.00 .payload/manifest.json
# Needs the image's python3 (torch, triton, nvidia-ml-py, click, pytest). Changes nothing on the host
# outside /tmp.
set -u
TIMEFORMAT="wall %R s"
OUTDIR=${OUT:-./device-out}
mkdir -p "$OUTDIR"
PY=${PY:-python3}
SITE=/tmp/site
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NO_COLOR=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { echo; echo "== $* ($(date +%T), +$SECONDS s)"; }
LOG=$OUTDIR/session.txt

# SGLang's payload unpacks while the host readings run (it is only needed from step 4 on).
( mkdir -p $SITE && cat .payload/site.tar.xz.* | xz -d -T0 | tar -x -C $SITE && touch $SITE/.unpacked-site ) \
  > /tmp/unpack.txt 2>&1 &
UNPACK=$!

{
step "1. host readings: fabric, fabric manager / NVLSM, IOMMU, ACS (bench/gpu_host_readings.sh)"
timeout 60 bash bench/gpu_host_readings.sh "$OUTDIR" > /dev/null 2>&1; echo "rc=$? (gpu-host-readings.txt)"

step "2. cuda.libcuda: as the image resolves it, then with a wrong libcuda first on LD_LIBRARY_PATH"
timeout 30 "$PY" -m doctor check --profile h200-tp8 --tp 1 --only cuda.libcuda -v 2>&1 | tail -12
wrong=/tmp/wrong-libcuda; mkdir -p $wrong
stub=$(ls /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so \
  2>/dev/null | head -1)
if [ -n "$stub" ]; then
  cp "$stub" $wrong/libcuda.so.1
  echo "-- the toolkit's link stub as libcuda.so.1 first on the path ($stub)"
  LD_LIBRARY_PATH=$wrong${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 30 "$PY" -m doctor check --profile h200-tp8 \
    --tp 1 --only cuda.libcuda -v 2>&1 | tail -12
fi
compat=$(ls -d /usr/local/cuda/compat /usr/local/cuda-*/compat 2>/dev/null | head -1)
if [ -n "$compat" ]; then
  echo "-- the CUDA forward-compatibility libraries first on the path ($compat: $(ls "$compat" | tr '\n' ' '))"
  LD_LIBRARY_PATH=$compat${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 30 "$PY" -m doctor check --profile h200-tp8 \
    --tp 1 --only cuda.libcuda -v 2>&1 | tail -12
fi

step "3. stack.kernels over the image's torch (GPU code and libtorch ABI of every kernel package)"
time timeout 40 "$PY" -m doctor check --profile h200-tp8 --tp 1 --python "$PY" --only stack.kernels -v 2>&1 | tail -25

step "4. default tier against import torch, in one run (bench/bench_default_tier.py)"
# (the unpacking runs outside this group's subshell: wait for its marker, not its pid)
for _ in $(seq 60); do [ -e $SITE/.unpacked-site ] || ! kill -0 $UNPACK 2>/dev/null && break; sleep 1; done
cat /tmp/unpack.txt; ls $SITE/.unpacked-site
timeout 90 env PYTHONPATH=$PWD:$SITE "$PY" bench/bench_default_tier.py --python "$PY" --profile h200-tp8 --tp 1 \
  --runs 3 > "$OUTDIR/default-tier.json" 2> "$OUTDIR/default-tier.err"; echo "rc=$?"
"$PY" -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({k: v for k, v in r.items() if k != "runs" and k != "checks"}, indent=1)[:3000])' \
  "$OUTDIR/default-tier.json" 2>&1 | tail -40
tail -3 "$OUTDIR/default-tier.err"

step "5. deep hashing against xargs -P sha256sum / openssl, in one run"
timeout 70 "$PY" bench/bench_model_deep.py --dir /tmp/k26-deep --files 16 --mib 64 --runs 3 --budget 60 2>&1 | tail -12

step "6. a real SGLang 0.5.23 server (tiny DeepSeek-V3, no speculation), smoke against it"
export PYTHONPATH=$PWD:$SITE SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
"$PY" -m doctor patches apply --python "$PY" --set ddtree-0.5.23 --state-dir /tmp/k26state --yes 2>&1 | tail -1
timeout 60 "$PY" bench/ddtree/make_tiny.py /tmp/tiny 2>&1 | tail -2
"$PY" -m sglang.launch_server --model-path /tmp/tiny/dsv3 --skip-tokenizer-init --attention-backend triton \
  --sampling-backend pytorch --mem-fraction-static 0.35 --disable-cuda-graph --host 127.0.0.1 --port 30000 \
  > "$OUTDIR/server.log" 2>&1 &
SERVER=$!
health() { "$PY" -c 'import sys, urllib.request as u
try: print(u.urlopen("http://127.0.0.1:30000/health", timeout=2).status)
except Exception as e: print(type(e).__name__); sys.exit(1)'; }
for _ in $(seq 120); do
  health >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || break
  sleep 1
done
echo "server /health after +$SECONDS s: $(health 2>&1)"
time timeout 60 "$PY" -m doctor smoke --url http://127.0.0.1:30000 --requests 4 --max-tokens 32 --timeout 50; echo "rc=$?"
K26_SMOKE_URL=http://127.0.0.1:30000 timeout 90 "$PY" -m pytest -q -p no:cacheprovider -n 0 -rs -m gpu \
  tests/test_smoke_gpu.py 2>&1 | tail -6

step "7. check on the tiny DDTREE profile: sglang.install must name what DDTREE imports that is missing"
time timeout 60 "$PY" -m doctor check --profile bench/ddtree/profiles/h200-tiny-ddtree.toml --python "$PY" 2>&1 \
  | tail -30
kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
grep -n -E "Traceback|Error|leak" "$OUTDIR/server.log" | head -10
step done
} 2>&1 | tee "$LOG"
