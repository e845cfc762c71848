// Hand-written backward variants with the struct shape compiler/codegen/codegen_cuda_grad.cpp emits (unhoisted
// forward part, d_score, scatter classes and scatter<I>), for plain, causal, softcap, learnable bias and slope.
#pragma once
#include "flex_ops.cuh"
#include "harness.h"

// kCheck: every entry point verifies it is called with in-range q and kv only (the kernels promise it; generated
// code relies on it) and sets bit 0 of the error word otherwise. Off for benchmarks.
template <bool kCheck>
struct CallCheck {
  template <class P>
  static __device__ __forceinline__ void qkv(const P& p, int q, int kv) {
    if (kCheck && (q < 0 || q >= (int)p.sym_Sq || kv < 0 || kv >= (int)p.sym_Skv)) atomicOr(p.error_flags, 1u);
  }
};

// Fields every generated Params has: the error word and the shape symbols.
#define FLEX_HARNESS_SYMS \
  long long sym_B;        \
  long long sym_H;        \
  long long sym_Hkv;      \
  long long sym_Sq;       \
  long long sym_Skv;      \
  long long sym_D;

#define FLEX_HARNESS_UNHOISTED                                                                                         \
  struct Row {};                                                                                                       \
  struct Col {};                                                                                                       \
  struct Tile {};                                                                                                      \
  __device__ static __forceinline__ void row(const Params&, Row&, int, int, int, int) {}                              \
  __device__ static __forceinline__ void col(const Params&, const Row&, Col&, int, int, int, int, int) {}             \
  __device__ static __forceinline__ void tile(const Params&, const Row&, Tile&, int, int, int, int, int) {}

template <class P>
__host__ inline void fill_syms(P& p, const HarnessBuffers& hb) {
  p.error_flags = hb.error_flags;
  p.sym_B = hb.B, p.sym_H = hb.H, p.sym_Hkv = hb.Hkv, p.sym_Sq = hb.Sq, p.sym_Skv = hb.Skv, p.sym_D = hb.D;
}

// score, everything attended.
template <bool kCheck>
struct PlainGrad {
  struct Params {
    unsigned int* error_flags;
    FLEX_HARNESS_SYMS
  };
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = false;
  FLEX_HARNESS_UNHOISTED
  __device__ static __forceinline__ float score_mod(const Params& p, const Row&, const Col&, const Tile&, int, int, int, int q, int k0, int j,
                                                    float score) {
    CallCheck<kCheck>::qkv(p, q, k0 + j);
    return score;
  }
  __device__ static __forceinline__ bool mask_mod(const Params& p, const Row&, const Col&, const Tile&, int, int, int, int q, int k0, int j) {
    CallCheck<kCheck>::qkv(p, q, k0 + j);
    return true;
  }
  static constexpr bool kDScoreIsOne = true;
  static constexpr int kNumScatters = 0;
  static constexpr int kScatterClass[1] = {0};
  static constexpr bool kStagedCol = false, kStagedTile = false;  // no staged terms (flex_backward_staged.cuh)
  static constexpr int kStagedColScatter = -1, kStagedTileScatter = -1;
  __device__ static __forceinline__ float d_score(const Params& p, int, int, int, int q, int kv, float) {
    CallCheck<kCheck>::qkv(p, q, kv);
    return 1.0f;
  }
  template <int I>
  __device__ static __forceinline__ void scatter(const Params&, int, int, int, int, int, float, long long& off, float& coef) {
    off = 0;
    coef = 0.f;
  }
  static __host__ Params make(const HarnessBuffers& hb) {
    Params p{};
    fill_syms(p, hb);
    return p;
  }
};

// mask_mod q >= kv.
template <bool kCheck>
struct CausalGrad : PlainGrad<kCheck> {
  using typename PlainGrad<kCheck>::Params;
  using typename PlainGrad<kCheck>::Row;
  using typename PlainGrad<kCheck>::Col;
  using typename PlainGrad<kCheck>::Tile;
  static constexpr bool kHasMaskMod = true;
  __device__ static __forceinline__ bool mask_mod(const Params& p, const Row&, const Col&, const Tile&, int, int, int, int q, int k0, int j) {
    CallCheck<kCheck>::qkv(p, q, k0 + j);
    const int t6 = (k0 + j);
    const bool t7 = (q >= t6);
    return t7;
  }
};

// score_mod 30 * tanh(score / 30) (the generator's fast tanh), d_score 1 - tanh^2.
template <bool kCheck>
struct SoftcapGrad : PlainGrad<kCheck> {
  using typename PlainGrad<kCheck>::Params;
  using typename PlainGrad<kCheck>::Row;
  using typename PlainGrad<kCheck>::Col;
  using typename PlainGrad<kCheck>::Tile;
  static constexpr bool kHasScoreMod = true;
  __device__ static __forceinline__ float score_mod(const Params& p, const Row&, const Col&, const Tile&, int, int, int, int q, int k0, int j,
                                                    float score) {
    CallCheck<kCheck>::qkv(p, q, k0 + j);
    const float t0 = (score * 0.033333335f);
    const float t1 = fj::tanh_fast(t0);
    const float t2 = (t1 * 30.0f);
    return t2;
  }
  static constexpr bool kDScoreIsOne = false;
  __device__ static __forceinline__ float d_score(const Params& p, int, int, int, int q, int kv, float score) {
    CallCheck<kCheck>::qkv(p, q, kv);
    const float t0 = (score * 0.033333335f);
    const float t1 = fj::tanh_fast(t0);
    const float t2 = (t1 * t1);
    const float t3 = (1.0f - t2);
    return t3;
  }
};

// Causal, score + bias[h, q - kv + Skv - 1] with bias f32[H, L] requiring a gradient (diagonal scatter).
template <bool kCheck>
struct BiasGrad {
  struct Params {
    unsigned int* error_flags;
    const void* buf_bias;
    long long buf_bias_s0;
    long long buf_bias_s1;
    long long buf_bias_n0;
    long long buf_bias_n1;
    FLEX_HARNESS_SYMS
    long long sym_L;
  };
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = true;
  FLEX_HARNESS_UNHOISTED
  __device__ static __forceinline__ float score_mod(const Params& p, const Row&, const Col&, const Tile&, int, int h, int, int q, int k0, int j,
                                                    float score) {
    CallCheck<kCheck>::qkv(p, q, k0 + j);
    const int t0 = (k0 + j);
    const int t1 = (q - t0);
    const int t2 = (t1 + ((int)p.sym_Skv));
    const int t3 = (t2 - 1);
    const float t4 = fj::load_f32(p.buf_bias, (long long)h * p.buf_bias_s0 + (long long)t3 * p.buf_bias_s1);
    const float t5 = (score + t4);
    return t5;
  }
  __device__ static __forceinline__ bool mask_mod(const Params& p, const Row&, const Col&, const Tile&, int, int, int, int q, int k0, int j) {
    CallCheck<kCheck>::qkv(p, q, k0 + j);
    const int t6 = (k0 + j);
    const bool t7 = (q >= t6);
    return t7;
  }
  static constexpr bool kDScoreIsOne = true;
  static constexpr int kNumScatters = 1;
  static constexpr int kScatterClass[1] = {3 /* diagonal */};
  static constexpr bool kStagedCol = false, kStagedTile = false;  // no staged terms (flex_backward_staged.cuh)
  static constexpr int kStagedColScatter = -1, kStagedTileScatter = -1;
  __device__ static __forceinline__ float d_score(const Params& p, int, int, int, int q, int kv, float) {
    CallCheck<kCheck>::qkv(p, q, kv);
    return 1.0f;
  }
  template <int I>
  __device__ static __forceinline__ void scatter(const Params& p, int b, int h, int hkv, int q, int kv, float score, long long& off, float& coef) {
    const int k0 = kv;
    const int j = 0;
    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;
    CallCheck<kCheck>::qkv(p, q, kv);
    if constexpr (I == 0) {  // bias[...] (diagonal)
      const int t0 = (q - (k0 + j));
      const int t1 = (t0 + ((int)p.sym_Skv));
      const int t2 = (t1 - 1);
      off = ((0ll) * p.buf_bias_n0 + fj::checked_index((long long)h, p.buf_bias_n0, nullptr, 0u)) * p.buf_bias_n1 +
            fj::checked_index((long long)t2, p.buf_bias_n1, nullptr, 0u);
      coef = 1.0f;
    }
  }
  static __host__ Params make(const HarnessBuffers& hb) {
    Params p{};
    fill_syms(p, hb);
    p.buf_bias = hb.bias;
    p.buf_bias_s0 = hb.bias_n1, p.buf_bias_s1 = 1;
    p.buf_bias_n0 = hb.bias_n0, p.buf_bias_n1 = hb.bias_n1;
    p.sym_L = hb.L;
    return p;
  }
};

// Causal, score + slope[h] * (kv - q) with slope f32[H] requiring a gradient (uniform scatter).
template <bool kCheck>
struct SlopeGrad {
  struct Params {
    unsigned int* error_flags;
    const void* buf_slope;
    long long buf_slope_s0;
    long long buf_slope_n0;
    FLEX_HARNESS_SYMS
  };
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = true;
  FLEX_HARNESS_UNHOISTED
  __device__ static __forceinline__ float score_mod(const Params& p, const Row&, const Col&, const Tile&, int, int h, int, int q, int k0, int j,
                                                    float score) {
    CallCheck<kCheck>::qkv(p, q, k0 + j);
    const float t0 = fj::load_f32(p.buf_slope, (long long)h * p.buf_slope_s0);
    const int t1 = (k0 + j);
    const int t2 = (t1 - q);
    const float t3 = (float)t2;
    const float t4 = (t0 * t3);
    const float t5 = (score + t4);
    return t5;
  }
  __device__ static __forceinline__ bool mask_mod(const Params& p, const Row&, const Col&, const Tile&, int, int, int, int q, int k0, int j) {
    CallCheck<kCheck>::qkv(p, q, k0 + j);
    const int t6 = (k0 + j);
    const bool t7 = (q >= t6);
    return t7;
  }
  static constexpr bool kDScoreIsOne = true;
  static constexpr int kNumScatters = 1;
  static constexpr int kScatterClass[1] = {0 /* uniform */};
  static constexpr bool kStagedCol = false, kStagedTile = false;  // no staged terms (flex_backward_staged.cuh)
  static constexpr int kStagedColScatter = -1, kStagedTileScatter = -1;
  __device__ static __forceinline__ float d_score(const Params& p, int, int, int, int q, int kv, float) {
    CallCheck<kCheck>::qkv(p, q, kv);
    return 1.0f;
  }
  template <int I>
  __device__ static __forceinline__ void scatter(const Params& p, int b, int h, int hkv, int q, int kv, float score, long long& off, float& coef) {
    const int k0 = kv;
    const int j = 0;
    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;
    CallCheck<kCheck>::qkv(p, q, kv);
    if constexpr (I == 0) {  // slope[...] (uniform)
      const int t0 = ((k0 + j) - q);
      const float t1 = (float)t0;
      off = (0ll) * p.buf_slope_n0 + fj::checked_index((long long)h, p.buf_slope_n0, nullptr, 0u);
      coef = t1;
    }
  }
  static __host__ Params make(const HarnessBuffers& hb) {
    Params p{};
    fill_syms(p, hb);
    p.buf_slope = hb.slope;
    p.buf_slope_s0 = 1;
    p.buf_slope_n0 = hb.slope_n0;
    return p;
  }
};
