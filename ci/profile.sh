#!/usr/bin/env bash
# Kernel profiles for the NTT and MSM figures, in one device call: Nsight Compute on
# the 2^24 NTT passes and the 2^24 MSM's stages, as `twolock bench` runs them.
#
#   bash ci/profile.sh [path/to/twolock]     # default: the GPU archive's extracted CLI
#
# Writes $OUT/ncu-{ntt,msm}.{ncu-rep,csv,log} (or ./profile-out without $OUT). The
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
# profile NAME KERNEL_REGEX COUNT ARGS...: ncu writes its report to a file (the CLI's own
# output stays out of it), then exports every profiled launch as CSV. Profiling starts
# at the first matching launch: ncu replays each kernel alone with caches flushed, so
# the warm-up runs are as representative as the timed ones.
profile() {
  local name=$1 kernels=$2 count=$3; shift 3
  timeout "${TWOLOCK_PROFILE_TIMEOUT:-240}" ncu --clock-control none "${SECTIONS[@]}" \
    --kernel-name "regex:$kernels" --launch-count "$count" -f -o "$OUT/ncu-$name" \
    "$TWOLOCK" "$@" >"$OUT/ncu-$name.log" 2>&1 || status=1
  ncu -i "$OUT/ncu-$name.ncu-rep" --csv --page details >"$OUT/ncu-$name.csv" 2>>"$OUT/ncu-$name.log" || status=1
}
# A 2^24 transform is 3 DIF passes and the bit reversal: one transform.
profile ntt 'ntt_' 4 bench ntt --log-min 24 --log-max 24 --runs 1
# One 2^24 MSM is about 16 launches (scalars, the counting sort, accumulation and head
# folding, reduction, chunk sums): one MSM.
profile msm 'msm_' 16 bench msm --log-min 24 --log-max 24 --runs 1 --cpu-log-max 16
echo "profile: exit $status; $(wc -l <"$OUT/ncu-ntt.csv") NTT rows, $(wc -l <"$OUT/ncu-msm.csv") MSM rows"
exit $status
