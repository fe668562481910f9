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

case "${1:-}" in
  aside)
    for p in "${PATHS[@]}"; do
      [ -e "$p" ] || continue
      [ -e "$ASIDE/$p" ] && { echo "$ASIDE/$p exists already: run '$0 back' first"; exit 1; }
      mkdir -p "$ASIDE/$(dirname "$p")" && mv "$p" "$ASIDE/$p"
    done
    travels ;;
  back)
    for p in "${PATHS[@]}"; do
      [ -e "$ASIDE/$p" ] || continue
      [ -e "$p" ] && { echo "$p exists in the tree and in $ASIDE: left both, resolve by hand"; exit 1; }
      mkdir -p "$(dirname "$p")" && mv "$ASIDE/$p" "$p"
    done
    [ -d "$ASIDE" ] && find "$ASIDE" -depth -type d -empty -delete
    travels ;;
  *) echo "usage: $0 aside|back"; exit 2 ;;
esac
