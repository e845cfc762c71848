#!/usr/bin/env bash
# A/B timing of flexjit builds on the GPU machine: each case runs every build in turn, the order reversed every
# round, with 300 warm-up launches so the clock settles (20 left a 5% spread between builds of one kernel that ran
# in a different order; 300 brought four rounds under 0.3%). Prints the median, min and max per case and build.
#
# Here: stage each build (templates are embedded, so a changed template is a changed build), e.g.
#   FLEXJIT_STAGE=.device/base bash tools/build_for_gpu.sh     # before the change
#   FLEXJIT_STAGE=.device/new  bash tools/build_for_gpu.sh     # after it
# There (device tool, carry [".device"]):
#   bash tools/device/ab.sh "base new" 3 "full causal"            # forward cases
#   MODE=backward bash tools/device/ab.sh "base new" 3 "causal sam"   # backward cases (flexjit bench-backward)
# Cases: full, full8k, causal, softcap, softcaprt, sam64, sam80, full64, softcap64, softcap96, alibi / alibirt (ALiBi +
# causal at D128: slopes from a buffer / one runtime slope), alibi64, alibi96, relh64, relw64, scale64, relbias64, samrt64
# (SAM with a runtime width W), causal64, sw64 / swrt64 / swrt (a sliding window of 1024, constant or a runtime int),
# sinks64 / sinksrt64 / sinks / sinks64odd (4 attention sinks + that window; odd: S 4000), causal96, full80, full96,
# full192, full256 (forward); causal, full, full64, causal96, causal64, causal80, causal192, causal256, causaldet / causal192det / causal256det (deterministic; causal192detq / causal256detq: with dQ by the query-major pass), relbias192 / relbias256 (the learnable bias at D192 / D256), alibi (slopes from a
# buffer, no gradient), relbias / relbiasdet / relbias64 (the learnable bias[h, q - kv + Skv - 1] + causal, with its
# gradient; deterministic; D64; relbiasng: without the gradient), kvbsoftcap (a softcap of score + a learnable per-KV
# bias, full attention), slope / slopedet (learnable ALiBi slopes + causal), sam / samdet / samng / samngdet (SAM ViT-B with
# rel_h / rel_w gradients; deterministic; without them; without them, deterministic), sam32 / sam80 / sam96 / sam128 (the same at other head dims:
# B8 H12, B8 H16, B4 H16, B4 H16), samrt (SAM with a runtime width W; backward).
set -uo pipefail
builds=$1
rounds=$2
cases=$3
mode=${MODE:-forward}
out=${OUT:-.}
export FLEXJIT_CACHE_DIR=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-ab}
results=$out/ab_$mode.txt
: > "$results"

forward_args() {
  case $1 in
    full) echo "--name full --shape 4,16,16,4096,4096,128" ;;
    full8k) echo "--name full --shape 2,16,16,8192,8192,128" ;;
    causal) echo "--name causal --mask q>=kv --shape 4,16,16,4096,4096,128" ;;
    softcap) echo "--name softcap --score cap*tanh(score/cap) --const cap:float=30 --shape 4,16,16,4096,4096,128" ;;
    softcaprt) echo "--name softcap_rt --score cap*tanh(score/cap) --param cap:float --set cap=30 --shape 4,16,16,4096,4096,128" ;;
    sam64) echo "--name sam_d64 --score score+rel_h[b,h,q,kv//64]+rel_w[b,h,q,kv%64] --buffer rel_h:bf16[B,H,Sq,64] --buffer rel_w:bf16[B,H,Sq,64] --shape 8,12,12,4096,4096,64" ;;
    full64) echo "--name full_d64 --shape 8,12,12,4096,4096,64" ;;
    softcap64) echo "--name softcap_d64 --score cap*tanh(score/cap) --const cap:float=30 --shape 8,12,12,4096,4096,64" ;;
    softcap96) echo "--name softcap_d96 --score cap*tanh(score/cap) --const cap:float=30 --shape 4,16,16,4096,4096,96" ;;
    alibi) echo "--name alibi --score score+slope[h]*(kv-q) --buffer slope:f32[H] --mask q>=kv --shape 4,16,16,4096,4096,128" ;;
    alibirt) echo "--name alibi_rt --score score+slope*(kv-q) --param slope:float --set slope=0.0625 --mask q>=kv --shape 4,16,16,4096,4096,128" ;;
    alibi64) echo "--name alibi_d64 --score score+slope*(kv-q) --param slope:float --set slope=0.0625 --mask q>=kv --shape 8,12,12,4096,4096,64" ;;
    alibi96) echo "--name alibi_d96 --score score+slope*(kv-q) --param slope:float --set slope=0.0625 --mask q>=kv --shape 4,16,16,4096,4096,96" ;;
    relh64) echo "--name relh_d64 --score score+rel_h[b,h,q,kv//64] --buffer rel_h:bf16[B,H,Sq,64] --shape 8,12,12,4096,4096,64" ;;
    relw64) echo "--name relw_d64 --score score+rel_w[b,h,q,kv%64] --buffer rel_w:bf16[B,H,Sq,64] --shape 8,12,12,4096,4096,64" ;;
    scale64) echo "--name scale_d64 --score score*c --param c:float --set c=0.5 --shape 8,12,12,4096,4096,64" ;;
    relbiasng) echo "--name relbias_nograd --score score+bias[h,q-kv+Skv-1] --buffer bias:f32[H,8191] --mask q>=kv --shape 4,16,16,4096,4096,128" ;;
    kvbsoftcap) echo "--name kvb_softcap --score 30.0*tanh((score+kvb[kv])/30.0) --buffer kvb:f32[Skv] --grad kvb --shape 4,16,16,4096,4096,128" ;;
    relbias64) echo "--name relbias_d64 --score score+bias[h,q-kv+Skv-1] --buffer bias:f32[H,8191] --shape 8,12,12,4096,4096,64" ;;
    samrt64) echo "--name samrt_d64 --score score+rel_h[b,h,q,kv//W]+rel_w[b,h,q,kv%W] --buffer rel_h:bf16[B,H,Sq,64] --buffer rel_w:bf16[B,H,Sq,64] --param W:int --set W=64 --shape 8,12,12,4096,4096,64" ;;
    causal64) echo "--name causal_d64 --mask q>=kv --shape 8,12,12,4096,4096,64" ;;
    sw64) echo "--name sw_d64 --mask q>=kv&&q-kv<1024 --shape 8,12,12,4096,4096,64" ;;
    swrt64) echo "--name swrt_d64 --mask q>=kv&&q-kv<window --param window:int --set window=1024 --shape 8,12,12,4096,4096,64" ;;
    swrt) echo "--name swrt --mask q>=kv&&q-kv<window --param window:int --set window=1024 --shape 4,16,16,4096,4096,128" ;;
    sinks64) echo "--name sinks_d64 --mask kv<4||(q>=kv&&q-kv<1024) --shape 8,12,12,4096,4096,64" ;;
    sinksrt64) echo "--name sinksrt_d64 --mask kv<4||(q>=kv&&q-kv<window) --param window:int --set window=1024 --shape 8,12,12,4096,4096,64" ;;
    sinks) echo "--name sinks --mask kv<4||(q>=kv&&q-kv<1024) --shape 4,16,16,4096,4096,128" ;;
    sinks64odd) echo "--name sinks_d64_odd --mask kv<4||(q>=kv&&q-kv<1024) --shape 8,12,12,4000,4000,64" ;;
    sam80) echo "--name sam_d80 --score score+rel_h[b,h,q,kv//64]+rel_w[b,h,q,kv%64] --buffer rel_h:bf16[B,H,Sq,64] --buffer rel_w:bf16[B,H,Sq,64] --shape 8,16,16,4096,4096,80" ;;
    causal96) echo "--name causal_d96 --mask q>=kv --shape 4,16,16,4096,4096,96" ;;
    full80) echo "--name full_d80 --shape 4,16,16,4096,4096,80" ;;
    full96) echo "--name full_d96 --shape 4,16,16,4096,4096,96" ;;
    full192) echo "--name full_d192 --shape 4,16,16,4096,4096,192" ;;
    full256) echo "--name full_d256 --shape 4,16,16,4096,4096,256" ;;
    *) echo "unknown forward case $1" >&2; return 1 ;;
  esac
}
backward_args() {
  case $1 in
    causal) echo "--name causal --mask q>=kv --shape 4,16,16,4096,4096,128" ;;
    full) echo "--name full --shape 4,16,16,4096,4096,128" ;;
    causal96) echo "--name causal --mask q>=kv --shape 4,16,16,4096,4096,96" ;;
    causal64) echo "--name causal --mask q>=kv --shape 8,12,12,4096,4096,64" ;;
    causal80) echo "--name causal --mask q>=kv --shape 4,16,16,4096,4096,80" ;;
    causal192) echo "--name causal --mask q>=kv --shape 4,16,16,4096,4096,192" ;;
    causal256) echo "--name causal --mask q>=kv --shape 4,16,16,4096,4096,256" ;;
    causal192det) echo "--name causal --mask q>=kv --deterministic --shape 4,16,16,4096,4096,192" ;;
    causal256det) echo "--name causal --mask q>=kv --deterministic --shape 4,16,16,4096,4096,256" ;;
    causal256detq) echo "--name causal --mask q>=kv --deterministic --dq qmajor --shape 4,16,16,4096,4096,256" ;;
    causal192detq) echo "--name causal --mask q>=kv --deterministic --dq qmajor --shape 4,16,16,4096,4096,192" ;;
    full64) echo "--name full --shape 8,12,12,4096,4096,64" ;;
    causaldet) echo "--name causal --mask q>=kv --deterministic --shape 4,16,16,4096,4096,128" ;;
    alibi) echo "--name alibi --score score+slope[h]*(kv-q) --buffer slope:f32[H] --mask q>=kv --shape 4,16,16,4096,4096,128" ;;
    relbias) echo "--name relbias --score score+bias[h,q-kv+Skv-1] --buffer bias:f32[H,8191] --grad bias --mask q>=kv --shape 4,16,16,4096,4096,128" ;;
    relbiasdet) echo "--name relbias --score score+bias[h,q-kv+Skv-1] --buffer bias:f32[H,8191] --grad bias --mask q>=kv --deterministic --shape 4,16,16,4096,4096,128" ;;
    slope) echo "--name slope --score score+slope[h]*(kv-q) --buffer slope:f32[H] --grad slope --mask q>=kv --shape 4,16,16,4096,4096,128" ;;
    slopedet) echo "--name slope --score score+slope[h]*(kv-q) --buffer slope:f32[H] --grad slope --mask q>=kv --deterministic --shape 4,16,16,4096,4096,128" ;;
    relbiasng) echo "--name relbias_nograd --score score+bias[h,q-kv+Skv-1] --buffer bias:f32[H,8191] --mask q>=kv --shape 4,16,16,4096,4096,128" ;;
    kvbsoftcap) echo "--name kvb_softcap --score 30.0*tanh((score+kvb[kv])/30.0) --buffer kvb:f32[Skv] --grad kvb --shape 4,16,16,4096,4096,128" ;;
    relbias64) echo "--name relbias --score score+bias[h,q-kv+Skv-1] --buffer bias:f32[H,8191] --grad bias --mask q>=kv --shape 8,12,12,4096,4096,64" ;;
    relbias192) echo "--name relbias --score score+bias[h,q-kv+Skv-1] --buffer bias:f32[H,8191] --grad bias --mask q>=kv --shape 4,16,16,4096,4096,192" ;;
    relbias256) echo "--name relbias --score score+bias[h,q-kv+Skv-1] --buffer bias:f32[H,8191] --grad bias --mask q>=kv --shape 4,16,16,4096,4096,256" ;;
    sam) echo "--name sam_vitb --score score+rel_h[b,h,q,kv//64]+rel_w[b,h,q,kv%64] --buffer rel_h:bf16[B,H,Sq,64] --buffer rel_w:bf16[B,H,Sq,64] --grad rel_h --grad rel_w --shape 8,12,12,4096,4096,64" ;;
    samdet) echo "--name sam_vitb --score score+rel_h[b,h,q,kv//64]+rel_w[b,h,q,kv%64] --buffer rel_h:bf16[B,H,Sq,64] --buffer rel_w:bf16[B,H,Sq,64] --grad rel_h --grad rel_w --deterministic --shape 8,12,12,4096,4096,64" ;;
    samng) echo "--name sam_vitb_nograd --score score+rel_h[b,h,q,kv//64]+rel_w[b,h,q,kv%64] --buffer rel_h:bf16[B,H,Sq,64] --buffer rel_w:bf16[B,H,Sq,64] --shape 8,12,12,4096,4096,64" ;;
    samngdet) echo "--name sam_vitb_nograd --score score+rel_h[b,h,q,kv//64]+rel_w[b,h,q,kv%64] --buffer rel_h:bf16[B,H,Sq,64] --buffer rel_w:bf16[B,H,Sq,64] --deterministic --shape 8,12,12,4096,4096,64" ;;
    sam32|sam80|sam96|sam128)
      local d=${1#sam} shape="8,12,12,4096,4096"
      [ "$d" = 80 ] && shape="8,16,16,4096,4096"
      [ "$d" = 128 ] || [ "$d" = 96 ] && shape="4,16,16,4096,4096"
      echo "--name sam_d$d --score score+rel_h[b,h,q,kv//64]+rel_w[b,h,q,kv%64] --buffer rel_h:bf16[B,H,Sq,64] --buffer rel_w:bf16[B,H,Sq,64] --grad rel_h --grad rel_w --shape $shape,$d" ;;
    samrt) echo "--name samrt_vitb --score score+rel_h[b,h,q,kv//W]+rel_w[b,h,q,kv%W] --buffer rel_h:bf16[B,H,Sq,64] --buffer rel_w:bf16[B,H,Sq,64] --param W:int --set W=64 --grad rel_h --grad rel_w --shape 8,12,12,4096,4096,64" ;;
    *) echo "unknown backward case $1" >&2; return 1 ;;
  esac
}

set -f  # the case arguments hold * and [ ]: no globbing when they are split into words
for r in $(seq 1 "$rounds"); do
  for c in $cases; do
    order=$builds
    [ $((r % 2)) -eq 0 ] && order=$(echo "$builds" | tr ' ' '\n' | tac | tr '\n' ' ')
    for b in $order; do
      if [ "$mode" = backward ]; then
        a=$(backward_args "$c") || exit 2
        ms=$(timeout 120 ".device/$b/flexjit" bench-backward $a --json --iters 30 --warmup 10 2>>"$out/ab_errors.txt" | tail -1 |
          python3 -c "import sys, json; print(json.loads(sys.stdin.read())['bwd_ms'])" 2>/dev/null || echo ERR)
      else
        a=$(forward_args "$c") || exit 2
        ms=$(timeout 120 ".device/$b/flexjit" bench $a --json --iters 100 --warmup 300 2>>"$out/ab_errors.txt" | tail -1 |
          python3 -c "import sys, json; print(json.loads(sys.stdin.read())['ms'])" 2>/dev/null || echo ERR)
      fi
      echo "$b $r $c $ms" >> "$results"
    done
  done
done
set +f
python3 - "$results" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    build, _, case, ms = line.split()
    if ms != "ERR":
        d[(case, build)].append(float(ms))
for (case, build), v in sorted(d.items()):
    print(f"{case} {build} median {statistics.median(v):.4f} min {min(v):.4f} max {max(v):.4f} n {len(v)}")
PY
