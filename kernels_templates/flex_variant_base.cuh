// The base of every generated variant (FlexVariant): each hook defaults to identity, so the code generator emits only
// what a spec changes, and every kernel (forward, backward, decode, block-mask builders) can call every hook.
#pragma once

namespace flex {

// The contract between the kernels and a variant (all members static):
//   Params                                  the variant's launch parameters (POD, the kernels' second argument)
//   kHasScoreMod, kHasMaskMod               whether the spec has each mod
//   Row, Col, Tile                          hoisted state: per query row; per row and column j of a KV tile (the same
//                                           in every tile); per row and KV tile
//   row(vp, Row&, b, h, hkv, q)                              once per query row q < Sq
//   col(vp, Row, Col&, b, h, hkv, q, j)                      once per row and column j < min(kTileCols, Skv)
//   tile(vp, Row, Tile&, b, h, hkv, q, k0)                   once per row and KV tile starting at k0 < Skv
//   score_mod(vp, Row, Col, Tile, b, h, hkv, q, k0, j, score) -> float    score = scale * q.k at kv = k0 + j
//   mask_mod(vp, Row, Col, Tile, b, h, hkv, q, k0, j) -> bool            true = attend; run on partial tiles only
// The hooks see KV tiles of kTileCols columns: k0 is a multiple of kTileCols and j < kTileCols, so that kv // 64 and
// kv % 64 become k0 // 64 and j (the staging pass, compiler/passes/staging.h). A kernel whose tiles are wider calls
// them once per kTileCols-column part of its tile; kTileAligned says whether the variant relies on that alignment at
// all (without it, any k0 and j with kv = k0 + j serve, and kernel tiles need not be multiples of kTileCols).
// kDataDependentMask: the mask reads buffers, so its block mask comes from the dense builder (and its kept area is
// irregular, which the tile policy weighs). kColumnState: Col is not empty; kElementLoads: the mods load buffers per
// element (the tile policy weighs the registers of both).
// The variant is only ever called with q < Sq and k0 + j < Skv, except that a kEvaluablePastSkv variant (its mods
// read no buffer and divide by no runtime value, so they can neither fault nor flag an error) may be called at
// k0 + j >= Skv, with stale Tile / Col state, by kernels that then discard the result.
//
// Optional refinements, each with a default here:
//   kSplitScore: score_mod(s) = score_out_scale(vp) * score_mod_core(score_in_scale(vp) * s) with a positive out
//     scale: the forward kernels fold both scales into multiplies of their own.
//   kFixedMax (with kSplitScore): score_mod_core's values never exceed kScoreCoreMax, and exp2 of the whole range
//     below it stays a normal number in P's type: the softmax subtracts that bound instead of a running row maximum.
//   kRowTerms (forward variants only): score_mod's additive terms that depend on the query row alone were split off
//     (compiler/codegen/row_terms.h): the true score is score_mod + score_row_term(q, a) + score_col_term(a, kv - a)
//     for any anchor row a. The softmax of a row does not change when the same value is added to each score, so the
//     forward kernels add score_row_term to the row's LSE only; kColTerms: score_col_term is not zero, and is added
//     to every score of its column (once per column for a thread's rows). kHasScoreMod then says whether anything
//     runs per element at all.
//   kStagedKvCols: mask_mod's work that depends on the KV column alone (a buffer read at kv, such as a document
//     mask's doc[kv]) as KvCol values, computed once per column (kv_col) and read by mask_mod_staged.
template <class Derived>
struct VariantBase {
  struct Row {};
  struct Col {};
  struct Tile {};
  struct KvCol {};
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = false;
  static constexpr int kTileCols = 64;
  static constexpr bool kTileAligned = false;
  static constexpr bool kDataDependentMask = false;
  static constexpr bool kColumnState = false;
  static constexpr bool kElementLoads = false;
  static constexpr bool kSplitScore = false;
  static constexpr bool kFixedMax = false;
  static constexpr float kScoreCoreMax = 0.f;
  static constexpr bool kStagedKvCols = false;
  static constexpr bool kRowTerms = false;
  static constexpr bool kColTerms = false;
  static constexpr bool kEvaluablePastSkv = false;

  template <class P, class R>
  __device__ static __forceinline__ void row(const P&, R&, int, int, int, int) {}
  template <class P, class R, class C>
  __device__ static __forceinline__ void col(const P&, const R&, C&, int, int, int, int, int) {}
  template <class P, class R, class T>
  __device__ static __forceinline__ void tile(const P&, const R&, T&, int, int, int, int, int) {}
  template <class P, class R, class C, class T>
  __device__ static __forceinline__ float score_mod(const P&, const R&, const C&, const T&, int, int, int, int, int, int, float score) {
    return score;
  }
  template <class P, class R, class C, class T>
  __device__ static __forceinline__ bool mask_mod(const P&, const R&, const C&, const T&, int, int, int, int, int, int) {
    return true;
  }
  template <class P, class R, class C, class T>
  __device__ static __forceinline__ float score_mod_core(const P& vp, const R& row, const C& col, const T& tile, int b, int h, int hkv,
                                                         int q, int k0, int j, float score) {
    return Derived::score_mod(vp, row, col, tile, b, h, hkv, q, k0, j, score);
  }
  template <class P>
  __device__ static __forceinline__ float score_in_scale(const P&) {
    return 1.f;
  }
  template <class P>
  __device__ static __forceinline__ float score_out_scale(const P&) {
    return 1.f;
  }
  template <class P>
  __device__ static __forceinline__ float score_row_term(const P&, int, int, int, int, int) {
    return 0.f;
  }
  template <class P>
  __device__ static __forceinline__ float score_col_term(const P&, int, int, int, int, int) {
    return 0.f;
  }
  template <class P, class K>
  __device__ static __forceinline__ void kv_col(const P&, K&, int, int, int, int, int) {}
  template <class P, class R, class C, class T, class K>
  __device__ static __forceinline__ bool mask_mod_staged(const P& vp, const R& row, const C& col, const T& tile, const K&, int b, int h,
                                                         int hkv, int q, int k0, int j) {
    return Derived::mask_mod(vp, row, col, tile, b, h, hkv, q, k0, j);
  }
};

}  // namespace flex
