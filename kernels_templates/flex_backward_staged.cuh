// Staged additive terms of the Hopper KV-major backward (compiler/codegen/staged_terms.h): a score_mod summand
// buf[lead..., q, kv % 64] (Col) or buf[lead..., q, kv // 64] (Tile), e.g. SAM's rel_w and rel_h.
//
// A warpgroup of flex_backward_main_sm90 owns 64 KV rows starting at a multiple of 64, so for its rows kv % 64
// is the row inside the warpgroup and kv // 64 is one value J. Per query tile (64 rows from m0):
//   Col:  the block buf[m0 .. m0 + 63][0 .. 63] is copied next to Q and dO (flex::load_staged_block: cp.async,
//         16-byte chunks XOR-swizzled by row so the reads are conflict-free) and read transposed by ldmatrix.trans into the
//         S^T accumulator layout: thread (g, t4) of warp w gets rows 16 (w % 4) + g (+ 8) and query columns
//         (2 t4, 2 t4 + 1) of each n8 block, packed in one register.
//   Tile: buf[m0 + i][n0 / 64 + {0, 1}] for the CTA's two warpgroups (two 2-byte values per query row).
//   Diag: buf[lead..., f(q - kv)] on the tile's diagonals d = q - kv from m0 - n0 - 127 on: 191 floats (a band of
//         192) per ring slot, loaded by a band warp of the warp-specialised kernel (flex_bwd_sm90::load_bands:
//         Variant::staged_diag, 0 past the buffer) and read per element at a constant offset from one base per thread (st_diag in the kernel). Its gradient is
//         the generic diagonal scatter.
// Gradients: every warpgroup writes its dS^T (fp32) into a [64 q][68] plane; after the CTA barrier before dQ,
// each thread sums 16 columns of one query row (four runs of 4, 16 apart) over both planes (Col: one vector
// atomic per run) and over each plane (Tile: the warpgroups' two J, one 8-byte atomic per row; no other CTA
// writes those elements).
//
// Spread rows (Variant::kStagedSpread: a Col term with a gradient, and no scatter but the staged ones): CTA n of a
// head owns the KV rows 512 (n / 4) + 64 w + 16 (n % 4) + r instead (warp w = 0..7, r = 0..15), i.e. eight
// kv // 64 blocks of one 16-column slice of kv % 64. Its Col gradient is then summed over its eight warps before
// the atomics (16 columns per query row instead of 64: a quarter of the L2 reduction traffic), and its Tile
// gradient covers eight adjacent J (one 32-byte sector per query row).
//
// Selector GEMMs (kGradGemm: spread rows, bf16, d_score = 1, so the dS^T tile that dQ reads is the gradient of
// the terms, and both terms learnable, so each warpgroup has one): the sums are products of that tile with constant
// 0/1 matrices instead of slab stores, shuffles and tree sums. Warpgroup 0 computes G_col[q][r] = sum over the 8 warps w of dS[q][16 w + r] (the CTA's 16 kv % 64
// columns), warpgroup 1 G_tile[q][w] = sum over r of dS[q][16 w + r] (its 8 J); both sum the bf16 dS that dQ uses.
// Where the two [128 local KV rows][16] selectors live: where the warpgroups' dQ column counts are equal (head dims
// 32, 64, 128), in two spare regions of the K tile, each right after one warpgroup's dQ columns, so each
// warpgroup's dQ GEMM (B = K, MN-major) simply runs 16 columns longer and dS^T is read once (D128 then has no room
// for its bulk dQ rows). Elsewhere (80, 96: 48 + 32, 64 + 32 columns) ptxas serialised every wgmma of the kernel that
// way (C7511, registers), so there the selectors are tiles of their own and each warpgroup issues a separate m64n16
// GEMM on the dS^T tile ahead of dQ's. (The measurements: docs/notes/BACKWARD_SM90.md, selector columns.)
#pragma once
#include "flex_backward.cuh"
#include "flex_wgmma.cuh"

namespace flex_bwd_staged {

using flex_bwd::StagedRows;

constexpr int kRows = 64;                       // query rows per tile (flex_backward_main_sm90's kBlockM)
constexpr int kColBytes = kRows * 64 * 2;       // one Col tile: [64 q][64] 2-byte elements
constexpr int kTileBytes = kRows * 2 * 2;       // one Tile tile: [64 q][2] 2-byte elements
constexpr int kPlaneStride = 68;                // floats per query row of a dS^T plane: the accumulator-layout
                                                // stores (rows 2 t4 + e, columns g) hit 32 distinct banks
constexpr int kGradBytes = 2 * kRows * kPlaneStride * 4;

// Spread rows: CTAs per 512-row KV range (one per 16-column slice of kv % 64), the Tile values per query row,
// and the per-warp dS^T slabs [8 warps][64 q][kSlabStride] the gradients are summed through.
constexpr int kSpreadCtas = 4;
constexpr int kSpreadRange = 512;
constexpr int kSpreadTileBytes = kRows * 8 * 2;
constexpr int kSlabStride = 20;  // floats per query row: the accumulator-layout stores (rows 2 t4 + e, columns g) hit 32 banks
constexpr int kRowSumStride = kRows + 4;  // [8 warps][64 q + 4] Tile-gradient row sums: conflict-free float2 stores
constexpr int kSpreadGradBytes = 8 * kRows * kSlabStride * 4 + 8 * kRowSumStride * 4;

// Separate selectors: two [128 local KV rows][16] 0/1 tiles, MN-major B operands (32-byte swizzle: one region of 16
// columns), 1024-byte aligned inside their region (hence the extra 1 KB). SelectorTiles describes them as
// build_selectors expects (selector t at spare_offset(t)), as the K tile with spare regions does.
using SelectorTile = flex::SwizzledTile<128, 16, 32>;
constexpr int kSelectorRegionBytes = 2 * SelectorTile::kBytes + 1024;
struct SelectorTiles : SelectorTile {
  static constexpr int kSpares = 2;
  static __device__ __forceinline__ unsigned spare_offset(int i) { return i * SelectorTile::kBytes; }
};

// What a variant stages (Variant = void: nothing, for layouts computed without a variant).
template <class Variant>
struct Flags {
  static constexpr bool kCol = Variant::kStagedCol;
  static constexpr bool kTile = Variant::kStagedTile;
  static constexpr bool kGrad = Variant::kStagedColScatter >= 0 || Variant::kStagedTileScatter >= 0;
  static constexpr bool kAny = kCol || kTile;
  static constexpr bool kDiag = Variant::kStagedDiag;
  static_assert(!(kDiag && kAny), "flex_bwd_staged: a diagonal band with Col or Tile terms");
  static constexpr bool kSpread = Variant::kStagedSpread;
  static_assert(!kSpread || (kCol && Variant::kStagedColScatter >= 0), "flex_bwd_staged: spread rows need a Col term with a gradient");
  static constexpr int kTileStageBytes = kSpread ? kSpreadTileBytes : kTileBytes;
  static constexpr int kGradRegionBytes = kSpread ? kSpreadGradBytes : kGradBytes;
};
template <>
struct Flags<void> {
  static constexpr bool kCol = false, kTile = false, kGrad = false, kAny = false, kDiag = false, kSpread = false;
  static constexpr int kTileStageBytes = kTileBytes, kGradRegionBytes = kGradBytes;
};

// Diag: floats per ring slot, the 64 + 128 - 1 diagonals of a tile padded to 16 bytes. Entry i is diagonal
// m0 - n0 - 127 + i, so the element (query column c, local KV row r) reads entry c - r + 127.
constexpr int kDiagBand = kRows + 128;
constexpr int kDiagBytes = kDiagBand * 4;

// Blocked accumulators (deterministic selector GEMMs, FlexBackwardParams::staged_blocks): a CTA's fixed-point sums
// of one query tile, [64 q][16] of the Col term (its 16 kv % 64 columns) and [64 q][8] of the Tile term (its 8 J),
// wait in one stage of shared memory in the order of the accumulator's block (flex_bwd::blocked_index) and leave by
// one 64-bit bulk reduction each instead of a 64-bit atomic per element (integer atomics have no vector form, so
// each element would be its own L2 request).
constexpr int kBlockColW = 16;
constexpr int kBlockTileW = 8;
constexpr int kBlockedColBytes = kRows * kBlockColW * 8;
constexpr int kBlockedStageBytes = kBlockedColBytes + kRows * kBlockTileW * 8;

// A lane's part of a slot's band: entries lane, lane + 32, ... (0 past the 191 a tile reaches).
template <class Variant>
__device__ __forceinline__ void load_diag(const typename Variant::Params& vp, unsigned s_band, int b, int h, int hkv, int d0, int lane) {
#pragma unroll 2
  for (int i = 0; i < kDiagBand / 32; ++i) {
    const int e = lane + 32 * i;
    const float v = e < kDiagBand - 1 ? Variant::staged_diag(vp, b, h, hkv, d0 + e) : 0.f;
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(s_band + 4 * e), "f"(v) : "memory");
  }
}

// Whether every scatter of the variant is a staged term's (kScatterStaged), the condition for spread rows.
template <class Variant>
__host__ __device__ constexpr bool all_scatters_staged() {
  for (int i = 0; i < Variant::kNumScatters; ++i)
    if (Variant::kScatterClass[i] != flex_bwd::kScatterStaged) return false;
  return true;
}

template <class E>
__device__ __forceinline__ float to_float(unsigned short x);
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(unsigned short x) { return __uint_as_float((unsigned)x << 16); }
template <>
__device__ __forceinline__ float to_float<__half>(unsigned short x) { return __half2float(__ushort_as_half(x)); }

// Element `hi` (0: low half, 1: high half) of a packed pair (bf16: one mask or shift).
template <class E>
__device__ __forceinline__ float unpack(unsigned pair, int hi) {
  return to_float<E>((unsigned short)(hi ? pair >> 16 : pair & 0xffffu));
}
template <>
__device__ __forceinline__ float unpack<__nv_bfloat16>(unsigned pair, int hi) {
  return __uint_as_float(hi ? pair & 0xffff0000u : pair << 16);
}

// One query tile's Tile values buf[m0 + i][j0], buf[m0 + i][j0 + 1] into `dst` (4 bytes per row), by thread i of
// 64. A block past Skv (the second warpgroup of the last CTA) reads 0, not past the buffer's last dim.
__device__ __forceinline__ void load_tile(unsigned char* smem_dst, unsigned dst, const StagedRows& r, int m0, int seqlen_q, int j0,
                                          int seqlen_kv, int i) {
  const int row = m0 + i;
  const bool v0 = row < seqlen_q && j0 * 64 < seqlen_kv;
  const bool v1 = row < seqlen_q && (j0 + 1) * 64 < seqlen_kv;
  const long long off = (long long)row * r.row_stride + (long long)j0 * r.col_stride;
  const bool fast = r.col_stride == 1 && v0 == v1 && ((reinterpret_cast<unsigned long long>(r.base) + 2 * off) & 3) == 0;
  if (fast) {
    flex_bwd::cp_async_4(dst + 4 * i, v0 ? static_cast<const unsigned short*>(r.base) + off : r.base, v0);
  } else {
    const unsigned lo = v0 ? flex::staged_raw_at(r.base, off) : 0u;
    const unsigned hi = v1 ? flex::staged_raw_at(r.base, off + r.col_stride) : 0u;
    *reinterpret_cast<unsigned*>(smem_dst + 4 * i) = lo | (hi << 16);
  }
}

// Spread rows: the Tile values buf[m0 + i][j0 .. j0 + 7] (the CTA's eight J) into `dst` (16 bytes per row), by
// thread i of 64. J at or past Skv / 64 (a last, partial range) read 0, not past the buffer's last dim.
__device__ __forceinline__ void load_tile8(unsigned char* smem_dst, unsigned dst, const StagedRows& r, int m0, int seqlen_q, int j0,
                                           int seqlen_kv, int i) {
  const int row = m0 + i;
  const bool row_valid = row < seqlen_q;
  const long long off = (long long)row * r.row_stride + (long long)j0 * r.col_stride;
  const bool fast = r.col_stride == 1 && (j0 + 7) * 64 < seqlen_kv && ((reinterpret_cast<unsigned long long>(r.base) + 2 * off) & 15) == 0;
  if (fast) {
    flex::cp_async_16(dst + 16 * i, row_valid ? static_cast<const unsigned short*>(r.base) + off : r.base, row_valid);
  } else {
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const bool v0 = row_valid && (j0 + 2 * k) * 64 < seqlen_kv;
      const bool v1 = row_valid && (j0 + 2 * k + 1) * 64 < seqlen_kv;
      const unsigned lo = v0 ? flex::staged_raw_at(r.base, off + 2 * k * r.col_stride) : 0u;
      const unsigned hi = v1 ? flex::staged_raw_at(r.base, off + (2 * k + 1) * r.col_stride) : 0u;
      w[k] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(smem_dst + 16 * i) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The thread's Col values of the tile: col[nt][half] packs the rows' Col columns chunk0 * 8 + 8 half + g, query
// columns nt * 8 + 2 t4 (low) and + 1 (high); chunk0 = 2 (warp % 4) for a warpgroup's 64 contiguous rows, 2 (n %
// 4) for spread rows. Four ldmatrix.trans: matrix m of one covers n8 block 2 k + m / 2, half m % 2.
__device__ __forceinline__ void read_col(unsigned (&col)[kRows / 8][2], unsigned src, int chunk0, int lane) {
  const int m = lane / 8, rr = lane % 8;
#pragma unroll
  for (int k = 0; k < kRows / 16; ++k) {
    const int q = (2 * k + m / 2) * 8 + rr;
    unsigned x[4];
    flex::ldmatrix_x4_trans(x, src + flex::staged_block_offset(q, chunk0 + m % 2));
    col[2 * k][0] = x[0];
    col[2 * k][1] = x[1];
    col[2 * k + 1][0] = x[2];
    col[2 * k + 1][1] = x[3];
  }
}

// The Tile value of query row q (of the tile) for warpgroup wg.
template <class E>
__device__ __forceinline__ float read_tile(const unsigned char* tile, int q, int wg) {
  return to_float<E>(*reinterpret_cast<const unsigned short*>(tile + 4 * q + 2 * wg));
}

// Spread rows: the Tile value of query row q (of the tile) for warp w (J = j0 + w).
template <class E>
__device__ __forceinline__ float read_tile8(const unsigned char* tile, int q, int warp) {
  return to_float<E>(*reinterpret_cast<const unsigned short*>(tile + 16 * q + 2 * warp));
}

// One round of a reduce-scatter over lane bit 2 kHalf: v[0 .. kHalf) becomes the sum of this lane's and the partner
// lane's v[j + kHalf upper], upper = whether this lane has the bit (a compile-time round, so v stays in registers).
template <int kHalf>
__device__ __forceinline__ void halving_round(float (&v)[16], int lane) {
  const bool upper = lane & (2 * kHalf);
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const float send = upper ? v[j] : v[j + kHalf];
    const float keep = upper ? v[j + kHalf] : v[j];
    v[j] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * kHalf);
  }
}

// Spread rows: dS^T of the thread into its warp's slab, [64 q][kSlabStride] floats, column r = the row in the warp
// (the Col gradient's cross-warp sum), and, with a Tile gradient, the warp's sums over its 16 rows (its J) into
// row_sums[warp][q]. Those are reduced in registers: a thread adds its two rows, then three shuffle rounds over
// the 8 lanes of a column set each halve the values a lane keeps (16 -> 2: query columns 8 g + 2 t4, + 1).
template <bool kTileGrad, int kMT>
__device__ __forceinline__ void write_slab(float* slabs, const float (&ds)[kMT][4], int warp, int lane) {
  static_assert(kMT == 8, "write_slab: 64 query columns");
  float* slab = slabs + warp * kRows * kSlabStride;
  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) slab[(nt * 8 + 2 * t4 + e % 2) * kSlabStride + g + (e / 2) * 8] = ds[nt][e];
  if constexpr (kTileGrad) {
    float v[16];  // v[2 nt + u]: query column nt * 8 + 2 t4 + u, summed over the thread's rows g and g + 8
#pragma unroll
    for (int nt = 0; nt < kMT; ++nt) {
      v[2 * nt] = ds[nt][0] + ds[nt][2];
      v[2 * nt + 1] = ds[nt][1] + ds[nt][3];
    }
    // Round with lane bit 4 (g bit 2) keeps v[8 b ..], bit 3 (g bit 1) v[4 b ..], bit 2 (g bit 0) v[2 b ..].
    halving_round<8>(v, lane);
    halving_round<4>(v, lane);
    halving_round<2>(v, lane);
    float* sums = slabs + 8 * kRows * kSlabStride;
    *reinterpret_cast<float2*>(sums + warp * kRowSumStride + 8 * g + 2 * t4) = make_float2(v[0], v[1]);
  }
}

// dS^T of the thread (kMT n8 blocks of the accumulator layout) into its warpgroup's plane.
template <int kMT>
__device__ __forceinline__ void write_plane(float* planes, const float (&ds)[kMT][4], int wg, int warp, int lane) {
  float* plane = planes + wg * kRows * kPlaneStride;
  const int g = lane / 4, t4 = lane % 4;
  const int c = 16 * (warp % 4) + g;
#pragma unroll
  for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) plane[(nt * 8 + 2 * t4 + e % 2) * kPlaneStride + c + (e / 2) * 8] = ds[nt][e];
}

// Adds v[0 .. 3] into columns c .. c + 3 of one gradient row, at element offset off: one float4 atomic where the
// row has all four columns and the address is 16-byte aligned (sm_90, not deterministic), else per element,
// skipping zeros and columns at or past `cols`.
template <bool kDeterministic>
__device__ __forceinline__ void add_quad(void* grad, long long off, int c, int cols, const float (&v)[4]) {
  bool vec = !kDeterministic && c + 4 <= cols && (off & 3) == 0 && (reinterpret_cast<unsigned long long>(grad) & 15) == 0;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
  vec = false;
#else
  if (vec) atomicAdd(reinterpret_cast<float4*>(static_cast<float*>(grad) + off), make_float4(v[0], v[1], v[2], v[3]));
#endif
  if (!vec) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (v[k] != 0.f && c + k < cols) flex_bwd::accumulate<kDeterministic>(grad, off + k, v[k]);
  }
}

// Adds t0 and t1 into the adjacent gradient elements off and off + 1 where they exist (valid0, valid1): one 8-byte
// atomic where both do and the pair is aligned (sm_90, not deterministic), else per element, skipping zeros.
template <bool kDeterministic>
__device__ __forceinline__ void add_two(void* grad, long long off, bool valid0, bool valid1, float t0, float t1) {
  bool pair = !kDeterministic && valid0 && valid1 && (off & 1) == 0 && (reinterpret_cast<unsigned long long>(grad) & 7) == 0;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
  pair = false;
#endif
  if (pair) {
    flex_bwd::add_pair(static_cast<float*>(grad) + off, t0, t1);
  } else {
    if (valid0 && t0 != 0.f) flex_bwd::accumulate<kDeterministic>(grad, off, t0);
    if (valid1 && t1 != 0.f) flex_bwd::accumulate<kDeterministic>(grad, off + 1, t1);
  }
}

// The tile's gradients from both planes (after a CTA barrier that follows every write_plane): thread tid sums
// columns 4 (tid % 4) + 16 k .. + 3 (k = 0..3) of query row tid / 4, so that each of a warp's four vector
// reductions covers 64 contiguous bytes of 8 rows (whole 32-byte sectors; columns 16 (tid % 4) .. + 15 per
// thread sent every sector half-filled).
template <class Variant, bool kDeterministic>
__device__ __forceinline__ void flush_grads(const FlexBackwardParams& p, const typename Variant::Params& vp, const float* planes, int b, int h,
                                            int hkv, int m0, int n0, int tid) {
  const int i = tid / 4, c0 = 4 * (tid % 4);
  const int row = m0 + i;
  const bool valid = row < p.seqlen_q;
  float a[16], s[16];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 x = *reinterpret_cast<const float4*>(planes + i * kPlaneStride + c0 + 16 * k);
    const float4 y = *reinterpret_cast<const float4*>(planes + (kRows + i) * kPlaneStride + c0 + 16 * k);
    a[4 * k] = x.x, a[4 * k + 1] = x.y, a[4 * k + 2] = x.z, a[4 * k + 3] = x.w;
    s[4 * k] = y.x, s[4 * k + 1] = y.y, s[4 * k + 2] = y.z, s[4 * k + 3] = y.w;
  }
  if constexpr (Variant::kStagedTileScatter >= 0) {
    // Warpgroup w's J = n0 / 64 + w: the row sum of plane w.
    float t0 = 0.f, t1 = 0.f;
#pragma unroll
    for (int k = 0; k < 16; ++k) t0 += a[k], t1 += s[k];
    t0 += __shfl_xor_sync(0xffffffffu, t0, 1);
    t0 += __shfl_xor_sync(0xffffffffu, t0, 2);
    t1 += __shfl_xor_sync(0xffffffffu, t1, 1);
    t1 += __shfl_xor_sync(0xffffffffu, t1, 2);
    if (valid && tid % 4 == 0) {
      const StagedRows r = Variant::staged_tile(vp, b, h, hkv);
      void* grad = p.grad_ptr[Variant::kStagedTileScatter];
      const int j0 = n0 / 64;
      const long long off = r.grad_base + (long long)row * r.cols + j0;
      // Both warpgroups' sums share a sector: one 8-byte vector atomic where the element pair is aligned.
      add_two<kDeterministic>(grad, off, true, (j0 + 1) * 64 < p.seqlen_kv, t0, t1);
    }
  }
  if constexpr (Variant::kStagedColScatter >= 0) {
    bool any = false;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      a[k] += s[k];
      any = any || a[k] != 0.f;
    }
    if (valid && any) {
      const StagedRows r = Variant::staged_col(vp, b, h, hkv);
      void* grad = p.grad_ptr[Variant::kStagedColScatter];
      const long long off = r.grad_base + (long long)row * r.cols + c0;
      // Vector atomics where the row allows (sm_90: one L2 request per 4 floats). What they cost is the number
      // of 32-byte sectors reduced in L2, hence the column order above, which fills whole sectors. A bulk
      // reduction of whole rows (cp.reduce.async.bulk) measured the same as the vector atomics.
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float v[4] = {a[4 * k], a[4 * k + 1], a[4 * k + 2], a[4 * k + 3]};
        add_quad<kDeterministic>(grad, off + 16 * k, c0 + 16 * k, r.cols, v);
      }
    }
  }
}

// Spread rows: the tile's gradients from the eight slabs (after a CTA barrier that follows every write_slab), by
// thread tid for query row tid / 4 and sub = tid % 4: the Col columns 16 (n % 4) + 4 sub .. + 3 summed over the
// warps (a warp's vector atomics cover 8 rows x 64 contiguous bytes), and the Tile elements J = j0 + 2 sub, + 1
// summed over their warps' 16 rows (8 rows x 32 bytes).
template <class Variant, bool kDeterministic>
__device__ __forceinline__ void flush_spread(const FlexBackwardParams& p, const typename Variant::Params& vp, const float* slabs, int b, int h,
                                             int hkv, int m0, int j0, int col0, int tid) {
  const int i = tid / 4, sub = tid % 4;
  const int row = m0 + i;
  if (row >= p.seqlen_q) return;
  {
    float4 x[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) x[w] = *reinterpret_cast<const float4*>(slabs + (w * kRows + i) * kSlabStride + 4 * sub);
    // A tree, not a chain of eight dependent adds behind the loads.
#pragma unroll
    for (int step = 1; step < 8; step *= 2)
#pragma unroll
      for (int w = 0; w < 8; w += 2 * step) x[w] = make_float4(x[w].x + x[w + step].x, x[w].y + x[w + step].y, x[w].z + x[w + step].z, x[w].w + x[w + step].w);
    const float a[4] = {x[0].x, x[0].y, x[0].z, x[0].w};
    const StagedRows r = Variant::staged_col(vp, b, h, hkv);
    void* grad = p.grad_ptr[Variant::kStagedColScatter];
    const int c = col0 + 4 * sub;
    add_quad<kDeterministic>(grad, r.grad_base + (long long)row * r.cols + c, c, r.cols, a);
  }
  if constexpr (Variant::kStagedTileScatter >= 0) {
    const float* sums = slabs + 8 * kRows * kSlabStride;
    const float t[2] = {sums[2 * sub * kRowSumStride + i], sums[(2 * sub + 1) * kRowSumStride + i]};
    const StagedRows r = Variant::staged_tile(vp, b, h, hkv);
    void* grad = p.grad_ptr[Variant::kStagedTileScatter];
    const int j = j0 + 2 * sub;
    add_two<kDeterministic>(grad, r.grad_base + (long long)row * r.cols + j, j * 64 < p.seqlen_kv, (j + 1) * 64 < p.seqlen_kv, t[0], t[1]);
  }
}

// The selectors at `base` + Tile::spare_offset(t) (Tile: the K layout with spare regions, or SelectorTiles): selector 0
// has a one in column lr % 16 of row lr (the Col sums, warpgroup 0's), selector 1 in column lr / 16 (the Tile sums,
// warpgroup 1's; columns 8 .. 15 stay zero), every other column of the region zero. Written once per CTA by all
// threads; the fence and barrier before the first dQ GEMM publish them to the tensor cores.
template <class Tile, class Element>
__device__ __forceinline__ void build_selectors(unsigned char* base, int tid, int nthreads) {
  static_assert(Tile::kSpares == 2, "build_selectors: two selector regions");
  constexpr unsigned short kOne = flex::std_like::is_same<Element, __nv_bfloat16>::value ? 0x3F80u : 0x3C00u;
  constexpr int kChunks = Tile::kChunksPerRegionRow;
  for (int i = tid; i < 2 * 128 * kChunks; i += nthreads) {
    const int t = i / (128 * kChunks), row = (i / kChunks) % 128, chunk = i % kChunks;
    const int one = t == 0 ? row % 16 : row / 16;
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int c = chunk * 8 + 2 * k;
      w[k] = (c == one ? kOne : 0u) | ((c + 1 == one ? kOne : 0u) << 16);
    }
    // Region 0's chunk offset is the offset inside any region.
    *reinterpret_cast<uint4*>(base + Tile::spare_offset(t) + Tile::chunk_offset(row, chunk)) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Separate selectors: issues (and commits as one group) this warpgroup's selector GEMM, acc = dS . selector over the
// 128 local KV rows: A = the dS^T tile (MN-major, as the dQ GEMM reads it), B = selector tile `which` (0: Col, 1: Tile).
template <class TileDS, class Element>
__device__ __forceinline__ void issue_selector_gemm(float (&acc)[8], unsigned s_ds, unsigned s_sel, int which) {
  static_assert(TileDS::kBytes == 128 * 64 * 2, "issue_selector_gemm: a [128 kv][64 q] dS^T tile");
  flex::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 128 / 16; ++kk)
    flex::Wgmma<16>::template ss<Element, 1, 1>(acc, flex::desc_mn_major<TileDS>(s_ds, kk * 16, 0),
                                                flex::desc_mn_major<SelectorTile>(s_sel + which * SelectorTile::kBytes, kk * 16, 0), kk > 0 ? 1 : 0);
  flex::wgmma_commit();
}

// Two fixed-point values into adjacent 8-byte entries of a blocked stage (see kBlockColW).
__device__ __forceinline__ void store_fixed_pair(unsigned addr, float x, float y) {
  asm volatile("st.shared.v2.u64 [%0], {%1, %2};\n" ::"r"(addr), "l"(flex_bwd::to_fixed(x)), "l"(flex_bwd::to_fixed(y)) : "memory");
}

// Warpgroup 0 after its selector sums completed: the Col gradient of query rows q_row0 and q_row0 + 8, columns
// col0 + (0 .. 15). Partner lanes t4 and t4 ^ 1 swap one pair so each sends 4 adjacent columns as one float4
// atomic (a warp covers 8 rows x 64 contiguous bytes; add_quad falls back to one per element), or, with s_block set,
// stores them as fixed point into this tile's Col block in shared memory (query tile m0).
template <class Variant, bool kDeterministic>
__device__ __forceinline__ void flush_selected_col(const FlexBackwardParams& p, const typename Variant::Params& vp, const float (&acc)[8], int b,
                                                   int h, int hkv, int q_row0, int col0, int t4, int m0 = 0, unsigned s_block = 0) {
  const StagedRows r = Variant::staged_col(vp, b, h, hkv);
  void* grad = p.grad_ptr[Variant::kStagedColScatter];
  const bool odd = t4 & 1;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float a0 = acc[2 * half], a1 = acc[2 * half + 1], b0 = acc[4 + 2 * half], b1 = acc[4 + 2 * half + 1];
    const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
    const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
    const int row = q_row0 + 8 * half;
    if (row >= p.seqlen_q) continue;
    const int c = odd ? col0 + 8 + 2 * (t4 - 1) : col0 + 2 * t4;
    const float v[4] = {odd ? r0 : a0, odd ? r1 : a1, odd ? b0 : r0, odd ? b1 : r1};
    if (s_block != 0) {
      const unsigned at = s_block + ((row - m0) * kBlockColW + (c - col0)) * 8;
      store_fixed_pair(at, v[0], v[1]);
      store_fixed_pair(at + 16, v[2], v[3]);
    } else {
      add_quad<kDeterministic>(grad, r.grad_base + (long long)row * r.cols + c, c, r.cols, v);
    }
  }
}

// Warpgroup 1 after its selector sums completed: the Tile gradient of query rows q_row0 and q_row0 + 8 for J = j0 +
// 2 t4 and + 1 (the first n8 block; the second is the selector's zero columns), one 8-byte atomic per pair
// (s_block = 0), or into this tile's Tile block in shared memory (query tile m0), whose entries past Skv get the
// zeros their dS sums to.
template <class Variant, bool kDeterministic>
__device__ __forceinline__ void flush_selected_tile(const FlexBackwardParams& p, const typename Variant::Params& vp, const float (&acc)[8], int b,
                                                    int h, int hkv, int q_row0, int j0, int t4, int m0 = 0, unsigned s_block = 0) {
  const StagedRows r = Variant::staged_tile(vp, b, h, hkv);
  void* grad = p.grad_ptr[Variant::kStagedTileScatter];
  const int j = j0 + 2 * t4;
  const bool v0 = j * 64 < p.seqlen_kv, v1 = (j + 1) * 64 < p.seqlen_kv;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = q_row0 + 8 * half;
    if (row >= p.seqlen_q) continue;
    if (s_block != 0)
      store_fixed_pair(s_block + kBlockedColBytes + ((row - m0) * kBlockTileW + 2 * t4) * 8, v0 ? acc[2 * half] : 0.f, v1 ? acc[2 * half + 1] : 0.f);
    else
      add_two<kDeterministic>(grad, r.grad_base + (long long)row * r.cols + j, v0, v1, acc[2 * half], acc[2 * half + 1]);
  }
}

// A blocked stage's Col block (col = true; slice0: the CTA's first kv % 64 column) or Tile block (its first J) of
// query tile m0, added to the blocked accumulator by one bulk reduction in this thread's bulk group. After a
// fence_proxy_async and a barrier that follow every store of the block.
template <class Variant>
__device__ __forceinline__ void send_block(const FlexBackwardParams& p, const typename Variant::Params& vp, unsigned s_stage, int b, int h,
                                           int hkv, int m0, bool col, int slice0) {
  const StagedRows r = col ? Variant::staged_col(vp, b, h, hkv) : Variant::staged_tile(vp, b, h, hkv);
  const int w = col ? kBlockColW : kBlockTileW;
  unsigned long long* dst = static_cast<unsigned long long*>(p.grad_ptr[col ? Variant::kStagedColScatter : Variant::kStagedTileScatter]) +
                            flex_bwd::blocked_index(r.rows, r.cols, w, r.grad_base, m0, slice0);
  flex::bulk_reduce_add_u64(dst, s_stage + (col ? 0 : kBlockedColBytes), min(kRows, p.seqlen_q - m0) * w * 8);
  flex::bulk_commit();
}

}  // namespace flex_bwd_staged
