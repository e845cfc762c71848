#!/usr/bin/env bash
# The reliability run of issue 27 on the GPU machine: random specs launched on the GPU against
# the float64 reference (flexjit_differential --gpu), then the runtime soak (flexjit_soak: eight
# threads launching with recompiles and cache clears, two devices where there are two, and a
# million decode steps in a CUDA graph with memory measured). Full logs go to $OUT/soak.log and
# $OUT/soak/; a summary table is printed last. Exits non-zero if anything failed.
#
# Here (the CPU machine), build and stage the binaries (CPU backend off: no LLVM needed there):
#   tools/device/soak.sh --build            -> .device/soak/{flexjit_differential,flexjit_soak} (about 20 MiB)
# There, from the repo root, with .device/soak carried:
#   tools/device/soak.sh                    (DIFF_CASES=1000 DIFF_JOBS=12 SOAK_SECONDS=180 DECODE_STEPS=1000000)
set -uo pipefail
cd "$(dirname "$0")/../.."
STAGE=${FLEXJIT_BIN:-.device/soak}

if [ "${1:-}" = "--build" ]; then
  set -e
  build=${FLEXJIT_SOAK_BUILD:-build-gpu-soak}
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXJIT_CPU_BACKEND=OFF >/dev/null
  cmake --build "$build" --target flexjit_differential flexjit_soak -j "${JOBS:-2}"
  mkdir -p "$STAGE"
  cp "$build/tests/fuzz/flexjit_differential" "$build/tests/soak/flexjit_soak" "$STAGE/"
  strip "$STAGE/flexjit_differential" "$STAGE/flexjit_soak"
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo '+local changes')" > "$STAGE/COMMIT"
  ls -la "$STAGE"
  exit 0
fi

OUT=${OUT:-/tmp/flexjit-soak-out}
LOGDIR="$OUT/soak"
mkdir -p "$LOGDIR"
LOG="$OUT/soak.log"
: > "$LOG"
export FLEXJIT_SOURCE_DIR=$PWD
export FLEXJIT_CACHE_DIR=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-soak-cache}
[ -x "$STAGE/flexjit_differential" ] && [ -x "$STAGE/flexjit_soak" ] || {
  echo "missing $STAGE/flexjit_differential or flexjit_soak: run tools/device/soak.sh --build on the build machine and carry $STAGE"
  exit 2
}
echo "binaries from commit $(cat "$STAGE/COMMIT" 2>/dev/null || echo '?'); $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | paste -sd, -)" | tee -a "$LOG"

# 1. Differential: DIFF_CASES random bf16 / f16 specs over DIFF_JOBS processes (each case
# compiles its own kernels with NVRTC, which is what takes the time), forward and backward on
# GPU 0, against the float64 reference. Failing cases are shrunk and saved as JSON.
CASES=${DIFF_CASES:-1000}
JOBS=${DIFF_JOBS:-12}
SEED=${DIFF_SEED:-27000000}
per=$(( (CASES + JOBS - 1) / JOBS ))
start=$(date +%s)
for j in $(seq 0 $((JOBS - 1))); do
  "$STAGE/flexjit_differential" --gpu --gpu-specs --no-cpu --count "$per" --seed $((SEED + j * per)) --quiet --shrink-budget 60 \
    --save "$LOGDIR/differential-cases" > "$LOGDIR/differential-$j.log" 2>&1 &
done
wait
diff_secs=$(( $(date +%s) - start ))
cat "$LOGDIR"/differential-*.log >> "$LOG"
totals=$(grep -h '^--- differential:' "$LOGDIR"/differential-*.log | awk '
  { for (i = 1; i <= NF; i++) {
      if ($(i+1) == "cases") c += $i; if ($(i+1) == "forward") f += $i; if ($(i+1) == "backward") b += $i
      if ($(i+1) == "GPU") g += $i; if ($(i+1) == "disagreements") d += $i } }
  END { printf "%d %d %d %d %d", c, f, b, g, d }')
read -r d_cases d_fwd d_bwd d_gpu d_fail <<< "$totals"
d_done=$(grep -c '^--- differential:' "$LOGDIR"/differential-*.log | awk -F: '{s += $2} END {print s}')

# 2. The soak.
SOAK_LOG="$LOGDIR/flexjit_soak.log"
"$STAGE/flexjit_soak" --seconds "${SOAK_SECONDS:-180}" --decode-steps "${DECODE_STEPS:-1000000}" > "$SOAK_LOG" 2>&1
soak_rc=$?
cat "$SOAK_LOG" >> "$LOG"

echo
echo "=== issue 27 reliability run (full logs: $LOG) ==="
printf '%-14s %s\n' "differential" "${d_cases:-0} GPU specs in ${diff_secs} s (${d_done}/${JOBS} processes finished): ${d_fwd:-0} forward, ${d_bwd:-0} backward comparisons, ${d_gpu:-0} GPU launches; disagreements: ${d_fail:-?}"
if [ "${d_fail:-1}" != "0" ] || [ "$d_done" != "$JOBS" ]; then
  grep -h -A2 '^FAIL' "$LOGDIR"/differential-*.log | cut -c1-400 | head -30
  ls "$LOGDIR/differential-cases" 2>/dev/null | head -20 | sed 's/^/  saved: /'
fi
[ "${d_gpu:-0}" -gt 0 ] || echo "  no GPU launch happened: is there a CUDA device? (see $LOGDIR/differential-0.log)"
printf '%-14s exit %s\n' "soak" "$soak_rc"
grep -E '^(launch phase|decode phase|  memory|errors|  error|soak:)' "$SOAK_LOG" | cut -c1-600
grep -q '^soak:' "$SOAK_LOG" || tail -5 "$SOAK_LOG" | cut -c1-600
[ "${d_fail:-1}" = "0" ] && [ "$d_done" = "$JOBS" ] && [ "${d_gpu:-0}" -gt 0 ] && [ "$soak_rc" = "0" ]
