// The flash-attention forward template (FlashAttention-2 style, mma.sync, sm_80+) that generated variants splice into.
#pragma once
#include "flex_mma.cuh"
#include "flex_params.cuh"
#include "flex_traits.cuh"

// Tile configuration per head dim (the host mirrors this table; a block mask must be built for
// q_tile = kBlockM and kv_tile = kBlockN):
//
//   kHeadDim | kBlockM | kBlockN | kNWarps | rows/warp | shared memory (bytes)
//   ---------+---------+---------+---------+-----------+----------------------
//        32  |   128   |    64   |    4    |    32     |  30720
//        64  |   128   |    64   |    4    |    32     |  55296
//        80  |   128   |    64   |    4    |    32     |  67584
//        96  |   128   |    64   |    4    |    32     |  79872
//       128  |   128   |    64   |    4    |    32     | 104448
//       192  |   128   |    64   |    8    |    16     | 153600
//       256  |   128   |    64   |    8    |    16     | 202752  (needs sm_90's 227 KB; A100 allows 163 KB)
//
// kBlockN is 64 everywhere, so a KV tile never straddles a 64-aligned group (SAM's kv // 64, kv % 64).
//
// Contract with the generated Variant (all members __device__ static __forceinline__):
//   Params (POD, 2nd kernel argument); kHasScoreMod, kHasMaskMod; Row, Col, Tile (hoisted state);
//   row(vp, Row&, b, h, hkv, q)                       once per valid query row (q < Sq)
//   col(vp, Row, Col&, b, h, hkv, q, j)               once per valid row and column j < min(kBlockN, Skv)
//   tile(vp, Row, Tile&, b, h, hkv, q, k0)            once per valid row per visited KV tile with k0 < Skv
//   score_mod(vp, Row, Col, Tile, b, h, hkv, q, k0, j, score) -> float   score = scale * q.k, kv = k0 + j
//   mask_mod (vp, Row, Col, Tile, b, h, hkv, q, k0, j) -> bool           true = attend; partial tiles only
// Optionally (kStagedKvCols, only in variants generated for the 64-row Hopper loop): mask_mod's work that depends on
// the KV column alone (a buffer read at kv, such as a document mask's doc[kv]), computed once per column of a
// partial tile into shared memory instead of once per element, and mask_mod reading it:
//   KvCol (at most 8 bytes); kv_col(vp, KvCol&, b, h, hkv, k0, j)         once per column j with k0 + j < Skv
//   mask_mod_staged(vp, Row, Col, Tile, KvCol, b, h, hkv, q, k0, j) -> bool  the same value as mask_mod
// The variant is only ever called with q < Sq and k0 + j < Skv; other elements are masked here.
//
// What the host must guarantee (the kernel does not check):
//   - q/k/v/o 16-byte aligned, last dim contiguous, every other stride a multiple of 8 elements;
//   - H % Hkv == 0; Sq >= 1 (grid.x > 0); without score_mod, scale > 0 (the row max is taken before scaling);
//   - dynamic shared memory limit raised to Traits::kSmemBytes (all configs exceed 48 KB);
//   - a block mask built with q_tile = kBlockM, kv_tile = kBlockN, num_q_tiles >= grid.x, KV tile indices
//     in [0, ceil(Skv / kBlockN)) (a tile past Skv would only be masked out), each list without repeats.
// Fully masked rows (and query tiles whose lists are empty) produce O = 0 and LSE = -inf.

namespace flex {

// The constant factors a generated variant may split off its score_mod (compiler/codegen/score_scales.h):
// score_mod(s) = kScoreOutScale * score_mod_core(kScoreInScale * s) with kScoreOutScale > 0. Variants without
// them (hand-written ones, and score_mods of another form) keep kSplit = false.
template <class Variant, class = void>
struct ScoreScales {
  static constexpr bool kSplit = false;
  static constexpr float kIn = 1.f, kOut = 1.f;
};
template <class Variant>
struct ScoreScales<Variant, decltype(void(Variant::kScoreOutScale))> {
  static constexpr bool kSplit = true;
  static constexpr float kIn = Variant::kScoreInScale, kOut = Variant::kScoreOutScale;
};

// The range a generated variant declares for its score_mod_core (compiler/codegen/score_scales.h): softcap's tanh
// lies in [-1, 1]. Variants without one keep kBounded = false.
template <class Variant, class = void>
struct ScoreCoreBounds {
  static constexpr bool kBounded = false;
  static constexpr float kMin = 0.f, kMax = 0.f;
};
template <class Variant>
struct ScoreCoreBounds<Variant, decltype(void(Variant::kScoreCoreMax))> {
  static constexpr bool kBounded = true;
  static constexpr float kMin = Variant::kScoreCoreMin, kMax = Variant::kScoreCoreMax;
};
// Element types whose exponent range is fp32's (bf16): a P far below 1 stays a normal number after packing.
template <class Element>
struct HasFp32ExponentRange {
  static constexpr bool value = false;
};
template <>
struct HasFp32ExponentRange<__nv_bfloat16> {
  static constexpr bool value = true;
};

// Whether a variant's mask_mod can read per-column values staged in shared memory (see the contract above).
struct NoKvCol {};
template <class Variant, class = void>
struct StagedKvCols {
  static constexpr bool value = false;
  using KvCol = NoKvCol;
};
template <class Variant>
struct StagedKvCols<Variant, decltype(void(Variant::kStagedKvCols))> {
  static constexpr bool value = Variant::kStagedKvCols;
  using KvCol = typename Variant::KvCol;
};

// Per-thread helpers of one (Traits, Variant) instantiation.
template <class Traits, class Variant>
struct ForwardKernel {
  using Element = typename Traits::Element;
  using VParams = typename Variant::Params;
  using Row = typename Variant::Row;
  using Col = typename Variant::Col;
  using Tile = typename Variant::Tile;
  using KvCol = typename StagedKvCols<Variant>::KvCol;
  using Mma = Mma16816<Element>;

  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kNThreads = Traits::kNThreads;
  static constexpr int kRowsPerWarp = Traits::kRowsPerWarp;
  static constexpr int kMTiles = Traits::kMTiles;
  static constexpr int kNTiles = Traits::kNTiles;
  static constexpr int kDTiles = Traits::kDTiles;
  static constexpr int kRowsPerThread = Traits::kRowsPerThread;
  static constexpr int kColsPerThread = Traits::kColsPerThread;
  static constexpr int kChunksPerRow = Traits::kChunksPerRow;
  static constexpr int kSmemStride = Traits::kSmemStride;

  static __device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

  // With a split score_mod the S tile holds core values: the softmax's exp2 factor and the LSE's unit carry
  // kScoreOutScale (a positive factor leaves the row maximum where it is), and apply_mods multiplies the raw
  // q.k by scale * kScoreInScale once: softcap's three multiplies per element become one.
  using Scales = ScoreScales<Variant>;
  // exp2 factor of an S element: log2(e) per score unit, and the softmax scale when there is no score_mod.
  static __device__ __forceinline__ float exp2_mult(float scale) {
    constexpr float kLog2e = 1.4426950408889634f;
    return Variant::kHasScoreMod ? kLog2e * Scales::kOut : scale * kLog2e;
  }
  // What one unit of an S element is in natural-log score units, for the LSE.
  static __device__ __forceinline__ float score_unit(float scale) { return Variant::kHasScoreMod ? Scales::kOut : scale; }

  // kFixedMax: the core of a split score_mod is bounded (ScoreCoreBounds), so the softmax subtracts the bound
  // kMax instead of each row's running maximum: no max reduction, no shuffles, no rescale of the sums and of O,
  // and each exp2 waits on its own S element only. exp2((x - kMax) * mult) is at least 2^-kFixedMaxRangeLog2,
  // a normal number in fp32 and, with P packed as bf16, in P V's operands too (fp16 P would flush it to 0, so
  // fp16 keeps the running maximum). The range is a compile-time constant: mult is log2(e) * kScoreOutScale.
  using CoreBounds = ScoreCoreBounds<Variant>;
  static constexpr float kFixedMaxRangeLog2 = 100.f;
  static constexpr bool kFixedMax = Scales::kSplit && CoreBounds::kBounded && HasFp32ExponentRange<Element>::value &&
                                    (CoreBounds::kMax - CoreBounds::kMin) * 1.4426950408889634f * Scales::kOut <= kFixedMaxRangeLog2;
  // The row maximum a row starts from: the fixed bound, or -inf (no element yet).
  static __device__ __forceinline__ float initial_row_max() { return kFixedMax ? CoreBounds::kMax : neg_inf(); }

  // Tile row of the thread's accumulator row r (0 <= r < kRowsPerThread): m-tile r/2, half r%2.
  static __device__ __forceinline__ int row_in_tile(int warp, int lane, int r) {
    return warp * kRowsPerWarp + (r / 2) * 16 + (r % 2) * 8 + lane / 4;
  }
  // Tile column of the thread's accumulator column c (0 <= c < kColsPerThread): n8-tile c/2, element c%2.
  static __device__ __forceinline__ int col_in_tile(int lane, int c) { return (c / 2) * 8 + 2 * (lane % 4) + (c % 2); }

  // Async copy of rows [row0, row0 + kRows) of a [S, D] slice into a padded shared tile; rows at or past
  // seqlen are zero-filled without reading global memory.
  // Thread tid copies chunk tid % kChunksPerRow of rows tid / kChunksPerRow + i * kRowsPerPass: one pointer
  // advanced by a fixed step, so no per-chunk addresses stay live across the mainloop. When kNThreads is not
  // a multiple of kChunksPerRow (D = 80, 96, 192) the last few threads idle.
  static constexpr int kRowsPerPass = kNThreads / kChunksPerRow;
  template <int kRows>
  static __device__ __forceinline__ void load_rows(unsigned smem, const Element* g, long long stride_s, int row0,
                                                   int seqlen, int tid) {
    constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
    const int r = tid / kChunksPerRow;
    const int c = tid % kChunksPerRow;
    if (r >= kRowsPerPass) return;
    const Element* src = g + (long long)(row0 + r) * stride_s + c * 8;
    const unsigned dst = smem + (r * kSmemStride + c * 8) * 2;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int row = r + i * kRowsPerPass;
      if (kRows % kRowsPerPass == 0 || row < kRows) {
        const bool valid = row0 + row < seqlen;
        cp_async_16(dst + i * kRowsPerPass * kSmemStride * 2, valid ? src : g, valid);
      }
      src += kRowsPerPass * stride_s;
    }
  }

  // Score modification and masking of one S tile, in place. kPartial: run mask_mod. kCheckBounds: the tile
  // crosses Sq or Skv, so elements outside [0, Sq) x [0, Skv) become -inf without calling the variant.
  template <bool kPartial, bool kCheckBounds>
  static __device__ __forceinline__ void apply_mods(float (&s)[kMTiles][kNTiles][4], const VParams& vp,
                                                    const Row (&row)[kRowsPerThread],
                                                    const Col (&col)[kRowsPerThread][kColsPerThread],
                                                    const Tile (&tile)[kRowsPerThread], int b, int h, int hkv,
                                                    int m0, int warp, int lane, int k0, int seqlen_q,
                                                    int seqlen_kv, float scale, const KvCol* kv_cols = nullptr) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = mt * 2 + e / 2;
          const int c = nt * 2 + e % 2;
          const int q = m0 + row_in_tile(warp, lane, r);
          const int j = col_in_tile(lane, c);
          float x = s[mt][nt][e];
          bool in_range = true;
          if constexpr (kCheckBounds) in_range = q < seqlen_q && k0 + j < seqlen_kv;
          if (in_range) {
            if constexpr (Variant::kHasScoreMod) {
              // FUSION POINT: score_mod
              if constexpr (Scales::kSplit)
                x = Variant::score_mod_core(vp, row[r], col[r][c], tile[r], b, h, hkv, q, k0, j, x * (scale * Scales::kIn));
              else
                x = Variant::score_mod(vp, row[r], col[r][c], tile[r], b, h, hkv, q, k0, j, x * scale);
            }
            if constexpr (kPartial) {
              // FUSION POINT: mask_mod
              if constexpr (StagedKvCols<Variant>::value) {
                if (!Variant::mask_mod_staged(vp, row[r], col[r][c], tile[r], kv_cols[j], b, h, hkv, q, k0, j)) x = neg_inf();
              } else {
                if (!Variant::mask_mod(vp, row[r], col[r][c], tile[r], b, h, hkv, q, k0, j)) x = neg_inf();
              }
            }
          } else {
            x = neg_inf();
          }
          s[mt][nt][e] = x;
        }
      }
    }
  }

  // Online softmax, base 2:  m' = max(m, rowmax(S));  P = exp2((S - m') * mult);
  //                          l' = l * exp2((m - m') * mult) + rowsum(P);  O' = O * exp2((m - m') * mult)
  // This step takes the new row maxima and rescales l; the caller rescales O by alpha when the warp-wide
  // result is true, then exponentiates with exp_pack.
  // Lazy rescaling: a row keeps its stale max m unless the tile's max exceeds it by more than
  // kRescaleLog2 in exp2 units, so P <= 2^kRescaleLog2 (harmless in fp32 sums and in bf16/fp16 P) and the
  // O *= alpha pass runs only when some row of the warp jumped. The final O / l and LSE use the same m,
  // so the result is unchanged. A row with every element -inf so far keeps m = -inf and subtracts 0,
  // so P = exp2(-inf) = 0 instead of NaN from (-inf) - (-inf).
  static __device__ __forceinline__ bool softmax_rescale(const float (&s)[kMTiles][kNTiles][4], float (&row_max)[kRowsPerThread],
                                                         float (&row_sum)[kRowsPerThread], float mult,
                                                         float (&max_scaled)[kRowsPerThread], float (&alpha)[kRowsPerThread]) {
    if constexpr (kFixedMax) {
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        max_scaled[r] = CoreBounds::kMax * mult;
        alpha[r] = 1.f;
      }
      return false;
    }
    constexpr float kRescaleLog2 = 8.f;
    bool rescale = false;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 2 + half;
        float t[kNTiles];  // tree reduction: depth log2(kNTiles) instead of a kNTiles-long dependency chain
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) t[nt] = fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]);
#pragma unroll
        for (int stride = 1; stride < kNTiles; stride *= 2)
#pragma unroll
          for (int i = 0; i + stride < kNTiles; i += 2 * stride) t[i] = fmaxf(t[i], t[i + stride]);
        const float mx = flex::quad_max(fmaxf(row_max[r], t[0]));
        // (mx - m) * mult is +inf when m = -inf < mx, NaN (false) when both are -inf.
        const bool jump = (mx - row_max[r]) * mult > kRescaleLog2;
        const float m_new = jump ? mx : row_max[r];
        // 0 while the row has no max, and also where a finite max scales past the fp32 range (scores near -3.4e38,
        // e.g. the lowest bf16 used as a mask value): every element so far then scales to -inf as well, and 0 keeps
        // alpha = ex2(-inf - max_scaled) at 0 instead of NaN. A row whose every score is that low ends as fully masked.
        const float scaled = m_new * mult;
        max_scaled[r] = scaled == neg_inf() ? 0.f : scaled;
        alpha[r] = flex::ex2(row_max[r] * mult - max_scaled[r]);
        row_max[r] = m_new;
        row_sum[r] *= alpha[r];
        rescale |= jump;
      }
    }
    return rescale;
  }

  // P for the 16 columns kk of m-tile mt: exponentials, row sums, and the packed 16x16 A fragment of P @ V
  // (two n8 accumulator tiles of S form one A fragment).
  // kFmaShare: one exponential in four (second n8 tile of the even k-steps) on the FMA pipe (flex::ex2_fma)
  // instead of the MUFU unit. The Hopper loop at D = 128 uses it (H100: full attention 446 -> 465 TFLOP/s,
  // softcap 357 -> 369, causal and documents unchanged); at D = 64 it made full attention 6% slower.
  // With kFixedMax one in two (the second n8 tile of every k-step): softcap's tanh is a second MUFU op per
  // element, and once no row maximum holds the exponentials back MUFU is what they wait on (softcap D128
  // 1.387 -> 1.330 ms, 24 interleaved rounds). Before the fixed maximum, one in two was slower than one in four.
  template <bool kFmaShare = false>
  static __device__ __forceinline__ void exp_pack(const float (&s)[kMTiles][kNTiles][4], int mt, int kk, float mult,
                                                  const float (&max_scaled)[kRowsPerThread], float (&row_sum)[kRowsPerThread],
                                                  unsigned (&pa)[4]) {
    float pr[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = fmaf(s[mt][2 * kk + i][e], mult, -max_scaled[mt * 2 + e / 2]);
        pr[i][e] = kFmaShare && i == 1 && (kFixedMax || kk % 2 == 0) ? flex::ex2_fma(x) : flex::ex2(x);
      }
    row_sum[mt * 2] += (pr[0][0] + pr[0][1]) + (pr[1][0] + pr[1][1]);
    row_sum[mt * 2 + 1] += (pr[0][2] + pr[0][3]) + (pr[1][2] + pr[1][3]);
    pa[0] = Mma::pack(pr[0][0], pr[0][1]);
    pa[1] = Mma::pack(pr[0][2], pr[0][3]);
    pa[2] = Mma::pack(pr[1][0], pr[1][1]);
    pa[3] = Mma::pack(pr[1][2], pr[1][3]);
  }

  // O = O / l;  LSE = max * score_unit + ln(l). A fully masked row has l = 0: O = 0 and LSE = -inf.
  static __device__ __forceinline__ void normalize(float (&acc_o)[kMTiles][kDTiles][4], const float (&row_max)[kRowsPerThread],
                                                   const float (&row_sum)[kRowsPerThread], float score_unit,
                                                   float (&lse)[kRowsPerThread]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 2 + half;
        const float l = flex::quad_sum(row_sum[r]);
        const bool empty = !(l > 0.f);
        const float inv = empty ? 0.f : 1.f / l;
        lse[r] = empty ? neg_inf() : row_max[r] * score_unit + logf(l);
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          acc_o[mt][dt][2 * half] *= inv;
          acc_o[mt][dt][2 * half + 1] *= inv;
        }
      }
    }
  }

  // Writes the normalised O tile (staged through shared memory `stage`, at least kBlockM x kSmemStride
  // elements and free of other readers, so the global stores are 16-byte and row-contiguous) and the LSE.
  // Every thread of the CTA calls it; it synchronises.
  // kFixedOffsets: each thread addresses its shared and global stores from one base pointer with compile-time
  // offsets. The per-element form computes (row * stride + col) / 2 on signed ints, three integer instructions per
  // 4-byte store, and 16 per global store; the fixed offsets took 2.6% off the document mask's 64-row loop,
  // whose CTAs are short. The 128-row loop keeps the per-element form: with the fixed offsets ptxas scheduled its
  // main loop differently and causal ran 1.3-1.5% slower (two interleaved runs).
  template <bool kFixedOffsets = false>
  static __device__ __forceinline__ void store_o_lse(const FlexForwardParams& p, unsigned char* stage,
                                                     const float (&acc_o)[kMTiles][kDTiles][4], const float (&lse)[kRowsPerThread],
                                                     int b, int h, int m0, int seqlen_q, long long o_row0, int tid, int warp, int lane) {
    if constexpr (kFixedOffsets) {
      unsigned* s_o = reinterpret_cast<unsigned*>(stage) + (row_in_tile(warp, lane, 0) * kSmemStride + 2 * (lane % 4)) / 2;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt)
            s_o[((mt * 16 + half * 8) * kSmemStride + dt * 8) / 2] = Mma::pack(acc_o[mt][dt][2 * half], acc_o[mt][dt][2 * half + 1]);
        }
      }
      __syncthreads();
      // Thread tid copies chunk tid % kChunksPerRow of rows tid / kChunksPerRow + i * kRowsPerPass, as load_rows.
      constexpr int kPasses = (kBlockM + kRowsPerPass - 1) / kRowsPerPass;
      const int copy_row = tid / kChunksPerRow;
      const int c = tid % kChunksPerRow;
      if (copy_row < kRowsPerPass) {
        const unsigned char* src = stage + (copy_row * kSmemStride + c * 8) * 2;
        Element* dst = static_cast<Element*>(p.o) + b * p.o_stride_b + h * p.o_stride_h + (o_row0 + m0 + copy_row) * p.o_stride_s + c * 8;
        const long long step = kRowsPerPass * p.o_stride_s;
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
          const int row = copy_row + i * kRowsPerPass;
          if ((kBlockM % kRowsPerPass == 0 || row < kBlockM) && m0 + row < seqlen_q)
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src + i * kRowsPerPass * kSmemStride * 2);
          dst += step;
        }
      }
    } else {
      unsigned* s_o = reinterpret_cast<unsigned*>(stage);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = row_in_tile(warp, lane, mt * 2 + half);
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            const int col = dt * 8 + 2 * (lane % 4);
            s_o[(row * kSmemStride + col) / 2] = Mma::pack(acc_o[mt][dt][2 * half], acc_o[mt][dt][2 * half + 1]);
          }
        }
      }
      __syncthreads();
      Element* g_o = static_cast<Element*>(p.o) + b * p.o_stride_b + h * p.o_stride_h + o_row0 * p.o_stride_s;
#pragma unroll
      for (int i = 0; i < kBlockM * kChunksPerRow / kNThreads; ++i) {
        const int chunk = tid + i * kNThreads;
        const int row = chunk / kChunksPerRow;
        const int c = chunk % kChunksPerRow;
        if (m0 + row < seqlen_q) {
          const uint4 val = *reinterpret_cast<const uint4*>(stage + (row * kSmemStride + c * 8) * 2);
          *reinterpret_cast<uint4*>(g_o + (long long)(m0 + row) * p.o_stride_s + c * 8) = val;
        }
      }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
      float* g_lse = p.lse + b * p.lse_stride_b + h * p.lse_stride_h + o_row0;
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int q = m0 + row_in_tile(warp, lane, r);
        if (q < seqlen_q) g_lse[q] = lse[r];
      }
    }
  }

  // Hoisted variant state of the thread's rows and tile columns (Row per query row, Col per row and column).
  // kClampRows: rows past Sq take the state of row Sq - 1 instead of none (hoist_tile_clamped reads it).
  template <bool kClampRows = false>
  static __device__ __forceinline__ void hoist_rows(const VParams& vp, Row (&row_st)[kRowsPerThread],
                                                    Col (&col_st)[kRowsPerThread][kColsPerThread], int b, int h, int hkv, int m0,
                                                    int warp, int lane, int seqlen_q, int seqlen_kv) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int q = kClampRows ? min(m0 + row_in_tile(warp, lane, r), seqlen_q - 1) : m0 + row_in_tile(warp, lane, r);
      if (q < seqlen_q) {
        Variant::row(vp, row_st[r], b, h, hkv, q);
#pragma unroll
        for (int c = 0; c < kColsPerThread; ++c) {
          const int j = col_in_tile(lane, c);
          if (j < seqlen_kv) Variant::col(vp, row_st[r], col_st[r][c], b, h, hkv, q, j);
        }
      }
    }
  }

  // Per-tile variant state (Tile) of the thread's rows for the KV tile at k0.
  static __device__ __forceinline__ void hoist_tile(const VParams& vp, const Row (&row_st)[kRowsPerThread], Tile (&tile_st)[kRowsPerThread],
                                                    int b, int h, int hkv, int m0, int k0, int warp, int lane, int seqlen_q,
                                                    int seqlen_kv) {
    if (k0 < seqlen_kv) {
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int q = m0 + row_in_tile(warp, lane, r);
        if (q < seqlen_q) Variant::tile(vp, row_st[r], tile_st[r], b, h, hkv, q, k0);
      }
    }
  }

  // hoist_tile without a branch, for a visited KV tile (k0 < Skv): rows past Sq compute row Sq - 1's state (the
  // row states must come from hoist_rows<true>). With no branch to merge at, the compiler can schedule the loads'
  // consumers (a bf16 widening) after later work instead of right behind the loads.
  static __device__ __forceinline__ void hoist_tile_clamped(const VParams& vp, const Row (&row_st)[kRowsPerThread],
                                                            Tile (&tile_st)[kRowsPerThread], int b, int h, int hkv, int m0, int k0,
                                                            int warp, int lane, int seqlen_q) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r)
      Variant::tile(vp, row_st[r], tile_st[r], b, h, hkv, min(m0 + row_in_tile(warp, lane, r), seqlen_q - 1), k0);
  }

  // score_mod and mask_mod of one S tile, choosing the instantiation: mask_mod on the masked (partial)
  // tiles only, bounds checks only on tiles that cross Sq or Skv, nothing at all on interior full tiles
  // without a score_mod.
  static __device__ __forceinline__ void mods(float (&s)[kMTiles][kNTiles][4], bool masked_tile, bool check_bounds, const VParams& vp,
                                              const Row (&row)[kRowsPerThread], const Col (&col)[kRowsPerThread][kColsPerThread],
                                              const Tile (&tile)[kRowsPerThread], int b, int h, int hkv, int m0, int warp, int lane,
                                              int k0, int seqlen_q, int seqlen_kv, float scale, const KvCol* kv_cols = nullptr) {
    if constexpr (Variant::kHasMaskMod) {
      if (masked_tile) {
        if (check_bounds)
          apply_mods</*kPartial=*/true, /*kCheckBounds=*/true>(s, vp, row, col, tile, b, h, hkv, m0, warp, lane, k0, seqlen_q, seqlen_kv,
                                                               scale, kv_cols);
        else
          apply_mods</*kPartial=*/true, /*kCheckBounds=*/false>(s, vp, row, col, tile, b, h, hkv, m0, warp, lane, k0, seqlen_q, seqlen_kv,
                                                                scale, kv_cols);
        return;
      }
    }
    if (check_bounds)
      apply_mods</*kPartial=*/false, /*kCheckBounds=*/true>(s, vp, row, col, tile, b, h, hkv, m0, warp, lane, k0, seqlen_q, seqlen_kv,
                                                            scale, kv_cols);
    else if (Variant::kHasScoreMod)
      apply_mods</*kPartial=*/false, /*kCheckBounds=*/false>(s, vp, row, col, tile, b, h, hkv, m0, warp, lane, k0, seqlen_q, seqlen_kv,
                                                             scale, kv_cols);
  }
};

// The work of one forward CTA: its (b, h, query tile), sequence lengths, row offsets of a ragged batch, and
// the KV tiles to visit in order (partial tiles, which run mask_mod, first; then full ones).
struct ForwardTiles {
  int b, h, hkv, m_block, m0, seqlen_q, seqlen_kv;
  long long q_row0, kv_row0;  // first row of this sequence in packed (ragged) tensors; 0 when dense
  const int* partial_idx;
  const int* full_idx;
  int n_partial, n_full;
  int first_kv = -1;  // at(0) when the ranked order carried it (from FlexQTileWork::first_kv_row), else -1
  // KV rows the listed tiles are shifted by (a ranked mask built with shift_kv_tiles; FlexQTileWork): tile t covers
  // rows [t kBlockN + kv_shift, ...). Only the 64-row Hopper loop's masks are shifted; other loops read 0 here.
  int kv_shift = 0;
  __device__ __forceinline__ int count() const { return n_partial + n_full; }
  __device__ __forceinline__ int at(int t) const {
    if (t < n_partial) return partial_idx != nullptr ? partial_idx[t] : t;
    return full_idx != nullptr ? full_idx[t - n_partial] : t - n_partial;
  }
  __device__ __forceinline__ int first() const { return first_kv >= 0 ? first_kv : at(0); }
};

// The sequence geometry of w's (b, h, query tile); false when a ragged batch's tile lies past its sequence's end.
// kMhaShortcut (ranked_work): skip the two runtime divisions of the KV head when there is no GQA. The ranked
// 64-row CTAs are short, so their prologue counts; the other loops keep the divisions, so their kernels stay the
// PTX that was measured (ptxas rescheduled the 128-row loop after small prologue and epilogue changes before).
template <int kBlockM, bool kVarlen, bool kMhaShortcut = false>
__device__ __forceinline__ bool item_geometry(const FlexForwardParams& p, ForwardTiles& w) {
  w.hkv = kMhaShortcut && p.heads == p.kv_heads ? w.h : w.h / (p.heads / p.kv_heads);
  w.m0 = w.m_block * kBlockM;
  w.seqlen_q = p.seqlen_q;
  w.seqlen_kv = p.seqlen_kv;
  w.q_row0 = 0;
  w.kv_row0 = 0;
  if constexpr (kVarlen) {
    w.q_row0 = p.cu_seqlens_q[w.b];
    w.kv_row0 = p.cu_seqlens_kv[w.b];
    w.seqlen_q = p.cu_seqlens_q[w.b + 1] - (int)w.q_row0;
    w.seqlen_kv = p.cu_seqlens_kv[w.b + 1] - (int)w.kv_row0;
    if (w.m0 >= w.seqlen_q) return false;
  }
  return true;
}

// The KV tile lists of w's (b, h, query tile) from the block mask; without one, every tile (partial when the
// variant has a mask_mod; without a mask_mod a "partial" tile needs no masking, so every tile is full).
template <int kBlockN, bool kHasMaskMod>
__device__ __forceinline__ void item_lists(const FlexForwardParams& p, ForwardTiles& w) {
  const FlexBlockMask& bm = p.block_mask;
  w.partial_idx = nullptr;
  w.full_idx = nullptr;
  w.n_partial = 0;
  w.n_full = 0;
  if (bm.kv_num_partial != nullptr || bm.kv_num_full != nullptr) {
    const long long off = w.b * bm.stride_b + w.h * bm.stride_h + w.m_block;
    if (bm.kv_num_partial != nullptr) {
      w.n_partial = bm.kv_num_partial[off];
      w.partial_idx = bm.kv_partial_idx + off * bm.max_kv_tiles;
    }
    if (bm.kv_num_full != nullptr) {
      w.n_full = bm.kv_num_full[off];
      w.full_idx = bm.kv_full_idx + off * bm.max_kv_tiles;
    }
  } else {
    const int n_blocks = (w.seqlen_kv + kBlockN - 1) / kBlockN;
    if (kHasMaskMod) w.n_partial = n_blocks;
    else w.n_full = n_blocks;
  }
}

// The work of a ranked launch's CTA (kRankTiles: data-dependent masks, whose query tiles carry irregular amounts
// of work): heaviest query tiles first, so that the last wave holds the lightest ones (CTAs start roughly in
// linear block order). The CTA at position `lin` of its batch computes the query tile of rank lin / heads-in-group,
// the ranks coming from the block mask's q_order (FlexQTileWork, one load; a mask built without one, by another
// spec's builder, falls back to the reversed tile index). Heads are interleaved in groups of kHeadGroup, so the
// heaviest tiles of 8 heads all start before the lighter ones while the K/V working set in L2 stays near 8 heads
// (as in head-major order); for document masks this removes most of the last-wave tail.
// Only data-dependent masks take it (the generator decides): the ranking compiled into the kernels of full
// attention and softcap cost them 7% (register allocation), and causal-like masks get the heavy-first order from
// the reversed tile index anyway.
template <int kBlockM, int kBlockN, bool kHasMaskMod>
__device__ __forceinline__ void ranked_work(const FlexForwardParams& p, ForwardTiles& w) {
  constexpr int kHeadGroup = 8;
  // lin = blockIdx.x + nq blockIdx.y; its group lin / (nq kHeadGroup) is blockIdx.y / kHeadGroup, since
  // blockIdx.x < nq: no division by a launch value, and a full group divides by the constant.
  const int nq = gridDim.x;
  const int group = blockIdx.y / kHeadGroup;
  const int group_heads = min(kHeadGroup, p.heads - group * kHeadGroup);
  const int i = blockIdx.x + nq * (blockIdx.y % kHeadGroup);
  const int rank = group_heads == kHeadGroup ? i / kHeadGroup : i / group_heads;
  w.b = blockIdx.z;
  w.h = group * kHeadGroup + (group_heads == kHeadGroup ? i % kHeadGroup : i % group_heads);
  const FlexBlockMask& bm = p.block_mask;
  if (bm.q_order != nullptr) {
    const long long row = w.b * bm.stride_b + w.h * bm.stride_h;
    const int4 e = __ldg(reinterpret_cast<const int4*>(bm.q_order + row + rank));
    w.m_block = e.x;
    w.n_partial = e.y;
    w.n_full = e.z;
    w.first_kv = e.w >= 0 ? e.w / kBlockN : -1;
    w.kv_shift = e.w >= 0 ? e.w % kBlockN : 0;
    w.partial_idx = bm.kv_partial_idx + (row + w.m_block) * bm.max_kv_tiles;
    w.full_idx = bm.kv_full_idx + (row + w.m_block) * bm.max_kv_tiles;
    item_geometry<kBlockM, false, true>(p, w);
  } else {
    w.m_block = nq - 1 - rank;
    item_geometry<kBlockM, false, true>(p, w);
    item_lists<kBlockN, kHasMaskMod>(p, w);
  }
}

// Fills the CTA's work (grid (nq, H, B)). Returns false when a ragged batch's CTA lies past its
// sequence's end.
template <int kBlockM, int kBlockN, bool kHasMaskMod, bool kVarlen, bool kRankTiles>
__device__ __forceinline__ bool forward_tiles(const FlexForwardParams& p, ForwardTiles& w) {
  if constexpr (kRankTiles && !kVarlen) {
    ranked_work<kBlockM, kBlockN, kHasMaskMod>(p, w);
    return true;
  } else {
    // Heaviest query tiles (most KV tiles under causal-like masks) first: they start in the first wave.
    w.b = blockIdx.z;
    w.m_block = gridDim.x - 1 - blockIdx.x;
    w.h = blockIdx.y;
    if (!item_geometry<kBlockM, kVarlen>(p, w)) return false;
    item_lists<kBlockN, kHasMaskMod>(p, w);
    return true;
  }
}

}  // namespace flex

// One CTA computes O and LSE for kBlockM query rows of one (b, h). grid = (ceil(Sq / kBlockM), H, B),
// block = Traits::kNThreads, dynamic shared memory = Traits::kSmemBytes.
// kVarlen: the ragged-batch instantiation (p.cu_seqlens_q / p.cu_seqlens_kv, see flex_params.cuh). It is a
// separate instantiation because per-sequence lengths held in registers cost the dense path 15% (causal D128
// spilled): without it, Sq and Skv stay in the constant bank and the dense code is unchanged.
// kRankTiles: order CTAs by the block mask's per-tile work (flex::ranked_work); dense launches only.
template <class Traits, class Variant, bool kVarlen = false, bool kRankTiles = false>
__device__ __forceinline__ void flex_forward(const FlexForwardParams& p, const typename Variant::Params& vp) {
  using K = flex::ForwardKernel<Traits, Variant>;
  using Element = typename Traits::Element;
  using Mma = typename K::Mma;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kMTiles = Traits::kMTiles;
  constexpr int kNTiles = Traits::kNTiles;
  constexpr int kDTiles = Traits::kDTiles;
  constexpr int kRowsPerThread = Traits::kRowsPerThread;
  constexpr int kColsPerThread = Traits::kColsPerThread;
  constexpr int kSmemStride = Traits::kSmemStride;

  extern __shared__ __align__(128) unsigned char flex_smem[];

  // ============================================ Prologue ============================================
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  flex::ForwardTiles w;
  if (!flex::forward_tiles<kBlockM, kBlockN, Variant::kHasMaskMod, kVarlen, kRankTiles>(p, w))
    return;
  const int b = w.b, h = w.h, hkv = w.hkv, m0 = w.m0;
  const int seqlen_q = w.seqlen_q, seqlen_kv = w.seqlen_kv;

  const Element* g_q = static_cast<const Element*>(p.q) + b * p.q_stride_b + h * p.q_stride_h + w.q_row0 * p.q_stride_s;
  const Element* g_k = static_cast<const Element*>(p.k) + b * p.k_stride_b + hkv * p.k_stride_h + w.kv_row0 * p.k_stride_s;
  const Element* g_v = static_cast<const Element*>(p.v) + b * p.v_stride_b + hkv * p.v_stride_h + w.kv_row0 * p.v_stride_s;

  // Shared memory: Q [kBlockM][kSmemStride], then K[stage], V[stage] [kBlockN][kSmemStride] each.
  const unsigned s_q = flex::smem_addr(flex_smem);
  const unsigned s_k = s_q + Traits::kSmemQElems * 2;
  const unsigned s_v = s_k + Traits::kStages * Traits::kSmemKVElems * 2;
  constexpr unsigned kStageBytes = Traits::kSmemKVElems * 2;

  const int n_masked = w.n_partial;
  const int n_tiles = w.count();

  // Q and the first two K/V tiles in flight: group 0 = {Q, K0, V0}, group 1 = {K1, V1} (possibly empty).
  int idx_cur = n_tiles > 0 ? w.at(0) : 0;
  int idx_next = n_tiles > 1 ? w.at(1) : 0;
  K::template load_rows<kBlockM>(s_q, g_q, p.q_stride_s, m0, seqlen_q, tid);
  if (n_tiles > 0) {
    K::template load_rows<kBlockN>(s_k, g_k, p.k_stride_s, idx_cur * kBlockN, seqlen_kv, tid);
    K::template load_rows<kBlockN>(s_v, g_v, p.v_stride_s, idx_cur * kBlockN, seqlen_kv, tid);
  }
  flex::cp_async_commit();
  if (n_tiles > 1) {
    K::template load_rows<kBlockN>(s_k + kStageBytes, g_k, p.k_stride_s, idx_next * kBlockN, seqlen_kv, tid);
    K::template load_rows<kBlockN>(s_v + kStageBytes, g_v, p.v_stride_s, idx_next * kBlockN, seqlen_kv, tid);
  }
  flex::cp_async_commit();

  // Hoisted variant state, while the copies fly.
  typename Variant::Row row_st[kRowsPerThread];
  typename Variant::Col col_st[kRowsPerThread][kColsPerThread];
  K::hoist_rows(vp, row_st, col_st, b, h, hkv, m0, warp, lane, seqlen_q, seqlen_kv);

  // Per-lane ldmatrix byte offsets (see flex_mma.cuh for the fragment layouts).
  //   Q (A, 16x16): matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) -> a0..a3.
  //   K (B of S, non-trans): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
  //   V (B of O, trans):     matrices (kv 0-7, d 0-7), (kv 8-15, d 0-7), (kv 0-7, d 8-15), (kv 8-15, d 8-15).
  const int l8 = lane % 8;
  const int lm = lane / 8;
  const unsigned q_lane =
      s_q + ((warp * Traits::kRowsPerWarp + (lm & 1) * 8 + l8) * kSmemStride + (lm >> 1) * 8) * 2;
  const unsigned k_lane = ((((lm >> 1) * 8 + l8) * kSmemStride) + (lm & 1) * 8) * 2;
  const unsigned v_lane = ((((lm & 1) * 8 + l8) * kSmemStride) + (lm >> 1) * 8) * 2;

  float acc_o[kMTiles][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
  // Running row max (in the units the max is taken in: raw q.k without score_mod, modified score with it)
  // and this thread's part of the running row sum of exp2((x - max) * mult).
  float row_max[kRowsPerThread];
  float row_sum[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    row_max[r] = K::initial_row_max();
    row_sum[r] = 0.f;
  }
  // exp(score - max) = exp2((x - max) * mult): without score_mod x = q.k and score = scale * x, so the scale
  // folds into the same FFMA as log2(e).
  const float mult = K::exp2_mult(p.scale);
  const bool q_tail = m0 + kBlockM > seqlen_q;

  // ============================================ Mainloop ============================================
  for (int it = 0; it < n_tiles; ++it) {
    const unsigned stage_off = (it & 1) * kStageBytes;
    const int idx_pf = it + 2 < n_tiles ? w.at(it + 2) : 0;  // read early: latency hides behind the GEMMs
    const int k0 = idx_cur * kBlockN;

    typename Variant::Tile tile_st[kRowsPerThread];
    K::hoist_tile(vp, row_st, tile_st, b, h, hkv, m0, k0, warp, lane, seqlen_q, seqlen_kv);

    flex::cp_async_wait<1>();  // this tile's K and V have landed (the next tile's may still fly)
    __syncthreads();

    // S = Q @ K^T   (per warp: [kRowsPerWarp x kBlockN], fp32)
    float acc_s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
    const unsigned k_base = s_k + stage_off + k_lane;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      unsigned a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) flex::ldmatrix_x4(a[mt], q_lane + (mt * 16 * kSmemStride + kk * 16) * 2);
#pragma unroll
      for (int np = 0; np < kBlockN / 16; ++np) {
        unsigned bk[4];
        flex::ldmatrix_x4(bk, k_base + (np * 16 * kSmemStride + kk * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma::run(acc_s[mt][2 * np], a[mt], bk[0], bk[1]);
          Mma::run(acc_s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    // S = mask(score_mod(scale * S)); -inf outside [0, Sq) x [0, Skv)
    // (K::mods dispatches the same way; calling it here instead costs this loop 40-130 bytes of extra spills
    // under ptxas's register allocation, measured on the harness variants.)
    const bool check_bounds = q_tail || k0 + kBlockN > seqlen_kv;
    bool masked_tile = false;
    if constexpr (Variant::kHasMaskMod) {
      masked_tile = it < n_masked;
      if (masked_tile) {
        if (check_bounds)
          K::template apply_mods</*kPartial=*/true, /*kCheckBounds=*/true>(acc_s, vp, row_st, col_st, tile_st, b, h, hkv, m0, warp, lane,
                                                                            k0, seqlen_q, seqlen_kv, p.scale);
        else
          K::template apply_mods</*kPartial=*/true, /*kCheckBounds=*/false>(acc_s, vp, row_st, col_st, tile_st, b, h, hkv, m0, warp, lane,
                                                                             k0, seqlen_q, seqlen_kv, p.scale);
      }
    }
    if (!masked_tile) {
      if (check_bounds)
        K::template apply_mods</*kPartial=*/false, /*kCheckBounds=*/true>(acc_s, vp, row_st, col_st, tile_st, b, h, hkv, m0, warp, lane,
                                                                           k0, seqlen_q, seqlen_kv, p.scale);
      else if (Variant::kHasScoreMod)
        K::template apply_mods</*kPartial=*/false, /*kCheckBounds=*/false>(acc_s, vp, row_st, col_st, tile_st, b, h, hkv, m0, warp, lane,
                                                                            k0, seqlen_q, seqlen_kv, p.scale);
    }

    float alpha[kRowsPerThread];
    float max_scaled[kRowsPerThread];
    const bool rescale = K::softmax_rescale(acc_s, row_max, row_sum, mult, max_scaled, alpha);
    // Rows that did not jump have alpha = 1 exactly (or O = 0 while still empty), so the skip is exact.
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] *= alpha[mt * 2 + e / 2];
    }

    // O += P @ V, 16 columns of P at a time: P stays in registers, and the exponentials of one chunk
    // overlap the mmas of the previous one.
    const unsigned v_base = s_v + stage_off + v_lane;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      unsigned pa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) K::exp_pack(acc_s, mt, kk, mult, max_scaled, row_sum, pa[mt]);
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        unsigned bv[4];
        flex::ldmatrix_x4_trans(bv, v_base + (kk * 16 * kSmemStride + dp * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma::run(acc_o[mt][2 * dp], pa[mt], bv[0], bv[1]);
          Mma::run(acc_o[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
        }
      }
    }

    // Every warp is done with this stage: refill it with tile it + 2.
    __syncthreads();
    if (it + 2 < n_tiles) {
      K::template load_rows<kBlockN>(s_k + stage_off, g_k, p.k_stride_s, idx_pf * kBlockN, seqlen_kv, tid);
      K::template load_rows<kBlockN>(s_v + stage_off, g_v, p.v_stride_s, idx_pf * kBlockN, seqlen_kv, tid);
    }
    flex::cp_async_commit();
    idx_cur = idx_next;
    idx_next = idx_pf;
  }

  // ============================================ Epilogue ============================================
  float lse[kRowsPerThread];
  K::normalize(acc_o, row_max, row_sum, K::score_unit(p.scale), lse);
  // O is staged through the Q tile's shared memory once every copy has landed and every warp is done.
  flex::cp_async_wait<0>();
  __syncthreads();
  // The ragged row offset is read again rather than kept live across the mainloop (registers are the limit there).
  K::store_o_lse(p, flex_smem, acc_o, lse, b, h, m0, seqlen_q, kVarlen ? p.cu_seqlens_q[b] : 0, tid, warp, lane);
}
