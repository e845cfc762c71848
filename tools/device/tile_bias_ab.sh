set -u
S=examples/gallery/sam_relpos.json
for round in 1 2; do
  for d in .device/bin_base .device/bin; do
    n=$(basename $d)
    for spec in "$S" ; do
      r=$(FLEXJIT_CACHE_DIR=/tmp/fc_$n $d/flexjit bench $S --shape 8,12,12,4096,4096,64 --iters 100 --json | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["ms"])')
      r2=$(FLEXJIT_CACHE_DIR=/tmp/fc_$n $d/flexjit bench --name relh --score 'score + rel_h[b, h, q, kv // 64]' --buffer 'rel_h: bf16[B, H, Sq, 64]' --head-dim 128 --shape 4,16,16,4096,4096,128 --iters 100 --json | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["ms"])')
      echo "$n SAM_D64 $r relh_D128 $r2"
    done
  done
done
timeout 240 .device/bin/gpu_tests "SAM's rel_w added by the S GEMM*" 2>&1 | tail -2
timeout 200 .device/bin/gpu_tests "gallery specs*,*strides work without a copy,every head dim*,fp16 inputs,GQA*,lengths*,fully masked rows*" 2>&1 | tail -2
