// The widening pass of a ragged prefill over an FP8 K / V (VarlenArgs): each value times its head's scale, rounded
// once to the kernel's element type, into a workspace copy that the forward kernels then read as usual.
//
// Why a pass instead of FP8 tiles in the forward kernels: a prefill is compute-bound (every KV row meets many query
// rows), so reading the cache once more costs little next to the attention (the pass moves 3 bytes per element; the
// attention does 4 * Sq flops per element), while FP8 operands in the Hopper kernels would need a second set of
// tensor maps, swizzles and wgmma layouts (wgmma takes FP8 only as K-major operands of FP8 products). Decode, which
// is memory-bound, reads FP8 tiles directly (flex_decode.cuh).
#pragma once
#include "flex_fp8.cuh"
#include "flex_fp8_widen_params.cuh"

namespace flex {

__device__ __forceinline__ float2 unpack_pair(unsigned w, __nv_bfloat16) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}
__device__ __forceinline__ float2 unpack_pair(unsigned w, __half) { return __half22float2(*reinterpret_cast<const __half2*>(&w)); }

// Two FP8 values (bytes of w selected as fp8_high_bytes does) as Element values times `scale`: exact widening, then
// one rounding (none when the scale is 1).
template <class Fp8, class Element>
__device__ __forceinline__ unsigned widen_scaled_pair(unsigned w, unsigned selector, float scale) {
  const unsigned exact = widen_fp8_pair<Fp8, Element>(fp8_high_bytes(w, selector));
  if (scale == 1.f) return exact;
  const float2 f = unpack_pair(exact, Element{});
  return Mma16816<Element>::pack(f.x * scale, f.y * scale);
}

}  // namespace flex

// Eight values per thread (one 8-byte load, one 16-byte store), over the whole tensor by a grid-stride loop.
template <class Fp8, class Element>
__device__ __forceinline__ void flex_widen_fp8(const FlexFp8WidenParams& p) {
  const int chunks = p.dim / 8;
  const long long total = p.rows * p.heads * chunks;
  Element* dst = static_cast<Element*>(p.dst);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const int c = static_cast<int>(i % chunks);
    const long long rh = i / chunks;
    const int h = static_cast<int>(rh % p.heads);
    const long long r = rh / p.heads;
    const uint2 w = *reinterpret_cast<const uint2*>(p.src + r * p.src_stride_s + h * p.src_stride_h + 8 * c);
    const float s = p.scale ? p.scale[p.scale_per_head ? h : 0] : 1.f;
    uint4 out;
    out.x = flex::widen_scaled_pair<Fp8, Element>(w.x, 0x1404u, s);
    out.y = flex::widen_scaled_pair<Fp8, Element>(w.x, 0x3424u, s);
    out.z = flex::widen_scaled_pair<Fp8, Element>(w.y, 0x1404u, s);
    out.w = flex::widen_scaled_pair<Fp8, Element>(w.y, 0x3424u, s);
    *reinterpret_cast<uint4*>(dst + (rh * p.dim + 8 * c)) = out;
  }
}
