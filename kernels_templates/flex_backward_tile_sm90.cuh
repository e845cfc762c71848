// The consumer warpgroups' steps of one (head, query tile) in the Hopper backward (flex_backward_sm90.cuh), in the
// order the kernel runs them around its GEMMs: the P recompute and dS with the spec's mods (flex_backward_mods.cuh),
// the packing and store of dS^T, and dQ's GEMM with its reduction (atomics, fixed point or bulk rows).
#pragma once
#include "flex_backward.cuh"
#include "flex_backward_loads_sm90.cuh"
#include "flex_backward_staged.cuh"
#include "flex_sm90_pipeline.cuh"
#include "flex_wgmma.cuh"

namespace flex_bwd_sm90 {

// x, through an instruction the compiler cannot look through. Used at the top of the query-tile loop for the
// shared-memory bases and the lane: everything derived from them (some fifty wgmma descriptors, swizzled dS^T
// offsets, lse / delta addresses) is then recomputed per tile with a few integer ops instead of being hoisted out
// of the loop, where it would stay live across the whole loop and push the accumulators (dK, dV, S^T, dP^T: 192
// registers at D = 128) into spills.
__device__ __forceinline__ unsigned opaque(unsigned x) {
  unsigned r;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}

// A [M][N] register array seen as the flat [M * N] array the wgmma wrappers take (the same registers).
template <int M, int N>
__device__ __forceinline__ float (&flat(float (&a)[M][N]))[M * N] {
  return reinterpret_cast<float(&)[M * N]>(a);
}

// Where a thread's elements of a tile lie, for the per-element steps.
struct ElementCoords {
  int b, h, hkv, m0;
  int kv_r0, t4;  // the thread's KV rows kv_r0 and kv_r0 + 8, its query columns m0 + 8 nt + 2 t4 + e % 2
  int warp, wg;
  int cls;        // the tile's class (2: partial, mask_mod decides)
  int seqlen_q, seqlen_kv;
};

// The P step of a tile (for the kernel's thread): P^T = exp(score_mod(scale * S^T) - lse) from the S^T accumulator,
// masked and out-of-range elements 0, into acc_s (P, or P d_score when that is folded in: kFoldDScore) and packed per
// n8 tile into the A fragments of dV += P^T dO (pa[kk] = columns 16 kk .. 16 kk + 15: a0 (g, 2t..), a1 (g + 8, 2t..),
// a2 / a3 the same 8 columns on); score_v keeps the scores for the scatters and a late d_score. kChecked: the tile may
// hold masked or out-of-range elements (partial tiles, tiles crossing Sq or Skv), which are tested one by one.
// Staged terms (flex_backward_staged.cuh) join the logit: Col values per element from st_col, the Tile term per query
// column from st_tile; a Diag term per element from st_diag, the band entry of the thread's query column 2 t4 and first
// KV row (the element's entry is a constant offset from it). lse2: the thread's query columns' lse2 pairs, per n8
// tile (load_pairs).
template <bool kChecked, class Variant, class Element, bool kFoldDScore, int kMT>
__device__ __forceinline__ void recompute_p(const FlexBackwardParams& p, const typename Variant::Params& vp, const ElementCoords& at, float scale_log2,
                                            const float2 (&lse2_nt)[kMT], const unsigned (&st_col)[kMT][2], const unsigned char* st_tile,
                                            const float* st_diag, float (&acc_s)[kMT][4], float (&score_v)[kMT][4], unsigned (&pa)[kMT / 2][4]) {
  using Mma = flex::Mma16816<Element>;
  using Mods = flex_bwd::BackwardMods<Variant>;
  using Staged = flex_bwd_staged::Flags<Variant>;
  constexpr bool kSpread = Staged::kSpread;
  constexpr float kLog2e = 1.4426950408889634f;
  const int b = at.b, h = at.h, hkv = at.hkv, m0 = at.m0, kv_r0 = at.kv_r0, t4 = at.t4, warp = at.warp, wg = at.wg;
  const int cls = at.cls, seqlen_q = at.seqlen_q, seqlen_kv = at.seqlen_kv;
#pragma unroll
  for (int nt = 0; nt < kMT; ++nt) {
    const float2 lse2 = lse2_nt[nt];
    float st_add[2] = {0.f, 0.f};  // the Tile term per query column
    if constexpr (Staged::kTile && kSpread) {
      st_add[0] = flex_bwd_staged::read_tile8<typename Variant::StagedTileElement>(st_tile, nt * 8 + 2 * t4, warp);
      st_add[1] = flex_bwd_staged::read_tile8<typename Variant::StagedTileElement>(st_tile, nt * 8 + 2 * t4 + 1, warp);
    } else if constexpr (Staged::kTile) {
      st_add[0] = flex_bwd_staged::read_tile<typename Variant::StagedTileElement>(st_tile, nt * 8 + 2 * t4, wg);
      st_add[1] = flex_bwd_staged::read_tile<typename Variant::StagedTileElement>(st_tile, nt * 8 + 2 * t4 + 1, wg);
    }
    // Without a score_mod left, the Tile term and the LSE of a query column fold into one addend per column
    // (two FFMAs per n8 block instead of an FADD per element).
    const float st_base[2] = {fmaf(st_add[0], kLog2e, -lse2.x), fmaf(st_add[1], kLog2e, -lse2.y)};
    float pv[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int q = m0 + nt * 8 + 2 * t4 + (e % 2);
      const int kv = kv_r0 + (e / 2) * 8;
      const float score = acc_s[nt][e] * p.scale;
      score_v[nt][e] = score;
      bool keep = !kChecked || (q < seqlen_q && kv < seqlen_kv);
      float z = score;
      if (keep) {
        const typename Variant::Row rs{};
        const typename Variant::Col cs{};
        const typename Variant::Tile ts{};
        z = Mods::score_mod(vp, rs, cs, ts, b, h, hkv, q, kv, 0, score);
        if constexpr (Variant::kHasMaskMod && kChecked) {
          if (cls == 2 && !Mods::mask_mod(vp, rs, cs, ts, b, h, hkv, q, kv, 0)) keep = false;
        }
      }
      float x;  // the exponent of P
      if constexpr (Staged::kDiag) {
        // Column 8 nt + e % 2 further, KV row 8 (e / 2) further: an immediate offset from the thread's entry.
        const float dg = st_diag[8 * nt + (e % 2) - 8 * (e / 2)];
        if constexpr (Variant::kHasScoreMod) x = (z + dg) * kLog2e - (e % 2 ? lse2.y : lse2.x);
        else x = fmaf(acc_s[nt][e], scale_log2, fmaf(dg, kLog2e, e % 2 ? -lse2.y : -lse2.x));
      } else if constexpr (Staged::kAny) {
        // The staged terms join the logit: with no score_mod left, scale and log2(e) still fold into one
        // FFMA on the raw q.k, the terms into its addend.
        float col = 0.f;
        if constexpr (Staged::kCol) col = flex_bwd_staged::unpack<typename Variant::StagedColElement>(st_col[nt][e / 2], e % 2);
        if constexpr (Variant::kHasScoreMod) x = (z + (st_add[e % 2] + col)) * kLog2e - (e % 2 ? lse2.y : lse2.x);
        else if constexpr (Staged::kCol) x = fmaf(acc_s[nt][e], scale_log2, fmaf(col, kLog2e, st_base[e % 2]));
        else x = fmaf(acc_s[nt][e], scale_log2, st_base[e % 2]);
      } else {
        x = Mods::logit2(z, acc_s[nt][e], scale_log2) - (e % 2 ? lse2.y : lse2.x);
      }
      pv[e] = Mods::template prob<kChecked>(keep, x);
      // dS_pre = P d_score (dP - delta) when d_score is folded into P.
      acc_s[nt][e] = kFoldDScore ? Mods::ds_pre(vp, b, h, hkv, q, kv, score, pv[e]) : pv[e];
    }
    pa[nt / 2][(nt % 2) * 2 + 0] = Mma::pack(pv[0], pv[1]);
    pa[nt / 2][(nt % 2) * 2 + 1] = Mma::pack(pv[2], pv[3]);
  }
}

// The lse2 (or delta) pairs of the thread's query columns (8 nt + 2 t4, + 1) of a tile, from its shared-memory row.
// Loaded before the GEMMs whose result they meet are issued: loaded where they are used, they queue behind those
// GEMMs' shared-memory reads, and the first FFMA of each pair waits for them.
template <int kMT>
__device__ __forceinline__ void load_pairs(float2 (&v)[kMT], const float* row, int t4) {
#pragma unroll
  for (int nt = 0; nt < kMT; ++nt) v[nt] = *reinterpret_cast<const float2*>(row + nt * 8 + 2 * t4);
}

// The dS step of a tile: dS = P (dP - delta) in place of dP^T (acc_s holds P, or P d_score when that was folded in,
// which gives dS_pre directly). kChecked: exactly 0 where P is (masked and out-of-range elements); interior full
// tiles have no such element, so only the tiles that test elements pay for the select.
template <bool kChecked, class Variant, int kMT>
__device__ __forceinline__ void compute_ds(const float (&acc_s)[kMT][4], float (&acc_dp)[kMT][4], const float2 (&delta)[kMT]) {
#pragma unroll
  for (int nt = 0; nt < kMT; ++nt) {
    const float2 dl = delta[nt];
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dp[nt][e] = flex_bwd::BackwardMods<Variant>::template ds<kChecked>(acc_s[nt][e], acc_dp[nt][e], e % 2 ? dl.y : dl.x);
  }
}

// An accumulator tile [kMT n8 tiles][4] packed into the A fragments of an rs wgmma (a[kk]: columns 16 kk .. + 15).
template <class Element, int kMT>
__device__ __forceinline__ void pack_a(const float (&acc)[kMT][4], unsigned (&a)[kMT / 2][4]) {
  using Mma = flex::Mma16816<Element>;
#pragma unroll
  for (int kk = 0; kk < kMT / 2; ++kk) {
    a[kk][0] = Mma::pack(acc[2 * kk][0], acc[2 * kk][1]);
    a[kk][1] = Mma::pack(acc[2 * kk][2], acc[2 * kk][3]);
    a[kk][2] = Mma::pack(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[kk][3] = Mma::pack(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

// The warp's packed dS^T (or, in the head-dim split form, P^T) rows row0 .. row0 + 15 into the shared [block_n][64]
// tile at s_tile (a shared-memory address) that dQ's GEMM (and the split form's dV and dK GEMMs) read: element
// (kv row r, query column c). Each A fragment is four 8x8 matrices, (r, c), (r + 8, c), (r, c + 1), (r + 8, c + 1) in
// 8-column chunks, which is stmatrix.x4's register order: one instruction per fragment with one address per lane (lane
// l gives matrix l / 8's row l % 8) instead of four 4-byte stores. chunk0: the fragments' first 8-column chunk (the
// split form's warpgroups hold 32 query columns each, from column 32 wg).
template <class S, int kKK>
__device__ __forceinline__ void store_transposed_tile(unsigned s_tile, const unsigned (&da)[kKK][4], int row0, int lane, int chunk0 = 0) {
  using TileDS = typename S::TileDS;
  const int r = row0 + (lane & 7) + (lane & 8);
#pragma unroll
  for (int kk = 0; kk < kKK; ++kk) {
    const unsigned addr = s_tile + TileDS::chunk_offset(r, chunk0 + 2 * kk + (lane >> 4));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(da[kk][0]), "r"(da[kk][1]),
                 "r"(da[kk][2]), "r"(da[kk][3])
                 : "memory");
  }
}

// dQ (unscaled) += dS K for this warpgroup's kN columns from kCol0 (the caller has fenced dS^T into the async
// proxy and synchronised the CTA); runs `overlap` while the GEMM is in flight, waits for every wgmma group of the
// warpgroup, then adds into the accumulator.
// kBulk: the partial goes into the CTA's dQ rows in shared memory (`dq_buf`, row q - m0, in the bulk layout of
// flex_bwd::bulk_dq_group_xor) instead, for the tile's bulk reduction.
// Layout::kSelectorCols = 16 (kGradGemm): the GEMM runs on into K's spare region after the warpgroup's columns, whose
// first 16 columns hold its selector (flex_backward_staged.cuh); those 16 columns of the product, the staged
// gradient sums, go to `sel` (the m64n16 accumulator layout). One GEMM instead of a second one over the same dS^T
// tile: dS^T is read from shared memory once.
// `issue_next` issues one more wgmma group right behind dQ's (the dK GEMM; when dK went first, the next tile's S^T
// GEMM or an empty group): dQ's partial then goes out while that group runs, which is left in flight on return.
template <int kN, class Layout, class Element, bool kDeterministic, bool kBulk, class IssueNext, class Overlap>
__device__ __forceinline__ void dq_block(const FlexBackwardParams& p, unsigned s_ds, unsigned s_k, int col0, long long row_base,
                                         int q_row0, int t4, void* dq_buf, int m0, float (&sel)[8], IssueNext&& issue_next,
                                         Overlap&& overlap) {
  constexpr int kHeadDim = Layout::kHeadDim;
  constexpr int kNSel = kN + Layout::kSelectorCols;
  float acc[kNSel / 2];
  flex::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Layout::kBlockN / 16; ++kk)
    flex::Wgmma<kNSel>::template ss<Element, 1, 1>(acc, flex::desc_mn_major<typename Layout::TileDS>(s_ds, kk * 16, 0),
                                                   flex::desc_mn_major<typename Layout::TileK>(s_k, kk * 16, col0), kk > 0 ? 1 : 0);
  flex::wgmma_commit();
  issue_next();
  overlap();
  flex::wgmma_wait<1>();
  flex::fence_operands(acc);
  if constexpr (Layout::kSelectorCols > 0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) sel[i] = acc[kN / 2 + i];
  }
  if constexpr (kBulk) {
    using Value = typename Layout::DqValue;
    static_assert(kN % 8 == 0 && Layout::kDqN0 % 8 == 0, "dq_block: bulk dQ rows permute whole 8-column groups");
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int q = q_row0 + half * 8;
      const int key = flex_bwd::bulk_dq_group_xor<Value, kHeadDim>(static_cast<Value*>(p.dq_accum) + (row_base + q) * kHeadDim);
      Value* row = static_cast<Value*>(dq_buf) + (q - m0) * kHeadDim + 2 * t4;
#pragma unroll
      for (int i = 0; i < kN / 8; ++i) {
        const float a = acc[4 * i + 2 * half], c = acc[4 * i + 2 * half + 1];
        Value* at = row + ((col0 / 8 + i) ^ key) * 8;
        if constexpr (kDeterministic) *reinterpret_cast<ulonglong2*>(at) = make_ulonglong2(flex_bwd::to_fixed(a), flex_bwd::to_fixed(c));
        else *reinterpret_cast<float2*>(at) = make_float2(a, c);
      }
    }
  } else if constexpr (!kDeterministic) {
    // Two adjacent n8 tiles per float4 atomic: partners t4 and t4 ^ 1 swap one pair, so the even thread holds
    // columns 8i + 2 t4 .. + 3 of tile i and the odd one 8 (i + 1) + 2 (t4 - 1) .. + 3 of tile i + 1: half the
    // atomic instructions of float2 ones, the same whole sectors (docs/notes/BACKWARD_SM90.md, four-wide dQ atomics).
    static_assert(kN % 16 == 0, "dq_block: float4 dQ atomics pair the n8 tiles");
    const bool odd = t4 & 1;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int q = q_row0 + half * 8;
#pragma unroll
      for (int i = 0; i < kN / 8; i += 2) {
        const float a0 = acc[4 * i + 2 * half], a1 = acc[4 * i + 2 * half + 1];
        const float b0 = acc[4 * i + 4 + 2 * half], b1 = acc[4 * i + 4 + 2 * half + 1];
        const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
        const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
        if (q < p.seqlen_q) {
          const int col = odd ? col0 + i * 8 + 8 + 2 * (t4 - 1) : col0 + i * 8 + 2 * t4;
          const float4 v = odd ? make_float4(r0, r1, b0, b1) : make_float4(a0, a1, r0, r1);
          atomicAdd(reinterpret_cast<float4*>(static_cast<float*>(p.dq_accum) + (row_base + q) * kHeadDim + col), v);
        }
      }
    }
  } else {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int q = q_row0 + half * 8;
      if (q < p.seqlen_q) {
#pragma unroll
        for (int i = 0; i < kN / 8; ++i) {
          const long long off = (row_base + q) * kHeadDim + col0 + i * 8 + 2 * t4;
          flex_bwd::accumulate<true>(p.dq_accum, off, acc[4 * i + 2 * half]);
          flex_bwd::accumulate<true>(p.dq_accum, off + 1, acc[4 * i + 2 * half + 1]);
        }
      }
    }
  }
}

}  // namespace flex_bwd_sm90
