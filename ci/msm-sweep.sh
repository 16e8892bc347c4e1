#!/usr/bin/env bash
# The MSM's window width against its batch-affine rounds, in one device call: the
# planner picked c = 16 on XYZZ-only timings, and the rounds change what a wider window
# costs (fewer entries, more buckets).
#
#   bash ci/msm-sweep.sh [path/to/twolock]   # default: the GPU archive's extracted CLI
#
# Writes $OUT/msm-sweep-2^L-cC.json per point and a summary to stdout, then packs $OUT
# into $OUT/msm-sweep.tgz (a device call returns only a few files). Each point's MSM is
# checked against sppark where the peer is built (`equal_to_sppark` in the JSON).
# TWOLOCK_SWEEP_BITS and TWOLOCK_SWEEP_BITS_26 override the widths tried.
set -uo pipefail
cd "$(dirname "$0")/.."
TWOLOCK=${1:-target/gpu-extract/target/release/twolock}
OUT=${OUT:-sweep-out}
mkdir -p "$OUT"
[ -x "$TWOLOCK" ] || { echo "msm-sweep: no CLI at $TWOLOCK" >&2; exit 1; }
status=0
point() { # LOG C ROUNDS RUNS
  local f="$OUT/msm-sweep-2^$1-c$2.json"
  timeout "${TWOLOCK_SWEEP_TIMEOUT:-90}" "$TWOLOCK" bench msm --json --log-min "$1" --log-max "$1" \
    --runs "$4" --cpu-log-max 16 --window-bits "$2" --affine-rounds "$3" >"$f" 2>"${f%.json}.log" ||
    { echo "msm-sweep: 2^$1 c=$2 failed (see ${f%.json}.log)"; status=1; }
  # One line a row: size, c, rounds, median ms, equal to sppark.
  grep -oE '"(affine_rounds|median_ms)": [0-9.]+' "$f" | paste - - |
    sed "s/\"affine_rounds\": \([0-9]*\)\t\"median_ms\": \(.*\)/2^$1 c=$2 rounds=\1 median_ms=\2/"
  grep -o '"equal_to_sppark": *[a-z]*' "$f" | sort | uniq -c | sed "s/^/  2^$1 c=$2 /"
}
for c in ${TWOLOCK_SWEEP_BITS:-15 16 17 18 19 20}; do point 24 "$c" 0,1,2,3 3; done
for c in ${TWOLOCK_SWEEP_BITS_26:-16 18 20}; do point 26 "$c" 2 3; done
tar czf "$OUT/msm-sweep.tgz" -C "$OUT" --exclude msm-sweep.tgz . 2>/dev/null
exit "$status"
