// The Hopper forward epilogue: a consumer warpgroup's normalised O and LSE, from registers to global memory.
#pragma once
#include "flex_mods.cuh"
#include "flex_tile_scheduler.cuh"

namespace flex {

template <class Traits>
struct EpilogueSm90 {
  using Element = typename Traits::Element;
  using Layout = FragmentLayout<1, Traits::kDTiles>;
  static constexpr int kHeadDim = Traits::kHeadDim;  // columns past it (a padded tile head dim) are not stored

  // Each thread writes its two rows' columns as packed pairs straight from the accumulators: no shared memory, no
  // barrier, so the warpgroup goes on to its next work tile while the stores drain. warp: the consumer warp.
  __device__ __forceinline__ static void store(const FlexForwardParams& p, const ForwardTiles& w, const float (&o)[1][Traits::kDTiles][4],
                                               const float (&lse)[2], int warp, int lane) {
    Element* g_o = static_cast<Element*>(p.o) + w.b * p.o_stride_b + w.h * p.o_stride_h + w.q_row0 * p.o_stride_s;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = w.m0 + warp * 16 + Layout::row(lane, r);
      if (row < w.seqlen_q) {
        Element* dst = g_o + (long long)row * p.o_stride_s + 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < kHeadDim / 8; ++dt)
          *reinterpret_cast<unsigned*>(dst + dt * 8) = Mma16816<Element>::pack(o[0][dt][2 * r], o[0][dt][2 * r + 1]);
        if (p.lse != nullptr && lane % 4 == 0) p.lse[w.b * p.lse_stride_b + w.h * p.lse_stride_h + w.q_row0 + row] = lse[r];
      }
    }
  }
};

}  // namespace flex
