#!/usr/bin/env bash
# The `make run` demo: check a spec, show what it compiles to, evaluate it at a point, and
# run attention with it on the GPU when there is one, else on the CPU backend.
set -euo pipefail
BUILD=${1:-build}
FJ="$BUILD/tools/flexjit"
DATA=$(mktemp -d)
trap 'rm -rf "$DATA"' EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "A spec with an error: every diagnostic, with a caret"
"$FJ" check --score 'score + rel_h[b, h, q, kvv // 64]' --buffer 'rel_h: bf16[B, H, Sq, 64]' || true

say "SAM's decomposed relative-position bias: the IR with dependence and range facts"
"$FJ" dump examples/gallery/sam_relpos.json --emit=ir

say "The score_mod at one point (reference interpreter)"
"$FJ" eval examples/gallery/softcap.json --at b=0,h=0,q=5,kv=3,score=42.5

if "$FJ" devices; then
  DEVICE=cuda:0 DTYPE=bf16
else
  DEVICE=cpu DTYPE=f32
fi
say "Document-masked attention on $DEVICE ($DTYPE)"
"$FJ" random --shape 1,4,512,64 --dtype $DTYPE --seed 1 --out "$DATA/q.npy"
"$FJ" random --shape 1,4,512,64 --dtype $DTYPE --seed 2 --out "$DATA/k.npy"
"$FJ" random --shape 1,4,512,64 --dtype $DTYPE --seed 3 --out "$DATA/v.npy"
"$FJ" random --shape 512 --dtype i32 --ints 0,6 --sorted --seed 4 --out "$DATA/doc.npy"
time "$FJ" run examples/gallery/document.json --q "$DATA/q.npy" --k "$DATA/k.npy" --v "$DATA/v.npy" \
  --load doc="$DATA/doc.npy" --out "$DATA/o.npy" --lse "$DATA/lse.npy" --device $DEVICE
echo "wrote O $(stat -c %s "$DATA/o.npy") bytes and LSE $(stat -c %s "$DATA/lse.npy") bytes"
