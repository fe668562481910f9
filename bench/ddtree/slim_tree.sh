#!/usr/bin/env bash
# The working tree of a GPU-host call, slimmed: a call carries at most 64 MiB, of which the payload
# (.payload/site + flashinfer, .gpu/) takes 58; the recorded results and the test fixtures, which no GPU session
# reads, wait in .slim-aside/ (git-ignored) meanwhile.
#
#   bash bench/ddtree/slim_tree.sh aside    move them out of the tree that travels (prints what travels then)
#   bash bench/ddtree/slim_tree.sh back     put them back (also after an interrupted call)
set -euo pipefail
cd "$(dirname "$0")/../.."
ASIDE=.slim-aside
# What no GPU session reads: the recorded sessions, the doctor's snapshots and golden file, the trace fixtures.
PATHS=(bench/results tests/fixtures/golden tests/fixtures/snapshots/hosts tests/fixtures/traces
       tests/fixtures/diagnose_heldout)

travels() {  # (files set aside are still listed by git: stat skips them)
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | { xargs -0 stat -c %s 2>/dev/null || true; } \
    | awk '{s += $1} END {printf "%.1f MiB of the tree travels (carried payload not counted)\n", s / 1048576}'
}

move_all() {  # move_all FROM TO WHY: each of PATHS from under FROM to under TO, never onto one there (WHY says so)
  local p
  for p in "${PATHS[@]}"; do
    [ -e "$1$p" ] || continue
    [ -e "$2$p" ] && { echo "$2$p $3"; exit 1; }
    mkdir -p "$(dirname "$2$p")" && mv "$1$p" "$2$p"
  done
}

case "${1:-}" in
  aside)
    move_all "" "$ASIDE/" "exists already: run '$0 back' first"
    travels ;;
  back)
    move_all "$ASIDE/" "" "exists in the tree and in $ASIDE: left both, resolve by hand"
    [ -d "$ASIDE" ] && find "$ASIDE" -depth -type d -empty -delete
    travels ;;
  *) echo "usage: $0 aside|back"; exit 2 ;;
esac
