// The CPU attention kernel for one query tile of one head: S = Q·Kᵀ and O += P·V with Eigen,
// the JIT-compiled mods on row segments, online softmax in fp32.
//
// Compiled once per instruction set (see runtime/cpu/CMakeLists.txt) with
// -DFLEXJIT_CPU_ISA=<name> and -DEigen=flexjit_eigen_<name>: the namespace rename keeps each
// build's Eigen instantiations distinct, so the linker can never mix AVX-512 code into the
// generic build. Everything else here has internal linkage for the same reason.
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

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bf16_to_float(uint16_t v) { return bits_to_float(static_cast<uint32_t>(v) << 16); }

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (ex == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));
  if (ex != 0) return bits_to_float(sign | ((ex + 112) << 23) | (man << 13));
  // Zero and subnormals: man * 2^-24 is exact in fp32.
  return bits_to_float(float_to_bits(static_cast<float>(man) * 5.9604644775390625e-08f) | sign);
}

// Round to nearest even; NaN stays a (quiet) NaN.
uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Round to nearest even, overflow to inf, subnormal halves included.
uint16_t float_to_half(float f) {
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

float load_elem(const void* base, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::F32: return static_cast<const float*>(base)[i];
    case ElemType::F16: return half_to_float(static_cast<const uint16_t*>(base)[i]);
    case ElemType::BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
  return 0;
}

void store_elem(void* base, ElemType t, int64_t i, float v) {
  switch (t) {
    case ElemType::F32: static_cast<float*>(base)[i] = v; break;
    case ElemType::F16: static_cast<uint16_t*>(base)[i] = float_to_half(v); break;
    case ElemType::BF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(v); break;
  }
}

// Rows [r0, r0 + rows) of head `head` of batch b of a [B, heads, S, d] operand as an fp32
// matrix: mapped in place when it already is fp32 with unit inner stride, else converted
// into buf (rows x d, dense).
ConstMatMap rows_fp32(const Operand& t, ElemType et, int64_t b, int64_t head, int64_t r0, int64_t rows, int64_t d, float* buf) {
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
void exp_shifted(float* s, int64_t n, float mx) {
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

uint32_t run_query_tile(const AttentionJob& J, void* scratch_v, int64_t b, int64_t h, int64_t q_tile) {
  char* scratch = static_cast<char*>(scratch_v);
  const ScratchLayout& L = J.scratch;
  const int64_t M = J.block_m, N = J.block_n, D = J.D, Dv = J.Dv;
  const int64_t q0 = q_tile * M, m = std::min<int64_t>(M, J.Sq - q0);
  const int64_t hkv = h / (J.H / J.Hkv);
  float* sbuf = reinterpret_cast<float*>(scratch + L.s);
  float* row_max = reinterpret_cast<float*>(scratch + L.row_max);
  float* row_sum = reinterpret_cast<float*>(scratch + L.row_sum);
  float* alpha = reinterpret_cast<float*>(scratch + L.alpha);
  uint8_t* keep = reinterpret_cast<uint8_t*>(scratch + L.keep);
  uint8_t* ones = reinterpret_cast<uint8_t*>(scratch + L.ones);
  std::memset(ones, 1, static_cast<size_t>(N));
  auto state = [&](int64_t r) { return static_cast<void*>(scratch + L.state + static_cast<size_t>(r) * J.state_bytes); };

  ConstMatMap Q = rows_fp32(J.q, J.dtype, b, h, q0, m, D, reinterpret_cast<float*>(scratch + L.q));
  MatMap O(reinterpret_cast<float*>(scratch + L.o), m, Dv, Eigen::OuterStride<>(Dv));
  O.setZero();
  for (int64_t r = 0; r < m; ++r) {
    row_max[r] = kNegInf;
    row_sum[r] = 0;
  }

  // Prologue: the row and column stages of the mods, once per query row.
  const ModFunctions* F = J.mods;
  uint32_t errors = 0;
  if (F && J.row_stage)
    for (int64_t r = 0; r < m; ++r) F->row(J.params, b, h, hkv, q0 + r, state(r));
  if (F && J.col_stage)
    for (int64_t r = 0; r < m; ++r) F->col(J.params, b, h, hkv, q0 + r, std::min<int64_t>(N, J.Skv), state(r));

  // Mainloop over chunks of consecutive non-empty KV tiles: block classes, the tile stage and
  // mask_mod work per tile, the products per chunk (up to chunk_n columns), because Eigen
  // packs both operands on every product and wider products amortise that.
  struct TileInChunk {
    int64_t k0, n, col;  // first KV row, width, first column in the chunk
    bool masked;
  };
  constexpr int kMaxTilesPerChunk = 16;
  TileInChunk chunk[kMaxTilesPerChunk];
  const int64_t CN = J.chunk_n;
  const int64_t num_kv_tiles = (J.Skv + N - 1) / N;
  int64_t kt = 0;
  int64_t state_k0 = -1;  // the KV tile whose tile stage the row states hold
  auto tile_stage = [&](int64_t k0) {
    if (!F || !J.tile_stage || state_k0 == k0) return;
    for (int64_t r = 0; r < m; ++r) F->tile(J.params, b, h, hkv, q0 + r, k0, state(r));
    state_k0 = k0;
  };
  while (kt < num_kv_tiles) {
    int count = 0;
    int64_t cols = 0;
    while (kt < num_kv_tiles && count < kMaxTilesPerChunk && cols + N <= CN) {
      uint8_t cls = J.classify ? J.classify(J.classify_ctx, b, h, q_tile, kt) : kTileFull;
      if (cls == kTileEmpty) {
        ++kt;
        if (count) break;  // a gap ends the chunk: its columns must be contiguous
        continue;
      }
      const int64_t k0 = kt * N, n = std::min<int64_t>(N, J.Skv - k0);
      // mask_mod only on partial tiles, before the products: a tile it empties costs nothing more.
      const bool masked = F && cls == kTilePartial && J.has_mask_mod;
      if (masked) {
        tile_stage(k0);
        bool any = false;
        for (int64_t r = 0; r < m; ++r) {
          uint8_t* kr = keep + r * CN + cols;
          errors |= F->mask(J.params, b, h, hkv, q0 + r, k0, n, kr, state(r));
          if (!any) any = std::memchr(kr, 1, static_cast<size_t>(n)) != nullptr;
        }
        if (!any) {
          ++kt;
          if (count) break;
          continue;
        }
      }
      chunk[count++] = TileInChunk{k0, n, cols, masked};
      cols += n;
      ++kt;
      if (n < N) break;  // the last, short tile
    }
    if (!count) continue;
    const int64_t c0 = chunk[0].k0;

    // S = scale * Q @ K^T
    ConstMatMap K = rows_fp32(J.k, J.dtype, b, hkv, c0, cols, D, reinterpret_cast<float*>(scratch + L.k));
    MatMap S(sbuf, m, cols, Eigen::OuterStride<>(CN));
    S.noalias() = Q * K.transpose();
    S *= J.scale;

    // FUSION POINT: score_mod (and the mask of partial tiles: -inf where not kept), per tile.
    for (int i = 0; i < count; ++i) {
      const TileInChunk& t = chunk[i];
      if (!F || !(J.has_score_mod || t.masked)) continue;
      tile_stage(t.k0);  // the row states may hold a later tile's values
      for (int64_t r = 0; r < m; ++r) {
        errors |= F->score(J.params, b, h, hkv, q0 + r, t.k0, t.n, sbuf + r * CN + t.col, t.masked ? keep + r * CN + t.col : ones,
                           state(r));
      }
    }

    // Online softmax: P = exp(S - m_new), l = l * exp(m_old - m_new) + rowsum(P).
    for (int64_t r = 0; r < m; ++r) {
      float* sr = sbuf + r * CN;
      float mx = ConstArrMap(sr, cols).maxCoeff();
      float m_new = std::max(row_max[r], mx);
      if (m_new == kNegInf) {  // nothing attended in this row yet
        alpha[r] = 1;
        std::fill(sr, sr + cols, 0.0f);
        continue;
      }
      alpha[r] = std::exp(row_max[r] - m_new);
      exp_shifted(sr, cols, m_new);
      row_sum[r] = row_sum[r] * alpha[r] + ConstArrMap(sr, cols).sum();
      row_max[r] = m_new;
    }

    // O = diag(alpha) O + P @ V
    ConstMatMap V = rows_fp32(J.v, J.dtype, b, hkv, c0, cols, Dv, reinterpret_cast<float*>(scratch + L.v));
    O.array().colwise() *= ArrMap(alpha, m);
    O.noalias() += S * V;
  }

  // Epilogue: O / l and LSE = m + log(l); rows that attended nothing get O = 0, LSE = -inf.
  for (int64_t r = 0; r < m; ++r) {
    const int64_t qi = q0 + r;
    const float l = row_sum[r];
    const bool empty = l == 0.0f;
    const float inv = empty ? 0.0f : 1.0f / l;
    int64_t base = b * J.o.stride[0] + h * J.o.stride[1] + qi * J.o.stride[2];
    const float* orow = O.data() + r * Dv;
    if (J.dtype == ElemType::F32 && J.o.stride[3] == 1) {
      float* out = static_cast<float*>(J.o.data) + base;
      for (int64_t c = 0; c < Dv; ++c) out[c] = empty ? 0.0f : orow[c] * inv;
    } else {
      for (int64_t c = 0; c < Dv; ++c) store_elem(J.o.data, J.dtype, base + c * J.o.stride[3], empty ? 0.0f : orow[c] * inv);
    }
    if (J.lse) J.lse[b * J.lse_stride[0] + h * J.lse_stride[1] + qi * J.lse_stride[2]] = empty ? kNegInf : row_max[r] + std::log(l);
  }
  return errors;
}

}  // namespace flexjit::cpu::FLEXJIT_CAT(isa_, FLEXJIT_CPU_ISA)
