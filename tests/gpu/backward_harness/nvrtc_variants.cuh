// Generated backward variants (compiler/codegen/codegen_cuda_grad.cpp at commit bb5eda4, head dim 128 specs) for the
// NVRTC check: tests/data/backward/learnable_bias.json, alibi_learnable.json, gallery softcap.json and causal.json.
#pragma once

namespace v_learnable_bias {
struct FlexGradVariant {
  // Captured buffers, shape symbols and runtime parameters: one 8-byte slot per field,
  // filled by the host from the same ParamsLayout.
  struct Params {
    unsigned int* error_flags;  // error word of the launch (clamped loads, zero divisors)
    const void* buf_bias;
    long long buf_bias_s0;
    long long buf_bias_s1;
    long long buf_bias_n0;
    long long buf_bias_n1;
    long long sym_B;
    long long sym_H;
    long long sym_Hkv;
    long long sym_Sq;
    long long sym_Skv;
    long long sym_D;
    long long sym_L;
  };
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = true;
  struct Row {};  // values constant along a query row
  struct Col {};  // values per column j of a KV tile, the same in every tile
  struct Tile {};  // values per query row and KV tile
  __device__ static __forceinline__ void row(const Params& p, Row& row, int b, int h, int hkv, int q) {
  }
  __device__ static __forceinline__ void col(const Params& p, const Row& row, Col& col, int b, int h, int hkv, int q, int j) {
  }
  __device__ static __forceinline__ void tile(const Params& p, const Row& row, Tile& tile, int b, int h, int hkv, int q, int k0) {
  }
  __device__ static __forceinline__ float score_mod(const Params& p, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv, int q, int k0, int j, float score) {
    const int t0 = (k0 + j);
    const int t1 = (q - t0);
    const int t2 = (t1 + ((int)p.sym_Skv));
    const int t3 = (t2 - 1);
    // load bias[h, ((q - kv) + Skv) - 1]; stage element; unchecked: indices proven in range because (Sq + Skv) <= (L + 1) held at launch
    const float t4 = fj::load_f32(p.buf_bias, (long long)h * p.buf_bias_s0 + (long long)t3 * p.buf_bias_s1);
    const float t5 = (score + t4);
    return t5;
  }
  __device__ static __forceinline__ bool mask_mod(const Params& p, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv, int q, int k0, int j) {
    const int t6 = (k0 + j);
    const bool t7 = (q >= t6);
    return t7;
  }
  // Backward: dS_pre = dS * d_score; scatter I adds dS * coef into gradient element `off`.
  static constexpr bool kDScoreIsOne = true;
  static constexpr int kNumScatters = 1;
  static constexpr int kScatterClass[1] = {3 /* diagonal */};
  __device__ static __forceinline__ float d_score(const Params& p, int b, int h, int hkv, int q, int kv, float score) {
    const int k0 = kv;
    const int j = 0;
    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;
    return 1.0f;
  }
  template <int I>
  __device__ static __forceinline__ void scatter(const Params& p, int b, int h, int hkv, int q, int kv, float score, long long& off, float& coef) {
    const int k0 = kv;
    const int j = 0;
    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;
    if constexpr (I == 0) {  // bias[...] (diagonal)
      const int t0 = (q - (k0 + j));
      const int t1 = (t0 + ((int)p.sym_Skv));
      const int t2 = (t1 - 1);
      off = ((0ll) * p.buf_bias_n0 + fj::checked_index((long long)h, p.buf_bias_n0, nullptr, 0u)) * p.buf_bias_n1 + fj::checked_index((long long)t2, p.buf_bias_n1, nullptr, 0u);
      coef = 1.0f;
    }
  }
};
}  // namespace v_learnable_bias

namespace v_alibi_learnable {
struct FlexGradVariant {
  // Captured buffers, shape symbols and runtime parameters: one 8-byte slot per field,
  // filled by the host from the same ParamsLayout.
  struct Params {
    unsigned int* error_flags;  // error word of the launch (clamped loads, zero divisors)
    const void* buf_slope;
    long long buf_slope_s0;
    long long buf_slope_n0;
    long long sym_B;
    long long sym_H;
    long long sym_Hkv;
    long long sym_Sq;
    long long sym_Skv;
    long long sym_D;
  };
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = true;
  struct Row {};  // values constant along a query row
  struct Col {};  // values per column j of a KV tile, the same in every tile
  struct Tile {};  // values per query row and KV tile
  __device__ static __forceinline__ void row(const Params& p, Row& row, int b, int h, int hkv, int q) {
  }
  __device__ static __forceinline__ void col(const Params& p, const Row& row, Col& col, int b, int h, int hkv, int q, int j) {
  }
  __device__ static __forceinline__ void tile(const Params& p, const Row& row, Tile& tile, int b, int h, int hkv, int q, int k0) {
  }
  __device__ static __forceinline__ float score_mod(const Params& p, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv, int q, int k0, int j, float score) {
    // load slope[h]; stage row; unchecked: indices proven in range
    const float t0 = fj::load_f32(p.buf_slope, (long long)h * p.buf_slope_s0);
    const int t1 = (k0 + j);
    const int t2 = (t1 - q);
    const float t3 = (float)t2;
    const float t4 = (t0 * t3);
    const float t5 = (score + t4);
    return t5;
  }
  __device__ static __forceinline__ bool mask_mod(const Params& p, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv, int q, int k0, int j) {
    const int t6 = (k0 + j);
    const bool t7 = (q >= t6);
    return t7;
  }
  // Backward: dS_pre = dS * d_score; scatter I adds dS * coef into gradient element `off`.
  static constexpr bool kDScoreIsOne = true;
  static constexpr int kNumScatters = 1;
  static constexpr int kScatterClass[1] = {0 /* uniform */};
  __device__ static __forceinline__ float d_score(const Params& p, int b, int h, int hkv, int q, int kv, float score) {
    const int k0 = kv;
    const int j = 0;
    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;
    return 1.0f;
  }
  template <int I>
  __device__ static __forceinline__ void scatter(const Params& p, int b, int h, int hkv, int q, int kv, float score, long long& off, float& coef) {
    const int k0 = kv;
    const int j = 0;
    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;
    if constexpr (I == 0) {  // slope[...] (uniform)
      const int t0 = ((k0 + j) - q);
      const float t1 = (float)t0;
      off = (0ll) * p.buf_slope_n0 + fj::checked_index((long long)h, p.buf_slope_n0, nullptr, 0u);
      coef = t1;
    }
  }
};
}  // namespace v_alibi_learnable

namespace v_softcap {
struct FlexGradVariant {
  // Captured buffers, shape symbols and runtime parameters: one 8-byte slot per field,
  // filled by the host from the same ParamsLayout.
  struct Params {
    unsigned int* error_flags;  // error word of the launch (clamped loads, zero divisors)
    long long sym_B;
    long long sym_H;
    long long sym_Hkv;
    long long sym_Sq;
    long long sym_Skv;
    long long sym_D;
  };
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = false;
  struct Row {};  // values constant along a query row
  struct Col {};  // values per column j of a KV tile, the same in every tile
  struct Tile {};  // values per query row and KV tile
  __device__ static __forceinline__ void row(const Params& p, Row& row, int b, int h, int hkv, int q) {
  }
  __device__ static __forceinline__ void col(const Params& p, const Row& row, Col& col, int b, int h, int hkv, int q, int j) {
  }
  __device__ static __forceinline__ void tile(const Params& p, const Row& row, Tile& tile, int b, int h, int hkv, int q, int k0) {
  }
  __device__ static __forceinline__ float score_mod(const Params& p, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv, int q, int k0, int j, float score) {
    const float t0 = (score * 0.033333335f);
    const float t1 = fj::tanh_fast(t0);
    const float t2 = (t1 * 30.0f);
    return t2;
  }
  __device__ static __forceinline__ bool mask_mod(const Params& p, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv, int q, int k0, int j) {
    return true;
  }
  // Backward: dS_pre = dS * d_score; scatter I adds dS * coef into gradient element `off`.
  static constexpr bool kDScoreIsOne = false;
  static constexpr int kNumScatters = 0;
  static constexpr int kScatterClass[1] = {0};
  __device__ static __forceinline__ float d_score(const Params& p, int b, int h, int hkv, int q, int kv, float score) {
    const int k0 = kv;
    const int j = 0;
    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;
    const float t0 = (score * 0.033333335f);
    const float t1 = fj::tanh_fast(t0);
    const float t2 = (t1 * t1);
    const float t3 = (1.0f - t2);
    return t3;
  }
  template <int I>
  __device__ static __forceinline__ void scatter(const Params& p, int b, int h, int hkv, int q, int kv, float score, long long& off, float& coef) {
    const int k0 = kv;
    const int j = 0;
    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;
    off = 0;
    coef = 0.f;
  }
};
}  // namespace v_softcap

namespace v_causal {
struct FlexGradVariant {
  // Captured buffers, shape symbols and runtime parameters: one 8-byte slot per field,
  // filled by the host from the same ParamsLayout.
  struct Params {
    unsigned int* error_flags;  // error word of the launch (clamped loads, zero divisors)
    long long sym_B;
    long long sym_H;
    long long sym_Hkv;
    long long sym_Sq;
    long long sym_Skv;
    long long sym_D;
  };
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = true;
  struct Row {};  // values constant along a query row
  struct Col {};  // values per column j of a KV tile, the same in every tile
  struct Tile {};  // values per query row and KV tile
  __device__ static __forceinline__ void row(const Params& p, Row& row, int b, int h, int hkv, int q) {
  }
  __device__ static __forceinline__ void col(const Params& p, const Row& row, Col& col, int b, int h, int hkv, int q, int j) {
  }
  __device__ static __forceinline__ void tile(const Params& p, const Row& row, Tile& tile, int b, int h, int hkv, int q, int k0) {
  }
  __device__ static __forceinline__ float score_mod(const Params& p, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv, int q, int k0, int j, float score) {
    return score;
  }
  __device__ static __forceinline__ bool mask_mod(const Params& p, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv, int q, int k0, int j) {
    const int t0 = (k0 + j);
    const bool t1 = (q >= t0);
    return t1;
  }
  // Backward: dS_pre = dS * d_score; scatter I adds dS * coef into gradient element `off`.
  static constexpr bool kDScoreIsOne = true;
  static constexpr int kNumScatters = 0;
  static constexpr int kScatterClass[1] = {0};
  __device__ static __forceinline__ float d_score(const Params& p, int b, int h, int hkv, int q, int kv, float score) {
    const int k0 = kv;
    const int j = 0;
    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;
    return 1.0f;
  }
  template <int I>
  __device__ static __forceinline__ void scatter(const Params& p, int b, int h, int hkv, int q, int kv, float score, long long& off, float& coef) {
    const int k0 = kv;
    const int j = 0;
    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;
    off = 0;
    coef = 0.f;
  }
};
}  // namespace v_causal
