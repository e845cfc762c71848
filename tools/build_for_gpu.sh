#!/usr/bin/env bash
# Builds the GPU-side binaries on this (CPU) machine without the LLVM backend, so they need
# only libnvrtc and the C++ runtime on the GPU machine, and stages them in .device/bin for
# the device tool to carry: then `tools/gpu_check.sh` runs there.
#   FLEXJIT_GPU_BUILD (default build-gpu) and FLEXJIT_STAGE (default .device/bin) let two
#   people build side by side; run gpu_check.sh with FLEXJIT_BIN=<stage> then.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FLEXJIT_GPU_BUILD:-build-gpu}
stage=${FLEXJIT_STAGE:-.device/bin}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXJIT_CPU_BACKEND=OFF >/dev/null
cmake --build "$build" --target flexjit gpu_tests -j "$(nproc)"
mkdir -p "$stage"
cp "$build/tools/flexjit" "$build/tests/gpu_tests" "$stage/"
# No .git travels to the GPU machine: the benchmarks' tables read the commit from here (gpu_check.sh).
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench/RESULTS.md' || echo '+local changes')" > "$stage/COMMIT"
strip "$stage/flexjit" "$stage/gpu_tests"
ls -la "$stage"
