#!/usr/bin/env bash
# On the GPU machine: the Hopper forward main loop (harness flavour built with -DFLEX_HARNESS_SM90) against the
# mma.sync loop: full correctness check, compute-sanitizer on the small cases, then both benchmarks in one run.
# Binaries: .device/fwd/flex_harness_sm90 and flex_harness_sm80 (tests/gpu/kernel_harness/build.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
B=.device/fwd
OUT=${OUT:-gpu-out}
log="$OUT/forward_sm90.log"
steps=${*:-check sanitize bench}
for s in $steps; do
  case $s in
    check) echo "== check (sm90 loop)"; timeout 300 $B/flex_harness_sm90 check > "$OUT/fwd_check.log" 2>&1; echo "exit $?"; grep -E "FAIL|WRONG" "$OUT/fwd_check.log" | head -20; tail -1 "$OUT/fwd_check.log" ;;
    sanitize)
      for tool in memcheck racecheck; do
        timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 $B/flex_harness_sm90 sanitize > "$OUT/fwd_san_$tool.log" 2>&1
        echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/fwd_san_$tool.log" | tail -1)"
      done ;;
    bench)
      for f in sm80 sm90; do echo "== bench $f"; $B/flex_harness_$f bench 2>&1 | tee -a "$log" | sed -n '/^BENCH case/,$p'; done ;;
  esac
done
