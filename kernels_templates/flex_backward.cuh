// The flash-attention backward templates (FlashAttention-2 style, mma.sync, sm_80+): preprocessing, the
// KV-major dK/dV/dQ kernel with fused buffer-gradient scatters, dQ conversion and the transposed block mask.
#pragma once
#include "flex_backward_mods.cuh"
#include "flex_backward_params.cuh"
#include "flex_backward_policy.cuh"
#include "flex_backward_scatter.cuh"
#include "flex_backward_schedule.cuh"
#include "flex_mma.cuh"
#include "flex_staged_rows.cuh"
#include "flex_type_traits.cuh"

// Tile configuration per head dim (the host mirrors it in compiler/codegen/backward_source.cpp):
//
//   kHeadDim | kBlockM (q) | kBlockN (kv) | kNWarps | kDSplit | kStages (Q/dO)
//   ---------+-------------+--------------+---------+---------+---------------
//   32..128  |      64     |      128     |    8    |    1    |      2
//   192, 256 |      64     |       64     |    8    |    2    |      1
//
// One CTA owns kBlockN KV rows of one (b, kv head) and loops over the query heads of its group and the
// query tiles its block-mask column lists, so dK and dV (summed over the group) stay in registers and are
// written once. Scores are computed transposed (S^T = K Q^T): each warp owns 16 KV rows, so P^T and dS^T
// are the A operands of dV += P^T dO and dK += dS^T Q straight from the accumulators. dQ = dS K needs all
// KV rows of the tile: dS^T goes through shared memory and each warp adds a 16 x D/2 block of dQ into an
// fp32 accumulator with atomics (or 64-bit fixed point in deterministic mode).
// kDSplit = 2 (D >= 192): two warps share 16 KV rows and each keeps half of dK / dV (registers); both
// compute the same S and dP.
//
// Contract with the generated variant (see compiler/codegen/codegen_cuda_grad.cpp):
//   Params, Row, Col, Tile (empty: the backward variant is not hoisted), kHasScoreMod, kHasMaskMod,
//   score_mod(vp, Row, Col, Tile, b, h, hkv, q, k0 = kv, j = 0, score), mask_mod(...same, no score),
//   kDScoreIsOne, d_score(vp, b, h, hkv, q, kv, score),
//   kNumScatters, kScatterClass[i], scatter<I>(vp, b, h, hkv, q, kv, score, off, coef):
//   offset of the target element in its contiguous gradient and the coefficient dS is multiplied by;
//   kStagedCol, kStagedTile, kStagedColScatter, kStagedTileScatter, kStagedDiag (terms only the Hopper kernel
//   stages, flex_backward_staged.cuh: false / -1 here), with StagedColElement / staged_col(vp, b, h, hkv), the
//   Tile counterparts and staged_diag(vp, b, h, hkv, d) where a term is staged.

namespace flex_bwd {

// Where a staged term's rows live (flex_backward_staged.cuh), from the variant's staged_col / staged_tile.
using StagedRows = flex::StagedRows;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000u); }

// 4-byte asynchronous copy (.ca: the only size class below 16 bytes), zero-filled when !pred.
__device__ __forceinline__ void cp_async_4(unsigned dst, const void* src, bool pred) {
  const int src_size = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_size));
}

// The bulk dQ layout (flex_backward_main_sm90 with kDqBulk): each dq_accum row's 8-column groups are permuted, group c
// of the row at address `row` stored at group c ^ bulk_dq_group_xor(row). The Hopper kernel writes a query tile's
// partial into unpadded shared rows in this order and sends the whole tile by one bulk reduction; the permutation keeps
// the consumers' stores conflict-free. One store phase writes one group in each of kKeys consecutive rows (fp32: 4 rows
// of 32 bytes, fixed point: 2 of 64), and rows are multiples of 128 bytes, so unpermuted those groups would share banks.
// Keyed by the row's address rather than its index, so that a ragged view's shifted pointer cannot make the kernel
// that writes the rows and the one that converts them disagree.
template <class Value, int kHeadDim>
__device__ __forceinline__ int bulk_dq_group_xor(const void* row) {
  constexpr int kKeys = 128 / (8 * (int)sizeof(Value));
  constexpr unsigned long long kRowBytes = kHeadDim * sizeof(Value);
  static_assert((kHeadDim / 8) % kKeys == 0, "bulk_dq_group_xor: a row must hold whole sets of permuted groups");
  return (int)(reinterpret_cast<unsigned long long>(row) / kRowBytes % kKeys);
}

// dQ accumulation of two adjacent columns: one 8-byte vector atomic on sm_90 (half the L2 atomic
// operations of two scalar ones), two scalar ones before.
__device__ __forceinline__ void add_pair(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}
}  // namespace flex_bwd

// The main kernels' tiles (both kinds), read off the backward policy.
template <int kHeadDim_, class Element_>
struct FlexBackwardTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr FlexBackwardPolicy kPolicy = flex_backward_tiles(kHeadDim_);
  static constexpr int kBlockM = kPolicy.block_m;
  static constexpr int kBlockN = kPolicy.block_n;
  static constexpr int kNWarps = kPolicy.warps;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kRowGroups = kBlockN / 16;         // warps over KV rows
  static constexpr int kDSplit = kNWarps / kRowGroups;    // warps sharing one 16-row group (dK/dV columns split)
  static constexpr int kStages = kPolicy.stages;
  static constexpr int kD16 = kHeadDim / 16;              // 16-column units of D
  static constexpr int kUnitsPerSplit = (kD16 + kDSplit - 1) / kDSplit;
  static constexpr int kQGroups = kBlockM / 16;            // dQ: warps over query rows
  static constexpr int kDqGroups = kNWarps / kQGroups;     // dQ: warps over D units
  static constexpr int kDqUnits = (kD16 + kDqGroups - 1) / kDqGroups;
  static constexpr int kSmemStride = kHeadDim + 8;
  static constexpr int kDsStride = kBlockM + 8;
  static constexpr int kChunksPerRow = kHeadDim / 8;
  // Shared memory (bytes): K, V tiles; Q, dO per stage; dS^T; lse2, delta per stage; reductions.
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kBlockN * kSmemStride * 2;
  static constexpr int kOffQ = kOffV + kBlockN * kSmemStride * 2;
  static constexpr int kStageQBytes = kBlockM * kSmemStride * 2;
  static constexpr int kOffDO = kOffQ + kStages * kStageQBytes;
  static constexpr int kOffDS = kOffDO + kStages * kStageQBytes;
  static constexpr int kOffLse = kOffDS + kBlockN * kDsStride * 2;
  static constexpr int kOffDelta = kOffLse + kStages * kBlockM * 4;
  static constexpr int kOffRed = kOffDelta + kStages * kBlockM * 4;    // [kNWarps][kBlockM] 8-byte slots
  static constexpr int kOffSched = kOffRed + kNWarps * kBlockM * 8;     // tile classes of the CTA's column
  static constexpr int kMaxSched = 2048;                                 // (head, query tile) positions cached
  static constexpr int kSmemBytes = kOffSched + kMaxSched;

  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 32 && kHeadDim <= 256, "FlexBackwardTraits: head dim must be a multiple of 16 in [32, 256]");
  static_assert(kRowGroups * kDSplit == kNWarps, "FlexBackwardTraits: warps must tile the KV rows evenly");
  static_assert(kQGroups * kDqGroups == kNWarps, "FlexBackwardTraits: warps must tile dQ evenly");
};

namespace flex_bwd {

template <class Traits>
struct Loader {
  using Element = typename Traits::Element;
  static constexpr int kNThreads = Traits::kNThreads;
  static constexpr int kChunksPerRow = Traits::kChunksPerRow;
  static constexpr int kSmemStride = Traits::kSmemStride;
  // Rows [row0, row0 + kRows) of a [S, D] slice into a padded shared tile; rows past seqlen are zero-filled.
  template <int kRows>
  static __device__ __forceinline__ void load_rows(unsigned smem, const Element* g, long long stride_s, int row0, int seqlen, int tid) {
    constexpr int kTotal = kRows * kChunksPerRow;
#pragma unroll
    for (int i = 0; i < (kTotal + kNThreads - 1) / kNThreads; ++i) {
      const int chunk = tid + i * kNThreads;
      if (kTotal % kNThreads == 0 || chunk < kTotal) {
        const int r = chunk / kChunksPerRow;
        const int c = chunk % kChunksPerRow;
        const bool valid = row0 + r < seqlen;
        const Element* src = valid ? g + (long long)(row0 + r) * stride_s + c * 8 : g;
        flex::cp_async_16(smem + (r * kSmemStride + c * 8) * 2, src, valid);
      }
    }
  }
};

}  // namespace flex_bwd

// delta = rowsum(dO * O), lse2 = lse * log2(e) (+inf for fully masked rows), dq_accum row cleared (unless
// dq_accum is null: the query-major pass computes dq without it).
// grid = (ceil(Sq / 8), H, B), 256 threads: one warp per query row.
template <class Element, int kHeadDim, bool kDeterministic>
__device__ __forceinline__ void flex_backward_preprocess(const FlexBackwardParams& p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q = blockIdx.x * 8 + warp, h = blockIdx.y, b = blockIdx.z;
  if (q >= p.seqlen_q) return;
  const Element* o = static_cast<const Element*>(p.o) + b * p.o_stride_b + h * p.o_stride_h + q * p.o_stride_s;
  const Element* d_o = static_cast<const Element*>(p.d_o) + b * p.do_stride_b + h * p.do_stride_h + q * p.do_stride_s;
  float sum = 0.f;
  for (int c = lane; c < kHeadDim / 8; c += 32) {
    const uint4 ov = *reinterpret_cast<const uint4*>(o + c * 8);
    const uint4 dv = *reinterpret_cast<const uint4*>(d_o + c * 8);
    const Element* oe = reinterpret_cast<const Element*>(&ov);
    const Element* de = reinterpret_cast<const Element*>(&dv);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += (float)oe[i] * (float)de[i];
  }
#pragma unroll
  for (int s = 16; s > 0; s /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, s);
  const long long row = ((long long)b * p.heads + h) * p.seqlen_q + q;
  if (lane == 0) {
    p.delta[row] = sum;
    const float l = p.lse[b * p.lse_stride_b + h * p.lse_stride_h + q];
    p.lse2[row] = l == flex_bwd::neg_inf() ? flex_bwd::pos_inf() : l * 1.4426950408889634f;
  }
  if (p.dq_accum == nullptr) return;
  if constexpr (kDeterministic) {
    unsigned long long* acc = static_cast<unsigned long long*>(p.dq_accum) + row * kHeadDim;
    for (int d = lane; d < kHeadDim; d += 32) acc[d] = 0ull;
  } else {
    float* acc = static_cast<float*>(p.dq_accum) + row * kHeadDim;
    for (int d = lane; d < kHeadDim; d += 32) acc[d] = 0.f;
  }
}

// dq = scale * dq_accum in q's dtype. grid = (ceil(Sq / 8), H, B), 256 threads. Each thread converts 8 consecutive
// columns of one row: 32 bytes (fp32) or 64 (fixed point) loaded as 16-byte vectors and one 16-byte store where the row
// allows it, so the pass streams near the DRAM rate (2-byte stores of one column per lane left it well below).
// kBulkLayout: the main kernel sent its partials by bulk reductions, whose rows hold their 8-column groups permuted.
template <class Element, int kHeadDim, bool kDeterministic, bool kBulkLayout = false>
__device__ __forceinline__ void flex_backward_dq(const FlexBackwardParams& p) {
  static_assert(kHeadDim % 8 == 0, "flex_backward_dq: head dims are multiples of 8");
  constexpr int kChunks = kHeadDim / 8;
  const int h = blockIdx.y, b = blockIdx.z;
  for (int i = threadIdx.x; i < 8 * kChunks; i += blockDim.x) {
    const int q = blockIdx.x * 8 + i / kChunks, c = i % kChunks;
    if (q >= p.seqlen_q) return;  // rows only grow with i
    using Value = typename flex::Conditional<kDeterministic, unsigned long long, float>::type;
    const Value* row = static_cast<const Value*>(p.dq_accum) + (((long long)b * p.heads + h) * p.seqlen_q + q) * kHeadDim;
    int group = c;
    if constexpr (kBulkLayout) group ^= flex_bwd::bulk_dq_group_xor<Value, kHeadDim>(row);
    const int at = group * 8;
    float v[8];
    if constexpr (kDeterministic) {
      const ulonglong2* src = reinterpret_cast<const ulonglong2*>(row + at);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const ulonglong2 x = src[j];
        v[2 * j] = (float)((double)(long long)x.x * (1.0 / 4294967296.0));
        v[2 * j + 1] = (float)((double)(long long)x.y * (1.0 / 4294967296.0));
      }
    } else {
      const float4* src = reinterpret_cast<const float4*>(row + at);
      const float4 x = src[0], y = src[1];
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
    }
    Element* dq = static_cast<Element*>(p.dq) + b * p.dq_stride_b + h * p.dq_stride_h + q * p.dq_stride_s + c * 8;
    union {
      uint4 u;
      Element e[8];
    } out;
#pragma unroll
    for (int j = 0; j < 8; ++j) out.e[j] = (Element)(v[j] * p.scale);
    if ((reinterpret_cast<unsigned long long>(dq) & 15) == 0) {
      *reinterpret_cast<uint4*>(dq) = out.u;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) dq[j] = out.e[j];
    }
  }
}

// Fixed-point buffer gradients to f32 (deterministic mode), blocked accumulators back in the buffer's order.
// Grid-stride, any grid. Four elements per thread: two 16-byte loads in flight and one 16-byte store (one 8-byte load
// per thread left too few bytes in flight to cover the memory's latency); a blocked accumulator's columns are a
// multiple of 8, so the four lie in one row and one slice, contiguous in both layouts.
__device__ __forceinline__ void flex_backward_convert(const FlexConvertParams& c) {
  const unsigned long long* in = static_cast<const unsigned long long*>(c.in);
  float* out = static_cast<float*>(c.out);
  auto value = [&](unsigned long long v) { return (float)((double)(long long)v * (1.0 / 4294967296.0)) * c.mult; };
  const bool vec_out = (reinterpret_cast<unsigned long long>(out) & 15) == 0;
  const long long quads = (c.n + 3) / 4;
  for (long long i4 = blockIdx.x * (long long)blockDim.x + threadIdx.x; i4 < quads; i4 += (long long)gridDim.x * blockDim.x) {
    const long long i = 4 * i4;
    long long src = i;
    if (c.block_w > 0) {
      const long long t = i / c.cols;  // the buffer's matrix row
      const long long row = t % c.rows;
      src = flex_bwd::blocked_index(c.rows, c.cols, c.block_w, (t - row) * c.cols, row, (int)(i - t * c.cols));
    }
    if (vec_out && i + 4 <= c.n) {
      const ulonglong2 x = *reinterpret_cast<const ulonglong2*>(in + src);
      const ulonglong2 y = *reinterpret_cast<const ulonglong2*>(in + src + 2);
      *reinterpret_cast<float4*>(out + i) = make_float4(value(x.x), value(x.y), value(y.x), value(y.y));
    } else {
      for (int k = 0; k < 4 && i + k < c.n; ++k) out[i + k] = value(in[src + k]);
    }
  }
}

// Forward block-mask lists -> dense tile classes (0 skip, 1 full, 2 partial). One warp per list row, its lanes over
// the row's entries: with a thread per row, a broadcast mask's few rows made this a chain of dependent loads on one
// warp (about 10 us at S 4096, a launch of one block). grid = ceil(rows / (blockDim / 32)).
__device__ __forceinline__ void flex_backward_tile_state(const FlexTileStateParams& t) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= t.rows) return;
  const FlexBlockMask& m = t.mask;
  unsigned char* st = t.tile_state + (long long)row * m.max_kv_tiles;
  const int np = m.kv_num_partial[row], nf = m.kv_num_full[row];
  for (int i = lane; i < np; i += 32) st[m.kv_partial_idx[(long long)row * m.max_kv_tiles + i]] = 2;
  for (int i = lane; i < nf; i += 32) st[m.kv_full_idx[(long long)row * m.max_kv_tiles + i]] = 1;
}

namespace flex_bwd {

// The two score GEMMs of a backward tile, sharing one loop so the loads of one overlap the mmas of the other:
// acc_x = A_x B_x^T and acc_y = A_y B_y^T over kD16 k-steps of 16, for one 16-row A tile each and kN rows of
// B (both [rows][k] tiles in shared memory with row stride kStride; a_x, a_y, b_x, b_y are the lane's ldmatrix
// addresses at k = 0). The KV-major kernel computes S^T = K Q^T and dP^T = V dO^T with it, the query-major pass
// S = Q K^T and dP = dO V^T.
template <class Mma, int kD16, int kN, int kStride>
__device__ __forceinline__ void score_gemms(float (&acc_x)[kN / 8][4], float (&acc_y)[kN / 8][4], unsigned a_x, unsigned a_y, unsigned b_x,
                                            unsigned b_y) {
#pragma unroll
  for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_x[nt][e] = acc_y[nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kD16; ++kk) {
    unsigned ax[4], ay[4];
    flex::ldmatrix_x4(ax, a_x + kk * 32);
    flex::ldmatrix_x4(ay, a_y + kk * 32);
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      unsigned bx[4], by[4];
      flex::ldmatrix_x4(bx, b_x + (np * 16 * kStride + kk * 16) * 2);
      flex::ldmatrix_x4(by, b_y + (np * 16 * kStride + kk * 16) * 2);
      Mma::run(acc_x[2 * np], ax, bx[0], bx[1]);
      Mma::run(acc_x[2 * np + 1], ax, bx[2], bx[3]);
      Mma::run(acc_y[2 * np], ay, by[0], by[1]);
      Mma::run(acc_y[2 * np + 1], ay, by[2], by[3]);
    }
  }
}

// A compile-time bool as a value, so one generic lambda can be instantiated for both forms of a tile.
template <bool B>
struct BoolTag {
  static constexpr bool value = B;
};

}  // namespace flex_bwd

// The main backward kernel. grid = (ceil(Skv / kBlockN), Hkv, B), block = kNThreads, smem = kSmemBytes.
// kDq = false when the query-major pass computes dq: no dS^T staging, no dQ GEMM, no dQ atomics here.
template <class Traits, class Variant, bool kDeterministic, bool kDq = true>
__device__ __forceinline__ void flex_backward_main(const FlexBackwardParams& p, const typename Variant::Params& vp) {
  static_assert(!Variant::kStagedCol && !Variant::kStagedTile && !Variant::kStagedDiag, "flex_backward_main: staged terms are the Hopper kernel's (flex_backward_sm90.cuh)");
  using Element = typename Traits::Element;
  using Mma = flex::Mma16816<Element>;
  using L = flex_bwd::Loader<Traits>;
  using Mods = flex_bwd::BackwardMods<Variant>;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kRowGroups = Traits::kRowGroups;
  constexpr int kStages = Traits::kStages;
  constexpr int kD16 = Traits::kD16;
  constexpr int kUnits = Traits::kUnitsPerSplit;
  constexpr int kQGroups = Traits::kQGroups;
  constexpr int kDqGroups = Traits::kDqGroups;
  constexpr int kDqUnits = Traits::kDqUnits;
  constexpr int kStride = Traits::kSmemStride;
  constexpr int kDsStride = Traits::kDsStride;
  constexpr int kMT = kBlockM / 8;  // n8 tiles of S^T over the query columns
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kNumScatters = Variant::kNumScatters;

  extern __shared__ __align__(128) unsigned char flex_smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  // Compile-time 0 without the D split, so the unit loops below carry no runtime branches (a branch between
  // ldmatrix and mma blocks keeps the compiler from overlapping their latencies).
  const int rg = warp % kRowGroups, ds = Traits::kDSplit == 1 ? 0 : warp / kRowGroups;
  constexpr bool kUnitsExact = kD16 % Traits::kDSplit == 0;
  constexpr bool kDqUnitsExact = kD16 % kDqGroups == 0;
  const int n_block = blockIdx.x, hkv = blockIdx.y, b = blockIdx.z;
  const int n0 = n_block * kBlockN;
  const int seqlen_q = p.seqlen_q, seqlen_kv = p.seqlen_kv;
  const int group = p.heads / p.kv_heads;
  const int num_m = (seqlen_q + kBlockM - 1) / kBlockM;
  const bool kv_tail = n0 + kBlockN > seqlen_kv;

  const unsigned s_base = flex::smem_addr(flex_smem);
  const unsigned s_k = s_base + Traits::kOffK, s_v = s_base + Traits::kOffV;
  const unsigned s_q = s_base + Traits::kOffQ, s_do = s_base + Traits::kOffDO;
  const unsigned s_ds = s_base + Traits::kOffDS;
  float* sh_lse = reinterpret_cast<float*>(flex_smem + Traits::kOffLse);
  float* sh_delta = reinterpret_cast<float*>(flex_smem + Traits::kOffDelta);
  float* sh_red = reinterpret_cast<float*>(flex_smem + Traits::kOffRed);

  const Element* g_k = static_cast<const Element*>(p.k) + b * p.k_stride_b + hkv * p.k_stride_h;
  const Element* g_v = static_cast<const Element*>(p.v) + b * p.v_stride_b + hkv * p.v_stride_h;

  const flex_bwd::ColumnSchedule<kBlockM, kBlockN, Traits::kNThreads, Traits::kMaxSched> sched(p, b, hkv, n0, flex_smem + Traits::kOffSched,
                                                                                              tid);
  const int total = sched.total;
  auto class_at = [&](int pos) -> int { return sched.class_at(pos); };
  auto next_pos = [&](int pos) -> int { return sched.next_pos(pos); };

  auto load_q_tile = [&](int pos, int stage) {
    const int h = hkv * group + pos / num_m;
    const int m0 = (pos % num_m) * kBlockM;
    const Element* g_q = static_cast<const Element*>(p.q) + b * p.q_stride_b + h * p.q_stride_h;
    const Element* g_do = static_cast<const Element*>(p.d_o) + b * p.do_stride_b + h * p.do_stride_h;
    L::template load_rows<kBlockM>(s_q + stage * Traits::kStageQBytes, g_q, p.q_stride_s, m0, seqlen_q, tid);
    L::template load_rows<kBlockM>(s_do + stage * Traits::kStageQBytes, g_do, p.do_stride_s, m0, seqlen_q, tid);
    if (tid < kBlockM) {
      // Rows past Sq: lse2 = +inf (P = 0) is stored by a plain store, delta zero-filled.
      const long long row = ((long long)b * p.heads + h) * seqlen_q + m0 + tid;
      const bool valid = m0 + tid < seqlen_q;
      if (valid) flex_bwd::cp_async_4(flex::smem_addr(sh_lse + stage * kBlockM + tid), p.lse2 + row, true);
      else sh_lse[stage * kBlockM + tid] = flex_bwd::pos_inf();
      flex_bwd::cp_async_4(flex::smem_addr(sh_delta + stage * kBlockM + tid), valid ? p.delta + row : p.delta, valid);
    }
  };

  int pos = next_pos(0);
  // K and V once, with the first Q / dO tile.
  L::template load_rows<kBlockN>(s_k, g_k, p.k_stride_s, n0, seqlen_kv, tid);
  L::template load_rows<kBlockN>(s_v, g_v, p.v_stride_s, n0, seqlen_kv, tid);
  if (pos < total) load_q_tile(pos, 0);
  flex::cp_async_commit();

  float acc_dk[kUnits][2][4];
  float acc_dv[kUnits][2][4];
#pragma unroll
  for (int u = 0; u < kUnits; ++u)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[u][i][e] = acc_dv[u][i][e] = 0.f;

  // Per-head scatter accumulators: uniform (one per scatter) and kv-only (the thread's two KV rows).
  float acc_uniform[kNumScatters > 0 ? kNumScatters : 1];
  float acc_kvrow[kNumScatters > 0 ? kNumScatters : 1][2];
#pragma unroll
  for (int i = 0; i < (kNumScatters > 0 ? kNumScatters : 1); ++i) acc_uniform[i] = acc_kvrow[i][0] = acc_kvrow[i][1] = 0.f;

  // ldmatrix lane offsets (bytes). A operand from a [rows][k] tile; B operand (non-trans) from [n][k];
  // B operand (trans) from [k][n].
  const int l8 = lane % 8, lm = lane / 8;
  const unsigned a_lane = (((lm & 1) * 8 + l8) * kStride + (lm >> 1) * 8) * 2;
  const unsigned bn_lane = ((((lm >> 1) * 8 + l8) * kStride) + (lm & 1) * 8) * 2;
  const unsigned bt_lane = ((((lm & 1) * 8 + l8) * kStride) + (lm >> 1) * 8) * 2;
  const unsigned warp_rows = rg * 16 * kStride * 2;
  const int kv_r0 = n0 + rg * 16 + g;  // the thread's KV rows: kv_r0, kv_r0 + 8

  const float scale_log2 = p.scale * kLog2e;
  int stage = 0;
  while (pos < total) {
    const int h = hkv * group + pos / num_m;
    const int m_block = pos % num_m;
    const int m0 = m_block * kBlockM;
    const int cls = class_at(pos);
    const int pos_next = next_pos(pos + 1);

    flex::cp_async_wait<0>();
    __syncthreads();
    if constexpr (kStages == 2) {
      if (pos_next < total) load_q_tile(pos_next, stage ^ 1);
      flex::cp_async_commit();
    }
    const unsigned sq = s_q + stage * Traits::kStageQBytes;
    const unsigned sdo = s_do + stage * Traits::kStageQBytes;
    const float* lse_st = sh_lse + stage * kBlockM;
    const float* delta_st = sh_delta + stage * kBlockM;

    // S^T = K Q^T and dP^T = V dO^T for the warp's 16 KV rows x kBlockM queries.
    float acc_s[kMT][4], acc_dp[kMT][4];
    flex_bwd::score_gemms<Mma, kD16, kBlockM, kStride>(acc_s, acc_dp, s_k + warp_rows + a_lane, s_v + warp_rows + a_lane, sq + bn_lane,
                                                       sdo + bn_lane);

    // P^T = exp(score_mod(scale * S) - lse), masked and out-of-range elements 0; then dS^T.
    const bool check_bounds = kv_tail || m0 + kBlockM > seqlen_q;
    const flex_bwd::KvMajorFragment frag{m0, kv_r0, t4};
    float score_v[kMT][4];
    float ds_v[kMT][4];  // dS (gradient w.r.t. the modified score)
#pragma unroll
    for (int nt = 0; nt < kMT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int q = frag.q(nt, e), kv = frag.kv(nt, e);
        const int c = nt * 8 + 2 * t4 + (e % 2);
        const float score = acc_s[nt][e] * p.scale;
        score_v[nt][e] = score;
        bool keep = !check_bounds || (q < seqlen_q && kv < seqlen_kv);
        float z = score;
        if (keep) {
          typename Variant::Row rs{};
          typename Variant::Col cs{};
          typename Variant::Tile ts{};
          z = Mods::score_mod(vp, rs, cs, ts, b, h, hkv, q, kv, 0, score);
          if constexpr (Variant::kHasMaskMod) {
            if (cls == 2 && !Mods::mask_mod(vp, rs, cs, ts, b, h, hkv, q, kv, 0)) keep = false;
          }
        }
        // exp2 and the load of lse2 for kept elements only: BackwardMods::prob's unconditional exp2 and select
        // compile differently in this kernel (more registers; 4% more instructions with a kv-bias gradient).
        const float x2 = Mods::logit2(z, acc_s[nt][e], scale_log2);
        const float pr = keep ? flex::ex2(x2 - lse_st[c]) : 0.f;
        acc_s[nt][e] = pr;
        ds_v[nt][e] = Mods::template ds</*kZeroMasked=*/true>(pr, acc_dp[nt][e], delta_st[c]);
      }
    }

    // dV += P^T dO (this warp's D units).
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      unsigned pa[4];
      pa[0] = Mma::pack(acc_s[2 * kk][0], acc_s[2 * kk][1]);
      pa[1] = Mma::pack(acc_s[2 * kk][2], acc_s[2 * kk][3]);
      pa[2] = Mma::pack(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
      pa[3] = Mma::pack(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
        const int du = ds * kUnits + u;
        if (kUnitsExact || du < kD16) {
          unsigned bv[4];
          flex::ldmatrix_x4_trans(bv, sdo + bt_lane + (kk * 16 * kStride + du * 16) * 2);
          Mma::run(acc_dv[u][0], pa, bv[0], bv[1]);
          Mma::run(acc_dv[u][1], pa, bv[2], bv[3]);
        }
      }
    }

    // Scatters (buffer gradients) and dS_pre = dS * d_score.
    if constexpr (kNumScatters > 0)
      flex_bwd::scatter_one<Traits, Variant, kDeterministic, 0>(p, vp, ds_v, score_v, acc_uniform, acc_kvrow, sh_red, b, h, hkv, m0, n0,
                                                                kv_r0, warp, lane, ds == 0);
    Mods::ds_pre(vp, b, h, hkv, frag, ds_v, score_v);

    // dK += dS^T Q; dS^T to shared memory for dQ.
    unsigned* s_ds_u = reinterpret_cast<unsigned*>(flex_smem + Traits::kOffDS);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      unsigned da[4];
      da[0] = Mma::pack(ds_v[2 * kk][0], ds_v[2 * kk][1]);
      da[1] = Mma::pack(ds_v[2 * kk][2], ds_v[2 * kk][3]);
      da[2] = Mma::pack(ds_v[2 * kk + 1][0], ds_v[2 * kk + 1][1]);
      da[3] = Mma::pack(ds_v[2 * kk + 1][2], ds_v[2 * kk + 1][3]);
      if (kDq && ds == 0) {
        const int r = rg * 16 + g;
        const int c = kk * 16 + 2 * t4;
        s_ds_u[(r * kDsStride + c) / 2] = da[0];
        s_ds_u[((r + 8) * kDsStride + c) / 2] = da[1];
        s_ds_u[(r * kDsStride + c + 8) / 2] = da[2];
        s_ds_u[((r + 8) * kDsStride + c + 8) / 2] = da[3];
      }
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
        const int du = ds * kUnits + u;
        if (kUnitsExact || du < kD16) {
          unsigned bq[4];
          flex::ldmatrix_x4_trans(bq, sq + bt_lane + (kk * 16 * kStride + du * 16) * 2);
          Mma::run(acc_dk[u][0], da, bq[0], bq[1]);
          Mma::run(acc_dk[u][1], da, bq[2], bq[3]);
        }
      }
    }
    // dQ reads every warp's dS^T, and a single Q / dO stage is refilled next; without either, the barrier at the
    // top of the next iteration is enough.
    if constexpr (kDq || kStages == 1) __syncthreads();
    if constexpr (kStages == 1) {
      // Q / dO are no longer read in this iteration (dQ reads dS^T and K): refill the single stage.
      if (pos_next < total) load_q_tile(pos_next, 0);
      flex::cp_async_commit();
    }

    // dQ (unscaled) += dS K: warp (qg, dg) owns 16 query rows x D units dg, dg + kDqGroups, ...
    if constexpr (kDq) {
      const int qg = warp % kQGroups, dg = warp / kQGroups;
      float acc_dq[kDqUnits][2][4];
#pragma unroll
      for (int u = 0; u < kDqUnits; ++u)
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_dq[u][i][e] = 0.f;
      const unsigned ds_lane = s_ds + (((lm >> 1) * 8 + l8) * kDsStride + qg * 16 + (lm & 1) * 8) * 2;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        unsigned a[4];
        flex::ldmatrix_x4_trans(a, ds_lane + kk * 16 * kDsStride * 2);
#pragma unroll
        for (int u = 0; u < kDqUnits; ++u) {
          const int du = dg + u * kDqGroups;
          if (kDqUnitsExact || du < kD16) {
            unsigned bk[4];
            flex::ldmatrix_x4_trans(bk, s_k + bt_lane + (kk * 16 * kStride + du * 16) * 2);
            Mma::run(acc_dq[u][0], a, bk[0], bk[1]);
            Mma::run(acc_dq[u][1], a, bk[2], bk[3]);
          }
        }
      }
      const long long row_base = ((long long)b * p.heads + h) * seqlen_q;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int q = m0 + qg * 16 + g + half * 8;
        if (q < seqlen_q) {
#pragma unroll
          for (int u = 0; u < kDqUnits; ++u) {
            const int du = dg + u * kDqGroups;
            if (kDqUnitsExact || du < kD16) {
#pragma unroll
              for (int i = 0; i < 2; ++i) {
                const long long off = (row_base + q) * kHeadDim + du * 16 + i * 8 + 2 * t4;
                if constexpr (kDeterministic) {
                  flex_bwd::accumulate<true>(p.dq_accum, off, acc_dq[u][i][2 * half]);
                  flex_bwd::accumulate<true>(p.dq_accum, off + 1, acc_dq[u][i][2 * half + 1]);
                } else {
                  flex_bwd::add_pair(static_cast<float*>(p.dq_accum) + off, acc_dq[u][i][2 * half], acc_dq[u][i][2 * half + 1]);
                }
              }
            }
          }
        }
      }
    }

    // End of a head: flush the per-head scatter accumulators.
    if constexpr (kNumScatters > 0) {
      const bool head_done = pos_next >= total || (pos_next / num_m) != (pos / num_m);
      if (head_done)
        flex_bwd::flush_one<Traits, Variant, kDeterministic, 0>(p, vp, acc_uniform, acc_kvrow, sh_red, b, h, hkv, kv_r0, warp, lane, ds == 0);
    }
    pos = pos_next;
    if constexpr (kStages == 2) stage ^= 1;
  }
  flex::cp_async_wait<0>();

  // dK = scale * acc_dk, dV = acc_dv: registers -> global (rows past Skv dropped).
  Element* g_dk = static_cast<Element*>(p.dk) + b * p.dk_stride_b + hkv * p.dk_stride_h;
  Element* g_dv = static_cast<Element*>(p.dv) + b * p.dv_stride_b + hkv * p.dv_stride_h;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int kv = kv_r0 + half * 8;
    if (kv < seqlen_kv) {
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
        const int du = ds * kUnits + u;
        if (kUnitsExact || du < kD16) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int d = du * 16 + i * 8 + 2 * t4;
            *reinterpret_cast<unsigned*>(g_dk + kv * p.dk_stride_s + d) =
                Mma::pack(acc_dk[u][i][2 * half] * p.scale, acc_dk[u][i][2 * half + 1] * p.scale);
            *reinterpret_cast<unsigned*>(g_dv + kv * p.dv_stride_s + d) = Mma::pack(acc_dv[u][i][2 * half], acc_dv[u][i][2 * half + 1]);
          }
        }
      }
    }
  }
}
