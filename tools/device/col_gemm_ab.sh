#!/usr/bin/env bash
# On the GPU machine: SAM forward timings of two binary sets, interleaved (A B A B), then the column-GEMM and forward
# tests of the second. Usage: tools/device/col_gemm_ab.sh DIR_A DIR_B
set -u
cd "$(dirname "$0")/../.."
S=examples/gallery/sam_relpos.json
ms() { python3 -c 'import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(j.get("ms", j.get("fwd_bwd_ms")))' 2>/dev/null || echo failed; }
for round in 1 2; do
  for d in "$1" "$2"; do
    n=$(basename "$d")
    export FLEXJIT_CACHE_DIR=/tmp/fc_$n
    echo "$n SAM_D64 $($d/flexjit bench $S --shape 8,12,12,4096,4096,64 --iters 100 --json | ms)" \
      "SAM_D32 $($d/flexjit bench $S --head-dim 32 --shape 8,12,12,4096,4096,32 --iters 100 --json | ms)" \
      "plain_D64 $($d/flexjit bench --name plain --head-dim 64 --shape 8,12,12,4096,4096,64 --iters 100 --json | ms)"
  done
done
FLEXJIT_CACHE_DIR=/tmp/fc_$(basename "$2") OUT=${OUT:-gpu-out} FLEXJIT_BIN=$2 tools/device/col_gemm_check.sh tests
