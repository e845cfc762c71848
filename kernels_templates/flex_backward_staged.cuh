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
// Gradients: every warpgroup writes its dS^T (fp32) into a [64 q][68] plane; after the CTA barrier before dQ,
// each thread sums 16 consecutive columns of one query row over both planes (Col: one vector atomic per 4
// columns) and over each plane (Tile: the warpgroup's J, one atomic per row, no other CTA writes that element).
#pragma once
#include "flex_backward.cuh"

namespace flex_bwd_staged {

using flex_bwd::StagedRows;

constexpr int kRows = 64;                       // query rows per tile (flex_backward_main_sm90's kBlockM)
constexpr int kColBytes = kRows * 64 * 2;       // one Col tile: [64 q][64] 2-byte elements
constexpr int kTileBytes = kRows * 2 * 2;       // one Tile tile: [64 q][2] 2-byte elements
constexpr int kPlaneStride = 68;                // floats per query row of a dS^T plane: the accumulator-layout
                                                // stores (rows 2 t4 + e, columns g) hit 32 distinct banks
constexpr int kGradBytes = 2 * kRows * kPlaneStride * 4;

// What a variant stages (Variant = void: nothing, for layouts computed without a variant).
template <class Variant>
struct Flags {
  static constexpr bool kCol = Variant::kStagedCol;
  static constexpr bool kTile = Variant::kStagedTile;
  static constexpr bool kGrad = Variant::kStagedColScatter >= 0 || Variant::kStagedTileScatter >= 0;
  static constexpr bool kAny = kCol || kTile;
};
template <>
struct Flags<void> {
  static constexpr bool kCol = false, kTile = false, kGrad = false, kAny = false;
};

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

// The thread's Col values of the tile: col[nt][half] packs rows 16 (warp % 4) + 8 half + g, query columns
// nt * 8 + 2 t4 (low) and + 1 (high). Four ldmatrix.trans: matrix m of one covers n8 block 2 k + m / 2, half m % 2.
__device__ __forceinline__ void read_col(unsigned (&col)[kRows / 8][2], unsigned src, int warp, int lane) {
  const int m = lane / 8, rr = lane % 8;
#pragma unroll
  for (int k = 0; k < kRows / 16; ++k) {
    const int q = (2 * k + m / 2) * 8 + rr;
    unsigned x[4];
    flex::ldmatrix_x4_trans(x, src + flex::staged_block_offset(q, 2 * (warp % 4) + m % 2));
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

// The tile's gradients from both planes (after a CTA barrier that follows every write_plane): thread tid sums
// columns 16 (tid % 4) .. + 15 of query row tid / 4.
template <class Variant, bool kDeterministic>
__device__ __forceinline__ void flush_grads(const FlexBackwardParams& p, const typename Variant::Params& vp, const float* planes, int b, int h,
                                            int hkv, int m0, int n0, int tid) {
  const int i = tid / 4, c0 = 16 * (tid % 4);
  const int row = m0 + i;
  const bool valid = row < p.seqlen_q;
  float a[16], s[16];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 x = *reinterpret_cast<const float4*>(planes + i * kPlaneStride + c0 + 4 * k);
    const float4 y = *reinterpret_cast<const float4*>(planes + (kRows + i) * kPlaneStride + c0 + 4 * k);
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
      if (t0 != 0.f) flex_bwd::accumulate<kDeterministic>(grad, off, t0);
      if (t1 != 0.f && (j0 + 1) * 64 < p.seqlen_kv) flex_bwd::accumulate<kDeterministic>(grad, off + 1, t1);
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
      // Vector atomics where the row allows (sm_90: one L2 request per 4 floats). A bulk reduction of whole
      // rows (cp.reduce.async.bulk) measured the same: the cost is the reduction traffic, not the requests.
      bool vec = !kDeterministic && (off & 3) == 0 && (reinterpret_cast<unsigned long long>(grad) & 15) == 0;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
      vec = false;
#else
      if (vec) {
        float4* dst = reinterpret_cast<float4*>(static_cast<float*>(grad) + off);
#pragma unroll
        for (int k = 0; k < 4; ++k) atomicAdd(dst + k, make_float4(a[4 * k], a[4 * k + 1], a[4 * k + 2], a[4 * k + 3]));
      }
#endif
      if (!vec) {
#pragma unroll
        for (int k = 0; k < 16; ++k)
          if (a[k] != 0.f) flex_bwd::accumulate<kDeterministic>(grad, off + k, a[k]);
      }
    }
  }
}

}  // namespace flex_bwd_staged
