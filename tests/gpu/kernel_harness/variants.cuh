// Hand-written variants shaped like the generator's output (Row/Col/Tile hoisting, score_mod, mask_mod).
#pragma once
#include "harness.h"

// kCheck: every entry point verifies it was called only with in-range indices (the contract lets generated
// code skip bounds checks), counting violations in HarnessParams::violations. Off for benchmarks.
template <bool kCheck>
struct CallCheck {
  static __device__ __forceinline__ void q(const HarnessParams& vp, int q) {
    if (kCheck && (q < 0 || q >= vp.seqlen_q)) atomicAdd(vp.violations, 1);
  }
  static __device__ __forceinline__ void kv(const HarnessParams& vp, int kv) {
    if (kCheck && (kv < 0 || kv >= vp.seqlen_kv)) atomicAdd(vp.violations, 1);
  }
};

// Shared defaults: no hoisted state, identity score, attend everything.
template <bool kCheck>
struct BaseVariant {
  using Params = HarnessParams;
  using Check = CallCheck<kCheck>;
  struct Row {};
  struct Col {};
  struct Tile {};
  static __device__ __forceinline__ void row(const Params& vp, Row&, int, int, int, int q) { Check::q(vp, q); }
  static __device__ __forceinline__ void col(const Params& vp, const Row&, Col&, int, int, int, int q, int j) {
    Check::q(vp, q);
    Check::kv(vp, j);
  }
  static __device__ __forceinline__ void tile(const Params& vp, const Row&, Tile&, int, int, int, int q, int k0) {
    Check::q(vp, q);
    Check::kv(vp, k0);
  }
};

template <bool kCheck>
struct PlainVariant : BaseVariant<kCheck> {
  using B = BaseVariant<kCheck>;
  using typename B::Col;
  using typename B::Params;
  using typename B::Row;
  using typename B::Tile;
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = false;
  static __device__ __forceinline__ float score_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int,
                                                    int, int, int, float score) {
    return score;
  }
  static __device__ __forceinline__ bool mask_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int, int,
                                                  int, int) {
    return true;
  }
};

// mask_mod: q >= kv (top-left aligned causal).
template <bool kCheck>
struct CausalVariant : BaseVariant<kCheck> {
  using B = BaseVariant<kCheck>;
  using typename B::Col;
  using typename B::Params;
  using typename B::Row;
  using typename B::Tile;
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = true;
  static __device__ __forceinline__ float score_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int,
                                                    int, int, int, float score) {
    return score;
  }
  static __device__ __forceinline__ bool mask_mod(const Params& vp, const Row&, const Col&, const Tile&, int, int, int,
                                                  int q, int k0, int j) {
    B::Check::q(vp, q);
    B::Check::kv(vp, k0 + j);
    return q >= k0 + j;
  }
};

// SAM relative position: score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]. kBlockN = 64 and k0 is
// a multiple of 64, so rel_w's index is j (hoisted per column into Col, reused by every tile) and rel_h's
// is k0 / 64 (hoisted per tile into Tile).
template <bool kCheck>
struct SamVariant {
  using Params = HarnessParams;
  using Check = CallCheck<kCheck>;
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = false;
  struct Row {};
  struct Col {
    float w;
  };
  struct Tile {
    float h;
  };
  static __device__ __forceinline__ void row(const Params& vp, Row&, int, int, int, int q) { Check::q(vp, q); }
  static __device__ __forceinline__ void col(const Params& vp, const Row&, Col& c, int b, int h, int, int q, int j) {
    Check::q(vp, q);
    Check::kv(vp, j);
    c.w = __bfloat162float(vp.rel_w[b * vp.rel_w_stride_b + h * vp.rel_w_stride_h + q * vp.rel_w_stride_q + j]);
  }
  static __device__ __forceinline__ void tile(const Params& vp, const Row&, Tile& t, int b, int h, int, int q, int k0) {
    Check::q(vp, q);
    Check::kv(vp, k0);
    t.h = __bfloat162float(vp.rel_h[b * vp.rel_h_stride_b + h * vp.rel_h_stride_h + q * vp.rel_h_stride_q + k0 / 64]);
  }
  static __device__ __forceinline__ float score_mod(const Params& vp, const Row&, const Col& c, const Tile& t, int, int,
                                                    int, int q, int k0, int j, float score) {
    Check::q(vp, q);
    Check::kv(vp, k0 + j);
    return score + t.h + c.w;
  }
  static __device__ __forceinline__ bool mask_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int, int,
                                                  int, int) {
    return true;
  }
};

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Soft capping: 30 * tanh(score / 30); kApprox uses the single MUFU tanh.approx.f32 instead of tanhf.
template <bool kCheck, bool kApprox>
struct SoftcapVariant : BaseVariant<kCheck> {
  using B = BaseVariant<kCheck>;
  using typename B::Col;
  using typename B::Params;
  using typename B::Row;
  using typename B::Tile;
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = false;
  static __device__ __forceinline__ float score_mod(const Params& vp, const Row&, const Col&, const Tile&, int, int, int,
                                                    int q, int k0, int j, float score) {
    B::Check::q(vp, q);
    B::Check::kv(vp, k0 + j);
    const float x = score * (1.f / 30.f);
    return 30.f * (kApprox ? tanh_approx(x) : tanhf(x));
  }
  static __device__ __forceinline__ bool mask_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int, int,
                                                  int, int) {
    return true;
  }
};

// Data-dependent document mask: doc_q[b, q] == doc_kv[b, kv]; doc_q hoisted into Row.
template <bool kCheck>
struct DocVariant {
  using Params = HarnessParams;
  using Check = CallCheck<kCheck>;
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = true;
  struct Row {
    int doc;
  };
  struct Col {};
  struct Tile {};
  static __device__ __forceinline__ void row(const Params& vp, Row& r, int b, int, int, int q) {
    Check::q(vp, q);
    r.doc = vp.doc_q[(long long)b * vp.seqlen_q + q];
  }
  static __device__ __forceinline__ void col(const Params& vp, const Row&, Col&, int, int, int, int q, int j) {
    Check::q(vp, q);
    Check::kv(vp, j);
  }
  static __device__ __forceinline__ void tile(const Params& vp, const Row&, Tile&, int, int, int, int q, int k0) {
    Check::q(vp, q);
    Check::kv(vp, k0);
  }
  static __device__ __forceinline__ float score_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int,
                                                    int, int, int, float score) {
    return score;
  }
  static __device__ __forceinline__ bool mask_mod(const Params& vp, const Row& r, const Col&, const Tile&, int b, int,
                                                  int, int q, int k0, int j) {
    Check::q(vp, q);
    Check::kv(vp, k0 + j);
    return vp.doc_kv[(long long)b * vp.seqlen_kv + k0 + j] == r.doc;
  }
};
