#!/usr/bin/env bash
# Runs on the GPU machine over binaries staged by tools/build_for_gpu.sh: the GPU tests,
# compute-sanitizer on five representative launches, the PyTorch cross-check and the
# benchmarks. Logs and result tables go to $OUT (or ./gpu-out).
#   tools/gpu_check.sh [tests] [sanitize] [sanitize_bwd] [torch] [bench] [backward] [multi_gpu]   (default: tests sanitize torch bench)
#   sanitize_bwd: compute-sanitizer memcheck and racecheck on `flexjit run --backward` of causal, document, SAM, the
#   learnable relative bias (its gradient: the diagonal scatter) and learnable ALiBi slopes (a per-head scatter)
#   backward: the [backward] GPU tests, then bench/bench_backward.py (table in $OUT/backward_table.md)
#   decode: the [decode] and [varlen] GPU tests, then bench/bench_decode.py and bench/bench_varlen.py ($OUT/varlen)
#   multi_gpu: the two-GPU tests (one spec on both devices, replicas, wrong-device errors); needs 2 GPUs
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${FLEXJIT_BIN:-.device/bin}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export FLEXJIT_CACHE_DIR=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-cache}
export PYTHONUNBUFFERED=1
FLEXJIT_TEST_JOBS=${FLEXJIT_TEST_JOBS:-8}
# The commit the binaries were built from (tools/build_for_gpu.sh), for the benchmark tables.
export FLEXJIT_COMMIT=${FLEXJIT_COMMIT:-$(cat "$BIN/COMMIT" 2>/dev/null || echo unknown)}
steps=${*:-tests sanitize torch bench}
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

# compute-sanitizer memcheck and racecheck on `flexjit run` of causal, document, SAM, the relative bias and ALiBi
# (small random inputs); $1 = forward, or backward (adds --backward, and the rel_h / rel_w, bias and slope gradients).
sanitize_launches() {
  local pass=$1
  echo "== compute-sanitizer on $pass launches (memcheck, racecheck)"
  python3 tests/gpu/sanitize_inputs.py "$OUT/san" || status=1
  for tool in memcheck racecheck; do
    for spec in causal document sam_relpos relative_bias alibi_causal; do
      local san="$OUT/san"
      local args=(run "examples/gallery/$spec.json" --q "$san/q.npy" --k "$san/k.npy" --v "$san/v.npy" --out "$san/o.npy" --device cuda:0)
      [ "$pass" = backward ] && args+=(--backward --do "$san/q.npy" --dq "$san/dq.npy" --dk "$san/dk.npy" --dv "$san/dv.npy")
      [ "$spec" = document ] && args+=(--load "doc=$san/doc.npy")
      [ "$spec" = sam_relpos ] && args+=(--load "rel_h=$san/rel.npy" --load "rel_w=$san/rel.npy")
      [ "$spec" = sam_relpos ] && [ "$pass" = backward ] && args+=(--grad "rel_h=$san/drh.npy" --grad "rel_w=$san/drw.npy")
      [ "$spec" = relative_bias ] && args+=(--load "bias=$san/bias.npy")
      [ "$spec" = relative_bias ] && [ "$pass" = backward ] && args+=(--grad "bias=$san/dbias.npy")
      [ "$spec" = alibi_causal ] && args+=(--load "slope=$san/slope.npy")
      [ "$spec" = alibi_causal ] && [ "$pass" = backward ] && args+=(--grad "slope=$san/dslope.npy")
      local log="$OUT/san_${pass}_${tool}_${spec}.log"
      compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/flexjit" "${args[@]}" > "$log" 2>&1
      local rc=$?
      echo "$tool $spec $pass: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
      [ $rc -eq 0 ] || { status=1; tail -5 "$log"; }
    done
  done
}

# Every GPU test case in its own process, $FLEXJIT_TEST_JOBS (default 8) at a time: on a fresh machine the tests'
# NVRTC compiles dominate (over ten minutes serially with a cold cache), and processes compile in parallel where one
# test binary compiles one module after another. Logs: $OUT/gpu_tests.log (every case's, in order), a line per case.
run_tests_parallel() {
  echo "== GPU tests ($FLEXJIT_TEST_JOBS at a time)"
  local dir=$OUT/gpu_tests.d
  rm -rf "$dir" && mkdir -p "$dir"
  # Catch2 test specs treat , [ ] * " and \ specially: escape them so each name selects exactly its own case.
  "$BIN/gpu_tests" --list-test-names-only | sed '/^$/d' > "$dir/names"
  sed 's/[][\\,*"]/\\&/g' "$dir/names" | awk '{ printf "%04d %s\n", NR, $0 }' | xargs -P "$FLEXJIT_TEST_JOBS" -d '\n' -n1 sh -c \
    'i=${1%% *}; "$0" "${1#* }" > "'"$dir"'/$i.log" 2>&1; echo $? > "'"$dir"'/$i.rc"' "$BIN/gpu_tests"
  local i=0 failed=0
  : > "$OUT/gpu_tests.log"
  while IFS= read -r name; do
    i=$((i + 1))
    local n=$(printf '%04d' $i) rc
    rc=$(cat "$dir/$n.rc" 2>/dev/null || echo missing)
    cat "$dir/$n.log" >> "$OUT/gpu_tests.log"
    if [ "$rc" = 0 ]; then
      echo "ok     $name: $(grep -E 'All tests passed|test cases' "$dir/$n.log" | tail -1)"
    else
      echo "FAILED $name (exit $rc)"
      grep -v spills "$dir/$n.log" | tail -15
      failed=$((failed + 1))
    fi
  done < "$dir/names"
  echo "GPU tests: $i cases, $failed failed"
  [ $failed -eq 0 ] || status=1
}

for step in $steps; do
  case $step in
    tests)
      run_tests_parallel
      ;;
    sanitize)
      sanitize_launches forward
      ;;
    multi_gpu)
      echo "== two-GPU tests"
      "$BIN/gpu_tests" "[multi_gpu],*wrong device*" 2>&1 | tee "$OUT/multi_gpu_tests.log" | tail -5 || status=1
      ;;
    sanitize_bwd)
      sanitize_launches backward
      ;;
    torch)
      echo "== gallery against torch flex_attention"
      python3 tests/gpu/compare_torch.py --flexjit "$BIN/flexjit" --out "$OUT/torch_compare.json" || status=1
      echo "== gallery backward against torch flex_attention (compiled)"
      python3 tests/gpu/compare_torch.py --flexjit "$BIN/flexjit" --out "$OUT/torch_backward.json" --backward || status=1
      ;;
    decode)
      echo "== decode and ragged-prefill tests"
      "$BIN/gpu_tests" "[decode],[varlen]" 2>&1 | tee "$OUT/decode_tests.log" | tail -25 || status=1
      echo "== decode benchmarks"
      python3 bench/bench_decode.py --flexjit "$BIN/flexjit" --out "$OUT" || status=1
      echo "== ragged-prefill benchmarks"
      mkdir -p "$OUT/varlen"
      python3 bench/bench_varlen.py --flexjit "$BIN/flexjit" --out "$OUT/varlen" || status=1
      ;;
    bench)
      echo "== benchmarks"
      python3 bench/bench_forward.py --flexjit "$BIN/flexjit" --out "$OUT" || status=1
      ;;
    backward)
      echo "== backward tests"
      "$BIN/gpu_tests" "[backward]" 2>&1 | tee "$OUT/backward_tests.log" | tail -40 || status=1
      echo "== backward benchmarks"
      python3 bench/bench_backward.py --flexjit "$BIN/flexjit" --out "$OUT" || status=1
      ;;
  esac
done
exit $status
