// Launch parameters of the flex attention forward kernel: plain structs shared by NVRTC device code and host C++.
#pragma once

// Plain data only: this header is also compiled as host C++20 (no CUDA headers), so it must not use
// CUDA types, qualifiers or fixed-width integer typedefs.

// One query tile's work in a ranked block mask (FlexBlockMask::q_order). The builder of a data-dependent mask
// sorts each (b, h) row's query tiles by their count of listed KV tiles, heaviest first (ties: the later tile
// first), so the scheduler finds a work index's tile and counts in one 16-byte load.
struct FlexQTileWork {
  int m_block;    // the query tile
  int n_partial;  // its count of partial KV tiles (as kv_num_partial)
  int n_full;     // its count of full KV tiles (as kv_num_full)
  int reserved;   // keeps the entry one 16-byte load
};

// Block sparsity of one launch, built for tiles of q_tile x kv_tile. For each (b, h, query tile) it lists
// the KV tiles to visit: "partial" tiles run mask_mod per element, "full" tiles skip it, tiles in neither
// list are skipped entirely. All pointers null means no block mask: every KV tile is visited, as partial
// when the variant has a mask_mod and as full otherwise.
struct FlexBlockMask {
  const int* kv_num_partial;  // [Bm, Hm, num_q_tiles]: count of partial KV tiles per query tile (null = 0)
  const int* kv_partial_idx;  // [Bm, Hm, num_q_tiles, max_kv_tiles]: their KV tile indices, visited in order
  const int* kv_num_full;     // [Bm, Hm, num_q_tiles]: count of full KV tiles (mask_mod skipped; null = 0)
  const int* kv_full_idx;     // [Bm, Hm, num_q_tiles, max_kv_tiles]: their KV tile indices, visited after the partial ones
  long long stride_b;         // element stride of the count arrays over b (0 = broadcast over batch)
  long long stride_h;         // element stride of the count arrays over h (0 = broadcast over heads);
                              // the index arrays use stride_b * max_kv_tiles and stride_h * max_kv_tiles
  int num_q_tiles;            // number of query tiles the mask was built for (ceil(Sq / q_tile))
  int max_kv_tiles;           // capacity of each index list (usually ceil(Skv / kv_tile))
  int q_tile;                 // query tile size the mask was built for; must equal the kernel's kBlockM
  int kv_tile;                // KV tile size the mask was built for; must equal the kernel's kBlockN
  const FlexQTileWork* q_order;  // [Bm, Hm, num_q_tiles]: per mask row, its query tiles heaviest first (null = not ranked)
};

// Everything the forward kernel needs besides the variant's own parameters.
// Layouts: q [B, H, Sq, D], k/v [B, Hkv, Skv, D], o like q, given by element strides with the last dim
// contiguous, so [B, S, H, D] storage works without a copy. Requirements the host checks (the kernel
// uses 16-byte vector accesses): q/k/v/o 16-byte aligned, every stride a multiple of 8 elements.
struct FlexForwardParams {
  const void* q;              // query, element type = the kernel's Element (bf16 or fp16)
  const void* k;              // key
  const void* v;              // value
  void* o;                    // output, same layout rules as q
  float* lse;                 // [B, H, Sq] natural-log log-sum-exp of the modified scores; may be null
  long long q_stride_b;       // element stride of q over batch
  long long q_stride_h;       // element stride of q over heads
  long long q_stride_s;       // element stride of q over query positions
  long long k_stride_b;       // element stride of k over batch
  long long k_stride_h;       // element stride of k over KV heads
  long long k_stride_s;       // element stride of k over KV positions
  long long v_stride_b;       // element stride of v over batch
  long long v_stride_h;       // element stride of v over KV heads
  long long v_stride_s;       // element stride of v over KV positions
  long long o_stride_b;       // element stride of o over batch
  long long o_stride_h;       // element stride of o over heads
  long long o_stride_s;       // element stride of o over query positions
  long long lse_stride_b;     // element stride of lse over batch
  long long lse_stride_h;     // element stride of lse over heads (the row stride is 1)
  int batch;                  // B
  int heads;                  // H, query heads
  int kv_heads;               // Hkv; H must be a multiple of it; kv head of query head h is h / (H / Hkv)
  int seqlen_q;               // Sq >= 1
  int seqlen_kv;              // Skv >= 1
  float scale;                // softmax scale (> 0) applied to q.k before score_mod
  FlexBlockMask block_mask;   // block sparsity; all pointers null = no block mask
  // Ragged batches, read only by the kVarlen instantiation of flex_forward (null in dense launches). Sequence b owns query rows [cu_seqlens_q[b],
  // cu_seqlens_q[b + 1]) and KV rows [cu_seqlens_kv[b], cu_seqlens_kv[b + 1]) of q/o and k/v (the _stride_b
  // strides are then unused, usually 0), and lse entries at the same query rows. seqlen_q / seqlen_kv are the
  // bounds of the per-sequence lengths (grid.x = ceil(seqlen_q / kBlockM)); CTAs past their sequence's end exit.
  // The block mask must be empty (the kernel classifies a sequence's KV tiles itself, flex::TileScheduler).
  // total_q / total_kv: the packed tensors' rows. A sequence outside these bounds is skipped and sets
  // kFlexBadLengthsFlag in *error_word (the launch's error word; null: not reported).
  const int* cu_seqlens_q;
  const int* cu_seqlens_kv;
  int total_q, total_kv;
  unsigned int* error_word;
  // The warp-specialised kernel's work counter (flex::TileScheduler): [0] the next work index past the first wave,
  // [1] the CTAs done. Zero before a launch; the launch's last CTA zeroes them again (so graph replays need no reset).
  int* tile_counter;
  // Context parallelism: the positions the mods see for query row 0 and KV row 0 of this launch, a shard of a longer
  // sequence (0 for a whole sequence; dense launches only; read only by modules built with FLEX_SHARD_POSITIONS).
  // seqlen_q / seqlen_kv stay the shard's rows. (A ragged module built with FLEX_SHARD_POSITIONS places each
  // sequence's queries at the end of its KV instead.)
  int q_offset;
  int kv_offset;
};

// The error-word bit a launch sets for sequence lengths outside its bounds (ragged prefill, decode). Bit 31 is the
// zero divisor's, bits 0..29 the checked loads' (compiler/codegen/codegen_cuda.h).
constexpr unsigned kFlexBadLengthsFlag = 1u << 30;

// FLEX_SHARD_POSITIONS: defined 1 (before any include) by the module of a launch that is a shard of a longer
// sequence, or of a ragged prefill whose queries sit at the end of their KV (VarlenArgs::queries_at_kv_end); the
// other modules compile the offsets away, so whole-sequence launches spend no registers on them.
#ifndef FLEX_SHARD_POSITIONS
#define FLEX_SHARD_POSITIONS 0
#endif

// A TMA tensor map (CUtensorMap: 128 opaque bytes; CUDA 13 aligns it to 128 bytes), encoded by the host with
// cuTensorMapEncodeTiled.
struct alignas(128) FlexTensorMap {
  unsigned long long opaque[16];
};

// The tensor maps of a warp-specialised forward launch (flex_forward_kernel_sm90.cuh): q, k and v as rank-4 tensors
// {D, S, heads, B} (innermost first, the launch's strides; a ragged batch's packed tensors with B = 1), boxes of one
// swizzle region by the kernel's block_m (q) or block_n (k, v) rows. Passed as a __grid_constant__ kernel parameter.
struct FlexForwardTmaMaps {
  FlexTensorMap q, k, v;
};
