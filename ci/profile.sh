#!/usr/bin/env bash
# Kernel profiles for the NTT and MSM figures, in one device call: Nsight Compute on
# the 2^24 NTT passes and the 2^24 MSM's stages, as `twolock bench` runs them.
#
#   bash ci/profile.sh [path/to/twolock]     # default: the GPU archive's extracted CLI
#
# Writes $OUT/ncu-ntt.csv and $OUT/ncu-msm.csv (or ./profile-out without $OUT). The
# card's clocks are left as they are (--clock-control none), as the device notes ask.
# Written 2026-12-05 after the device time ran out: not yet run on a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
TWOLOCK=${1:-target/gpu-extract/target/release/twolock}
OUT=${OUT:-profile-out}
mkdir -p "$OUT"
command -v ncu >/dev/null || { echo "profile: ncu not found" >&2; exit 1; }
[ -x "$TWOLOCK" ] || { echo "profile: no CLI at $TWOLOCK" >&2; exit 1; }
SECTIONS=(--section SpeedOfLight --section Occupancy --section LaunchStats
  --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis)
status=0
# The NTT: a forward 2^24 transform is 3 DIF passes and the bit reversal; skip the
# warm-up's launches, profile one transform's.
timeout "${TWOLOCK_PROFILE_TIMEOUT:-240}" ncu --clock-control none "${SECTIONS[@]}" \
  --kernel-name regex:'ntt_' --launch-skip 8 --launch-count 4 --csv --page details \
  "$TWOLOCK" bench ntt --log-min 24 --log-max 24 --runs 1 >"$OUT/ncu-ntt.csv" 2>"$OUT/ncu-ntt.log" || status=1
# The MSM: every stage kernel of one 2^24 run after the first (the warm-up).
timeout "${TWOLOCK_PROFILE_TIMEOUT:-240}" ncu --clock-control none "${SECTIONS[@]}" \
  --kernel-name regex:'msm_' --launch-skip 40 --launch-count 40 --csv --page details \
  "$TWOLOCK" bench msm --log-min 24 --log-max 24 --runs 1 --cpu-log-max 16 >"$OUT/ncu-msm.csv" 2>"$OUT/ncu-msm.log" || status=1
echo "profile: exit $status; $(wc -l <"$OUT/ncu-ntt.csv") NTT rows, $(wc -l <"$OUT/ncu-msm.csv") MSM rows"
exit $status
