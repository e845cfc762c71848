B=.device/bin; export FLEXJIT_CACHE_DIR=/tmp/fjc
for cfg in "64 8,12,12,4096,4096,64" "80 8,16,16,4096,4096,80" "128 4,16,16,4096,4096,128" "32 8,12,12,4096,4096,32"; do
  set -- $cfg
  SAM=(--score "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]" --buffer "rel_h: bf16[B, H, Sq, 64]" --buffer "rel_w: bf16[B, H, Sq, 64]" --head-dim $1 --grad rel_h --grad rel_w)
  for dq in atomic qmajor; do echo "D$1 $dq $($B/flexjit bench-backward "${SAM[@]}" --shape $2 --dq $dq --json | sed -e 's/.*"fwd_ms"/"fwd_ms"/')"; done
done
