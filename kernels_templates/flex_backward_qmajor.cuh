// The query-major backward pass (mma.sync, sm_80+): dQ without atomics, and the buffer-gradient scatters whose
// target a query row owns (SAM's rel_w[.., q, kv % 64] and rel_h[.., q, kv // 64], bias[offset[q]]).
#pragma once
#include "flex_backward.cuh"

// One CTA owns kBlockM query rows of one (b, h) and loops over the KV tiles the forward block mask lists for
// them, with the forward's geometry (128 query rows, 64-wide KV tiles), so the lists are read directly and the
// variant is hoisted as in the forward (Row / Col / Tile state; kBlockN = 64 keeps a tile inside one 64-aligned
// group, which is what makes kv // 64 a Tile value and kv % 64 a Col value). Per KV tile, per warp (16 rows):
//   S = Q K^T, dP = dO V^T                                      (recomputed: this pass runs beside the KV-major one)
//   P = exp2(score_mod(scale S) log2e - lse2), dS = P (dP - delta)
//   row-owned scatters (below), dS_pre = dS * d_score
//   dQ += dS_pre K                                              (K via ldmatrix.trans, as V in the forward's P V)
// and at the end dq = scale * dQ in q's dtype, written once: no accumulator, no atomics, no conversion kernel.
// Fully masked rows (lse2 = +inf) get P = 0 everywhere and so dq = 0.
//
//   kHeadDim | kBlockM | kBlockN | kNWarps | K/V stages | shared memory
//   ---------+---------+---------+---------+------------+--------------
//   32..128  |   128   |    64   |    8    |     2      | 4 (Q, dO, 2 x K, 2 x V) tiles: 73,728 B at D64, 139,264 B at D128
//   192, 256 |   128   |    64   |    8    |     1      | 153,600 B at D192, 202,752 B at D256 (sm_90's limit only)
//
// 8 warps of 16 rows rather than the forward's 4 x 32: the pass holds three accumulators (S, dP, dQ) where the
// forward holds two, plus the register accumulators of the row-owned scatters (a 16-row warp owns 2 rows x 16
// columns of a tile per thread: 32 registers per rel_w-like scatter instead of 64).
//
// Row-owned scatters (the generator's kScatterRowClass; everything else stays in the KV-major kernel):
//   kRowCol  target depends on q and on kv only through the column j (kv % c, c dividing 64): the same element
//            for (q, j) in every tile, so it is summed in registers across tiles and added once per (row, column)
//            at the end;
//   kRowTile target depends on q and on kv only through the tile (kv // c, c a multiple of 64): a row sum per tile
//            (the thread's 16 elements, then a quad shuffle), one add per row and tile;
//   kRowSum  target depends on q only: summed over the whole row, one add per row at the end.
// The adds are atomics (fp32, or 64-bit fixed point when deterministic) because the generator cannot prove
// that distinct rows have distinct targets (clamped indices, data-dependent offsets); each is formed in a fixed
// order, so the deterministic result does not depend on scheduling.
//
// Contract with the generated variant (compiler/codegen/codegen_cuda_grad.cpp, the hoisted "Q" struct): the
// forward's (Params, Row, Col, Tile, row, col, tile, score_mod, mask_mod), plus kDScoreIsOne, d_score,
// kNumScatters, kScatterRowClass[I], scatter_coef<I>(vp, b, h, hkv, q, kv, score) -> float and
// scatter_offset<I>(vp, b, h, hkv, q, kv) -> long long (computed once per target, at a representative kv).

template <int kHeadDim_, class Element_>
struct FlexBackwardQTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr FlexBackwardPolicy kPolicy = flex_backward_tiles(kHeadDim_);
  static constexpr int kBlockM = kPolicy.qmajor_block_m;
  static constexpr int kBlockN = kPolicy.qmajor_block_n;
  static constexpr int kNWarps = kPolicy.qmajor_warps;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kNWarps;  // one m16 tile
  static constexpr int kNTiles = kBlockN / 8;              // n8 accumulator tiles of S per warp
  static constexpr int kDTiles = kHeadDim / 8;             // n8 accumulator tiles of dQ per warp
  static constexpr int kD16 = kHeadDim / 16;
  static constexpr int kRowsPerThread = 2;                 // rows g and g + 8 of the warp's m16 tile
  static constexpr int kColsPerThread = 2 * kNTiles;       // Variant::Col arrays are [kRowsPerThread][kColsPerThread]
  static constexpr int kStages = kPolicy.qmajor_stages;    // K/V buffers
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kSmemStride = kHeadDim + 8;         // as the forward: odd count of 16-byte chunks per row
  static constexpr int kRowTileBytes = kBlockM * kSmemStride * 2;
  static constexpr int kKvTileBytes = kBlockN * kSmemStride * 2;
  static constexpr int kOffQ = 0;
  static constexpr int kOffDO = kOffQ + kRowTileBytes;
  static constexpr int kOffK = kOffDO + kRowTileBytes;
  static constexpr int kOffV = kOffK + kStages * kKvTileBytes;
  static constexpr int kSmemBytes = kOffV + kStages * kKvTileBytes;

  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 32 && kHeadDim <= 256,
                "FlexBackwardQTraits: head dim must be a multiple of 16 in [32, 256]");
  static_assert(kRowsPerWarp == 16, "FlexBackwardQTraits: each warp owns one 16-row mma tile");
  static_assert(kSmemBytes <= 232448, "FlexBackwardQTraits: shared memory exceeds sm_90's 227 KB per block");
};

namespace flex_bwdq {

// Where a scatter's target sits for the query-major pass (Variant::kScatterRowClass).
enum : int {
  kRowNone = 0,  // not this pass's (the KV-major kernel computes it)
  kRowSum = 1,   // q only
  kRowCol = 2,   // q and kv % 64 (the column inside a tile)
  kRowTile = 3,  // q and kv // 64 (the tile)
};

// The 16x16 A fragment of columns [16 kk, 16 kk + 16) of a 16-row accumulator tile (two n8 tiles), rounded to
// the element type: the mma C layout of rows g, g + 8 matches the A layout of a0..a3.
template <class Mma, int kNT>
__device__ __forceinline__ void a_fragment(unsigned (&a)[4], const float (&acc)[kNT][4], int kk) {
  a[0] = Mma::pack(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = Mma::pack(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = Mma::pack(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = Mma::pack(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// The scatters of one tile (dS in ds, pre-mod scores in score; the thread's rows q_r[0], q_r[1], columns
// k0 + nt * 8 + 2 * t4 + e % 2). kRowCol and kRowSum accumulate into registers; kRowTile adds its row sums now.
template <class Traits, class Variant, bool kDeterministic, int I, int kNS>
__device__ __forceinline__ void scatter_tile(const FlexBackwardParams& p, const typename Variant::Params& vp,
                                             const float (&ds)[Traits::kNTiles][4], const float (&score)[Traits::kNTiles][4],
                                             float (&acc_col)[kNS][2][Traits::kColsPerThread], float (&acc_row)[kNS][2], int b, int h,
                                             int hkv, const int (&q_r)[2], int k0, int t4) {
  constexpr int kClass = Variant::kScatterRowClass[I];
  if constexpr (kClass != kRowNone) {
    float rsum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < Traits::kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float d = ds[nt][e];
        if (d != 0.f) {
          const int r = e / 2;
          long long off;
          const float v = flex_bwd::BackwardMods<Variant>::template scatter<I, /*kOffset=*/false>(vp, b, h, hkv, q_r[r], k0 + nt * 8 + 2 * t4 + e % 2,
                                                                                                 score[nt][e], d, off);
          if constexpr (kClass == kRowCol) acc_col[I][r][nt * 2 + e % 2] += v;
          else rsum[r] += v;
        }
      }
    if constexpr (kClass == kRowSum) {
      acc_row[I][0] += rsum[0];
      acc_row[I][1] += rsum[1];
    } else if constexpr (kClass == kRowTile) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float s = flex::quad_sum(rsum[r]);
        if (t4 == 0 && s != 0.f && q_r[r] < p.seqlen_q)
          flex_bwd::accumulate<kDeterministic>(p.grad_ptr[I], Variant::template scatter_offset<I>(vp, b, h, hkv, q_r[r], k0), s);
      }
    }
  }
  if constexpr (I + 1 < Variant::kNumScatters)
    scatter_tile<Traits, Variant, kDeterministic, I + 1, kNS>(p, vp, ds, score, acc_col, acc_row, b, h, hkv, q_r, k0, t4);
}

// End of the CTA: the register accumulators of kRowCol (one add per row and column) and kRowSum (one per row).
// A nonzero column sum implies an element of that column was in range, so kv = j < Skv there.
template <class Traits, class Variant, bool kDeterministic, int I, int kNS>
__device__ __forceinline__ void scatter_flush(const FlexBackwardParams& p, const typename Variant::Params& vp,
                                              const float (&acc_col)[kNS][2][Traits::kColsPerThread], const float (&acc_row)[kNS][2],
                                              int b, int h, int hkv, const int (&q_r)[2], int t4) {
  constexpr int kClass = Variant::kScatterRowClass[I];
  if constexpr (kClass == kRowCol) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < Traits::kColsPerThread; ++c) {
        const float v = acc_col[I][r][c];
        if (v != 0.f && q_r[r] < p.seqlen_q)
          flex_bwd::accumulate<kDeterministic>(p.grad_ptr[I],
                                               Variant::template scatter_offset<I>(vp, b, h, hkv, q_r[r], (c / 2) * 8 + 2 * t4 + c % 2), v);
      }
  } else if constexpr (kClass == kRowSum) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float s = flex::quad_sum(acc_row[I][r]);
      if (t4 == 0 && s != 0.f && q_r[r] < p.seqlen_q)
        flex_bwd::accumulate<kDeterministic>(p.grad_ptr[I], Variant::template scatter_offset<I>(vp, b, h, hkv, q_r[r], 0), s);
    }
  }
  if constexpr (I + 1 < Variant::kNumScatters)
    scatter_flush<Traits, Variant, kDeterministic, I + 1, kNS>(p, vp, acc_col, acc_row, b, h, hkv, q_r, t4);
}

}  // namespace flex_bwdq

// The query-major pass. grid = (ceil(Sq / kBlockM), H, B), block = kNThreads, dynamic smem = kSmemBytes.
// `bm`: the forward block mask (all pointers null: every KV tile, partial with a mask_mod); its query tile must be
// a multiple of kBlockM and its KV tile a multiple of kBlockN (a listed KV tile is walked as kv_tile / kBlockN
// tiles; the host checks). Reads delta and lse2 from the preprocessing kernel; writes dq and the row-owned
// scatters' gradients (cleared by the host).
template <class Traits, class Variant, bool kDeterministic>
__device__ __forceinline__ void flex_backward_qmajor(const FlexBackwardParams& p, const FlexBlockMask& bm,
                                                     const typename Variant::Params& vp) {
  using Element = typename Traits::Element;
  using Mma = flex::Mma16816<Element>;
  using L = flex_bwd::Loader<Traits>;
  using Mods = flex_bwd::BackwardMods<Variant>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kNT = Traits::kNTiles;
  constexpr int kDTiles = Traits::kDTiles;
  constexpr int kD16 = Traits::kD16;
  constexpr int kCols = Traits::kColsPerThread;
  constexpr int kStages = Traits::kStages;
  constexpr int kStride = Traits::kSmemStride;
  constexpr unsigned kKvBytes = Traits::kKvTileBytes;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kNS = Variant::kNumScatters > 0 ? Variant::kNumScatters : 1;

  extern __shared__ __align__(128) unsigned char flex_smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  // Heaviest query tiles first (the most KV tiles under causal-like masks), as the forward.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int hkv = h / (p.heads / p.kv_heads);
  const int m0 = m_block * kBlockM;
  const int seqlen_q = p.seqlen_q, seqlen_kv = p.seqlen_kv;

  const Element* g_q = static_cast<const Element*>(p.q) + b * p.q_stride_b + h * p.q_stride_h;
  const Element* g_do = static_cast<const Element*>(p.d_o) + b * p.do_stride_b + h * p.do_stride_h;
  const Element* g_k = static_cast<const Element*>(p.k) + b * p.k_stride_b + hkv * p.k_stride_h;
  const Element* g_v = static_cast<const Element*>(p.v) + b * p.v_stride_b + hkv * p.v_stride_h;
  const unsigned s_base = flex::smem_addr(flex_smem);
  const unsigned s_q = s_base + Traits::kOffQ, s_do = s_base + Traits::kOffDO;
  const unsigned s_k = s_base + Traits::kOffK, s_v = s_base + Traits::kOffV;

  // KV tiles: the forward's partial tiles (mask_mod per element) first, then its full ones. A listed tile of
  // kv_tile = sub * kBlockN columns is walked as sub consecutive tiles.
  const int* partial_idx = nullptr;
  const int* full_idx = nullptr;
  int n_partial = 0, n_full = 0, sub = 1;
  if (bm.kv_num_partial != nullptr || bm.kv_num_full != nullptr) {
    const long long off = b * bm.stride_b + h * bm.stride_h + m0 / bm.q_tile;
    if (bm.kv_num_partial != nullptr) {
      n_partial = bm.kv_num_partial[off];
      partial_idx = bm.kv_partial_idx + off * bm.max_kv_tiles;
    }
    if (bm.kv_num_full != nullptr) {
      n_full = bm.kv_num_full[off];
      full_idx = bm.kv_full_idx + off * bm.max_kv_tiles;
    }
    sub = bm.kv_tile / kBlockN;
  } else {
    const int n_blocks = (seqlen_kv + kBlockN - 1) / kBlockN;
    if (Variant::kHasMaskMod) n_partial = n_blocks;
    else n_full = n_blocks;
  }
  const int n_masked = n_partial * sub;
  const int n_tiles = (n_partial + n_full) * sub;
  auto tile_at = [&](int t) -> int {
    const int u = t / sub;
    int idx;
    if (u < n_partial) idx = partial_idx != nullptr ? partial_idx[u] : u;
    else idx = full_idx != nullptr ? full_idx[u - n_partial] : u - n_partial;
    return idx * sub + (t - u * sub);
  };
  auto load_kv = [&](int idx, int stage) {
    L::template load_rows<kBlockN>(s_k + stage * kKvBytes, g_k, p.k_stride_s, idx * kBlockN, seqlen_kv, tid);
    L::template load_rows<kBlockN>(s_v + stage * kKvBytes, g_v, p.v_stride_s, idx * kBlockN, seqlen_kv, tid);
  };

  // Group 0 = {Q, dO, KV tile 0}; with two stages group 1 = {KV tile 1} (possibly empty).
  int idx_cur = n_tiles > 0 ? tile_at(0) : 0;
  int idx_next = kStages == 2 && n_tiles > 1 ? tile_at(1) : 0;
  L::template load_rows<kBlockM>(s_q, g_q, p.q_stride_s, m0, seqlen_q, tid);
  L::template load_rows<kBlockM>(s_do, g_do, p.do_stride_s, m0, seqlen_q, tid);
  if (n_tiles > 0) load_kv(idx_cur, 0);
  flex::cp_async_commit();
  if constexpr (kStages == 2) {
    if (n_tiles > 1) load_kv(idx_next, 1);
    flex::cp_async_commit();
  }

  // Per thread: rows g and g + 8 of the warp's 16; their lse2 and delta, and the hoisted variant state.
  int q_r[2];
  float lse2_r[2], delta_r[2];
  typename Variant::Row row_st[2];
  typename Variant::Col col_st[2][kCols];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    q_r[r] = m0 + warp * 16 + g + 8 * r;
    const bool valid = q_r[r] < seqlen_q;
    const long long row = ((long long)b * p.heads + h) * seqlen_q + q_r[r];
    lse2_r[r] = valid ? p.lse2[row] : flex_bwd::pos_inf();
    delta_r[r] = valid ? p.delta[row] : 0.f;
    if (valid) {
      Variant::row(vp, row_st[r], b, h, hkv, q_r[r]);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int j = (c / 2) * 8 + 2 * t4 + c % 2;
        if (j < seqlen_kv) Variant::col(vp, row_st[r], col_st[r][c], b, h, hkv, q_r[r], j);
      }
    }
  }

  float acc_dq[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dq[dt][e] = 0.f;
  float acc_col[kNS][2][kCols];
  float acc_row[kNS][2];
#pragma unroll
  for (int i = 0; i < kNS; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      acc_row[i][r] = 0.f;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc_col[i][r][c] = 0.f;
    }

  // ldmatrix lane offsets (bytes), as the forward: A from a [rows][k] tile (Q, dO), B non-trans from [n][k]
  // (K, V for S and dP), B trans from [k][n] (K for dQ).
  const int l8 = lane % 8, lm = lane / 8;
  const unsigned q_lane = ((warp * 16 + (lm & 1) * 8 + l8) * kStride + (lm >> 1) * 8) * 2;
  const unsigned bn_lane = ((((lm >> 1) * 8 + l8) * kStride) + (lm & 1) * 8) * 2;
  const unsigned bt_lane = ((((lm & 1) * 8 + l8) * kStride) + (lm >> 1) * 8) * 2;
  const float scale_log2 = p.scale * kLog2e;
  const bool q_tail = m0 + kBlockM > seqlen_q;

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = kStages == 2 ? (it & 1) : 0;
    const int idx_pf = it + kStages < n_tiles ? tile_at(it + kStages) : 0;  // read early: hidden behind the GEMMs
    const int k0 = idx_cur * kBlockN;
    const unsigned sk = s_k + stage * kKvBytes, sv = s_v + stage * kKvBytes;

    typename Variant::Tile tile_st[2];
    if (k0 < seqlen_kv) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (q_r[r] < seqlen_q) Variant::tile(vp, row_st[r], tile_st[r], b, h, hkv, q_r[r], k0);
    }

    flex::cp_async_wait<kStages - 1>();  // this tile's K and V have landed (the next one's may still fly)
    __syncthreads();

    // A sub-tile of a listed KV tile may start past Skv: nothing to do there (uniform over the CTA).
    if (k0 < seqlen_kv) {
      // S = Q K^T and dP = dO V^T for the warp's 16 rows x kBlockN columns.
      float acc_s[kNT][4], acc_dp[kNT][4];
      flex_bwd::score_gemms<Mma, kD16, kBlockN, kStride>(acc_s, acc_dp, s_q + q_lane, s_do + q_lane, sk + bn_lane, sv + bn_lane);

      // P = exp(score_mod(scale S) - lse), masked and out-of-range elements 0; dS = P (dP - delta). Two forms,
      // chosen once per tile as in the KV-major kernel: tiles with a mask_mod or crossing Sq / Skv test every
      // element, interior full tiles none (no per-element predicates, branches or selects).
      const bool check_bounds = q_tail || k0 + kBlockN > seqlen_kv;
      const bool masked_tile = Variant::kHasMaskMod && it < n_masked;
      float score_v[kNT][4];
      auto p_ds_tile = [&](auto checked) {
        constexpr bool kChecked = decltype(checked)::value;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e / 2, c = nt * 2 + e % 2;
            const int j = nt * 8 + 2 * t4 + e % 2;
            const float score = acc_s[nt][e] * p.scale;
            score_v[nt][e] = score;
            bool keep = !kChecked || !check_bounds || (q_r[r] < seqlen_q && k0 + j < seqlen_kv);
            float z = score;
            if (keep) {
              z = Mods::score_mod(vp, row_st[r], col_st[r][c], tile_st[r], b, h, hkv, q_r[r], k0, j, score);
              if constexpr (Variant::kHasMaskMod && kChecked) {
                if (masked_tile && !Mods::mask_mod(vp, row_st[r], col_st[r][c], tile_st[r], b, h, hkv, q_r[r], k0, j)) keep = false;
              }
            }
            const float pr = Mods::template prob<kChecked>(keep, Mods::logit2(z, acc_s[nt][e], scale_log2) - lse2_r[r]);
            acc_dp[nt][e] = Mods::template ds<kChecked>(pr, acc_dp[nt][e], delta_r[r]);  // dS, in place of dP
          }
      };
      if (check_bounds || masked_tile) p_ds_tile(flex_bwd::BoolTag<true>{});
      else p_ds_tile(flex_bwd::BoolTag<false>{});

      if constexpr (Variant::kNumScatters > 0)
        flex_bwdq::scatter_tile<Traits, Variant, kDeterministic, 0, kNS>(p, vp, acc_dp, score_v, acc_col, acc_row, b, h, hkv, q_r, k0, t4);
      Mods::ds_pre(vp, b, h, hkv, flex_bwd::QMajorFragment{q_r, k0, t4}, acc_dp, score_v);

      // dQ (unscaled) += dS_pre K: two n8 accumulator tiles of dS form one 16x16 A fragment, as P in the forward.
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        unsigned a[4];
        flex_bwdq::a_fragment<Mma, kNT>(a, acc_dp, kk);
#pragma unroll
        for (int dp = 0; dp < kD16; ++dp) {
          unsigned bk[4];
          flex::ldmatrix_x4_trans(bk, sk + bt_lane + (kk * 16 * kStride + dp * 16) * 2);
          Mma::run(acc_dq[2 * dp], a, bk[0], bk[1]);
          Mma::run(acc_dq[2 * dp + 1], a, bk[2], bk[3]);
        }
      }
    }

    // Every warp is done with this stage: refill it with tile it + kStages.
    __syncthreads();
    if (it + kStages < n_tiles) load_kv(idx_pf, stage);
    flex::cp_async_commit();
    if constexpr (kStages == 2) {
      idx_cur = idx_next;
      idx_next = idx_pf;
    } else {
      idx_cur = idx_pf;
    }
  }
  flex::cp_async_wait<0>();

  // dq = scale * dQ in q's dtype (rows past Sq dropped; rows without any visited tile get 0).
  Element* g_dq = static_cast<Element*>(p.dq) + b * p.dq_stride_b + h * p.dq_stride_h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (q_r[r] < seqlen_q) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
        *reinterpret_cast<unsigned*>(g_dq + q_r[r] * p.dq_stride_s + dt * 8 + 2 * t4) =
            Mma::pack(acc_dq[dt][2 * r] * p.scale, acc_dq[dt][2 * r + 1] * p.scale);
    }
  }
  if constexpr (Variant::kNumScatters > 0)
    flex_bwdq::scatter_flush<Traits, Variant, kDeterministic, 0, kNS>(p, vp, acc_col, acc_row, b, h, hkv, q_r, t4);
}
