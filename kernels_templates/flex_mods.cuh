// score_mod and mask_mod applied to one thread's part of an S accumulator tile, with the variant's hoisted state.
#pragma once
#include "flex_params.cuh"
#include "flex_softmax.cuh"
#include "flex_variant_base.cuh"

namespace flex {

// The part of an accumulator tile a thread holds (the mma.sync m16n8 C layout, which wgmma repeats per warp):
// kMTiles blocks of 16 rows of its warp and kNTiles blocks of 8 columns. Row r (0 <= r < 2 kMTiles) is
// (r / 2) 16 + (r % 2) 8 + lane / 4 from the warp's first row; column c (0 <= c < 2 kNTiles) is
// (c / 2) 8 + 2 (lane % 4) + c % 2.
template <int kMTiles_, int kNTiles_>
struct FragmentLayout {
  static constexpr int kMTiles = kMTiles_, kNTiles = kNTiles_;
  static constexpr int kRows = 2 * kMTiles, kCols = 2 * kNTiles;
  static __device__ __forceinline__ int row(int lane, int r) { return (r / 2) * 16 + (r % 2) * 8 + lane / 4; }
  static __device__ __forceinline__ int col(int lane, int c) { return (c / 2) * 8 + 2 * (lane % 4) + (c % 2); }
};

// The mods of one thread's rows over KV tiles of kNTiles * 8 columns, cut into parts of Variant::kTileCols columns
// (the width the hooks see, flex_variant_base.cuh): Row state per row, Col state per row and column of a part (the
// same in every part), Tile state per row and part. Rows at or past Sq use row Sq - 1 (their results are never
// stored), so the hooks always see a valid q and no per-row branch is needed. The hooks see positions: row and KV
// column indices of the launch plus q_pos0 / kv_pos0 (a shard of a longer sequence; 0 otherwise); the bounds
// checks stay on the launch's own rows.
// FUSION POINT: score_mod and mask_mod have exactly one call site each, in apply().
template <class Variant, int kMTiles, int kNTiles>
struct FragmentMods {
  using Layout = FragmentLayout<kMTiles, kNTiles>;
  using VParams = typename Variant::Params;
  using Row = typename Variant::Row;
  using Col = typename Variant::Col;
  using Tile = typename Variant::Tile;
  using KvCol = typename Variant::KvCol;
  static constexpr int kRows = Layout::kRows;
  static constexpr int kTileCols = Variant::kTileCols;
  // A thread's columns in one part: kTileCols / 8 n8 blocks of 2 (fewer when the whole tile is narrower).
  static constexpr int kPartCols = Layout::kCols < kTileCols / 4 ? Layout::kCols : kTileCols / 4;
  static constexpr int kParts = (kNTiles * 8 + kTileCols - 1) / kTileCols;
  static_assert(kTileCols % 8 == 0, "FragmentMods: parts must hold whole n8 blocks");

  Row row[kRows];
  Col col[kRows][kPartCols];
  Tile tile[kRows][kParts];
  int q[kRows];  // positions
  int anchor;    // the position the split score terms are taken relative to (Variant::kRowTerms): the warp's first row's
#if FLEX_SHARD_POSITIONS
  int kv_pos0;  // the position of the launch's KV row 0
#else
  static constexpr int kv_pos0 = 0;  // not a member: a zero held in a register still costs some variants spills
#endif

  // Row and Col state of the thread's rows; row0 is the warp's first row in the launch, q_pos0 / kv_pos0 the positions
  // of the launch's row 0 and KV row 0.
  __device__ __forceinline__ void hoist_rows(const VParams& vp, int b, int h, int hkv, int row0, int lane, int seqlen_q, int seqlen_kv,
                                             int q_pos0, int kv_pos0_) {
#if FLEX_SHARD_POSITIONS
    kv_pos0 = kv_pos0_;
#else
    q_pos0 = 0;
    (void)kv_pos0_;
#endif
    anchor = row0 + q_pos0;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      q[r] = min(row0 + Layout::row(lane, r), seqlen_q - 1) + q_pos0;
      Variant::row(vp, row[r], b, h, hkv, q[r]);
#pragma unroll
      for (int c = 0; c < kPartCols; ++c) {
        const int j = Layout::col(lane, c);
        if (j < seqlen_kv) Variant::col(vp, row[r], col[r][c], b, h, hkv, q[r], j);
      }
    }
  }

  // Tile state of the thread's rows for the KV tile at k0 (parts past Skv keep stale state: apply masks them).
  __device__ __forceinline__ void hoist_tile(const VParams& vp, int b, int h, int hkv, int k0, int seqlen_kv) {
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      const int kp = k0 + part * kTileCols;
      if (part == 0 || kp < seqlen_kv) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) Variant::tile(vp, row[r], tile[r][part], b, h, hkv, q[r], kp + kv_pos0);
      }
    }
  }

  // The row terms of the thread's rows (Variant::kRowTerms), which the LSE takes instead of the scores.
  __device__ __forceinline__ void row_terms(const VParams& vp, int b, int h, int hkv, float (&t)[kRows]) const {
#pragma unroll
    for (int r = 0; r < kRows; ++r) t[r] = Variant::score_row_term(vp, b, h, hkv, q[r], anchor);
  }

  // S = mask(score_mod(score_scale * S)) in place for the KV tile at k0 (score_scale: the softmax scale, times the
  // variant's in scale for a split score_mod, whose core is then applied), plus the column terms (kColTerms).
  // kPartial: run mask_mod. kCheckKv: the tile crosses Skv, so columns past it become -inf without calling the
  // variant. kv_cols: the tile's staged per-column values (kStagedKvCols), one per column.
  // Where the mods may run past Skv, a partial tile's column check selects after them instead of branching around
  // them: with the branch, ptxas spilled the S tile of masks like attention sinks + window at head dim 64. Tiles
  // without mask_mod keep the branch: a score_mod alone does not spill there, and the select did not pay off.
  template <bool kPartial, bool kCheckKv>
  __device__ __forceinline__ void apply(float (&s)[kMTiles][kNTiles][4], const VParams& vp, int b, int h, int hkv, int k0, int lane,
                                        int seqlen_kv, float score_scale, const KvCol* kv_cols = nullptr) const {
    constexpr bool kSelectPastSkv = kPartial && kCheckKv && Variant::kEvaluablePastSkv;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        // The column terms of the thread's two columns of this n8 block, shared by its rows.
        float col_term[2] = {0.f, 0.f};
        if constexpr (Variant::kColTerms) {
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) {
            const int c = nt * 2 + cc;
            const int kv = k0 + (c / kPartCols) * kTileCols + Layout::col(lane, c % kPartCols);
            if (!kCheckKv || kv < seqlen_kv) col_term[cc] = Variant::score_col_term(vp, b, h, hkv, anchor, kv + kv_pos0 - anchor);
          }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = mt * 2 + e / 2;
          const int c = nt * 2 + e % 2;
          const int part = c / kPartCols;
          const int pc = c % kPartCols;
          const int j = Layout::col(lane, pc);
          const int kp = k0 + part * kTileCols;  // in the launch; the hooks see kp + kv_pos0
          float x = s[mt][nt][e];
          const bool in_kv = !kCheckKv || kp + j < seqlen_kv;
          if (kSelectPastSkv || in_kv) {
            if constexpr (Variant::kHasScoreMod) {
              // FUSION POINT: score_mod
              if constexpr (Variant::kSplitScore)
                x = Variant::score_mod_core(vp, row[r], col[r][pc], tile[r][part], b, h, hkv, q[r], kp + kv_pos0, j, x * score_scale);
              else
                x = Variant::score_mod(vp, row[r], col[r][pc], tile[r][part], b, h, hkv, q[r], kp + kv_pos0, j, x * score_scale);
              if constexpr (Variant::kColTerms) x += col_term[e % 2];
            }
            if constexpr (kPartial) {
              // FUSION POINT: mask_mod
              bool keep;
              if constexpr (Variant::kStagedKvCols)
                keep = Variant::mask_mod_staged(vp, row[r], col[r][pc], tile[r][part], kv_cols[part * kTileCols + j], b, h, hkv, q[r],
                                                kp + kv_pos0, j);
              else
                keep = Variant::mask_mod(vp, row[r], col[r][pc], tile[r][part], b, h, hkv, q[r], kp + kv_pos0, j);
              if (!keep) x = neg_inf();
            }
          } else {
            x = neg_inf();
          }
          if constexpr (kSelectPastSkv) x = in_kv ? x : neg_inf();
          s[mt][nt][e] = x;
        }
      }
    }
  }

  // The mods of one tile, choosing the instantiation: mask_mod on partial tiles only, the Skv check only on the tile
  // that crosses it, nothing at all on interior full tiles without a score_mod.
  __device__ __forceinline__ void run(float (&s)[kMTiles][kNTiles][4], bool partial, bool check_kv, const VParams& vp, int b, int h,
                                      int hkv, int k0, int lane, int seqlen_kv, float score_scale, const KvCol* kv_cols = nullptr) const {
    if constexpr (Variant::kHasMaskMod) {
      if (partial) {
        if (check_kv) apply</*kPartial=*/true, /*kCheckKv=*/true>(s, vp, b, h, hkv, k0, lane, seqlen_kv, score_scale, kv_cols);
        else apply</*kPartial=*/true, /*kCheckKv=*/false>(s, vp, b, h, hkv, k0, lane, seqlen_kv, score_scale, kv_cols);
        return;
      }
    }
    if (check_kv) apply</*kPartial=*/false, /*kCheckKv=*/true>(s, vp, b, h, hkv, k0, lane, seqlen_kv, score_scale, kv_cols);
    else if (Variant::kHasScoreMod) apply</*kPartial=*/false, /*kCheckKv=*/false>(s, vp, b, h, hkv, k0, lane, seqlen_kv, score_scale, kv_cols);
  }
};

// The factors a kernel needs from the variant's score scales, once per launch: S is multiplied by score_scale before
// score_mod (core), mult is the softmax's exp2 factor of one S unit, score_unit the LSE's.
struct ScoreFactors {
  float score_scale, mult, score_unit;
  template <class Variant>
  __device__ __forceinline__ static ScoreFactors of(const typename Variant::Params& vp, float scale) {
    constexpr float kLog2e = 1.4426950408889634f;
    ScoreFactors f;
    if constexpr (Variant::kHasScoreMod) {
      const float out = Variant::kSplitScore ? Variant::score_out_scale(vp) : 1.f;
      f.score_scale = Variant::kSplitScore ? scale * Variant::score_in_scale(vp) : scale;
      f.mult = kLog2e * out;
      f.score_unit = out;
    } else {
      // Without a score_mod the max is taken on raw q.k, and the scale folds into the exponential's FFMA.
      f.score_scale = scale;
      f.mult = scale * kLog2e;
      f.score_unit = scale;
    }
    return f;
  }
};

}  // namespace flex
