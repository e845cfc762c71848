// Shared declarations of the standalone forward-kernel harness: variant parameters and the launch entry points.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "flex_params.cuh"

// One parameter struct for every hand-written variant (each uses the fields it needs), standing in for
// the generator's per-variant Params.
struct HarnessParams {
  const __nv_bfloat16* rel_h;  // SAM: [B, H, Sq, rel_h_cols], rel_h[b, h, q, kv // 64]
  const __nv_bfloat16* rel_w;  // SAM: [B, H, Sq, 64], rel_w[b, h, q, kv % 64]
  long long rel_h_stride_b, rel_h_stride_h, rel_h_stride_q;
  long long rel_w_stride_b, rel_w_stride_h, rel_w_stride_q;
  const int* doc_q;            // document mask: [B, Sq] document of each query (-1 = attends nothing)
  const int* doc_kv;           // document mask: [B, Skv] document of each key
  int seqlen_q, seqlen_kv;     // for the call-range checks
  int* violations;             // checked variants count calls with an index out of range here
};

enum class VariantKind { Plain, Causal, Sam, Softcap, SoftcapApprox, Doc };
enum class DType { BF16, FP16 };

// Launch the forward kernel for head dim `head_dim` (one translation unit per head dim instantiates it).
// check = the variant counts out-of-range calls into HarnessParams::violations (correctness mode).
// Returns cudaErrorNotSupported when that combination is not instantiated.
cudaError_t launch_forward(int head_dim, VariantKind kind, DType dtype, bool check, const FlexForwardParams& p,
                           const HarnessParams& vp, cudaStream_t stream);

// Tile configuration the kernels were instantiated with (mirrors the table in flex_forward.cuh).
struct TileConfig {
  int block_m, block_n, n_warps, smem_bytes;
};
TileConfig tile_config(int head_dim);

#define FLEX_HARNESS_HEAD_DIMS(X) X(32) X(64) X(80) X(96) X(128) X(192) X(256)
