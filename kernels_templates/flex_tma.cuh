// Hopper (sm_90a) tensor memory access: tile loads by the TMA unit, completed on shared-memory mbarriers.
// The tensor maps come from the host (runtime/tensor_maps.cpp, cuTensorMapEncodeTiled) as __grid_constant__
// kernel parameters; their layout matches flex::SwizzledTile, one TMA box per swizzle region.
#pragma once
#include "flex_params.cuh"

namespace flex {

// An mbarrier expecting `count` arrivals per phase. Initialise from one thread, then fence_mbarrier_init and a
// CTA barrier before any other thread or the TMA unit uses it.
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also tells the barrier to expect `bytes` more bytes from the TMA unit in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Waits until the phase with the given parity (0 for the first phase, then alternating) has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "flex_mbarrier_wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra flex_mbarrier_wait;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Box (c0, c1, c2, c3) of a rank-4 tensor map (innermost coordinate first) into shared memory at dst; the bytes
// complete a transaction on `bar`. Elements outside the tensor's dims arrive as zeros.
__device__ __forceinline__ void tma_load_4d(unsigned dst, const FlexTensorMap* map, unsigned bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Rows [row0, row0 + kRows) of head `head`, batch `batch` of a [B, heads, S, D] tensor into a SwizzledTile: one box
// of [kRows][Tile::kRegionCols] per swizzle region (the map's box; its swizzle mode is the tile's). Rows at or past
// S are zero-filled. The caller has announced Tile::kBytes on `bar`.
template <class Tile>
__device__ __forceinline__ void tma_load_tile(unsigned dst, const FlexTensorMap* map, unsigned bar, int row0, int head, int batch) {
#pragma unroll
  for (int r = 0; r < Tile::kRegions; ++r)
    tma_load_4d(dst + Tile::region_offset(r), map, bar, r * Tile::kRegionCols, row0, head, batch);
}

}  // namespace flex
