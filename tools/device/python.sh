#!/usr/bin/env bash
# The Python package on the GPU machine (issue 30), from a wheel built here: nothing is compiled there.
#
# Here (the CPU machine), once per change of the C++ library or python/:
#   bash tools/device/python.sh build
#     builds the static libraries without the LLVM CPU backend in build-gpu (as tools/build_for_gpu.sh does), the
#     cp312 wheel against them with pyenv's Python 3.12 ($PYTHON312, default ~/.pyenv/versions/3.12.1/bin/python)
#     into .device/python/, and downloads pytest's wheels next to it (the GPU machine has no pytest and no network).
#     Carry .device/python (about 5 MiB): run(..., carry=[".device/python"]).
#
# There (repo root, from the device tool), each step within the tool's 10 minutes:
#   bash tools/device/python.sh tests      python/tests on CUDA: test_gpu.py against torch FlexAttention and a float64
#                                          reference (gallery forward/backward with buffer gradients through the string
#                                          API and the drop-in, attention-gym mods, opcheck, torch.compile(fullgraph=True),
#                                          CUDA-graph capture and replay, streams, decode, varlen)
#   bash tools/device/python.sh overhead   bench/python_overhead.py: Python launch overhead over the C++ launch
#   bash tools/device/python.sh sam        bench/sam_encoder.py --check: SAM ViT-B images/s (SDPA + bias, FlexAttention
#                                          compiled, flexjit), forward batch 32 and forward+backward batch 8
#   bash tools/device/python.sh decoder    bench/decoder_block.py: decoder block, sliding window + sink, torch.compile
#   (several steps in one call run in order; no step: tests overhead)
# Env: BUDGET_S=570 (a deadline for the whole call; each step gets what is left), PYTEST_ARGS (e.g. "-k gallery").
# Output: $OUT/python.log (everything); the summary table is printed last.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
STAGE="$ROOT/.device/python"

if [ "${1:-}" = build ]; then
  set -e
  PY312=${PYTHON312:-$HOME/.pyenv/versions/3.12.1/bin/python}
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXJIT_CPU_BACKEND=OFF >/dev/null
  cmake --build build-gpu --target flexjit_runtime -j "${JOBS:-2}"
  rm -rf "$STAGE" && mkdir -p "$STAGE/wheels"
  "$PY312" -m pip wheel --no-deps -w "$STAGE" ./python -Ccmake.define.FLEXJIT_PREBUILT=build-gpu -Ccmake.define.FLEXJIT_CPU_BACKEND=OFF
  "$PY312" -m pip download -q --only-binary :all: --python-version 3.12 -d "$STAGE/wheels" pytest
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo '+local changes')" > "$STAGE/COMMIT"
  du -sh "$STAGE"; ls "$STAGE" "$STAGE/wheels"
  exit 0
fi

OUT_DIR="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/python.log"
: > "$LOG"
WORK="$(mktemp -d)"
SUMMARY="$WORK/summary.txt"
: > "$SUMMARY"
export FLEXJIT_CACHE_DIR="${FLEXJIT_CACHE_DIR:-/tmp/flexjit-cache}"
export PYTHONUNBUFFERED=1
start=$(date +%s)
deadline=$((start + ${BUDGET_S:-570}))
log() { echo "$@" | tee -a "$LOG"; }
limit() {
  local left=$((deadline - $(date +%s) - 10))
  ((left < 5)) && left=5
  echo "$left"
}

# The wheel (and pytest's, when the machine lacks it) unpacked into a private site directory.
SITE="$WORK/site"
mkdir -p "$SITE"
wheel=$(ls "$STAGE"/flexjit-*cp312*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  log "no wheel in $STAGE: run 'bash tools/device/python.sh build' on the CPU machine and carry .device/python"
  exit 1
fi
python3 -m zipfile -e "$wheel" "$SITE"
python3 -c "import pytest" 2>/dev/null || for w in "$STAGE"/wheels/*.whl; do python3 -m zipfile -e "$w" "$SITE"; done
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
log "flexjit from $(basename "$wheel") (commit $(cat "$STAGE/COMMIT" 2>/dev/null || echo unknown)); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
python3 -c "import torch, flexjit; print('torch', torch.__version__, '| flexjit devices:', flexjit.device_count(), '| CPU backend:', flexjit.has_cpu_backend())" 2>&1 | tee -a "$LOG"

run_step() {  # name, command...
  local name=$1
  shift
  log "== $name: $*"
  local t0=$(date +%s)
  timeout "$(limit)" "$@" > "$WORK/$name.out" 2>&1
  local rc=$?
  cat "$WORK/$name.out" >> "$LOG"
  echo "$name: exit $rc in $(($(date +%s) - t0)) s" >> "$SUMMARY"
  ((rc == 124)) && echo "$name: TIMED OUT (raise BUDGET_S or run the step alone)" >> "$SUMMARY"
  return $rc
}

for step in ${@:-tests overhead}; do
  case $step in
    tests)
      run_step tests python3 -m pytest -q -rs -p no:cacheprovider python/tests ${PYTEST_ARGS:-}
      grep -E "passed|failed|error|skipped" "$WORK/tests.out" | tail -3 >> "$SUMMARY"
      grep -E "^(FAILED|ERROR) " "$WORK/tests.out" | head -30 >> "$SUMMARY"
      ;;
    overhead)
      run_step overhead python3 bench/python_overhead.py
      grep -E "^\||^For scale" "$WORK/overhead.out" >> "$SUMMARY"
      ;;
    sam)
      run_step sam python3 bench/sam_encoder.py --check
      grep -E "^\||^check" "$WORK/sam.out" >> "$SUMMARY"
      ;;
    decoder)
      run_step decoder python3 bench/decoder_block.py
      grep -E "^\||^check" "$WORK/decoder.out" >> "$SUMMARY"
      ;;
    *)
      log "unknown step $step (tests, overhead, sam, decoder; build runs here)"
      ;;
  esac
done
tail -40 "$WORK/tests.out" 2>/dev/null | grep -E "Error|assert|^E " | head -20 | sed 's/^/  /' >> "$SUMMARY" || true
echo
echo "== summary (full log: $LOG)"
cat "$SUMMARY"
rm -rf "$WORK"
