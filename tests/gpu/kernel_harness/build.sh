#!/usr/bin/env bash
# Builds the standalone forward-kernel harness into .device/harness/ (not part of CMake).
# One object per head dim, compiled in parallel; ptxas resource usage goes to ptxas_<D>.log
# (summarised by ptxas_summary.py).
# ARCHS="sm_90a" builds only the Hopper target (quicker iteration); default is sm_90a + sm_80.
# HARNESS_OUT=<dir> and EXTRA_FLAGS="-D..." build an experimental flavour elsewhere; DIMS="64 128" only some head dims.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="${HARNESS_OUT:-$ROOT/.device/harness}"
NVCC="${NVCC:-/usr/local/cuda/bin/nvcc}"
mkdir -p "$OUT"
GENCODE=(-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80)
if [[ "${ARCHS:-}" == "sm_90a" ]]; then GENCODE=(-gencode arch=compute_90a,code=sm_90a); fi
FLAGS=(-std=c++17 -O3 "${GENCODE[@]}" ${EXTRA_FLAGS:-} -I "$ROOT/kernels_templates" -I "$ROOT/tests/gpu/kernel_harness")
SRC="$ROOT/tests/gpu/kernel_harness"
pids=()
for d in ${DIMS:-32 64 80 96 128 192 256}; do
  ( "$NVCC" "${FLAGS[@]}" -Xptxas -v -DFLEX_HEAD_DIM=$d -c "$SRC/kernels.cu" -o "$OUT/kernels_d$d.o" \
      > "$OUT/ptxas_d$d.log" 2>&1 || { cat "$OUT/ptxas_d$d.log"; exit 1; } ) &
  pids+=($!)
done
"$NVCC" "${FLAGS[@]}" -c "$SRC/main.cu" -o "$OUT/main.o"
for p in "${pids[@]}"; do wait "$p"; done
objs=(); for d in ${DIMS:-32 64 80 96 128 192 256}; do objs+=("$OUT/kernels_d$d.o"); done
"$NVCC" "${FLAGS[@]}" "${objs[@]}" "$OUT/main.o" -o "$OUT/flex_harness" -lpthread
# NVRTC compile check of the templates as the runtime compiles them (runs here, no GPU needed):
#   LD_LIBRARY_PATH=/usr/local/cuda/lib64 $OUT/nvrtc_check kernels_templates
g++ -std=c++17 -O1 "$SRC/nvrtc_check.cpp" -I /usr/local/cuda/include -L /usr/local/cuda/lib64 -lnvrtc -o "$OUT/nvrtc_check"
echo "built $OUT/flex_harness $OUT/nvrtc_check"
