# Staged SAM backward: GPU backward tests, then SAM / plain D64 timings (B8 H12 S4096), one call.
B=${FLEXJIT_BIN:-.device/bin}
export FLEXJIT_CACHE_DIR=/tmp/fjc
$B/gpu_tests "${TESTS:-[backward]}" 2>&1 | tail -4
SAM=(--score "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]" --buffer "rel_h: bf16[B, H, Sq, 64]" --buffer "rel_w: bf16[B, H, Sq, 64]" --head-dim 64)
S=8,12,12,4096,4096,64
for g in "--grad rel_h --grad rel_w" "--grad rel_h --grad rel_w --deterministic" ""; do
  echo "SAM $g"; $B/flexjit bench-backward "${SAM[@]}" $g --shape $S --json | sed -e 's/.*"deterministic"/"deterministic"/'
done
echo plain; $B/flexjit bench-backward --score score --head-dim 64 --shape $S --dq atomic --json | sed -e 's/.*"dq"/"dq"/'
