#!/usr/bin/env bash
# GPU-machine run of the sm_90a backward harness (prebuilt by tests/gpu/backward_harness/build.sh into
# .device/backward_sm90/): the correctness matrix, then the old-vs-new benchmarks. The full output goes to
# "$OUT/backward_sm90.log"; stdout gets the failures, the check summary and the benchmark table (last).
# Usage (repo root): tools/device/backward_sm90.sh [check|bench|all|sanitize] [harness flags, e.g. --quick --d=128]
#   sanitize: compute-sanitizer memcheck over five small cases (check --tiny).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$ROOT/.device/backward_sm90/backward_harness"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/backward_sm90.log"
MODE="${1:-all}"
shift || true
: > "$LOG"
if [[ ! -x "$BIN" ]]; then
  echo "missing $BIN: build it with tests/gpu/backward_harness/build.sh (and carry .device/backward_sm90)"
  exit 2
fi
{
  echo "== $(date -u) $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null)"
  echo "== ptxas (build machine)"
  cat "$ROOT/.device/backward_sm90/ptxas_summary.txt" 2>/dev/null
} >> "$LOG"
status=0
if [[ "$MODE" == "check" || "$MODE" == "all" ]]; then
  echo "== check $*" >> "$LOG"
  start=$SECONDS
  timeout 420 "$BIN" check "$@" >> "$LOG" 2>&1 || status=$?
  echo "== check exit $status after $((SECONDS - start)) s" >> "$LOG"
fi
if [[ "$MODE" == "sanitize" ]]; then
  SAN="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  echo "== sanitize ($SAN memcheck, check --tiny)" >> "$LOG"
  timeout 500 "$SAN" --tool memcheck --print-limit 20 "$BIN" check --tiny >> "$LOG" 2>&1 || status=$?
  echo "== check exit $status (sanitize)" >> "$LOG"
  grep -E "ERROR SUMMARY|Invalid|out of bounds" "$LOG" | head -20
fi
if [[ "$MODE" == "bench" || "$MODE" == "all" ]]; then
  echo "== bench" >> "$LOG"
  start=$SECONDS
  timeout 150 "$BIN" bench >> "$LOG" 2>&1 || { rc=$?; echo "== bench exit $rc" >> "$LOG"; [[ $status -eq 0 ]] && status=$rc; }
  echo "== bench done after $((SECONDS - start)) s" >> "$LOG"
fi

# Summary (stdout comes back truncated to about 12,000 characters: keep it short).
grep -m1 "^device:" "$LOG"
grep -m1 "^shared memory per CTA" "$LOG"
grep -E "^== check exit|stopped at|CUDA error|Segmentation|Aborted" "$LOG" | head -5
grep "^FAILED:" "$LOG" | head -30
nfail=$(grep -c "^FAILED:" "$LOG")
[[ $nfail -gt 30 ]] && echo "... $((nfail - 30)) more failures in $LOG"
# One line per head dim: the worst new-kernel relative L2 errors.
awk -F'|' '!/^FAILED/ && / sm90 / && /PASS|FAIL/ { split($1, a, " "); d = a[3]; n[d]++; if (/FAIL/) f[d]++
    for (i = 2; i <= 5; ++i) { if ($i ~ /NaN/) nan[d] = 1; split($i, c, " "); if ($i !~ /NaN/ && c[1] ~ /^[0-9.e+-]+$/ && c[1] + 0 > w[d]) w[d] = c[1] + 0 } }
  END { for (d in n) printf("D%-4s sm90 runs %3d, failed %2d, worst relL2 over dq/dk/dv/grad %.1e%s\n", d, n[d], f[d], w[d], nan[d] ? ", NaN seen" : "") }' "$LOG" | sort -V
grep "^CHECK SUMMARY" "$LOG"
sed -n '/^BENCH TABLE/,$p' "$LOG"
echo "(full log: $LOG)"
exit $status
