#!/usr/bin/env bash
# Decode on the GPU machine, from prebuilt binaries (nothing is built there):
#   harness  the standalone harness (.device/decode/<flavour>/decode_harness.xz, tests/gpu/decode_harness/build.sh):
#            its 40 correctness checks on `default` (the runtime's kernel per configuration, both pipelines), then
#            the target-shape timings of `default` side by side with `pairs` (the previous default) when built
#   runtime  .device/bin/gpu_tests (tools/build_for_gpu.sh): "[decode],[varlen]", then the "[decode_bench]" timings
#            with the default and with FLEXJIT_DECODE_ALTERNATE=0 (the previous pipeline), in alternation
#   bench    python3 bench/bench_decode.py with .device/bin/flexjit (flexjit, FlexDecoding and SDPA flash)
# Steps whose binaries are missing are skipped and say so.
#
# Run from the repo root:  bash tools/device/decode.sh [harness] [runtime] [bench]   (default: all three)
# Env: PASSES=2 (timing passes of the harness and of [decode_bench]), CHECK_ALL=1 (checks on every flavour),
#      BUDGET_S=570 (whole-script deadline: a step that would run past it gets what is left, so the summary still
#      prints within the device tool's 10 minutes).
# Output: $OUT/decode.log (everything), and bench_decode.py's $OUT/decode.json and $OUT/decode_table.md ($OUT unset:
# ./). The summary table is the last thing printed.
set -uo pipefail
ROOT="$(pwd)"
OUT_DIR="${OUT:-$ROOT}"
SRC="$ROOT/.device/decode"
BIN="$ROOT/.device/bin"
LOG="$OUT_DIR/decode.log"
WORK="$(mktemp -d)"
RESULTS="$WORK/results.txt"
mkdir -p "$OUT_DIR"
: > "$LOG"
: > "$RESULTS"
export FLEXJIT_CACHE_DIR="${FLEXJIT_CACHE_DIR:-/tmp/flexjit-cache}"
export PYTHONUNBUFFERED=1
steps="${*:-harness runtime bench}"
start=$(date +%s)
deadline=$((start + ${BUDGET_S:-570}))
log() { echo "$@" | tee -a "$LOG"; }
note() { echo "NOTE $*" >> "$RESULTS"; log "$*"; }
# Seconds a step may take: its own limit, or what is left before the deadline (at least 5).
limit() {
  local left=$((deadline - $(date +%s) - 15))
  ((left < 5)) && left=5
  ((left < $1)) && echo "$left" || echo "$1"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$LOG" 2>&1

has_step() { [[ " $steps " == *" $1 "* ]]; }

if has_step harness; then
  flavours=()
  for f in default pairs alt; do
    [[ -f "$SRC/$f/decode_harness" || -f "$SRC/$f/decode_harness.xz" ]] && flavours+=("$f")
  done
  if [[ ${#flavours[@]} -eq 0 || "${flavours[0]}" != default ]]; then
    note "harness: no .device/decode/default build (run tests/gpu/decode_harness/build.sh): skipped"
  else
    # Unpack (xz, or python's lzma where xz is missing).
    for f in "${flavours[@]}"; do
      mkdir -p "$WORK/$f"
      if [[ -f "$SRC/$f/decode_harness" ]]; then
        cp "$SRC/$f/decode_harness" "$WORK/$f/decode_harness"
      elif command -v xz > /dev/null; then
        xz -dc "$SRC/$f/decode_harness.xz" > "$WORK/$f/decode_harness"
      else
        python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
          "$SRC/$f/decode_harness.xz" "$WORK/$f/decode_harness"
      fi
      chmod +x "$WORK/$f/decode_harness"
    done
    log "harness flavours: ${flavours[*]}"
    # Correctness: the 40 cases with the fused merge (the runtime's default path), each launched twice.
    check_flavours=(default)
    [[ "${CHECK_ALL:-0}" == "1" ]] && check_flavours=("${flavours[@]}")
    for f in "${check_flavours[@]}"; do
      out="$WORK/check_$f.txt"
      DECODE_FUSED=1 timeout "$(limit 240)" "$WORK/$f/decode_harness" check > "$out" 2>&1
      rc=$?
      { echo "=== check $f (exit $rc)"; cat "$out"; } >> "$LOG"
      line="$(grep -a '^checks:' "$out" | tail -1)"
      log "check $f: ${line:-no summary} (exit $rc)"
      echo "CHECK $f ${line#checks: } rc=$rc" >> "$RESULTS"
      grep -a '^FAIL' "$out" | head -3
      [[ -z "$line" ]] && tail -3 "$out"
    done
    # Timings: PASSES rounds, each running every flavour once (interleaved, so drift hits all alike).
    for pass in $(seq 1 "${PASSES:-2}"); do
      for f in "${flavours[@]}"; do
        log "=== target $f pass $pass"
        timeout "$(limit 120)" "$WORK/$f/decode_harness" target 2>&1 | tee -a "$LOG" |
          sed -n "s/^RESULT /RESULT $f $pass /p" >> "$RESULTS"
      done
    done
  fi
fi

if has_step runtime; then
  if [[ ! -x "$BIN/gpu_tests" ]]; then
    note "runtime: no $BIN/gpu_tests (run tools/build_for_gpu.sh): skipped"
  else
    log "=== gpu_tests [decode],[varlen]"
    timeout "$(limit 300)" "$BIN/gpu_tests" "[decode],[varlen]" > "$WORK/tests.txt" 2>&1
    rc=$?
    cat "$WORK/tests.txt" >> "$LOG"
    line="$(grep -a -E '^(All tests passed|test cases:)' "$WORK/tests.txt" | tail -1)"
    echo "TESTS ${line:-no summary} (exit $rc)" >> "$RESULTS"
    log "gpu_tests [decode],[varlen]: ${line:-no summary} (exit $rc)"
    [[ $rc -ne 0 ]] && grep -a -B2 -A8 'FAILED' "$WORK/tests.txt" | head -40
    # Runtime timings ("DECODE_BENCH | case | ms | TB/s | splits n |"): the default pipeline and the previous one.
    for pass in $(seq 1 "${PASSES:-2}"); do
      for mode in default pairs; do
        log "=== [decode_bench] $mode pass $pass"
        (
          [[ $mode == pairs ]] && export FLEXJIT_DECODE_ALTERNATE=0
          timeout "$(limit 150)" "$BIN/gpu_tests" "[decode_bench]" 2>&1
        ) | tee -a "$LOG" |
          awk -F'|' -v m="$mode" -v p="$pass" '/^DECODE_BENCH/ {
            gsub(/^ +| +$/, "", $2); gsub(/ ms/, "", $3); gsub(/ /, "_", $2); split($5, s, " ");
            printf "RUNTIME %s %s %s %s %s\n", m, p, $2, $3 + 0, s[2] }' >> "$RESULTS"
      done
    done
  fi
fi

if has_step bench; then
  if [[ ! -x "$BIN/flexjit" ]]; then
    note "bench: no $BIN/flexjit (run tools/build_for_gpu.sh): skipped"
  else
    log "=== bench/bench_decode.py"
    timeout "$(limit 420)" python3 bench/bench_decode.py --flexjit "$BIN/flexjit" --out "$OUT_DIR" > "$WORK/bench.txt" 2>&1
    rc=$?
    cat "$WORK/bench.txt" >> "$LOG"
    echo "BENCH rc=$rc" >> "$RESULTS"
    [[ $rc -ne 0 ]] && { log "bench_decode.py exit $rc (124: ran out of time)"; tail -5 "$WORK/bench.txt"; }
  fi
fi

log "elapsed $(($(date +%s) - start)) s"
cat "$RESULTS" >> "$LOG"

# Summary: harness cases x flavours and runtime cases x pipelines ("pass1/pass2" ms), checks, tests, the bench table.
python3 - "$RESULTS" "$OUT_DIR/decode_table.md" <<'EOF'
import collections, os, sys
path, table = sys.argv[1], sys.argv[2]
harness = collections.defaultdict(lambda: collections.defaultdict(list))
runtime = collections.defaultdict(lambda: collections.defaultdict(list))
checks, splits, lines = {}, {}, []
for line in open(path):
    w = line.split()
    if not w:
        continue
    if w[0] == "CHECK":  # CHECK <flavour> <passed> / <total> passed rc=<exit>
        checks[w[1]] = f"{w[2]}/{w[4]}" + ("" if w[-1] == "rc=0" else f" {w[-1]}") if len(w) >= 6 else " ".join(w[2:])
    elif w[0] == "RESULT" and len(w) >= 7:  # RESULT <flavour> <pass> <case> <ms> <splits> <ctas/SM>
        harness[w[3]][w[1]].append(float(w[4]))
        if w[3] == "32768_contiguous":
            splits[w[1]] = f"{w[5]} splits, {w[6]} CTAs/SM"
    elif w[0] == "RUNTIME" and len(w) >= 6:  # RUNTIME <mode> <pass> <case> <ms> <splits>
        runtime[w[3]][w[1]].append(float(w[4]))
        splits[f"runtime {w[1]} {w[3]}"] = w[5]
    elif w[0] in ("TESTS", "BENCH", "NOTE"):
        lines.append(" ".join(w))


def fmt(v):
    return "/".join(f"{x:.4f}" if x < 1 else f"{x:.3f}" for x in v) if v else "-"


def grid(title, cells, cols):
    if not cells:
        return
    print(f"\n{title}")
    print(f"{'case':<36}" + "".join(f"{c:>18}" for c in cols) + "     change")
    for key, row in cells.items():
        change = ""
        if all(row.get(c) for c in cols[:2]) and len(cols) >= 2:
            change = f"{(min(row[cols[0]]) / min(row[cols[1]]) - 1) * 100:+.1f}%"
        print(f"{key:<36}" + "".join(f"{fmt(row.get(c, [])):>18}" for c in cols) + f"  {change:>9}")


hcols = [f for f in ("default", "pairs", "alt") if any(f in r for r in harness.values())]
grid("Harness, B8 H32/8 D128 bf16 one token (ms, median of 30, one entry per pass; copy in TB/s; change = best "
     "default vs best pairs):", harness, hcols)
if checks:
    print("checks: " + ", ".join(f"{f} {c}" for f, c in checks.items()))
for f in hcols:
    if f in splits:
        print(f"  {f}: {splits[f]}")
grid("Runtime gpu_tests [decode_bench] (ms, median of 50; default vs FLEXJIT_DECODE_ALTERNATE=0):", runtime,
     [c for c in ("default", "pairs") if any(c in r for r in runtime.values())])
rs = sorted({v for k, v in splits.items() if k.startswith("runtime ")})
if rs:
    print(f"  runtime splits: {', '.join(rs)}")
for l in lines:
    print(l)
if os.path.exists(table):
    print(open(table).read())
EOF
