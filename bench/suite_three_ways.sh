#!/usr/bin/env bash
# The README's test command started three ways, one after the other, each timed, on the checkout it is run in:
#
#   terminal  under a pseudo-terminal (script(1)): SIGINT at its default, as a person at a shell starts it
#   nohup     `nohup ... &` from this non-interactive script: the children inherit an ignored SIGINT and no
#             terminal, as under a CI runner or a cron job
#   load      under `nice -n 10` beside a parallel CPU load (one busy process per core, at normal priority)
#
#   bash bench/suite_three_ways.sh [OUT]     (OUT: the report, default bench/results/suite-three-ways.txt)
#
# Each way's summary line, exit status and wall time go to OUT; the logs beside it (OUT.<way>.log). Run it once the
# caches are filled (a first run downloads: README, "What it costs"). WAYS picks some ("nohup load"). PYTHON names the interpreter (default: the CI
# venv's when it exists, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/suite-three-ways.txt}
PY=${PYTHON:-}
[ -z "$PY" ] && { [ -x "$HOME/.cache/k26-doctor-ci/venv/bin/python" ] && PY=$HOME/.cache/k26-doctor-ci/venv/bin/python || PY=python3; }
CMD=("$PY" -m pytest -q -p no:cacheprovider)
# SUITE_ARGS: extra pytest arguments (a file to try the script on); empty for the README's command
read -r -a extra <<< "${SUITE_ARGS:-}"; CMD+=("${extra[@]}")
mkdir -p "$(dirname "$OUT")"
{
  echo "# the README's test command three ways: $(git rev-parse --short HEAD 2>/dev/null) $(date -u +%FT%TZ)"
  echo "# host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $("$PY" -V 2>&1)"
} > "$OUT"

summary() {  # the pytest summary line of a log
  sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -aE '[0-9]+ (passed|failed)' | tail -1
}

record() {  # WAY RC SECONDS LOG
  printf '%-8s exit %s  %5ds  %s\n' "$1" "$2" "$3" "$(summary "$4")" | tee -a "$OUT"
}

way_terminal() {
  local log=$OUT.terminal.log t0=$SECONDS
  script -qec "$(printf '%q ' "${CMD[@]}")" /dev/null > "$log" 2>&1
  record terminal $? $((SECONDS - t0)) "$log"
}

way_nohup() {
  local log=$OUT.nohup.log t0=$SECONDS pid
  nohup "${CMD[@]}" > "$log" 2>&1 < /dev/null &
  pid=$!
  # what the children of a background job of a non-interactive shell inherit: SIGINT ignored (bit 1 of SigIgn)
  echo "nohup: SigIgn of the pytest process $(awk '/^SigIgn/ {print $2}' /proc/$pid/status 2>/dev/null)" >> "$OUT"
  wait "$pid"
  record nohup $? $((SECONDS - t0)) "$log"
}

way_load() {
  local log=$OUT.load.log t0=$SECONDS burners=() i
  for i in $(seq "$(nproc)"); do
    "$PY" -c 'while True: pass' & burners+=($!)
  done
  nice -n 10 "${CMD[@]}" > "$log" 2>&1 < /dev/null
  local rc=$?
  kill "${burners[@]}" 2>/dev/null; wait "${burners[@]}" 2>/dev/null
  record load $rc $((SECONDS - t0)) "$log"
}

status=0
for way in ${WAYS:-terminal nohup load}; do
  "way_$way" || status=1
  grep -q "^$way  *exit 0 " "$OUT" || status=1
done
exit $status
