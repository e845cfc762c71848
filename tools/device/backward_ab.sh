#!/usr/bin/env bash
# On the GPU machine: backward timings of several binary sets side by side, interleaved (A B .. A B ..), for an
# A/B of a backward template change. Usage: tools/device/backward_ab.sh DIR... (ROUNDS=2 by default)
set -u
cd "$(dirname "$0")/../.."
S=examples/gallery/sam_relpos.json
run() {  # dir tag args...
  local dir=$1 tag=$2; shift 2
  FLEXJIT_CACHE_DIR=/tmp/fc_$(basename "$dir") "$dir/flexjit" bench-backward "$@" --json 2>&1 | tail -1 |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print("'"$tag"'", j["fwd_ms"], j["bwd_ms"], j["fwd_bwd_ms"])' 2>/dev/null || echo "$tag failed"
}
for round in $(seq "${ROUNDS:-2}"); do
  for d in "$@"; do
    n=$(basename "$d")
    run "$d" "$n sam_grads" $S --grad rel_h --grad rel_w --shape 8,12,12,4096,4096,64
    run "$d" "$n sam_nograd" $S --shape 8,12,12,4096,4096,64
    run "$d" "$n plain_d64" --name plain --head-dim 64 --shape 8,12,12,4096,4096,64
    run "$d" "$n causal_d128" --name causal --mask 'q >= kv' --head-dim 128 --shape 4,16,16,4096,4096,128
  done
done
