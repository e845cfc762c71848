// Shared declarations of the standalone backward harness: host-side buffers of the variants and launch entry points.
#pragma once
#include <cuda_runtime.h>

#include "flex_backward_params.cuh"

enum class VariantKind {
  Plain,    // no mods
  Causal,   // mask_mod q >= kv
  Softcap,  // score_mod 30 tanh(s / 30), d_score 1 - tanh^2
  Bias,     // causal + learnable bias[h, q - kv + Skv - 1] (diagonal scatter)
  Slope,    // causal + learnable slope[h] * (kv - q) (uniform scatter)
};
enum class DType { BF16, FP16 };
enum class KernelKind {
  Sm90,      // flex_backward_main_sm90 (kDq = true)
  Sm90NoDq,  // flex_backward_main_sm90 (kDq = false): dK, dV and buffer gradients only
  Old,       // flex_backward_main (mma.sync)
};

// Everything the variants' Params are filled from (each variant takes the fields the generator would give it).
struct HarnessBuffers {
  unsigned int* error_flags;  // the variants set bit 0 when called with q or kv out of range (check builds)
  const float* bias;          // [H, L]
  long long bias_n0, bias_n1;
  const float* slope;         // [H]
  long long slope_n0;
  long long B, H, Hkv, Sq, Skv, D, L;
};

// Per head dim (one translation unit each). check = the variants verify their call ranges.
// Returns cudaErrorNotSupported when that combination is not instantiated.
cudaError_t launch_main(int head_dim, VariantKind kind, DType dtype, KernelKind kernel, bool deterministic, bool check,
                        const FlexBackwardParams& p, const HarnessBuffers& hb, cudaStream_t stream);
cudaError_t launch_preprocess(int head_dim, DType dtype, bool deterministic, const FlexBackwardParams& p, cudaStream_t stream);
cudaError_t launch_dq(int head_dim, DType dtype, bool deterministic, const FlexBackwardParams& p, cudaStream_t stream);
// Shared memory of the main kernel.
int main_smem_bytes(int head_dim, KernelKind kernel);

#define FLEX_BWD_HARNESS_HEAD_DIMS(X) X(32) X(64) X(80) X(96) X(128)
