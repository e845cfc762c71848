#!/usr/bin/env bash
# Builds the standalone decode-kernel harness into .device/decode/ (not part of CMake).
# One object per head dim; ptxas resource usage goes to ptxas_d<D>.log.
# ARCHS="sm_90a" (default) builds the Hopper target only; ARCHS="all" adds sm_80. DIMS="128" only some head dims.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="${DECODE_OUT:-$ROOT/.device/decode}"
NVCC="${NVCC:-/usr/local/cuda/bin/nvcc}"
mkdir -p "$OUT"
GENCODE=(-gencode arch=compute_90a,code=sm_90a)
if [[ "${ARCHS:-}" == "all" ]]; then GENCODE+=(-gencode arch=compute_80,code=sm_80); fi
SRC="$ROOT/tests/gpu/decode_harness"
FLAGS=(-std=c++20 -O3 "${GENCODE[@]}" ${EXTRA_FLAGS:-} -I "$ROOT/kernels_templates" -I "$SRC")
pids=()
for d in ${DIMS:-64 128 256}; do
  ( "$NVCC" "${FLAGS[@]}" -Xptxas -v -DFLEX_HEAD_DIM=$d -c "$SRC/kernels.cu" -o "$OUT/kernels_d$d.o" \
      > "$OUT/ptxas_d$d.log" 2>&1 || { cat "$OUT/ptxas_d$d.log"; exit 1; } ) &
  pids+=($!)
done
"$NVCC" "${FLAGS[@]}" -c "$SRC/main.cu" -o "$OUT/main.o"
for p in "${pids[@]}"; do wait "$p"; done
objs=(); for d in ${DIMS:-64 128 256}; do objs+=("$OUT/kernels_d$d.o"); done
"$NVCC" "${FLAGS[@]}" "${objs[@]}" "$OUT/main.o" -o "$OUT/decode_harness" -lpthread
echo "built $OUT/decode_harness"
