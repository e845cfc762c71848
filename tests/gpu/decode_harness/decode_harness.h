// Shared declarations of the standalone decode-kernel harness: variant parameters and launch entry points.
#pragma once
#include <cuda_runtime.h>

#include "flex_decode_params.cuh"

// One parameter struct for every hand-written decode variant (each uses the fields it needs), standing in
// for the generator's per-variant Params.
struct DecodeHarnessParams {
  const float* alibi_slopes;  // ALiBi: [H] slope per query head
  const int* doc;             // document mask: [B, doc_stride] document id of each position (-1 = none)
  long long doc_stride;
  int window;                 // sliding window: q - kv < window (and q >= kv)
  // For the call-range checks of checked variants:
  const int* kv_lens;         // [B]
  const int* q_lens;          // [B]
  int batch, heads;
  int* violations;            // checked variants count calls with an index out of range here
};

enum class DVariant { Plain, Causal, Alibi, Softcap, Window, Doc };
enum class DType { BF16, FP16 };

// Kernel configuration of one launch.
struct DecodeConfig {
  int head_dim;
  int m_tiles;  // 1 or 2: packed query rows per CTA = 16 * m_tiles
  int stages;   // K/V shared-memory stages
};

// Launches the decode kernel and, when p.num_splits > 1, the combine kernel on `stream`.
// check = the variant counts out-of-range calls (correctness mode). cudaErrorNotSupported when the
// combination is not instantiated.
cudaError_t launch_decode(const DecodeConfig& cfg, DVariant kind, DType dtype, bool check, const FlexDecodeParams& p,
                          const DecodeHarnessParams& vp, cudaStream_t stream);
// Dynamic shared memory and resident CTAs per SM of that kernel (0 when not instantiated).
int decode_smem_bytes(const DecodeConfig& cfg);
int decode_ctas_per_sm(const DecodeConfig& cfg, DVariant kind, DType dtype, bool check);
// The stage count of DecodeConfig::stages == 0 (the runtime's default unless built with -DDECODE_DEFAULT_STAGES).
int decode_default_stages();

// Benchmark-only switch (main.cu): launch_decode skips the combine kernel, to time the decode kernel alone.
extern bool g_decode_skip_combine;

#define DECODE_HARNESS_HEAD_DIMS(X) X(64) X(128) X(256)
