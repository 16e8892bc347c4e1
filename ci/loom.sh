#!/usr/bin/env bash
# Model-checks the lock protocol with loom: loom-models/protocol.rs (the real pipeline
# on SimDevice: sweep, fault paths, single-lock baseline) and loom-models/bad_designs.rs
# (every known-bad design must be flagged). Prints a table of each model's preemption
# bound, executions and seconds, and fails if any model fails or if running the models
# takes longer than 10 minutes (the build is timed apart).
#
#   bash ci/loom.sh                 # every model
#   bash ci/loom.sh sweep::pool     # libtest filters: only the models matching them
#
# The build uses its own target dir (target/loom): `--cfg twolock_loom` swaps every
# Mutex, Condvar, Arc, atomic and thread of the pipeline for loom's, and must not
# invalidate the normal build.
#
# Bounds are stated at each model; LOOM_MAX_PREEMPTIONS=N overrides them all (slow).
#
# When a model fails, it prints the device calls of the failing execution and how to
# replay it, and this script re-runs it with TWOLOCK_LOOM_CHECKPOINT set, so that loom
# writes the failing interleaving to target/loom/checkpoints/<model>.json (model names
# with `::` become `-`). Replay that one execution, with loom's scheduling log and the
# source location of every loom operation:
#
#   LOOM_CHECKPOINT_FILE=target/loom/checkpoints/<model>.json LOOM_LOG=trace \
#   LOOM_LOCATION=1 RUSTFLAGS="--cfg twolock_loom" cargo test --release \
#     --target-dir target/loom --test loom_protocol <model> -- --exact --nocapture
#
# (loom starts from the path in an existing checkpoint file, so delete the file to
# explore from the start again.) Variables:
#   TWOLOCK_LOOM_BUDGET_S   seconds the models may take (default 600)
#   TWOLOCK_LOOM_RECORD     0 to skip re-running failed models to record them
set -euo pipefail

cd "$(dirname "$0")/.."

BUDGET_S="${TWOLOCK_LOOM_BUDGET_S:-600}"
TARGET_DIR=target/loom
CHECKPOINTS="$TARGET_DIR/checkpoints"
TESTS=(--test loom_protocol --test loom_bad_designs)
export RUSTFLAGS="--cfg twolock_loom"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

build_start=$(date +%s)
cargo test --release --target-dir "$TARGET_DIR" "${TESTS[@]}" --no-run
echo "loom: build took $(($(date +%s) - build_start)) s"

mkdir -p "$TARGET_DIR"
log="$TARGET_DIR/loom-run.log"
rm -rf "$CHECKPOINTS" # loom resumes from an existing checkpoint: start clean
start=$(date +%s)
status=0
timeout --kill-after=10 "$BUDGET_S" \
    cargo test --release --no-fail-fast --target-dir "$TARGET_DIR" "${TESTS[@]}" \
    -- --nocapture "$@" \
    >"$log" 2>&1 || status=$?
elapsed=$(($(date +%s) - start))

# The table: one `loom-model <binary> <model> bound <b> executions <n> seconds <s> <verdict>`
# line per model; verdict ok, FAILED, or flagged (a bad design caught, as it must be).
# A line may follow libtest's "test <name> ... " on the same line.
echo
printf '%-17s %-58s %5s %10s %8s  %s\n' binary model bound executions seconds verdict
{ grep -o 'loom-model .*' "$log" || true; } | sort -k2,3 |
    awk '{ printf "%-17s %-58s %5s %10s %8s  %s\n", $2, $3, $5, $7, $9, $10 }'
models=$(grep -c 'loom-model ' "$log" || true)
echo
echo "loom: $models models in ${elapsed} s (budget ${BUDGET_S} s)"
grep -E '^test result:' "$log" || true

if [ "$status" -eq 124 ] || [ "$status" -eq 137 ] || [ "$elapsed" -ge "$BUDGET_S" ]; then
    echo "loom: FAILED: the models took more than ${BUDGET_S} s; lower a bound" >&2
    tail -n 20 "$log" >&2
    exit 1
fi
if [ "$status" -ne 0 ]; then
    echo "loom: FAILED (exit $status); the failing models' reports:" >&2
    # Each report runs from its `=== loom model` header to its replay command.
    sed -n '/^=== loom model .* FAILED/,/^$/p' "$log" >&2 || true
    grep -E '^(thread .* panicked|test .* FAILED|error)' "$log" >&2 || true
    if [ "${TWOLOCK_LOOM_RECORD:-1}" != 0 ]; then
        mkdir -p "$CHECKPOINTS"
        { grep -o 'loom-model .* FAILED$' "$log" || true; } | awk '{ print $2, $3 }' | sort -u |
            while read -r binary model; do
                echo "loom: recording the failing interleaving of $binary $model" >&2
                TWOLOCK_LOOM_CHECKPOINT="$CHECKPOINTS" RUST_BACKTRACE=0 \
                    cargo test --release --target-dir "$TARGET_DIR" --test "$binary" \
                    "$model" -- --exact --nocapture >/dev/null 2>&1 || true
            done
        echo "loom: failing interleavings, to replay as the header of ci/loom.sh says:" >&2
        ls -1 "$CHECKPOINTS" >&2 || true
    fi
    exit 1
fi
echo "loom: ok"
