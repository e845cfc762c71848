// FP8 KV-cache element types and their exact widening to the kernels' 16-bit element types.
#pragma once
#include "flex_mma.cuh"

// Storage tags of an FP8 KV cache (one byte per element, OCP FP8 formats): e4m3 (bias 7, no infinities) and e5m2
// (bias 15). Tags rather than cuda_fp8.h's types: the kernels only move and widen the bytes, never compute in FP8.
struct FlexFp8E4M3 {
  unsigned char bits;
};
struct FlexFp8E5M2 {
  unsigned char bits;
};

namespace flex {

template <class T>
struct IsFp8 {
  static constexpr bool value = false;
};
template <>
struct IsFp8<FlexFp8E4M3> {
  static constexpr bool value = true;
};
template <>
struct IsFp8<FlexFp8E5M2> {
  static constexpr bool value = true;
};

// Widening without conversion instructions (so sm_80 runs it too): every e4m3 / e5m2 value, subnormals included,
// is exactly representable in bf16 and f16. Moving a byte's exponent and mantissa bits into place in the wider
// format gives the value times 2^(bias_fp8 - bias_wide) (normals and subnormals alike, since the subnormal scales
// match as well), and one multiply by 2^(bias_wide - bias_fp8) restores it exactly (a power of two, no overflow).
// Bytes whose exponent field is all ones (e4m3 NaN, e5m2 inf/NaN) become finite values on this path (e5m2 to
// f16 excepted, which is a plain byte move): a cache holding them is already corrupt.
//
// fp8_high_bytes(w, selector): two of w's bytes b0, b1 placed in the high byte of each 16-bit half, (b1 << 24) | (b0 << 8).
__device__ __forceinline__ unsigned fp8_high_bytes(unsigned w, unsigned selector) {
  unsigned r;
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(r) : "r"(w), "r"(selector));
  return r;
}
// d = a * b + (-0) per 16-bit half (the -0 addend keeps the sign of zero).
__device__ __forceinline__ unsigned fma_bf16x2(unsigned a, unsigned b) {
  unsigned r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
  return r;
}
__device__ __forceinline__ unsigned fma_f16x2(unsigned a, unsigned b) {
  unsigned r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
  return r;
}

// Two FP8 values (t = their bytes in the high byte of each half) as two Element values, packed.
template <class Fp8, class Element>
__device__ __forceinline__ unsigned widen_fp8_pair(unsigned t);

template <>
__device__ __forceinline__ unsigned widen_fp8_pair<FlexFp8E4M3, __nv_bfloat16>(unsigned t) {
  // s eeee mmm -> bf16 s 0000 eeee mmm 0000 (value * 2^-120), then * 2^120 (bf16 0x7B80).
  return fma_bf16x2((t & 0x80008000u) | ((t >> 4) & 0x07f007f0u), 0x7B807B80u);
}
template <>
__device__ __forceinline__ unsigned widen_fp8_pair<FlexFp8E4M3, __half>(unsigned t) {
  // s eeee mmm -> f16 s 0 eeee mmm 0000000 (value * 2^-8), then * 2^8 (f16 0x5C00).
  return fma_f16x2((t & 0x80008000u) | ((t >> 1) & 0x3f803f80u), 0x5C005C00u);
}
template <>
__device__ __forceinline__ unsigned widen_fp8_pair<FlexFp8E5M2, __nv_bfloat16>(unsigned t) {
  // s eeeee mm -> bf16 s 000 eeeee mm 00000 (value * 2^-112), then * 2^112 (bf16 0x7780).
  return fma_bf16x2((t & 0x80008000u) | ((t >> 3) & 0x0fe00fe0u), 0x77807780u);
}
template <>
__device__ __forceinline__ unsigned widen_fp8_pair<FlexFp8E5M2, __half>(unsigned t) {
  return t;  // e5m2 is the high byte of an f16
}

// 16 FP8 values (one 16-byte chunk) as 16 Element values (two 16-byte chunks), in order.
template <class Fp8, class Element>
__device__ __forceinline__ void widen_fp8_chunk(const uint4& in, uint4& lo, uint4& hi) {
  const unsigned w[4] = {in.x, in.y, in.z, in.w};
  unsigned out[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    out[2 * k] = widen_fp8_pair<Fp8, Element>(fp8_high_bytes(w[k], 0x1404u));      // bytes 0, 1
    out[2 * k + 1] = widen_fp8_pair<Fp8, Element>(fp8_high_bytes(w[k], 0x3424u));  // bytes 2, 3
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

}  // namespace flex
