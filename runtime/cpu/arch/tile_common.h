// Helpers shared by the per-instruction-set tile kernels (arch/*.cpp): fp16 / bf16
// conversion, fp32 views of operand rows and the softmax's exp. Include only from files built
// per instruction set with -DFLEXJIT_CPU_ISA=<name> and -DEigen=flexjit_eigen_<name>:
// everything here has internal linkage inside that build's namespace, so the linker never
// merges code compiled for different instruction sets.
#pragma once
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "runtime/cpu/attention_tile.h"

#ifndef FLEXJIT_CPU_ISA
#error "build this file with -DFLEXJIT_CPU_ISA=generic|avx2|avx512"
#endif
#define FLEXJIT_CAT_(a, b) a##b
#define FLEXJIT_CAT(a, b) FLEXJIT_CAT_(a, b)

namespace flexjit::cpu::FLEXJIT_CAT(isa_, FLEXJIT_CPU_ISA) {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;
using ConstMatMap = Eigen::Map<const RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;
using ArrMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrMap = Eigen::Map<const Eigen::ArrayXf>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t v) { return bits_to_float(static_cast<uint32_t>(v) << 16); }

inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (ex == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));
  if (ex != 0) return bits_to_float(sign | ((ex + 112) << 23) | (man << 13));
  // Zero and subnormals: man * 2^-24 is exact in fp32.
  return bits_to_float(float_to_bits(static_cast<float>(man) * 5.9604644775390625e-08f) | sign);
}

// Round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Round to nearest even, overflow to inf, subnormal halves included.
inline uint16_t float_to_half(float f) {
  uint32_t x = float_to_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // Below the smallest normal half (2^-14): adding 0.5 rounds to a multiple of 2^-24.
    float r = bits_to_float(x) + 0.5f;
    return static_cast<uint16_t>(sign | (float_to_bits(r) - 0x3f000000u));
  }
  x += 0xc8000fffu + ((x >> 13) & 1u);  // rebias the exponent by -112 and round
  return static_cast<uint16_t>(sign | (x >> 13));
}

inline float load_elem(const void* base, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::F32: return static_cast<const float*>(base)[i];
    case ElemType::F16: return half_to_float(static_cast<const uint16_t*>(base)[i]);
    case ElemType::BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
  return 0;
}

inline void store_elem(void* base, ElemType t, int64_t i, float v) {
  switch (t) {
    case ElemType::F32: static_cast<float*>(base)[i] = v; break;
    case ElemType::F16: static_cast<uint16_t*>(base)[i] = float_to_half(v); break;
    case ElemType::BF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(v); break;
  }
}

// Rows [r0, r0 + rows) of head `head` of batch b of a [B, heads, S, d] operand as an fp32
// matrix: mapped in place when it already is fp32 with unit inner stride, else converted
// into buf (rows x d, dense).
inline ConstMatMap rows_fp32(const Operand& t, ElemType et, int64_t b, int64_t head, int64_t r0, int64_t rows, int64_t d, float* buf) {
  const int64_t* st = t.stride;
  int64_t base = b * st[0] + head * st[1] + r0 * st[2];
  if (et == ElemType::F32 && st[3] == 1 && (st[2] >= d || rows == 1))
    return ConstMatMap(static_cast<const float*>(t.data) + base, rows, d, Eigen::OuterStride<>(rows == 1 ? d : st[2]));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t row = base + r * st[2];
    float* out = buf + r * d;
    if (st[3] == 1) {
      switch (et) {
        case ElemType::F32: std::memcpy(out, static_cast<const float*>(t.data) + row, static_cast<size_t>(d) * 4); break;
        case ElemType::F16: {
          const uint16_t* in = static_cast<const uint16_t*>(t.data) + row;
          for (int64_t c = 0; c < d; ++c) out[c] = half_to_float(in[c]);
          break;
        }
        case ElemType::BF16: {
          const uint16_t* in = static_cast<const uint16_t*>(t.data) + row;
          for (int64_t c = 0; c < d; ++c) out[c] = bf16_to_float(in[c]);
          break;
        }
      }
    } else {
      for (int64_t c = 0; c < d; ++c) out[c] = load_elem(t.data, et, row + c * st[3]);
    }
  }
  return ConstMatMap(buf, rows, d, Eigen::OuterStride<>(d));
}

// s[j] = exp(s[j] - mx) for the softmax (so the argument is <= 0): a Cephes-style polynomial
// the compiler vectorises (about 1 ulp above 1e-38), exactly 0 for -inf (masked entries).
// exp(x) = 2^k exp(r) with k = round(x / ln 2), found by the 1.5 * 2^23 rounding trick. The
// argument is clamped at -88, where k = -127 makes the scale 2^k's bit pattern 0, so tiny
// and masked entries come out as exactly 0 without a select on the result. The clamp is a
// separate pass: fused, GCC threads the polynomial into the clamp's branches and, unable to
// speculate floating-point arithmetic under -ftrapping-math, keeps the loop scalar.
inline void exp_shifted(float* s, int64_t n, float mx) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = s[j] - mx;
    s[j] = x < -88.0f ? -88.0f : x;
  }
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr uint32_t kRoundBits = 0x4b400000u;
  for (int64_t j = 0; j < n; ++j) {
    const float x = s[j];
    const float kr = x * 1.44269504088896341f + kRound;
    const float k = kr - kRound;
    float r = x - k * 0.693359375f;
    r = r + k * 2.12194440e-4f;
    const float r2 = r * r;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r2 + r + 1.0f;
    const uint32_t ki = float_to_bits(kr) - kRoundBits;  // k as a two's complement integer
    s[j] = y * bits_to_float((ki + 127u) << 23);
  }
}

}  // namespace

}  // namespace flexjit::cpu::FLEXJIT_CAT(isa_, FLEXJIT_CPU_ISA)
