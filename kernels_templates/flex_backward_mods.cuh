// The backward's recompute of one score element with the spec's mods (P, dS, dS_pre and each buffer gradient's
// term), the one place every backward kernel calls the generated variant's score_mod, mask_mod and derivatives.
#pragma once
#include "flex_mma.cuh"

namespace flex_bwd {

// Where element e (0..3) of n8 block nt of a thread's score fragment lies (the mma.sync m16n8 C layout, which wgmma
// repeats per warp). The KV-major kernels hold S^T: the thread's KV rows kv_r0 and kv_r0 + 8, query columns
// m0 + 8 nt + 2 t4 + e % 2.
struct KvMajorFragment {
  int m0, kv_r0, t4;
  __device__ __forceinline__ int q(int nt, int e) const { return m0 + nt * 8 + 2 * t4 + (e % 2); }
  __device__ __forceinline__ int kv(int nt, int e) const { return kv_r0 + (e / 2) * 8; }
};

// The query-major pass holds S: the thread's query rows q_r[0] and q_r[1], KV columns k0 + 8 nt + 2 t4 + e % 2.
struct QMajorFragment {
  const int (&q_r)[2];
  int k0, t4;
  __device__ __forceinline__ int q(int nt, int e) const { return q_r[e / 2]; }
  __device__ __forceinline__ int kv(int nt, int e) const { return k0 + nt * 8 + 2 * t4 + (e % 2); }
};

// The per-element steps of a backward tile, for every backward kernel (flex_backward.cuh, flex_backward_sm90.cuh,
// flex_backward_qmajor.cuh). The kernels keep their own fragment layouts and loops, and the order of the steps around
// their GEMMs, and call these per element:
//   keep = in range (and, on partial tiles, mask_mod);  z = score_mod(score) where kept
//   P = prob(keep, logit2(z) - lse2);  dS = ds(P, dP, delta);  scatter<I>(dS) for each buffer gradient;  dS_pre = ds_pre(dS)
// The branch that skips score_mod and mask_mod for elements out of range stays in each kernel's loop: moved into a
// function of its own, it compiles to selects instead (causal on sm_90a: 64 more selects, 6 more registers).
// FUSION POINT: score_mod, mask_mod, d_score and the scatters have one call site each, here.
template <class Variant>
struct BackwardMods {
  using VParams = typename Variant::Params;
  using Row = typename Variant::Row;
  using Col = typename Variant::Col;
  using Tile = typename Variant::Tile;
  static constexpr float kLog2e = 1.4426950408889634f;

  // score_mod's output z in base 2, the exponent of P before the row's lse2 is subtracted. Without a score_mod, z is
  // the scaled score, so the raw q.k s is used instead: scale and log2(e) fold with that subtraction into one FFMA.
  static __device__ __forceinline__ float logit2(float z, float s, float scale_log2) {
    return Variant::kHasScoreMod ? z * kLog2e : s * scale_log2;
  }

  // score_mod of the element at (q, k0 + j) with its hoisted Row / Col / Tile state (the KV-major kernels' variant is
  // not hoisted: empty state, k0 = kv, j = 0); the score itself without one.
  static __device__ __forceinline__ float score_mod(const VParams& vp, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv,
                                                    int q, int k0, int j, float score) {
    if constexpr (Variant::kHasScoreMod) {
      // FUSION POINT: score_mod
      return Variant::score_mod(vp, row, col, tile, b, h, hkv, q, k0, j, score);
    } else {
      return score;
    }
  }

  // Whether mask_mod keeps the element (called on partial tiles only).
  static __device__ __forceinline__ bool mask_mod(const VParams& vp, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv,
                                                  int q, int k0, int j) {
    // FUSION POINT: mask_mod
    return Variant::mask_mod(vp, row, col, tile, b, h, hkv, q, k0, j);
  }

  // P = exp2(x) for the exponent x of an element, 0 where the element is not kept (kChecked: the tile may hold
  // masked or out-of-range elements).
  template <bool kChecked>
  static __device__ __forceinline__ float prob(bool keep, float x) {
    const float ex = flex::ex2(x);
    return kChecked && !keep ? 0.f : ex;
  }

  // dS = P (dP - delta). kZeroMasked: exactly 0 where P is 0 (masked and out-of-range elements) even where dO holds
  // a non-finite value; tiles known to have no such element leave the select out.
  template <bool kZeroMasked>
  static __device__ __forceinline__ float ds(float pr, float dp, float delta) {
    const float d = pr * (dp - delta);
    return kZeroMasked && pr == 0.f ? 0.f : d;
  }

  // dS_pre = dS d score_mod / d score at (q, kv), taken only where dS != 0, so that the derivative sees in-range,
  // unmasked elements only (also P d_score, where a kernel folds the derivative into P).
  static __device__ __forceinline__ float ds_pre(const VParams& vp, int b, int h, int hkv, int q, int kv, float score, float ds) {
    if constexpr (Variant::kDScoreIsOne) {
      return ds;
    } else {
      // FUSION POINT: d_score
      return ds != 0.f ? ds * Variant::d_score(vp, b, h, hkv, q, kv, score) : ds;
    }
  }

  // dS_pre in place of dS over a thread's fragment (score: the elements' scores before score_mod).
  template <int kNT, class Fragment>
  static __device__ __forceinline__ void ds_pre(const VParams& vp, int b, int h, int hkv, const Fragment& f, float (&ds)[kNT][4],
                                                const float (&score)[kNT][4]) {
    if constexpr (!Variant::kDScoreIsOne) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[nt][e] = ds_pre(vp, b, h, hkv, f.q(nt, e), f.kv(nt, e), score[nt][e], ds[nt][e]);
    }
  }

  // What the element (q, kv) with score `score` and gradient dS adds to buffer gradient I: dS d score_mod / d value
  // of the loaded element. kOffset: also the target element's offset, for kernels that add per element or check it
  // there; the query-major pass forms each target once per row and takes the coefficient alone.
  template <int I, bool kOffset>
  static __device__ __forceinline__ float scatter(const VParams& vp, int b, int h, int hkv, int q, int kv, float score, float ds,
                                                  long long& off) {
    // FUSION POINT: scatter
    if constexpr (kOffset) {
      float coef;
      Variant::template scatter<I>(vp, b, h, hkv, q, kv, score, off, coef);
      return ds * coef;
    } else {
      return ds * Variant::template scatter_coef<I>(vp, b, h, hkv, q, kv, score);
    }
  }
};

}  // namespace flex_bwd
