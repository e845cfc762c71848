#!/usr/bin/env bash
# Runs N copies of the instrumented front-end fuzzer for S seconds each, for the many cores of the GPU machine, and
# sums their executions (the figure docs/FUZZING.md records). The instrumented target needs only libnvrtc when built
# without the LLVM CPU backend:
#   cmake -B build-fuzz-dev -G Ninja -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 \
#         -DFLEXJIT_FUZZ=ON -DFLEXJIT_CPU_BACKEND=OFF && cmake --build build-fuzz-dev --target fuzz_frontend
#   stage build-fuzz-dev/tests/fuzz/fuzz_frontend (and, optionally, corpus.tgz: a merged corpus, `corpus/` inside)
#   in STAGE (default .device/fuzz), carry it, then on the GPU machine:
#   tools/device/fuzz_parallel.sh N S            each process starts from its shard of the corpus and the seeds
#   FROM_SEEDS=1 tools/device/fuzz_parallel.sh N S   the checked-in seeds only (small inputs: about 4x the rate)
# Exits non-zero on any finding; logs of failing processes go to $OUT/errors.txt, artifacts to $OUT/findings.tgz.
set -uo pipefail
N=${1:-16}; S=${2:-400}
cd "$(dirname "$0")/../.."
ROOT=$PWD
STAGE=$(cd "${STAGE:-.device/fuzz}" && pwd)
OUT=${OUT:-/tmp/fuzz-out}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:malloc_context_size=8:suppressions=$ROOT/tests/asan.supp"
export LSAN_OPTIONS="suppressions=$ROOT/tests/lsan.supp"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export FLEXJIT_CACHE_DIR=/tmp/fuzzcache
W=/tmp/fuzz-parallel; rm -rf $W; mkdir -p $W/corpus $W/findings "$OUT"
if [ "${FROM_SEEDS:-0}" != 1 ] && [ -f "$STAGE/corpus.tgz" ]; then tar xzf "$STAGE/corpus.tgz" -C $W; fi
# Sharding gives each process a short start; together they still cover the whole corpus.
n=0
for f in $(ls $W/corpus); do d=$W/shard$((n % N + 1)); mkdir -p $d; mv "$W/corpus/$f" $d/; n=$((n + 1)); done
if ldd "$STAGE/fuzz_frontend" | grep -i "not found"; then exit 1; fi
for i in $(seq 1 "$N"); do
  mkdir -p $W/new$i $W/shard$i
  "$STAGE/fuzz_frontend" $W/new$i $W/shard$i "$ROOT/tests/fuzz/corpus/frontend" \
    -dict="$ROOT/tests/fuzz/dict/frontend.dict" -max_total_time="$S" -timeout=60 -rss_limit_mb=4096 \
    -print_final_stats=1 -seed=$((1000 + i)) -artifact_prefix=$W/findings/p$i- > $W/log$i.txt 2>&1 &
done
wait
runs=0
for i in $(seq 1 "$N"); do
  r=$(sed -n 's/^stat::number_of_executed_units: *//p' $W/log$i.txt | tail -1)
  echo "process $i: ${r:-no count}"; runs=$((runs + ${r:-0}))
done
echo "processes $N seconds $S executions $runs"
echo "largest edge count: $(grep -h "cov:" $W/log*.txt | grep -oE "cov: [0-9]+" | sort -t' ' -k2 -n | tail -1)"
tar czf "$OUT/findings.tgz" -C $W findings
bad=$(grep -l "ERROR\|deadly signal\|leak\|runtime error" $W/log*.txt)
if [ -n "$bad" ] || [ -n "$(ls $W/findings)" ]; then
  echo "FINDINGS in: $bad $(ls $W/findings)"; cat $bad | head -400 > "$OUT/errors.txt"; exit 1
fi
echo "no findings"
