// Hand-written decode variants shaped like the generator's output (plain, causal with offset, ALiBi, softcap, window, document).
#pragma once
#include "decode_harness.h"

// kCheck: every entry point verifies it was called only with in-range indices (b < B, h < H,
// kv_len - q_len <= q < kv_len, 0 <= kv < kv_len), counting violations. Off for benchmarks.
template <bool kCheck>
struct DCheck {
  static __device__ __forceinline__ void bhq(const DecodeHarnessParams& vp, int b, int h, int q) {
    if (!kCheck) return;
    const bool bad = b < 0 || b >= vp.batch || h < 0 || h >= vp.heads || q >= vp.kv_lens[b] ||
                     q < vp.kv_lens[b] - vp.q_lens[b];
    if (bad) atomicAdd(vp.violations, 1);
  }
  static __device__ __forceinline__ void kv(const DecodeHarnessParams& vp, int b, int kv) {
    if (kCheck && (kv < 0 || kv >= vp.kv_lens[b])) atomicAdd(vp.violations, 1);
  }
};

template <bool kCheck>
struct DBase {
  using Params = DecodeHarnessParams;
  using Check = DCheck<kCheck>;
  struct Row {};
  struct Col {};
  struct Tile {};
  static __device__ __forceinline__ void row(const Params& vp, Row&, int b, int h, int, int q) { Check::bhq(vp, b, h, q); }
  static __device__ __forceinline__ void col(const Params& vp, const Row&, Col&, int b, int h, int, int q, int j) {
    Check::bhq(vp, b, h, q);
    Check::kv(vp, b, j);
  }
  static __device__ __forceinline__ void tile(const Params& vp, const Row&, Tile&, int b, int h, int, int q, int k0) {
    Check::bhq(vp, b, h, q);
    Check::kv(vp, b, k0);
  }
  static __device__ __forceinline__ float score_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int,
                                                    int, int, int, float score) {
    return score;
  }
  static __device__ __forceinline__ bool mask_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int, int,
                                                  int, int) {
    return true;
  }
};

template <bool kCheck>
struct DPlain : DBase<kCheck> {
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = false;
};

// Causal with offset: query row i at absolute position q attends kv <= q.
template <bool kCheck>
struct DCausal : DBase<kCheck> {
  using B = DBase<kCheck>;
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = true;
  static __device__ __forceinline__ bool mask_mod(const DecodeHarnessParams& vp, const typename B::Row&,
                                                  const typename B::Col&, const typename B::Tile&, int b, int h, int,
                                                  int q, int k0, int j) {
    B::Check::bhq(vp, b, h, q);
    B::Check::kv(vp, b, k0 + j);
    return q >= k0 + j;
  }
};

// ALiBi: score + slope[h] * (kv - q); the slope is hoisted per row.
template <bool kCheck>
struct DAlibi : DBase<kCheck> {
  using B = DBase<kCheck>;
  using typename B::Col;
  using typename B::Tile;
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = false;
  struct Row {
    float slope;
  };
  static __device__ __forceinline__ void row(const DecodeHarnessParams& vp, Row& r, int b, int h, int, int q) {
    B::Check::bhq(vp, b, h, q);
    r.slope = vp.alibi_slopes[h];
  }
  static __device__ __forceinline__ void col(const DecodeHarnessParams& vp, const Row&, Col&, int b, int h, int, int q,
                                             int j) {
    B::Check::bhq(vp, b, h, q);
    B::Check::kv(vp, b, j);
  }
  static __device__ __forceinline__ void tile(const DecodeHarnessParams& vp, const Row&, Tile&, int b, int h, int, int q,
                                              int k0) {
    B::Check::bhq(vp, b, h, q);
    B::Check::kv(vp, b, k0);
  }
  static __device__ __forceinline__ float score_mod(const DecodeHarnessParams& vp, const Row& r, const Col&, const Tile&,
                                                    int b, int h, int, int q, int k0, int j, float score) {
    B::Check::bhq(vp, b, h, q);
    B::Check::kv(vp, b, k0 + j);
    return score + r.slope * (float)(k0 + j - q);
  }
  static __device__ __forceinline__ bool mask_mod(const DecodeHarnessParams&, const Row&, const Col&, const Tile&, int,
                                                  int, int, int, int, int) {
    return true;
  }
};

// Soft capping: 30 * tanh(score / 30) (tanhf).
template <bool kCheck>
struct DSoftcap : DBase<kCheck> {
  using B = DBase<kCheck>;
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = false;
  static __device__ __forceinline__ float score_mod(const DecodeHarnessParams& vp, const typename B::Row&,
                                                    const typename B::Col&, const typename B::Tile&, int b, int h, int,
                                                    int q, int k0, int j, float score) {
    B::Check::bhq(vp, b, h, q);
    B::Check::kv(vp, b, k0 + j);
    return 30.f * tanhf(score * (1.f / 30.f));
  }
};

// Causal sliding window: kv <= q and q - kv < window.
template <bool kCheck>
struct DWindow : DBase<kCheck> {
  using B = DBase<kCheck>;
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = true;
  static __device__ __forceinline__ bool mask_mod(const DecodeHarnessParams& vp, const typename B::Row&,
                                                  const typename B::Col&, const typename B::Tile&, int b, int h, int,
                                                  int q, int k0, int j) {
    B::Check::bhq(vp, b, h, q);
    B::Check::kv(vp, b, k0 + j);
    const int kv = k0 + j;
    return kv <= q && q - kv < vp.window;
  }
};

// Document mask over the cache: doc[b, kv] == doc[b, q] and the query's document is not -1 (-1 = attends
// nothing: fully masked rows). The query's document is hoisted per row.
template <bool kCheck>
struct DDoc : DBase<kCheck> {
  using B = DBase<kCheck>;
  using typename B::Col;
  using typename B::Tile;
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = true;
  struct Row {
    int doc;
  };
  static __device__ __forceinline__ void row(const DecodeHarnessParams& vp, Row& r, int b, int h, int, int q) {
    B::Check::bhq(vp, b, h, q);
    r.doc = vp.doc[b * vp.doc_stride + q];
  }
  static __device__ __forceinline__ void col(const DecodeHarnessParams& vp, const Row&, Col&, int b, int h, int, int q,
                                             int j) {
    B::Check::bhq(vp, b, h, q);
    B::Check::kv(vp, b, j);
  }
  static __device__ __forceinline__ void tile(const DecodeHarnessParams& vp, const Row&, Tile&, int b, int h, int, int q,
                                              int k0) {
    B::Check::bhq(vp, b, h, q);
    B::Check::kv(vp, b, k0);
  }
  static __device__ __forceinline__ float score_mod(const DecodeHarnessParams&, const Row&, const Col&, const Tile&, int,
                                                    int, int, int, int, int, float score) {
    return score;
  }
  static __device__ __forceinline__ bool mask_mod(const DecodeHarnessParams& vp, const Row& r, const Col&, const Tile&,
                                                  int b, int h, int, int q, int k0, int j) {
    B::Check::bhq(vp, b, h, q);
    B::Check::kv(vp, b, k0 + j);
    return r.doc >= 0 && vp.doc[b * vp.doc_stride + k0 + j] == r.doc;
  }
};
