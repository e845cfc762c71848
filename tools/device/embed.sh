#!/usr/bin/env bash
# examples/embed on the GPU machine, against a flexjit prefix installed here (nothing of
# flexjit is built there; only the example, with cmake and the C compiler):
#   here:   cmake -S . -B build-gpu-install -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXJIT_CPU_BACKEND=OFF -DFLEXJIT_TESTS=OFF
#           cmake --build build-gpu-install -j2 && cmake --install build-gpu-install --prefix .device/embed-prefix --strip
#   there:  bash tools/device/embed.sh            (carry .device/embed-prefix)
# It builds examples/embed (its build runs `flexjit compile --arch sm_90a --decode 4,2,1` into a
# fresh cache), runs it with FLEXJIT_LOG=info (20 decode steps, one CUDA graph, each step
# checked against float64 by the program), checks that every kernel it loaded came from the
# disk cache the build filled, and does the same linked with the static libraries.
# Output: $OUT/embed.log (everything); the summary table is printed last.
set -uo pipefail
# The program reads the cache its build filled only when FLEXJIT_CACHE_DIR is unset (it does not override
# a caller's choice), so a cache directory exported by the caller would hide a cold build-time cache.
unset FLEXJIT_CACHE_DIR
ROOT="$(pwd)"
OUT_DIR="${OUT:-$ROOT}"
PREFIX="${EMBED_PREFIX:-$ROOT/.device/embed-prefix}"
LOG="$OUT_DIR/embed.log"
WORK="$(mktemp -d)"
mkdir -p "$OUT_DIR"
: > "$LOG"
results=()
log() { echo "$@" | tee -a "$LOG"; }
record() { results+=("$(printf '%-34s %-6s %s' "$1" "$2" "$3")"); }

if [ ! -f "$PREFIX/lib/cmake/flexjit/flexjitConfig.cmake" ]; then
  log "no flexjit prefix at $PREFIX: build and install it on the CPU machine first (see the top of this script)"
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$LOG" 2>&1

for variant in shared static; do
  build="$WORK/embed-$variant"
  cache="$WORK/cache-$variant"
  static=OFF
  [ "$variant" = static ] && static=ON
  log "=== $variant: configure and build (the build fills $cache)"
  if ! cmake -S examples/embed -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DEMBED_STATIC=$static \
         -DEMBED_ARCHS=sm_90a -DEMBED_CACHE_DIR="$cache" >> "$LOG" 2>&1 || ! cmake --build "$build" >> "$LOG" 2>&1; then
    record "$variant: build" FAIL "see embed.log"
    continue
  fi
  record "$variant: build + flexjit compile" ok "$(ls "$cache" | wc -l) cache entries"
  log "=== $variant: run"
  FLEXJIT_LOG=info timeout 300 "$build/embed_decode" > "$WORK/run.txt" 2>&1
  rc=$?
  cat "$WORK/run.txt" >> "$LOG"
  summary=$(grep '^embed_decode:' "$WORK/run.txt" | tail -1)
  if [ $rc -eq 0 ] && grep -q 'cuda:0 (one CUDA graph' <<< "$summary"; then
    record "$variant: 20 graph-replayed steps" ok "$(grep -o 'max |O.*' <<< "$summary")"
  else
    record "$variant: 20 graph-replayed steps" FAIL "rc $rc: ${summary:-no summary line; see embed.log}"
  fi
  loads=$(grep -c 'flexjit: kernel .* for sm_' "$WORK/run.txt")
  compiled=$(grep 'flexjit: kernel .* for sm_' "$WORK/run.txt" | grep -c ': compiled in ')
  if [ "$loads" -gt 0 ] && [ "$compiled" -eq 0 ]; then
    record "$variant: kernels from the warm cache" ok "$loads of $loads from disk"
  else
    record "$variant: kernels from the warm cache" FAIL "$compiled of $loads compiled at run time (see embed.log)"
  fi
done
rm -rf "$WORK"
log ""
log "examples/embed on the GPU"
for r in "${results[@]}"; do log "$r"; done
