#!/usr/bin/env bash
# On the GPU machine: ncu metrics (duration, pipes, issue, stall reasons) of one forward launch of `flexjit bench`
# per case, for deciding what bounds a generated kernel. Usage: tools/device/profile_bench.sh TAG 'BENCH ARGS' [...]
set -u
cd "$(dirname "$0")/../.."
B=${FLEXJIT_BIN:-.device/bin}
OUT=${OUT:-gpu-out}
export FLEXJIT_CACHE_DIR=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-profile}
NCU="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
METRICS=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active,smsp__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio
while [ $# -ge 2 ]; do
  tag=$1; args=$2; shift 2
  # shellcheck disable=SC2086
  timeout 200 "$NCU" --kernel-name regex:flexjit_forward --launch-skip 3 --launch-count 1 --metrics "$METRICS" \
    "$B/flexjit" bench $args --warmup 1 --iters 1 > "$OUT/ncu_$tag.txt" 2>&1
  echo "== $tag (exit $?)"
  awk '/__/ && NF >= 2 { v = $NF; n = $1; if (n ~ /stalled/) { if (v + 0 < 0.1) next; sub(/smsp__average_warps_issue_stalled_/, "stall ", n); sub(/_per_issue_active.ratio/, "", n) }
       printf("  %-62s %s\n", n, v) }' "$OUT/ncu_$tag.txt" | head -30
done
