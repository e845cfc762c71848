// Builds a block mask on the GPU: for each (b, h, query tile) the lists of partial and full
// KV tiles (see FlexBlockMask in flex_params.cuh). Masks without buffers are classified by
// interval arithmetic over each tile's index box (no dense pass); data-dependent masks by
// evaluating mask_mod on every element of the tile.
#pragma once
#include "flex_interval.cuh"
#include "flex_blockmask_params.cuh"
#include "flex_params.cuh"

namespace flex_blockmask {

constexpr int kThreads = 128;

// The KV tile classes, in shared memory during a build.
enum : unsigned char { kEmpty = 0, kFull = 1, kPartial = 2 };

// Writes the lists of one (b, h, query tile) from the per-tile classes in `cls`.
__device__ __forceinline__ void compact(const FlexBlockMaskBuildParams& p, const unsigned char* cls, int num_kv_tiles, int b, int h,
                                        int qt) {
  long long row = (long long)b * p.stride_b + (long long)h * p.stride_h + qt;
  if (threadIdx.x == 0) {
    int np = 0, nf = 0;
    int* pidx = p.kv_partial_idx + row * p.max_kv_tiles;
    int* fidx = p.kv_full_idx + row * p.max_kv_tiles;
    for (int t = 0; t < num_kv_tiles; ++t) {
      if (cls[t] == kPartial) pidx[np++] = t;
      else if (cls[t] == kFull) fidx[nf++] = t;
    }
    p.kv_num_partial[row] = np;
    p.kv_num_full[row] = nf;
  }
}

}  // namespace flex_blockmask

// Interval path: grid (num_q_tiles, Hm, Bm), kThreads threads, dynamic shared memory of
// max_kv_tiles bytes. Box::classify returns 0 / 1 / 2 for a box of indices.
template <class Variant, class Box>
__device__ void flex_build_block_mask_interval(const FlexBlockMaskBuildParams& p, const typename Variant::Params& vp) {
  extern __shared__ unsigned char cls[];
  const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int num_kv_tiles = (p.seqlen_kv + p.kv_tile - 1) / p.kv_tile;
  const int group = p.heads / p.kv_heads;
  // A broadcast dimension stands for every index it covers.
  fji::I bi = p.stride_b ? fji::pt((long long)b) : fji::I{0, p.batch - 1};
  fji::I hi = p.stride_h ? fji::pt((long long)h) : fji::I{0, p.heads - 1};
  fji::I hkv = p.stride_h ? fji::pt((long long)(h / group)) : fji::I{0, p.kv_heads - 1};
  const long long q0 = (long long)qt * p.q_tile;
  const long long q1 = min((long long)p.seqlen_q, q0 + p.q_tile) - 1;
  fji::I qi{q0 + p.query_offset, q1 + p.query_offset};
  for (int t = threadIdx.x; t < num_kv_tiles; t += blockDim.x) {
    const long long k0 = (long long)t * p.kv_tile;
    const long long k1 = min((long long)p.seqlen_kv, k0 + p.kv_tile) - 1;
    cls[t] = (unsigned char)Box::classify(vp, bi, hi, hkv, qi, fji::I{k0 + p.kv_offset, k1 + p.kv_offset});
  }
  __syncthreads();
  flex_blockmask::compact(p, cls, num_kv_tiles, b, h, qt);
}

namespace flex_blockmask {

// mask_mod of element (q0 + r, k0 + j) of a tile, with the state the kernel would hoist for it. A variant whose hooks
// need aligned tiles (kTileAligned) sees the element in its kTileCols-column part of the tile, as the kernels call it.
template <class Variant>
__device__ __forceinline__ bool keeps(const FlexBlockMaskBuildParams& p, const typename Variant::Params& vp, int b, int h, int hkv, int q0,
                                      int k0, int r, int j) {
  const int q = q0 + r + p.query_offset;
  const int part = Variant::kTileAligned ? j / Variant::kTileCols * Variant::kTileCols : 0;
  const int kp = k0 + part + p.kv_offset, jp = j - part;  // kv_offset: a multiple of kTileCols when kTileAligned
  typename Variant::Row row;
  typename Variant::Col col;
  typename Variant::Tile tile;
  Variant::row(vp, row, b, h, hkv, q);
  Variant::col(vp, row, col, b, h, hkv, q, jp);
  Variant::tile(vp, row, tile, b, h, hkv, q, kp);
  return Variant::mask_mod(vp, row, col, tile, b, h, hkv, q, kp, jp);
}

}  // namespace flex_blockmask

// Dense path: every element of every tile is evaluated with the variant's mask_mod.
template <class Variant>
__device__ void flex_build_block_mask_dense(const FlexBlockMaskBuildParams& p, const typename Variant::Params& vp) {
  extern __shared__ unsigned char cls[];
  const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int num_kv_tiles = (p.seqlen_kv + p.kv_tile - 1) / p.kv_tile;
  const int hkv = h / (p.heads / p.kv_heads);
  const int q0 = qt * p.q_tile;
  const int rows = min(p.seqlen_q - q0, p.q_tile);
  for (int t = 0; t < num_kv_tiles; ++t) {
    const int k0 = t * p.kv_tile;
    const int cols = min(p.seqlen_kv - k0, p.kv_tile);
    bool any_true = false, any_false = false;
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
      const bool keep = flex_blockmask::keeps<Variant>(p, vp, b, h, hkv, q0, k0, e / cols, e % cols);
      any_true |= keep;
      any_false |= !keep;
    }
    any_true = __syncthreads_or(any_true);
    any_false = __syncthreads_or(any_false);
    if (threadIdx.x == 0) cls[t] = !any_true ? flex_blockmask::kEmpty : (!any_false ? flex_blockmask::kFull : flex_blockmask::kPartial);
  }
  __syncthreads();
  flex_blockmask::compact(p, cls, num_kv_tiles, b, h, qt);
}

// Ranks the query tiles of one (b, h) mask row by their count of listed KV tiles, heaviest first, ties the later
// tile first (FlexQTileWork); run after the dense builder. grid (Hm, Bm), kThreads threads, dynamic shared memory
// num_q_tiles ints rounded up to a multiple of 4 (the compiler vectorises the reads of the inner loop). Each
// thread counts, for its tiles, the tiles ahead of them: O(nq^2 / kThreads) compares, once per build (nq = 64 at
// 8192 rows).
__device__ void flex_rank_q_tiles(const FlexBlockMaskBuildParams& p) {
  extern __shared__ int work[];
  const int nq = p.num_q_tiles;
  const long long row = (long long)blockIdx.y * p.stride_b + (long long)blockIdx.x * p.stride_h;
  for (int t = threadIdx.x; t < nq; t += blockDim.x) {
    work[t] = p.kv_num_partial[row + t] + p.kv_num_full[row + t];
  }
  __syncthreads();
  for (int t = threadIdx.x; t < nq; t += blockDim.x) {
    const int wt = work[t];
    int rank = 0;
    for (int u = 0; u < nq; ++u) {
      const int wu = work[u];
      rank += (wu > wt || (wu == wt && u > t)) ? 1 : 0;
    }
    FlexQTileWork item{};
    item.m_block = t;
    item.n_partial = p.kv_num_partial[row + t];
    item.n_full = p.kv_num_full[row + t];
    p.q_order[row + rank] = item;
  }
}
