#!/usr/bin/env bash
# Builds the standalone decode-kernel harness (not part of CMake), one binary per pipeline flavour:
#   .device/decode/<flavour>/decode_harness.xz (xz keeps the carried tree small; tools/device/decode.sh unpacks it)
#   .device/decode/<flavour>/ptxas_d<D>.log     (ptxas resource usage per head dim)
# Objects go to build-decode/<flavour>/.
#   FLAVOURS="default pairs" (the default) picks flavours from the table below.
#   ARCHS="all" adds sm_80 to sm_90a. DIMS="128" builds only some head dims (the checks of other dims then fail).
#   EXTRA_FLAGS are added to every flavour's flags. PACK=0 leaves the binary uncompressed.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="${DECODE_OUT:-$ROOT/.device/decode}"
BUILD="${DECODE_BUILD:-$ROOT/build-decode}"
NVCC="${NVCC:-/usr/local/cuda/bin/nvcc}"
SRC="$ROOT/tests/gpu/decode_harness"

# Flavour -> compile flags (FlexDecodeTraits::kAlternate through kernels.cu's FLEX_DECODE_ALTERNATE):
#   default: the runtime's pipeline per configuration (flex_decode_alternate: alternating at D128 with one m-tile)
#   pairs:   64-row K+V pairs everywhere (the runtime's kernel before run 4)
#   alt:     alternating 128-row loads wherever there are two stages
flavour_flags() {
  case "$1" in
    default) echo "" ;;
    pairs) echo "-DFLEX_DECODE_ALTERNATE=0" ;;
    alt) echo "-DFLEX_DECODE_ALTERNATE=1" ;;
    *) echo "unknown flavour $1" >&2; exit 1 ;;
  esac
}

GENCODE=(-gencode arch=compute_90a,code=sm_90a)
if [[ "${ARCHS:-}" == "all" ]]; then GENCODE+=(-gencode arch=compute_80,code=sm_80); fi

for flavour in ${FLAVOURS:-default pairs}; do
  obj="$BUILD/$flavour"
  dst="$OUT/$flavour"
  mkdir -p "$obj" "$dst"
  FLAGS=(-std=c++20 -O3 "${GENCODE[@]}" $(flavour_flags "$flavour") ${EXTRA_FLAGS:-} -I "$ROOT/kernels_templates" -I "$SRC")
  rm -f "$obj"/*.o
  # At most two compilers at a time (the build machine has two cores); a failed one stops the script (set -e).
  jobs_running=0
  for unit in ${DIMS:-64 128 256} main; do
    if [[ "$unit" == main ]]; then
      ( "$NVCC" "${FLAGS[@]}" -c "$SRC/main.cu" -o "$obj/main.o" ) &
    else
      ( "$NVCC" "${FLAGS[@]}" -Xptxas -v -DFLEX_HEAD_DIM=$unit -c "$SRC/kernels.cu" -o "$obj/kernels_d$unit.o" \
          > "$dst/ptxas_d$unit.log" 2>&1 || { cat "$dst/ptxas_d$unit.log"; exit 1; } ) &
    fi
    jobs_running=$((jobs_running + 1))
    if (( jobs_running >= 2 )); then wait -n; jobs_running=$((jobs_running - 1)); fi
  done
  while (( jobs_running > 0 )); do wait -n; jobs_running=$((jobs_running - 1)); done
  objs=(); for d in ${DIMS:-64 128 256}; do objs+=("$obj/kernels_d$d.o"); done
  "$NVCC" "${FLAGS[@]}" "${objs[@]}" "$obj/main.o" -o "$obj/decode_harness" -lpthread
  rm -f "$dst/decode_harness" "$dst/decode_harness.xz"
  if [[ "${PACK:-1}" == "1" ]]; then
    xz -T2 -6 -c "$obj/decode_harness" > "$dst/decode_harness.xz"
  else
    cp "$obj/decode_harness" "$dst/decode_harness"
  fi
  echo "built $flavour -> $dst"
done
