#!/usr/bin/env bash
# On the GPU machine: the Hopper forward's column GEMM (SAM's rel_w by the S GEMM) against the per-element path
# in one binary. A launch with scale > 0.5 takes the per-element path, so `--scale 0.7` is the A/B baseline; 0.3 needs
# three bf16 parts of 1 / scale. Head dims above 64 never take the column GEMM (compiler/codegen/kernel_source.cpp).
# Usage (repo root, binaries from tools/build_for_gpu.sh in .device/bin): tools/device/col_gemm_check.sh [tests] [bench]
set -u
cd "$(dirname "$0")/../.."
B=${FLEXJIT_BIN:-.device/bin}
OUT=${OUT:-gpu-out}
export FLEXJIT_CACHE_DIR=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-col-gemm}
S=examples/gallery/sam_relpos.json
steps=${*:-tests bench}
for s in $steps; do
  case $s in
    tests)
      timeout 300 $B/gpu_tests "SAM's rel_w added by the S GEMM*" > "$OUT/col_gemm_tests.log" 2>&1
      echo "column GEMM tests: exit $? $(tail -2 "$OUT/col_gemm_tests.log" | head -1)"
      timeout 300 $B/gpu_tests "gallery specs*,*strides work without a copy,every head dim*,fp16 inputs,GQA*,lengths*" > "$OUT/fwd_tests.log" 2>&1
      echo "forward tests: exit $? $(tail -2 "$OUT/fwd_tests.log" | head -1)" ;;
    bench)
      # name shape scales... (one line per run: ms, TFLOP/s)
      while read -r name shape d scales; do
        for sc in $scales; do
          r=$($B/flexjit bench $S --head-dim "$d" --shape "$shape" --scale "$sc" --iters 100 --json 2>&1 | tail -1)
          echo "$name scale $sc: $(echo "$r" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["ms"], "ms", j["tflops"], "TFLOP/s")' 2>/dev/null || echo "$r")"
        done
      done <<'CASES'
SAM_D64 8,12,12,4096,4096,64 64 0 0.7 0.3 0 0.7
SAM_D32 8,12,12,4096,4096,32 32 0 0.7
CASES
      ;;
  esac
done
