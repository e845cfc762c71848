#!/usr/bin/env bash
# GPU-machine ncu profile of single benchmark cases of the standalone harnesses (one launch each, after warm-up
# launches), for deciding what bounds a kernel. Full ncu text per case goes to $OUT/ncu_<tag>.txt; stdout gets
# the duration, clock, pipe utilisation and stall reasons per case.
# Usage (repo root): tools/device/profile.sh TAG:HARNESS:CASE:KERNEL_REGEX [...]
#   e.g. bwd_causal:.device/bwd_prof/backward_harness:1:harness_bwd_main
#        fwd_softcap:.device/fwd_prof/flex_harness:5:flex_forward
#   HARNESS is run as `HARNESS one CASE`; the third matching launch is profiled.
# SASS=1 also samples warp stalls per SASS instruction (SourceCounters) and writes $OUT/sass_<tag>.csv, one row
# per instruction with its executed count and stall samples; tools/device/sass_hotspots.py sums it by block.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
NCU="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
METRICS=(
  gpu__time_duration.sum
  sm__cycles_elapsed.avg.per_second
  sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
  sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
  sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
  sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active
  smsp__issue_active.avg.pct_of_peak_sustained_active
  l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
  l1tex__throughput.avg.pct_of_peak_sustained_active
  lts__throughput.avg.pct_of_peak_sustained_elapsed
  dram__throughput.avg.pct_of_peak_sustained_elapsed
  lts__t_requests_op_red.sum
  lts__t_requests_op_atom.sum
  smsp__warps_active.avg.per_cycle_active
  smsp__inst_executed.sum
  launch__registers_per_thread
  "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
)
args=(--metrics "$(IFS=,; echo "${METRICS[*]}")")
for item in "$@"; do
  IFS=: read -r tag harness case_index regex <<< "$item"
  log="$OUT/ncu_$tag.txt"
  timeout 300 "$NCU" --kernel-name "regex:$regex" --launch-skip 2 --launch-count 1 "${args[@]}" "$harness" one "$case_index" > "$log" 2>&1
  echo "== $tag (exit $?): $(grep -m1 -E '^one:|^(full|causal|SAM|softcap|doc12) ' "$log")"
  if [[ "${SASS:-0}" == 1 ]]; then
    rep="/tmp/ncu_sass_$tag"
    timeout 300 "$NCU" --kernel-name "regex:$regex" --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats \
      --import-source no -f -o "$rep" "$harness" one "$case_index" > /dev/null 2>&1
    "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$tag.csv" 2> "$OUT/sass_$tag.err"
    echo "  sass rows: $(wc -l < "$OUT/sass_$tag.csv")"
  fi
  # name value pairs, stall reasons above 0.05 only
  awk '/__|launch__/ && NF >= 2 { v = $NF; n = $1; if (n ~ /stalled/) { if (v + 0 < 0.05) next; sub(/smsp__average_warps_issue_stalled_/, "stall ", n); sub(/_per_issue_active.ratio/, "", n) }
       printf("  %-70s %s %s\n", n, $(NF - 1), v) }' "$log" | sed 's/  *$//' | grep -v "^  ==" | head -40
done
