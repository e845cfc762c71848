#!/usr/bin/env bash
# On the GPU machine: ncu metrics (duration, pipes, issue, L2 and reduction traffic, stall reasons) of one launch
# of a generated kernel timed by `flexjit bench` (or `bench-backward`), for deciding what bounds it.
# Usage: tools/device/profile_bench.sh TAG 'BENCH ARGS' [...]
#   PROFILE_CMD=bench-backward PROFILE_KERNEL=flexjit_bwd_main profiles the backward's main kernel instead of
#   the forward (PROFILE_KERNEL is a regex of the kernel name). SASS=1 also writes $OUT/sass_<tag>.csv, executed
#   instructions and warp stall samples per SASS instruction, for tools/device/sass_hotspots.py.
set -u
cd "$(dirname "$0")/../.."
B=${FLEXJIT_BIN:-.device/bin}
OUT=${OUT:-gpu-out}
CMD=${PROFILE_CMD:-bench}
KERNEL=${PROFILE_KERNEL:-flexjit_forward}
export FLEXJIT_CACHE_DIR=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-profile}
NCU="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
METRICS=gpu__time_duration.sum,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active,smsp__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum,lts__t_requests_op_red.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio
while [ $# -ge 2 ]; do
  tag=$1; args=$2; shift 2
  eval "argv=($args)"  # the args keep their shell quoting ('score + rel_h[b, h, q, kv // 64]')
  timeout 240 "$NCU" --kernel-name "regex:$KERNEL" --launch-skip 3 --launch-count 1 --metrics "$METRICS" \
    "$B/flexjit" "$CMD" "${argv[@]}" --warmup 1 --iters 1 > "$OUT/ncu_$tag.txt" 2>&1
  echo "== $tag (exit $?)"
  if [[ "${SASS:-0}" == 1 ]]; then
    rep="/tmp/ncu_sass_$tag"
    timeout 240 "$NCU" --kernel-name "regex:$KERNEL" --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats \
      --import-source no -f -o "$rep" "$B/flexjit" "$CMD" "${argv[@]}" --warmup 1 --iters 1 > /dev/null 2>&1
    "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$tag.csv" 2> "$OUT/sass_$tag.err"
    echo "  sass rows: $(wc -l < "$OUT/sass_$tag.csv")"
  fi
  awk '/__/ && NF >= 2 { v = $NF; n = $1; if (n ~ /stalled/) { if (v + 0 < 0.1) next; sub(/smsp__average_warps_issue_stalled_/, "stall ", n); sub(/_per_issue_active.ratio/, "", n) }
       printf("  %-62s %s\n", n, v) }' "$OUT/ncu_$tag.txt" | head -40
done
