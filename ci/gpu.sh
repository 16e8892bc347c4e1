#!/usr/bin/env bash
# GPU CI: runs the GPU suite on a GPU machine from a nextest archive built elsewhere
# (no Rust toolchain needed here). See README "GPU CI" for building the archive.
#
#   bash ci/gpu.sh [ARCHIVE_DIR]          # default .gpu-archive
#
# Steps: (0) the archive's kernels must come from this checkout's cuda/ (else exit 1);
# (1) the whole suite under --profile gpu, in two passes (tests that may share
# the card, then those that squeeze it or measure its free memory), JUnit per pass;
# (2) compute-sanitizer memcheck and racecheck on the small GPU cases;
# (3) with TWOLOCK_GPU_BENCH=1, `twolock bench ntt` and `twolock bench msm`;
# (4) with TWOLOCK_GPU_STRESS=1, `twolock stress --device cuda`.
# TWOLOCK_GPU_BUNDLE=1 packs every output into $OUT/gpu-out.tar.gz.
# Logs, the JUnit file and JSON reports go to $OUT (default target/gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
ARCHIVE_DIR=${1:-.gpu-archive}
OUT=${OUT:-target/gpu-out}
mkdir -p "$OUT"
# TWOLOCK_GPU_BUNDLE=1: everything goes into one $OUT/gpu-out.tar.gz (for runners that
# collect only a few files), written even when the script is killed by a timeout.
if [ "${TWOLOCK_GPU_BUNDLE:-0}" = 1 ]; then
  FINAL_OUT=$OUT
  OUT=$(mktemp -d)
  bundle() { tar czf "$FINAL_OUT/gpu-out.tar.gz" -C "$OUT" . 2>/dev/null; }
  trap bundle EXIT
  trap 'bundle; exit 143' TERM INT
fi
NEXTEST="$ARCHIVE_DIR/cargo-nextest"
ARCHIVE="$ARCHIVE_DIR/twolock-gpu.tar.zst"
EXTRACT=target/gpu-extract
export INSTA_WORKSPACE_ROOT="$PWD"
export CI=true
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$OUT/gpu.txt"

# The archive's kernels must be this checkout's cuda/: cargo reruns build.rs by file
# times, so an archive built in another worktree can carry another tree's fatbins.
# `twolock --version` names the digest build.rs took of the sources (see build.rs).
mkdir -p "$EXTRACT"
"$NEXTEST" nextest list --archive-file "$ARCHIVE" --workspace-remap . \
  --extract-to "$EXTRACT" --extract-overwrite >/dev/null 2>"$OUT/extract.log"
built=$("$EXTRACT/target/release/twolock" --version 2>/dev/null | sed -n 's/.*(kernels \(.*\))$/\1/p')
here=$(find cuda -type f | LC_ALL=C sort | while IFS= read -r f; do printf '%s\0' "$f"; cat "$f"; done \
  | sha256sum | cut -c1-16)
echo "kernels: archive ${built:-unknown}, checkout $here"
if [ "$built" != "$here" ]; then
  echo "gpu.sh: the archive's kernels (${built:-unknown, see $OUT/extract.log}) were not built" \
    "from this checkout's cuda/ ($here): rebuild the archive from this checkout" \
    "(after 'touch cuda/*' if cargo kept an older build)" >&2
  exit 1
fi

# Two passes: everything that may share the card, then the tests that squeeze it or
# measure its free memory, alone.
EXCLUSIVE='test(/gpu_stress|gpu_bad_designs|returns_vram/)'
FILTER=${TWOLOCK_GPU_FILTER:-all()}
mkdir -p "$EXTRACT"
suite=0
for pass in shared exclusive; do
  if [ "$pass" = shared ]; then expr="($FILTER) - $EXCLUSIVE"; else expr="($FILTER) & $EXCLUSIVE"; fi
  echo "==> GPU suite, $pass pass (profile gpu): $expr"
  "$NEXTEST" nextest run --archive-file "$ARCHIVE" --workspace-remap . \
    --extract-to "$EXTRACT" --extract-overwrite --profile gpu --no-fail-fast \
    ${TWOLOCK_NEXTEST_ARGS:-} -E "$expr" 2>&1 | tee "$OUT/gpu-suite-$pass.log"
  rc=${PIPESTATUS[0]}
  # 4: no test matched the filter (e.g. a filtered run without exclusive tests).
  [ "$rc" -eq 0 ] || [ "$rc" -eq 4 ] || suite=1
  cp "$EXTRACT"/target/nextest/gpu/junit.xml "$OUT/junit-$pass.xml" 2>/dev/null || true
done
[ "$suite" -eq 0 ] || status=1

bins() { find "$EXTRACT/target/release/deps" -maxdepth 1 -type f -executable -name "gpu_$1-*" | head -1; }

# The small cases under compute-sanitizer (memcheck slows kernels 10-100x): libtest
# filters, any of which selects a test.
declare -A SMALL=(
  [arith]="gpu_fr_ops_edges_and_random gpu_fq_ops_edges_and_random gpu_fq2_ops_edges_and_random gpu_g1_ops_exceptional_cases gpu_fr_batch_inverse"
  [ntt]="gpu_ntt_edge_inputs gpu_witness_map_matches_ark_groth16 gpu_ntt_concurrent_streams"
  [msm]="gpu_msm_small_sizes_random gpu_msm_special_scalars gpu_msm_infinity_bases gpu_batch_add_bitmap gpu_msm_split_mixes gpu_g2_batch_add_matches_arkworks gpu_g2_beside_b_g1_matches_arkworks"
  [pipeline]="gpu_device_stages_match_reference"
)
# racecheck (shared-memory hazards) is far slower than memcheck: the NTT's edge-input
# sweep alone ran past 100 s under it on the H200, and with the stage-grouped NTT the
# witness map ran past 9 minutes on an H100, so racecheck takes the NTT's shared-memory
# passes through the concurrent-streams case only (19 s on the H100, every pass size).
declare -A RACE=(
  [ntt]="gpu_ntt_concurrent_streams"
)
# Each sanitizer run is cut off after this many seconds (a failure, with its log), so
# that one slow case cannot eat the runner's whole slot.
SANITIZER_TIMEOUT=${TWOLOCK_SANITIZER_TIMEOUT:-300}
if [ "${TWOLOCK_GPU_SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "==> compute-sanitizer (small cases)"
  for t in arith ntt msm pipeline; do
    bin=$(bins "$t")
    [ -n "$bin" ] || { echo "sanitizer: no gpu_$t binary"; status=1; continue; }
    for tool in memcheck racecheck; do
      cases=${SMALL[$t]}
      [ "$tool" = racecheck ] && [ -n "${RACE[$t]:-}" ] && cases=${RACE[$t]}
      # shellcheck disable=SC2086
      timeout "$SANITIZER_TIMEOUT" compute-sanitizer --tool "$tool" --error-exitcode 86 \
        "$bin" --test-threads 1 $cases >"$OUT/sanitizer-$t-$tool.log" 2>&1
      rc=$?
      [ "$rc" -eq 124 ] && echo "sanitizer $tool gpu_$t: cut off after ${SANITIZER_TIMEOUT} s (TWOLOCK_SANITIZER_TIMEOUT)"
      echo "sanitizer $tool gpu_$t: exit $rc, $(grep -c '^test .* ok$' "$OUT/sanitizer-$t-$tool.log") tests ok, $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$t-$tool.log" | tail -1)"
      [ "$rc" -eq 0 ] || status=1
    done
  done
fi

TWOLOCK="$EXTRACT/target/release/twolock"
if [ "${TWOLOCK_GPU_BENCH:-0}" = 1 ] && [ -x "$TWOLOCK" ]; then
  echo "==> benchmarks"
  "$TWOLOCK" bench ntt --json >"$OUT/bench-ntt.json" 2>"$OUT/bench-ntt.log" || status=1
  # arkworks on the CPU up to 2^20 only: at 2^26 it alone would take minutes.
  "$TWOLOCK" bench msm --runs 5 --cpu-log-max 20 --json >"$OUT/bench-msm.json" 2>"$OUT/bench-msm.log" || status=1
fi
if [ "${TWOLOCK_GPU_STRESS:-0}" = 1 ] && [ -x "$TWOLOCK" ]; then
  echo "==> stress --device cuda"
  "$TWOLOCK" stress --device cuda --report "$OUT/stress-cuda.json" 2>&1 | tee "$OUT/stress-cuda.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
echo "gpu.sh: suite exit $suite, overall $status"
exit "$status"
