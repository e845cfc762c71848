#!/usr/bin/env bash
# Builds the standalone backward harness (sm_90a) into .device/backward_sm90/ (not part of CMake).
# One object per head dim (JOBS at a time, default 2); ptxas resource usage goes to ptxas_d<D>.log and is
# summarised into ptxas_summary.txt by ptxas_summary.py. DIMS="64 128" builds only some head dims
# (the others then report "not built"). The generated modules themselves are compiled through NVRTC by the
# CMake test tests/unit/codegen/backward_nvrtc_test.cpp (every gallery and learnable spec, sm_80 and sm_90a).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="${HARNESS_OUT:-$ROOT/.device/backward_sm90}"
NVCC="${NVCC:-/usr/local/cuda/bin/nvcc}"
SRC="$ROOT/tests/gpu/backward_harness"
DIMS="${DIMS:-32 64 80 96 128}"
mkdir -p "$OUT"
FLAGS=(-std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a ${EXTRA_FLAGS:-} -I "$ROOT/kernels_templates" -I "$SRC")

compile_dim() {
  local d=$1
  if "$NVCC" "${FLAGS[@]}" -Xptxas -v -DFLEX_HEAD_DIM="$d" -c "$SRC/kernels.cu" -o "$OUT/kernels_d$d.o" > "$OUT/ptxas_d$d.log" 2>&1; then
    echo "  D$d done"
  else
    cat "$OUT/ptxas_d$d.log"
    return 1
  fi
}
pids=()
running=0
status=0
for d in $DIMS; do
  compile_dim "$d" &
  pids+=($!)
  running=$((running + 1))
  if [[ $running -ge ${JOBS:-2} ]]; then
    wait -n || status=1
    running=$((running - 1))
  fi
done
"$NVCC" "${FLAGS[@]}" -c "$SRC/main.cu" -o "$OUT/main.o" || status=1
while [[ $running -gt 0 ]]; do
  wait -n || status=1
  running=$((running - 1))
done
[[ $status -eq 0 ]] || { echo "build failed"; exit 1; }
objs=()
for d in $DIMS; do objs+=("$OUT/kernels_d$d.o"); done
"$NVCC" "${FLAGS[@]}" "${objs[@]}" "$OUT/main.o" -o "$OUT/backward_harness" -lpthread
python3 "$SRC/ptxas_summary.py" "$OUT" > "$OUT/ptxas_summary.txt"
echo "built $OUT/backward_harness (ptxas: $OUT/ptxas_summary.txt)"
