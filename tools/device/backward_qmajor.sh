#!/usr/bin/env bash
# The query-major backward pass on the GPU machine: the [backward] GPU tests (every case with dq by atomics and
# by the query-major pass), then `flexjit bench-backward` for both dQ strategies, plain and deterministic, on
# the causal case and SAM ViT-B (plus the learnable bias / slope cases). Run from the repo root with binaries
# staged by
#   FLEXJIT_GPU_BUILD=build-qmajor FLEXJIT_STAGE=.device/backward_qmajor tools/build_for_gpu.sh
# Full logs go to $OUT/backward_qmajor.log; a short summary (test result, failures, timing table) is printed last.
#   tools/device/backward_qmajor.sh [tests] [bench]   (default: both)
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${FLEXJIT_BIN:-.device/backward_qmajor}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
LOG="$OUT/backward_qmajor.log"
: > "$LOG"
export FLEXJIT_CACHE_DIR=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-cache}
# Fallbacks from the query-major pass to atomics are logged at info level.
export FLEXJIT_LOG=${FLEXJIT_LOG:-info}
unset FLEXJIT_BWD_DQ
steps=${*:-tests bench}
status=0
summary=""
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)
echo "GPU: $gpu" | tee -a "$LOG"

for step in $steps; do
  case $step in
    tests)
      echo "== gpu_tests [backward]" | tee -a "$LOG"
      start=$(date +%s)
      "$BIN/gpu_tests" "[backward]" > "$OUT/.bwd_tests.txt" 2>&1
      rc=$?
      cat "$OUT/.bwd_tests.txt" >> "$LOG"
      [ $rc -eq 0 ] || status=1
      result=$(grep -E "^(All tests passed|test cases:)" "$OUT/.bwd_tests.txt" | tail -1)
      summary+="gpu_tests [backward]: exit $rc, $(( $(date +%s) - start )) s: ${result:-no Catch summary (crash?)}"$'\n'
      if [ $rc -ne 0 ]; then
        # The failing assertions with their INFO context (case, dQ strategy, which gradient), bounded.
        summary+="--- failures (first 60 lines; all in $LOG) ---"$'\n'
        summary+=$(grep -E -B2 -A8 "FAILED|REQUIRE|CHECK\(|with messages|error|Error" "$OUT/.bwd_tests.txt" | head -60)$'\n'
      fi
      # Accuracy per checked run (case line, then its gradients' rel_l2): the worst gradient of each run, the
      # 20 worst runs.
      summary+="--- worst rel_l2 per run (of $(grep -c ", dq " "$OUT/.bwd_tests.txt") runs), 20 worst ---"$'\n'
      summary+=$(awk '/, dq / { run = $0; next }
                      /^  (dq|dk|dv|grad)/ { for (i = 1; i < NF; ++i) if ($i == "rel_l2") { v = $(i + 1) ~ /nan|inf/ ? 1e30 : $(i + 1) + 0; n = $1 ($1 == "grad" ? " " $2 : "") }
                                             if (!(run in worst) || v > worst[run]) { worst[run] = v; which[run] = n } }
                      END { for (r in worst) printf "%.2e %-6s %s\n", worst[r], which[r], r }' "$OUT/.bwd_tests.txt" | sort -g -r | head -20)$'\n'
      rm -f "$OUT/.bwd_tests.txt"
      ;;
    bench)
      echo "== bench-backward" | tee -a "$LOG"
      table="| case | dq | det | fwd ms | bwd ms | fwd+bwd ms |"$'\n'"| --- | --- | --- | --- | --- | --- |"$'\n'
      bench() {  # name, shape, "det" (also the deterministic mode) or "plain", then flags
        local name=$1 shape=$2 dets=("")
        [ "$3" = det ] && dets+=(--deterministic)
        shift 3
        for dq in atomic qmajor; do
          for det in "${dets[@]}"; do
            local line
            line=$("$BIN/flexjit" bench-backward "$@" --shape "$shape" --json --iters 20 --warmup 3 --dq "$dq" $det 2>>"$LOG")
            local rc=$?
            echo "$name dq=$dq ${det:-plain}: rc $rc $line" >> "$LOG"
            if [ $rc -ne 0 ] || [ -z "$line" ]; then
              status=1
              table+="| $name | $dq | ${det:+yes} | fails (see log) | | |"$'\n'
              continue
            fi
            table+=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("| %s | %s | %s | %.3f | %.3f | %.3f |" % (sys.argv[2], sys.argv[3], sys.argv[4], r["fwd_ms"], r["bwd_ms"], r["fwd_bwd_ms"]))' \
              "$(echo "$line" | tail -1)" "$name" "$dq" "${det:+yes}")$'\n'
          done
        done
      }
      causal=(--mask "q >= kv" --name causal --head-dim 128)
      sam=(--score "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]" --buffer "rel_h: bf16[B, H, Sq, 64]"
           --buffer "rel_w: bf16[B, H, Sq, 64]" --grad rel_h --grad rel_w --name sam_vitb --head-dim 64)
      bias=(--score "score + bias[h, q - kv + Skv - 1]" --buffer "bias: f32[H, L]" --grad bias --mask "q >= kv" --name learnable_bias
            --head-dim 128)
      slope=(--score "score + slope[h] * (kv - q)" --buffer "slope: f32[H]" --grad slope --mask "q >= kv" --name learnable_slope
             --head-dim 128)
      bench "causal B4 H16 S4096 D128" 4,16,16,4096,4096,128 det "${causal[@]}"
      bench "SAM ViT-B B8 H12 S4096 D64" 8,12,12,4096,4096,64 det "${sam[@]}"
      bench "learnable bias, causal D128" 4,16,16,4096,4096,128 plain "${bias[@]}"
      bench "learnable slope, causal D128" 4,16,16,4096,4096,128 plain "${slope[@]}"
      bench "no mask B4 H16 S4096 D64" 4,16,16,4096,4096,64 plain --name full --head-dim 64
      echo "$table" >> "$LOG"
      summary+="--- bench-backward (median ms, $gpu) ---"$'\n'"$table"
      ;;
  esac
done
grep -h "not by the query-major pass" "$LOG" | sort -u | head -5 | sed 's/^/note: /'
echo
echo "================ summary (backward_qmajor) ================"
printf '%s' "$summary"
exit $status
