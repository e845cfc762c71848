#!/usr/bin/env bash
# Runs the libFuzzer targets of a FLEXJIT_FUZZ build, each for SECONDS, starting from the
# checked-in seeds and regressions (tests/fuzz/corpus, tests/fuzz/regressions) plus what earlier
# runs found (BUILD/fuzz/corpus/<target>); prints one line per target and exits non-zero on
# any finding (its input is saved as BUILD/fuzz/findings/<target>-crash-*, -leak-*, -timeout-*).
#
#   tests/fuzz/run_fuzzers.sh BUILD SECONDS [TARGET...]     (default: every target built)
# FUZZ_FLAGS adds libFuzzer flags, e.g. FUZZ_FLAGS="-runs=10000000" to stop at a count instead.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: run_fuzzers.sh BUILD SECONDS [TARGET...]}
SECONDS_EACH=${2:?usage: run_fuzzers.sh BUILD SECONDS [TARGET...]}
shift 2
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  for bin in "$BUILD"/tests/fuzz/fuzz_*; do
    [ -x "$bin" ] && [ -f "$bin" ] && TARGETS+=("$(basename "$bin" | sed 's/^fuzz_//')")
  done
fi
[ ${#TARGETS[@]} -gt 0 ] || { echo "no fuzz targets in $BUILD/tests/fuzz: build them with make fuzz-build"; exit 1; }

# Leaks and every sanitizer report are findings; NVRTC's process-lifetime allocations are not.
# Allocation stacks are kept 8 frames deep (recording them is a fifth of the front end's time);
# rerun a finding with ASAN_OPTIONS=malloc_context_size=30 for the full stack.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:malloc_context_size=8:suppressions=$PWD/tests/asan.supp${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export FLEXJIT_CACHE_DIR="$PWD/$BUILD/fuzz/cache"

mkdir -p "$BUILD/fuzz/findings" "$BUILD/fuzz/logs"
status=0
summary=()
for t in "${TARGETS[@]}"; do
  bin="$BUILD/tests/fuzz/fuzz_$t"
  work="$BUILD/fuzz/corpus/$t"
  log="$BUILD/fuzz/logs/$t.log"
  mkdir -p "$work"
  dict=()
  [ -f "tests/fuzz/dict/$t.dict" ] && dict=(-dict="tests/fuzz/dict/$t.dict")
  seeds=("tests/fuzz/corpus/$t")
  [ -d "tests/fuzz/regressions/$t" ] && seeds+=("tests/fuzz/regressions/$t")
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$bin" "$work" "${seeds[@]}" "${dict[@]}" -max_total_time="$SECONDS_EACH" -timeout=60 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$BUILD/fuzz/findings/$t-" ${FUZZ_FLAGS:-} >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(ls "$work" | wc -l)
  result=ok
  if [ $rc -ne 0 ]; then
    result="FINDING (exit $rc): $(grep -m1 -E 'ERROR:|runtime error|violated|SUMMARY' "$log" | cut -c1-160)"
    status=1
  fi
  summary+=("$(printf '%-11s %6ss %12s runs %7s edges %7s corpus  %s' "$t" "$(( $(date +%s) - start ))" "${runs:-?}" "${cov:-?}" "$corpus" "$result")")
  echo "${summary[-1]}"
done
echo "--- fuzzing summary ($BUILD, logs in $BUILD/fuzz/logs) ---"
printf '%s\n' "${summary[@]}"
exit $status
