// FP8 KV-cache element types and their exact widening to the kernels' 16-bit element types.
#pragma once
#include "flex_mma.cuh"
#include "flex_type_traits.cuh"

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
  static constexpr bool value = IsSame<T, FlexFp8E4M3>::value || IsSame<T, FlexFp8E5M2>::value;
};

// Widening without conversion instructions (so sm_80 runs it too): every e4m3 / e5m2 value, subnormals included,
// is exactly representable in bf16 and f16. Moving a byte's exponent and mantissa bits into place in the wider
// format gives the value times 2^(bias_fp8 - bias_wide) (normals and subnormals alike, since the subnormal scales
// match as well), and one multiply by 2^(bias_wide - bias_fp8) restores it exactly (a power of two, no overflow).
// Bytes whose exponent field is all ones (e4m3 NaN, e5m2 inf/NaN) become finite values on this path (e5m2 to
// f16 excepted, which is a plain byte move; sm_89's e4m3 conversion instruction keeps NaN too): a cache holding
// them is already corrupt.
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

// P @ V of an FP8 cache runs on f16 operands whatever the kernel's element type: every e4m3 / e5m2 value is an
// f16 value, sm_89+ widens two e4m3 bytes in one instruction, e5m2 is a byte move, and P in [0, 1] keeps more bits
// in f16 than in bf16 (only P < 2^-24 of the row's largest term is lost to zero).
template <class Kv, class Element>
struct FlexPvElement {
  using type = Element;
};
template <class Element>
struct FlexPvElement<FlexFp8E4M3, Element> {
  using type = __half;
};
template <class Element>
struct FlexPvElement<FlexFp8E5M2, Element> {
  using type = __half;
};

// Two e4m3 values (the low and high byte of each 16-bit half of w) as f16x2, one register per half.
__device__ __forceinline__ void e4m3x4_to_f16(unsigned w, unsigned& lo, unsigned& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  lo = widen_fp8_pair<FlexFp8E4M3, __half>(fp8_high_bytes(w, 0x1404u));
  hi = widen_fp8_pair<FlexFp8E4M3, __half>(fp8_high_bytes(w, 0x3424u));
#endif
}

// mma fragments straight from FP8 bytes in shared memory (m16n8k16, g = lane / 4, t = lane % 4), read with
// ldmatrix as if they were b16 matrices of 8 rows x 16 bytes, so no widened copy of the tile is ever stored.
//
// K (B operand of Q @ K^T, n = KV row, k = head dim): a plain ldmatrix gives lane (g, t) bytes 4t..4t+3 of row g,
// i.e. head-dim columns 4t..4t+3 of the 16-column block. They become b0 (k = 2t, 2t+1) and b1 (k = 2t+8, 2t+9), so
// the mma's k index runs over the block's columns in the order 0 1 4 5 8 9 12 13 2 3 6 7 10 11 14 15; Q is stored
// in shared memory in that order (fp8_q_order) and the dot products are unchanged.
template <class Fp8, class Element>
__device__ __forceinline__ void fp8_k_fragment(unsigned bytes, unsigned& b0, unsigned& b1) {
  b0 = widen_fp8_pair<Fp8, Element>(fp8_high_bytes(bytes, 0x1404u));  // columns 4t, 4t+1
  b1 = widen_fp8_pair<Fp8, Element>(fp8_high_bytes(bytes, 0x3424u));  // columns 4t+2, 4t+3
}
template <>
__device__ __forceinline__ void fp8_k_fragment<FlexFp8E4M3, __half>(unsigned bytes, unsigned& b0, unsigned& b1) {
  e4m3x4_to_f16(bytes, b0, b1);
}

// V (B operand of P @ V, k = KV row, n = head dim): a transposing ldmatrix gives lane (g, t) the 2-byte units
// (rows 2t and 2t+1, columns 2g..2g+1): bytes V[2t][2g], V[2t][2g+1], V[2t+1][2g], V[2t+1][2g+1]. They are the
// f16 b fragments of two n8 tiles at once: one holding the block's even columns (n = g is column 2g), one its
// odd ones.
template <class Fp8>
__device__ __forceinline__ void fp8_v_fragments(unsigned bytes, unsigned& even, unsigned& odd);
template <>
__device__ __forceinline__ void fp8_v_fragments<FlexFp8E4M3>(unsigned bytes, unsigned& even, unsigned& odd) {
  unsigned w;
  asm("prmt.b32 %0, %1, 0, 0x3120;\n" : "=r"(w) : "r"(bytes));  // V[2t][2g], V[2t+1][2g] | V[2t][2g+1], V[2t+1][2g+1]
  e4m3x4_to_f16(w, even, odd);
}
template <>
__device__ __forceinline__ void fp8_v_fragments<FlexFp8E5M2>(unsigned bytes, unsigned& even, unsigned& odd) {
  even = fp8_high_bytes(bytes, 0x2404u);  // e5m2 is the high byte of an f16
  odd = fp8_high_bytes(bytes, 0x3414u);
}

// Q's 16 columns of one k-step (two 16-byte chunks a, b: column pairs 0..3 and 4..7) in fp8_k_fragment's k order:
// pairs 0 2 4 6, then 1 3 5 7.
__device__ __forceinline__ void fp8_q_order(const uint4& a, const uint4& b, uint4& first, uint4& second) {
  first = make_uint4(a.x, a.z, b.x, b.z);
  second = make_uint4(a.y, a.w, b.y, b.w);
}

}  // namespace flex
