#!/usr/bin/env bash
# Builds the GPU-side binaries on this (CPU) machine without the LLVM backend, so they need
# only libnvrtc and the C++ runtime on the GPU machine, and stages them in .device/bin for
# the device tool to carry: then `tools/gpu_check.sh` runs there.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXJIT_CPU_BACKEND=OFF >/dev/null
cmake --build build-gpu --target flexjit gpu_tests -j "$(nproc)"
mkdir -p .device/bin
cp build-gpu/tools/flexjit build-gpu/tests/gpu_tests .device/bin/
strip .device/bin/flexjit .device/bin/gpu_tests
ls -la .device/bin
