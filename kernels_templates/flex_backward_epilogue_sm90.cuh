// The Hopper backward's epilogue (flex_backward_sm90.cuh): the CTA's dK and dV rows from the consumers'
// accumulators to global memory.
#pragma once
#include "flex_backward_params.cuh"
#include "flex_mma.cuh"

namespace flex_bwd_sm90 {

// The epilogue: dK = scale * acc_dk and dV = acc_dv, the accumulators of the thread's KV rows kv_r0 and kv_r0 + 8 and
// kCols columns from col0, to global memory (rows past Skv dropped).
template <class Element, int kCols>
__device__ __forceinline__ void store_dk_dv(const FlexBackwardParams& p, const float (&acc_dk)[kCols / 2], const float (&acc_dv)[kCols / 2],
                                            int b, int hkv, int kv_r0, int col0, int t4, int seqlen_kv) {
  using Mma = flex::Mma16816<Element>;
  Element* g_dk = static_cast<Element*>(p.dk) + b * p.dk_stride_b + hkv * p.dk_stride_h;
  Element* g_dv = static_cast<Element*>(p.dv) + b * p.dv_stride_b + hkv * p.dv_stride_h;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int kv = kv_r0 + half * 8;
    if (kv < seqlen_kv) {
#pragma unroll
      for (int i = 0; i < kCols / 8; ++i) {
        const int d = col0 + i * 8 + 2 * t4;
        *reinterpret_cast<unsigned*>(g_dk + kv * p.dk_stride_s + d) =
            Mma::pack(acc_dk[4 * i + 2 * half] * p.scale, acc_dk[4 * i + 2 * half + 1] * p.scale);
        *reinterpret_cast<unsigned*>(g_dv + kv * p.dv_stride_s + d) = Mma::pack(acc_dv[4 * i + 2 * half], acc_dv[4 * i + 2 * half + 1]);
      }
    }
  }
}

}  // namespace flex_bwd_sm90
