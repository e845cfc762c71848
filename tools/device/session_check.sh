#!/usr/bin/env bash
# One device call: the forward harness (Hopper loop), the Hopper backward harness and the runtime's GPU tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
echo "== forward harness"; tools/device/forward_sm90.sh check sanitize 2>&1 | tail -8
.device/fwd/flex_harness_sm90 bench 2>&1 | sed -n '/^BENCH case/,$p' | grep -v "not built"
echo "== backward harness"; tools/device/backward_sm90.sh 2>&1 | tail -40
echo "== gpu_tests"; timeout 400 .device/bin/gpu_tests 2>&1 > "$OUT/gpu_tests.log"; echo "exit $?"; grep -E "FAILED|failed|passed|test cases" "$OUT/gpu_tests.log" | tail -12
