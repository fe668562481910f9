#!/usr/bin/env bash
# One GPU-host session of the DDTree validation, in stages that a command (at most 10 minutes) strings
# together; what a stage leaves in $WORK (/tmp/k26-gpu) a later command on the same warm host reuses.
#
#   bash bench/ddtree/gpu_session.sh setup            unpack the payload (.payload/, bench/ddtree/payload.py), apply
#                                                     the repository's DDTree set with `k26-doctor patches apply`,
#                                                     pre-compile FlashInfer's JIT modules (in the background)
#   bash bench/ddtree/gpu_session.sh tiny             the random tiny pair (make_tiny.py) in $WORK/tiny
#   bash bench/ddtree/gpu_session.sh pair [SEED]      the trained pair (make_trained.py) and its prompt sets in $WORK/pair
#   bash bench/ddtree/gpu_session.sh serve PLAN S     up + measure + down of PLAN within S seconds, then compare
#   bash bench/ddtree/gpu_session.sh all PLAN S       setup, the pair(s) the plan needs, serve
#   bash bench/ddtree/gpu_session.sh startplan [ARGS] the product's launch --wait cold and warm on the trained pair
#                                                     against the doctor's start plan (bench/bench_start_plan.py ARGS,
#                                                     e.g. --runs cold,warm --budget 500); after setup and pair
#   bash bench/ddtree/gpu_session.sh startcoldwarm    after setup and pair: launch --wait of the trained pair on empty
#                                                     caches (FlashInfer, Triton, SGLang's, its JIT kernels) with the
#                                                     product's prewarm, then warm on what it filled (issue 40's 1.15x)
#   bash bench/ddtree/gpu_session.sh bigload          after setup: a random DeepSeek-V3 of 28 GiB (make_big.py, timed),
#                                                     then launch --wait on it as the writing left the page cache and
#                                                     again with its pages dropped (posix_fadvise): the weights part
#   bash bench/ddtree/gpu_session.sh validate         after setup and pair: the product's `k26-doctor validate` end to
#                                                     end, in sub-stages callable alone (each resumable, bounded):
#                                                     validate-run [S] (validate the trained pair's profile, sequential),
#                                                     validate-launch (launch --wait WITHOUT the opt-in, smoke, SIGTERM),
#                                                     validate-changed (budget 32 and --disable-overlap-schedule refused
#                                                     by `check` and by the server started with the record's env),
#                                                     validate-nooverlap [S] (validate graphs without the overlap scheduler)
#
# Everything printed and every result lands in $OUT (the device tool's output folder) when it is set.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/k26-gpu}; OUT=${OUT:-$WORK/out}; AUX=$WORK/aux; mkdir -p "$WORK" "$OUT" "$AUX"
SITE=$WORK/site PARTS=$WORK/parts
export REPO WORK
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
# The Rust radix-tree core in the 0.5.23 wheel is built against torch 2.14 and misreads tensor dtypes under
# torch 2.11 ("insert value must be an int64 tensor, got Int"): SGLang's Python tree core instead.
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
# sglang-kernel 0.4.5 (the newest whose sm90 library resolves against torch 2.11) is below the 0.4.9 SGLang 0.5.23
# asks for: SGLang's own switch skips that check on this test stack.
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export FLASHINFER_WORKSPACE_BASE=$WORK/flashinfer-cache TRITON_CACHE_DIR=$WORK/triton-cache
export SGLANG_CACHE_DIR=$WORK/sglang-cache

log() { echo "[$(date +%T)] $*"; }

# The revision of the DDTree patch set: its manifest and patches hashed. .setup-done records the one applied to the
# site, so that a later revision of the repository re-applies it: an earlier revision left in place is a drifted set,
# which sglang.patches refuses (and a start measured on it is not the repository's).
PATCH_SET=$REPO/sglang_patches/ddtree-0.5.23
patch_set_hash() { (cd "$PATCH_SET" && cat manifest.json ./*.patch | sha256sum | cut -c1-16); }

stage_setup() {
  local want_set done_set
  want_set=$(patch_set_hash) || { log "setup: the patch set cannot be read in $PATCH_SET"; return 3; }
  if [ -e "$WORK/.setup-done" ]; then
    done_set=$(sed -n 's/^patch-set //p' "$WORK/.setup-done")
    if [ "$done_set" = "$want_set" ]; then log "setup: already done on this host (patch set $want_set)"; return 0; fi
    # SGLang unpacked again (its patched files, and the files the set added, removed first), then the set applied
    log "setup: the site holds patch set ${done_set:-unrecorded}, the repository's is $want_set: SGLang re-unpacked"
    rm -rf "$SITE/sglang" "$SITE/.unpacked-site"
  fi
  mkdir -p "$SITE" "$PARTS"
  cp -n "$REPO"/.payload/*.tar.xz.* "$PARTS"/ 2>/dev/null
  for group in site flashinfer; do
    [ -e "$SITE/.unpacked-$group" ] && continue
    want=$(python3 -c "import json;print(sum(1 for p in json.load(open('$REPO/.payload/manifest.json'))['parts'] if p.startswith('$group.')))" 2>/dev/null || echo 0)
    have=$(ls "$PARTS"/$group.tar.xz.* 2>/dev/null | wc -l)
    if [ "$want" -gt 0 ] && [ "$have" -eq "$want" ]; then
      cat "$PARTS"/$group.tar.xz.* | xz -d -T0 | tar -x -C "$SITE" && touch "$SITE/.unpacked-$group" && log "unpacked $group"
    else
      log "payload group $group: $have of $want parts here"
    fi
  done
  [ -e "$SITE/.unpacked-site" ] || { log "no SGLang payload on this host"; return 3; }
  # apache-tvm-ffi loads its test library at import: a payload built before that was known dropped it, and a
  # copy may travel beside the payload (.gpu/, git-ignored).
  if [ ! -e "$SITE/tvm_ffi/lib/libtvm_ffi_testing.so" ] && [ -e "$REPO/.gpu/libtvm_ffi_testing.so.xz" ]; then
    xz -dc "$REPO/.gpu/libtvm_ffi_testing.so.xz" > "$SITE/tvm_ffi/lib/libtvm_ffi_testing.so" \
      && log "tvm_ffi: test library restored from .gpu/"
  fi
  # FlashInfer's JIT modules from an earlier session on the same stack (its jit-cache.tar.xz), when carried.
  if [ -e "$REPO/.gpu/jit-cache.tar.xz" ] && [ ! -d "$WORK/flashinfer-cache" ]; then
    tar -xJf "$REPO/.gpu/jit-cache.tar.xz" -C "$WORK" && log "flashinfer JIT cache restored from .gpu/"
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  python3 -c "import torch,triton,transformers;print('torch',torch.__version__,'triton',triton.__version__,'transformers',transformers.__version__)"
  log "patch set (k26-doctor patches apply)"
  (cd "$REPO" && PYTHONPATH=$REPO:$PYTHONPATH python3 -m doctor patches apply --python python3 --set ddtree-0.5.23 \
      --state-dir "$WORK/k26state" --yes | tail -3)
  local status
  status=$(cd "$REPO" && PYTHONPATH=$REPO:$PYTHONPATH python3 -m doctor patches status --python python3 \
      --set ddtree-0.5.23 --state-dir "$WORK/k26state" | tail -1)
  echo "$status"
  case "$status" in
    "overall: applied"*) ;;
    *) log "setup: the patch set is not applied ($status): setup not recorded"; return 4 ;;
  esac
  python3 -c "import sgl_kernel, sglang; print('sgl_kernel', sgl_kernel.__version__, 'sglang', sglang.__version__)"
  # FlashInfer's sampling and norm modules, compiled once for every server of the session (105 s cold).
  # SETUP_JIT=0 leaves the caches empty (a cold start measured in the same call must not share the cores with it).
  if [ "${SETUP_JIT:-1}" = 1 ]; then
    (python3 "$REPO/bench/ddtree/jit_prewarm.py" > "$AUX/jit-prewarm.txt" 2>&1; echo "rc=$?" >> "$AUX/jit-prewarm.txt") &
    echo $! > "$WORK/jit-prewarm.pid"
  fi
  echo "patch-set $want_set" > "$WORK/.setup-done"
}

wait_jit() {
  local pid; pid=$(cat "$WORK/jit-prewarm.pid" 2>/dev/null) || return 0
  while kill -0 "$pid" 2>/dev/null; do sleep 1; done
  log "jit prewarm: $(tail -3 "$AUX/jit-prewarm.txt" 2>/dev/null | tr '\n' ' ')"
}

stage_gputests() {  # the set's kernels on this GPU, and one round's tree work timed on it
  # The harness that tests/test_ddtree_gpu.py runs under pytest, without pytest (the GPU image has none).
  (cd "$REPO" && python3 tests/ddtree_gpu_harness.py > "$AUX/ddtree-gpu-harness.txt" 2>&1
   echo "rc=$?" >> "$AUX/ddtree-gpu-harness.txt"
   K26_DDTREE_SITE=$SITE python3 bench/bench_ddtree_round.py --device cuda --repeat 100 \
      --output "$AUX/ddtree-round-cuda.txt" > "$AUX/ddtree-round-cuda.log" 2>&1) &
  echo $! > "$WORK/gputests.pid"
}

wait_gputests() {
  local pid; pid=$(cat "$WORK/gputests.pid" 2>/dev/null) || return 0
  while kill -0 "$pid" 2>/dev/null; do sleep 1; done
  log "gpu kernel harness: $(tail -1 "$AUX/ddtree-gpu-harness.txt" 2>/dev/null)"
  cat "$AUX/ddtree-round-cuda.txt" 2>/dev/null
}

stage_tiny() {
  # TINY_LAYERS=12,24: deeper random dsv3 targets too ($TINY/dsv3-l12, ...)
  python3 "$REPO/bench/ddtree/make_tiny.py" "$WORK/tiny" ${TINY_LAYERS:+--dsv3-layers=$TINY_LAYERS}
}

pair_build() {  # the trained pair on this GPU and its prompt sets
  local seed=${1:-1} mt="$REPO/bench/ddtree/make_trained.py"
  [ -e "$WORK/pair/.done" ] && return 0
  log "trained pair (seed $seed)"
  python3 "$mt" "$WORK/pair" --seed "$seed" --device cuda > "$AUX/pair-build.txt" 2>&1 \
    || { log "pair build failed"; tail -30 "$AUX/pair-build.txt"; return 1; }
  python3 "$mt" --prompts 1000 --kind greedy --seed 11 --language-seed "$seed" -o "$WORK/pair/greedy.json" \
    && python3 "$mt" --prompts 64 --kind sampled --seed 12 --language-seed "$seed" -o "$WORK/pair/sampled.json" \
    && python3 -c "
import json
d = {k: json.load(open(f'$WORK/pair/{k}.json'))['prompts'] for k in ('greedy', 'sampled')}
json.dump(d, open('$WORK/pair/prompts.json', 'w'))" && touch "$WORK/pair/.done"
  log "trained pair built: $(grep -c . "$AUX/pair-build.txt") log lines; $(tail -1 "$AUX/pair-build.txt")"
}

pair_report() {  # the pair's own predictions (fit, margins, simulated accept lengths), beside the servers
  (export PYTHONPATH=; python3 "$REPO/bench/ddtree/make_trained.py" "$WORK/pair" --device cuda --report > "$AUX/pair-report.txt" 2>&1
   cp "$WORK/pair/report.json" "$OUT/pair-report.json" 2>/dev/null) &
}

stage_pair() { pair_build "$@" && pair_report; }

stage_prep() {  # setup, with the trained pair trained meanwhile on the image's own packages (no report)
  (export PYTHONPATH=; pair_build "${PAIR_SEED:-1}") & local pp=$!
  stage_setup || return $?
  wait "$pp"; [ -e "$WORK/pair/.done" ] || { log "no trained pair"; return 1; }
}

sc() { python3 "$REPO/bench/ddtree/serve_check.py" "$@"; }
left_s() { echo $(( ${DEADLINE:?} - $(date +%s) )); }

finish() {  # measure, down, compare, and what the next session can reuse
  local plan=$1; shift
  sc measure --plan "$plan" "$@" --out "$OUT/results.json" --budget-s $(( $(left_s) - 40 ))
  sc down "$@" --out "$OUT/results.json"
  sc compare "$OUT/results.json" --json "$OUT/verdicts.json" | tee "$OUT/compare.txt"
  tar -czf "$OUT/logs.tgz" --exclude=aux/traces -C "$WORK" logs aux 2>/dev/null
  pack_traces
  # FlashInfer's JIT modules for a later session (JIT_CACHE_OUT=1; too large to come back with a full call).
  [ "${JIT_CACHE_OUT:-0}" = 1 ] && tar -cJf "$OUT/jit-cache.tar.xz" -C "$WORK" flashinfer-cache 2>/dev/null
  ls -la "$OUT"
  rm -f "$WORK"/state*.json
}

pack_traces() {  # the torch profiler's traces of `torch_profile` phases, in one file that can come back (16 MiB)
  [ -d "$AUX/traces" ] || return 0
  local dirs; dirs=$(cd "$AUX/traces" && ls -d */ 2>/dev/null | tr -d /)
  while [ -n "$dirs" ]; do
    tar -czf "$OUT/traces.tgz" -C "$AUX/traces" $dirs
    [ "$(stat -c %s "$OUT/traces.tgz")" -le $((15 * 1024 * 1024)) ] && break
    log "traces: $(du -h "$OUT/traces.tgz" | cut -f1) is too large to come back; dropping $(echo "$dirs" | tail -1)"
    dirs=$(echo "$dirs" | head -n -1); rm -f "$OUT/traces.tgz"
  done
}

stage_serve() {  # servers of every wave, on a host whose pairs exist already
  local plan=${1:?plan} budget=${2:-420}
  export DEADLINE=${DEADLINE:-$(( $(date +%s) + budget ))} PAIR=$WORK/pair TINY=$WORK/tiny
  wait_jit
  sc up --plan "$plan" --state "$WORK/state1.json" --logs "$WORK/logs" --budget-s $(( $(left_s) * ${UP_PCT:-45} / 100 ))
  finish "$plan" --state "$WORK/state1.json"
}

stage_all() {  # setup, wave 0 on the random pair while the trained pair trains, then the rest
  local plan=${1:?plan} budget=${2:-540}
  export DEADLINE=$(( $(date +%s) + budget )) PAIR=$WORK/pair TINY=$WORK/tiny
  # The pair trains from the first second (torch and transformers of the image suffice), beside the unpacking,
  # the JIT pre-compile and the kernel harness.
  local pp=""
  # The image's own packages only (PYTHONPATH cleared): the payload's site is being unpacked meanwhile.
  if grep -q '\$PAIR' "$plan"; then (export PYTHONPATH=; pair_build "${PAIR_SEED:-1}") & pp=$!; fi
  stage_setup || return $?
  grep -q '\$TINY' "$plan" && stage_tiny
  local w0=""
  if grep -q '"wave": 0' "$plan"; then
    sc up --plan "$plan" --wave 0 --state "$WORK/state0.json" --logs "$WORK/logs" --budget-s $(( $(left_s) / 2 )) &
    w0=$!
    # Wave 0 captures its CUDA graphs with the GPU to itself (the memory it logs for them is then a reading of
    # its own, not of other processes allocating meanwhile): the pair trains once that is done (120 s at most).
    local t=0 names
    names=$(python3 -c "import json;p=json.load(open('$plan'));print(' '.join(s['name'] for s in p['servers'] if s.get('wave')==0))")
    while [ $t -lt 120 ] && kill -0 "$w0" 2>/dev/null; do
      local pending=0
      for f in $names; do
        grep -q "Capture target verify CUDA graph end\|Capture target decode CUDA graph end\|Capture decode CUDA graph end\|Capture cuda graph end" "$WORK/logs/$f.log" 2>/dev/null || pending=1
      done
      [ $pending -eq 0 ] && break
      sleep 2; t=$((t + 2))
    done
    log "wave 0 captured its graphs (or gave up) after ${t} s"
  fi
  [ -n "${GPU_TESTS:-1}" ] && [ "${GPU_TESTS:-1}" != 0 ] && stage_gputests
  if [ -n "$pp" ]; then
    wait "$pp"
    [ -e "$WORK/pair/.done" ] || { log "no trained pair: its servers cannot start"; }
    # PAIR_REPORT=0: no report on the GPU beside exclusive speed phases (the report of a seed is deterministic).
    [ "${PAIR_REPORT:-1}" != 0 ] && pair_report
  fi
  # No wait for the JIT pre-compile: a server that reaches FlashInfer meanwhile waits on its file lock and loads
  # what it built, while the rest of its start (imports, weights, Triton) overlaps the compile.
  # A cold start of a dozen servers takes 130-180 s (FlashInfer JIT, Triton, graph capture): the up budget is
  # UP_PCT (default 40) of what is left, but never under 200 s while that leaves a minute to measure.
  local up=$(( $(left_s) * ${UP_PCT:-40} / 100 ))
  [ $up -lt 200 ] && up=$(( $(left_s) - 60 < 200 ? $(left_s) - 60 : 200 ))
  sc up --plan "$plan" --wave 1 2 3 --state "$WORK/state1.json" --logs "$WORK/logs" --budget-s $up
  [ -n "$w0" ] && wait "$w0"
  wait_jit
  wait_gputests
  finish "$plan" --state "$WORK/state0.json" --state "$WORK/state1.json"
}

stage_product() {  # the product's own path on the trained pair: check, the gate, launch --wait, smoke, SIGTERM
  local prof=$WORK/trained.toml k="python3 -m doctor" url=http://127.0.0.1:30000 t=0 pid
  sed "s|/tmp/trained|$WORK/pair|g" "$REPO/bench/ddtree/profiles/h200-trained-ddtree.toml" > "$prof"
  export PYTHONPATH=$REPO:$PYTHONPATH
  log "product: check --import-sglang"
  (cd "$REPO" && timeout 90 $k check --profile "$prof" --python python3 --import-sglang -v > "$AUX/product-check.txt" 2>&1
   echo "exit $?" >> "$AUX/product-check.txt"); tail -4 "$AUX/product-check.txt"
  log "product: the worker's gate without SGLANG_DDTREE_UNVALIDATED_WORKER (this configuration is not validated)"
  (cd "$REPO" && SGLANG_DDTREE_UNVALIDATED_WORKER= timeout 150 python3 -m sglang.launch_server \
      --model-path "$WORK/pair/dsv3" --speculative-algorithm DDTREE --speculative-draft-model-path "$WORK/pair/dsv3-dflash" \
      --speculative-ddtree-budget 16 --attention-backend triton --sampling-backend pytorch --skip-tokenizer-init \
      --mem-fraction-static 0.2 --port 30010 > "$AUX/product-gate-refusal.log" 2>&1; echo "exit $?" >> "$AUX/product-gate-refusal.log") &
  local gate=$!
  log "product: launch --wait"
  (cd "$REPO" && exec setsid $k launch --profile "$prof" --python python3 --wait --wait-timeout 300 \
      > "$AUX/product-launch.log" 2>&1) & pid=$!
  while [ $t -lt ${PRODUCT_WAIT_S:-150} ] && kill -0 $pid 2>/dev/null && ! curl -sf $url/health >/dev/null 2>&1; do sleep 2; t=$((t + 2)); done
  log "product: healthy after ${t} s (launch pid alive: $(kill -0 $pid 2>/dev/null && echo yes || echo no))"
  local ids; ids=$(python3 -c "import json;print(','.join(map(str, json.load(open('$WORK/pair/prompts.json'))['greedy'][0])))")
  (cd "$REPO" && $k smoke --profile "$prof" --url $url --input-ids "$ids" --max-tokens 48 --requests 8 \
      > "$AUX/product-smoke.txt" 2>&1; echo "exit $?" >> "$AUX/product-smoke.txt"); cat "$AUX/product-smoke.txt" | tail -12
  if python3 -c "import pytest" 2>/dev/null; then
    (cd "$REPO" && K26_SMOKE_URL=$url K26_SMOKE_INPUT_IDS="$ids" python3 -m pytest -q -p no:cacheprovider -o addopts= \
        -m gpu tests/test_smoke_gpu.py -rs > "$AUX/product-pytest-smoke.txt" 2>&1); tail -3 "$AUX/product-pytest-smoke.txt"
  else
    log "product: no pytest in this image: tests/test_smoke_gpu.py not run"
  fi
  kill -TERM -- -$pid 2>/dev/null || kill -TERM $pid 2>/dev/null; t=0
  while [ $t -lt 60 ] && kill -0 $pid 2>/dev/null; do sleep 1; t=$((t + 1)); done
  log "product: launch gone ${t} s after SIGTERM; GPU memory used now: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  tail -5 "$AUX/product-launch.log"
  wait $gate; grep -m3 -i "validated\|exit [0-9]" "$AUX/product-gate-refusal.log"
  tar -czf "$OUT/logs.tgz" -C "$WORK" logs aux 2>/dev/null
}

stage_startplan() {  # the start plan measured (bench/bench_start_plan.py): cold and warm launch --wait, fresh caches
  local prof=$WORK/trained.toml
  sed "s|/tmp/trained|$WORK/pair|g" "$REPO/bench/ddtree/profiles/h200-trained-ddtree.toml" > "$prof"
  export PYTHONPATH=$REPO:$PYTHONPATH
  (cd "$REPO" && python3 bench/bench_start_plan.py --profile "$prof" --out "$OUT" --root "$WORK/start-bench" "$@")
}

stage_startcoldwarm() {  # cold (fresh caches, the prewarm on) then warm launch --wait of the trained pair, in 540 s
  local prof=$WORK/trained.toml
  sed "s|/tmp/trained|$WORK/pair|g" "$REPO/bench/ddtree/profiles/h200-trained-ddtree.toml" > "$prof"
  export PYTHONPATH=$REPO:$PYTHONPATH
  mkdir -p "$OUT/startcoldwarm"
  (cd "$REPO" && timeout -k 10 "${START_TIMEOUT:-530}" python3 bench/bench_start_plan.py --profile "$prof" --out "$OUT/startcoldwarm" \
      --root "$WORK/start-coldwarm" --runs cold-prewarm,warm --budget 515 --limit 240 "$@")
  log "startcoldwarm: exit $?"; cat "$OUT/startcoldwarm/start-plan.json" 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin)
for r in d['runs']: print(r.get('run'), 'launch->healthy', r.get('launch_to_healthy_s'), 'exec->ready', r.get('server_ready_after_s'), 'predicted', r.get('predicted_s'), 'ratio', r.get('prediction_ratio'))
print({k: v for k, v in d.items() if '/' in k})" 2>/dev/null
}

stage_bigload() {  # the big random DeepSeek-V3 written (timed), launched cached then evicted, in 540 s
  local prof=$WORK/trained.toml
  sed "s|/tmp/trained|$WORK/pair|g" "$REPO/bench/ddtree/profiles/h200-trained-ddtree.toml" > "$prof"
  export PYTHONPATH=$REPO:$PYTHONPATH
  # The model must lie on a disk (a tmpfs page cannot be dropped: "evicted" would still load from memory).
  local big=${BIG_DIR:-$WORK/start-big/big-dsv3}
  mkdir -p "$OUT/bigload" "$(dirname "$big")"
  if [ "$(stat -f -c %T "$(dirname "$big")")" = tmpfs ] && [ -z "${BIG_DIR:-}" ]; then
    big=$REPO/.big-dsv3; log "bigload: $WORK is a tmpfs: the model goes to $big ($(stat -f -c %T "$REPO"))"
  fi
  df -h "$(dirname "$big")" | tail -1; free -g | head -2
  (cd "$REPO" && timeout -k 10 "${START_TIMEOUT:-530}" python3 bench/bench_start_plan.py --profile "$prof" --out "$OUT/bigload" \
      --root "$WORK/start-big" --big-dir "$big" --runs big-cached,big-evicted --budget 515 --limit 220 "$@")
  log "bigload: exit $?"; cat "$OUT/bigload/start-plan.json" 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin); print('model', {k: v for k, v in d.get('big_model', {}).items() if k != 'per_shard'})
for r in d['runs']:
    w = {c['part']: (c['predicted_s'], c['actual_s']) for c in r.get('comparison') or []}
    print(r.get('run'), 'resident before', (r.get('residency_before') or {}).get('resident_bytes'), 'exec->ready', r.get('server_ready_after_s'), 'predicted', r.get('predicted_s'), 'weights (pred, actual)', w.get('weights'))" 2>/dev/null
  df -h "$WORK" | tail -1
}

# -- the product's `k26-doctor validate` on the trained pair (after setup and pair) --------------------------------
VPROF=$WORK/validate.toml VSTATE=$WORK/doctor-state
validate_env() {
  export PYTHONPATH=$REPO:$PYTHONPATH
  sed "s|/tmp/trained|$WORK/pair|g" "$REPO/bench/ddtree/profiles/h200-trained-validate.toml" > "$VPROF"
  mkdir -p "$VSTATE" "$OUT/validate"
}
kd() { (cd "$REPO" && python3 -m doctor "$@"); }

stage_validate_run() {  # [S]: validate the profile's configuration (budget 16, graphs + overlap), sequential
  validate_env; local s=${1:-540}
  log "validate: k26-doctor validate --profile (trained pair), time budget ${s} s"
  kd validate --profile "$VPROF" --python python3 --state-dir "$VSTATE" --prompts "$WORK/pair/prompts.json" \
      --time-budget "$s" --format json --output "$OUT/validate/run.json" > "$OUT/validate/run.txt" 2> "$OUT/validate/run.err"
  echo "exit $?" >> "$OUT/validate/run.txt"
  tail -40 "$OUT/validate/run.err"; python3 -c "
import json; r=json.load(open('$OUT/validate/run.json'))
print('outcome', r['outcome'], 'timing', r.get('timing'))
for b, v in r['budgets'].items(): print(b, v['outcome'], v['why'], v.get('record'))" 2>/dev/null
  ls -la "$VSTATE/ddtree/validated" 2>/dev/null; cp -r "$VSTATE/ddtree/validated" "$OUT/validate/records" 2>/dev/null
}

stage_validate_launch() {  # launch --wait without the opt-in: DDTREE must start on the record; smoke; SIGTERM
  validate_env; local url=http://127.0.0.1:30000 t=0 pid ids
  log "validate: check (sglang.ddtree) without the opt-in"
  SGLANG_DDTREE_UNVALIDATED_WORKER= kd check --profile "$VPROF" --python python3 --state-dir "$VSTATE" --only sglang.ddtree -v \
      > "$OUT/validate/check.txt" 2>&1; echo "exit $?" >> "$OUT/validate/check.txt"; tail -6 "$OUT/validate/check.txt"
  log "validate: launch --wait without the opt-in"
  (cd "$REPO" && SGLANG_DDTREE_UNVALIDATED_WORKER= exec setsid python3 -m doctor launch --profile "$VPROF" --python python3 \
      --state-dir "$VSTATE" --wait --wait-timeout 300 > "$OUT/validate/launch.log" 2>&1) & pid=$!
  while [ $t -lt 240 ] && kill -0 $pid 2>/dev/null && ! curl -sf $url/health >/dev/null 2>&1; do sleep 2; t=$((t + 2)); done
  log "validate: healthy after ${t} s (launch alive: $(kill -0 $pid 2>/dev/null && echo yes || echo no))"
  grep -m3 -i "site validation record\|DDTREE worker\|speculative" "$OUT/validate/launch.log"
  ids=$(python3 -c "import json;print(','.join(map(str, json.load(open('$WORK/pair/prompts.json'))['greedy'][0])))")
  kd smoke --profile "$VPROF" --url $url --input-ids "$ids" --max-tokens 48 --requests 8 > "$OUT/validate/smoke.txt" 2>&1
  echo "exit $?" >> "$OUT/validate/smoke.txt"; tail -8 "$OUT/validate/smoke.txt"
  kill -TERM -- -$pid 2>/dev/null || kill -TERM $pid 2>/dev/null; t=0
  while [ $t -lt 60 ] && kill -0 $pid 2>/dev/null; do sleep 1; t=$((t + 1)); done
  log "validate: launch gone ${t} s after SIGTERM"; tail -4 "$OUT/validate/launch.log"
}

stage_validate_changed() {  # one changed key at a time: refused by the doctor and by the server
  validate_env; local name extra budget
  for name in budget32 nooverlap; do
    extra=""; budget=16
    [ $name = budget32 ] && budget=32
    [ $name = nooverlap ] && extra="--disable-overlap-schedule"
    sed -e "s/^ddtree_budget = 16/ddtree_budget = $budget/" -e "s|^args = \[|args = [${extra:+\"$extra\", }|" "$VPROF" > "$WORK/changed-$name.toml"
    log "validate: check with $name (must fail naming the key)"
    SGLANG_DDTREE_UNVALIDATED_WORKER= kd check --profile "$WORK/changed-$name.toml" --python python3 --state-dir "$VSTATE" \
        --only sglang.ddtree -v > "$OUT/validate/check-$name.txt" 2>&1; echo "exit $?" >> "$OUT/validate/check-$name.txt"
    grep -m4 -i "differs\|validate\|exit" "$OUT/validate/check-$name.txt"
    log "validate: the server started directly with $name and SGLANG_DDTREE_SITE_RECORD (must refuse naming the key)"
    (cd "$REPO" && SGLANG_DDTREE_UNVALIDATED_WORKER= SGLANG_DDTREE_SITE_RECORD="$VSTATE/ddtree/validated" timeout 150 \
        python3 -m sglang.launch_server --model-path "$WORK/pair/dsv3" --tp-size 1 --speculative-algorithm DDTREE \
        --speculative-draft-model-path "$WORK/pair/dsv3-dflash" --speculative-ddtree-budget $budget --attention-backend triton \
        --mem-fraction-static 0.35 --skip-tokenizer-init --sampling-backend pytorch --max-running-requests 48 $extra \
        --host 127.0.0.1 --port 30011 > "$OUT/validate/server-$name.log" 2>&1; echo "exit $?" >> "$OUT/validate/server-$name.log")
    grep -m3 "DDTREE\|exit [0-9]" "$OUT/validate/server-$name.log"
  done
}

stage_validate_nooverlap() {  # [S]: CUDA graphs without the overlap scheduler, validated by the product
  validate_env; local s=${1:-540}
  sed -e "s|^args = \[|args = [\"--disable-overlap-schedule\", |" "$VPROF" > "$WORK/validate-nooverlap.toml"
  log "validate: k26-doctor validate, graphs without the overlap scheduler, time budget ${s} s"
  kd validate --profile "$WORK/validate-nooverlap.toml" --python python3 --state-dir "$VSTATE" \
      --prompts "$WORK/pair/prompts.json" --time-budget "$s" --format json --output "$OUT/validate/nooverlap.json" \
      > "$OUT/validate/nooverlap.txt" 2> "$OUT/validate/nooverlap.err"; echo "exit $?" >> "$OUT/validate/nooverlap.txt"
  tail -30 "$OUT/validate/nooverlap.err"; tail -12 "$OUT/validate/nooverlap.txt"
}

stage_validate() { stage_validate_run "${1:-540}" && stage_validate_launch && stage_validate_changed && stage_validate_nooverlap "${2:-540}"; }

main() {
  local stage=${1:?stage}; shift
  case "$stage" in
    setup) stage_setup ;;
    tiny) stage_tiny ;;
    pair) stage_pair "$@" ;;
    serve) stage_serve "$@" ;;
    all) stage_all "$@" ;;
    product) stage_product ;;
    startplan) stage_startplan "$@" ;;
    startcoldwarm) stage_startcoldwarm "$@" ;;
    bigload) stage_bigload "$@" ;;
    prep) stage_prep ;;
    validate) stage_validate "$@" ;;
    validate-run) stage_validate_run "$@" ;;
    validate-launch) stage_validate_launch ;;
    validate-changed) stage_validate_changed ;;
    validate-nooverlap) stage_validate_nooverlap "$@" ;;
    *) echo "unknown stage $stage"; return 2 ;;
  esac
}

main "$@" 2>&1 | tee -a "$OUT/session.txt"
