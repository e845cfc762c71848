// Launch parameters of the flex attention backward kernels: plain structs shared by NVRTC device code and host C++.
#pragma once
#include "flex_params.cuh"

// Plain data only (compiled as host C++20 too): no CUDA types, qualifiers or fixed-width typedefs.

// Deterministic mode accumulates dQ and buffer gradients as 64-bit fixed point with this many fractional
// bits: integer additions commute, so the result does not depend on the order of the atomics. Values
// must stay below 2^(63 - kFlexFixedPointBits) = 2^31 in magnitude; the resolution is 2^-32.
#define FLEX_FIXED_POINT_BITS 32

// Everything the backward kernels need besides the variant's own parameters.
// Layouts as the forward: q/dq [B, H, Sq, D], k/v/dk/dv [B, Hkv, Skv, D], o/do like q, by element strides
// with the last dim contiguous. dq, dk, dv have the dtype of q.
struct FlexBackwardParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* d_o;
  const float* lse;           // [B, H, Sq] natural-log LSE (forward's or merged); -inf: fully masked row
  void* dq;
  void* dk;
  void* dv;
  float* delta;               // workspace [B, H, Sq]: rowsum(dO * O)
  float* lse2;                // workspace [B, H, Sq]: lse * log2(e), +inf for fully masked rows (P = 0 there)
  void* dq_accum;             // workspace [B, H, Sq, D]: fp32 (atomics) or 64-bit fixed point (deterministic)
  const unsigned char* tile_state;  // [Bm, Hm, nq_fwd, nkv_fwd] forward-granularity tile classes (0 skip,
                                    // 1 full, 2 partial); null: no block mask (every tile full)
  long long ts_stride_b;      // element strides of tile_state over b and h (0 = broadcast)
  long long ts_stride_h;
  int ts_nq;                  // forward query tiles (ceil(Sq / ts_q_tile))
  int ts_nkv;                 // forward KV tiles (ceil(Skv / ts_kv_tile))
  int ts_q_tile;              // forward tile sizes the states were built for
  int ts_kv_tile;
  long long q_stride_b, q_stride_h, q_stride_s;
  long long k_stride_b, k_stride_h, k_stride_s;
  long long v_stride_b, v_stride_h, v_stride_s;
  long long o_stride_b, o_stride_h, o_stride_s;
  long long do_stride_b, do_stride_h, do_stride_s;
  long long dq_stride_b, dq_stride_h, dq_stride_s;
  long long dk_stride_b, dk_stride_h, dk_stride_s;
  long long dv_stride_b, dv_stride_h, dv_stride_s;
  long long lse_stride_b, lse_stride_h;
  int batch;
  int heads;
  int kv_heads;
  int seqlen_q;
  int seqlen_kv;
  float scale;
  // Ragged batches (modules built with FLEX_RAGGED, flex_backward_ragged.cuh; null in dense launches): sequence b owns
  // rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q, o, d_o, dq and lse's last dimension, and [cu_seqlens_kv[b],
  // cu_seqlens_kv[b + 1]) of k, v, dk, dv (the _stride_b strides are 0); batch is B, seqlen_q / seqlen_kv the bounds
  // of the lengths. Each CTA works on its sequence's view (flex_bwd::ragged_sequence). A sequence outside the bounds or
  // the packed rows (total_q / total_kv) is skipped and sets kFlexBadLengthsFlag in *error_word.
  const int* cu_seqlens_q;
  const int* cu_seqlens_kv;
  int total_q, total_kv;
  unsigned int* error_word;
  // The tensor maps' coordinates (flex_backward_loads_sm90.cuh): row = tma_q_row0 / tma_kv_row0 + a row of the launch
  // (of the sequence, in a ragged view: its first packed rows), batch = b * tma_b_scale (1; 0 for a ragged batch,
  // whose maps describe the packed tensors as one batch).
  int tma_q_row0, tma_kv_row0, tma_b_scale;
  void* grad_ptr[8];          // per scatter: its buffer's gradient (f32, or 64-bit fixed point when
                              // deterministic), contiguous, the buffer's shape
  // Deterministic selector GEMMs (flex_bwd_sm90::Smem::kStagedBlocks): bit 0 set when the staged Col term's
  // fixed-point accumulator is blocked in 16-column slices (flex_bwd::blocked_index), bit 1 the Tile term's in
  // 8-column slices; an unset bit: per-element atomics into the buffer's order. The host sets them where the slices
  // tile the buffer's columns.
  int staged_blocks;
};

// The tensor maps of a warp-specialised Hopper backward launch (flex_backward_sm90.cuh, kProducer): q, k, v and d_o as
// rank-4 tensors {D, S, heads, B} (innermost first, the launch's strides), boxes of one swizzle region by the kernel's
// block_m (q, d_o) or block_n (k, v) rows. Passed as a __grid_constant__ kernel parameter.
struct FlexBackwardTmaMaps {
  FlexTensorMap q, k, v, d_o;
};

// The transposed block-mask builder: one thread per (b, h, query tile) row of the forward mask.
struct FlexTileStateParams {
  FlexBlockMask mask;         // the forward mask (counts and lists)
  unsigned char* tile_state;  // [Bm, Hm, num_q_tiles, max_kv_tiles], cleared to 0 before the launch
  int rows;                   // Bm * Hm * num_q_tiles
};

// The ragged tile-class builder (flex_backward_ragged.cuh): one thread per (sequence, mask head, query tile, KV tile)
// of the backward's own tiles, classified at the sequence's lengths.
struct FlexRaggedTileStateParams {
  const int* cu_seqlens_q;
  const int* cu_seqlens_kv;
  unsigned char* tile_state;  // [batch, mask_heads, nq, nkv]
  int batch, mask_heads, group;  // group: query heads per KV head (the classifier's hkv = h / group)
  int nq, nkv, q_tile, kv_tile;
  int seqlen_q, seqlen_kv;       // the bounds of the lengths
  int total_q, total_kv;
};

// Host and device: the host's tests check the layout (tests/unit/codegen/backward_policy_test.cpp).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FLEX_BLOCKED_INDEX_FN __host__ __device__ __forceinline__
#else
#define FLEX_BLOCKED_INDEX_FN inline
#endif

namespace flex_bwd {

// A staged gradient's blocked accumulator (deterministic selector GEMMs, flex_backward_staged.cuh): the element
// (row, c) of a buffer's rows x cols matrix starting at `base`. Within each block of 64 rows (the last one holds
// nb = rows - 64 (row / 64) of them), the columns are cut into slices of w (w divides cols), and slice c / w is an
// [nb][w] run, so a CTA's sums of one query tile and slice are contiguous.
FLEX_BLOCKED_INDEX_FN long long blocked_index(long long rows, long long cols, int w, long long base, long long row, int c) {
  const long long block0 = row - row % 64;
  const long long nb = rows - block0 < 64 ? rows - block0 : 64;
  return base + block0 * cols + (c / w) * nb * w + (row % 64) * w + c % w;
}

}  // namespace flex_bwd

// Conversion of fixed-point or fp32 accumulators into the outputs: out[i] = in[i] * mult.
struct FlexConvertParams {
  const void* in;             // fp32 or 64-bit fixed point (deterministic)
  void* out;                  // Element (dq) or f32 (buffer gradients)
  long long n;                // elements
  float mult;
  // block_w > 0: `in` holds a staged gradient's blocked accumulator (flex_bwd::blocked_index) of a buffer whose
  // last two dims are rows x cols; 0: the same order as `out`.
  long long rows, cols;
  int block_w;
};
