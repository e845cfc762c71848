// Launch parameters of the block-mask builder: a plain struct shared by NVRTC device code and
// host C++ (no CUDA types), like flex_params.cuh.
#pragma once
#include "flex_params.cuh"

// Where the builder writes, and the launch geometry the mask is for.
struct FlexBlockMaskBuildParams {
  int* kv_num_partial;     // [Bm, Hm, num_q_tiles]
  int* kv_partial_idx;     // [Bm, Hm, num_q_tiles, max_kv_tiles]
  int* kv_num_full;        // [Bm, Hm, num_q_tiles]
  int* kv_full_idx;        // [Bm, Hm, num_q_tiles, max_kv_tiles]
  FlexQTileWork* q_order;  // [Bm, Hm, num_q_tiles]: written by flex_rank_q_tiles (data-dependent masks only)
  long long stride_b;      // element stride of the count arrays over b (0 when broadcast over batch)
  long long stride_h;      // element stride of the count arrays over h (0 when broadcast over heads)
  int num_q_tiles, max_kv_tiles, q_tile, kv_tile;
  int batch, heads, kv_heads, seqlen_q, seqlen_kv;
  int query_offset;        // absolute position of query row 0 (decode: Skv - Sq; a shard of a longer sequence: its q_offset)
  int kv_offset;           // absolute position of KV row 0 (a shard of a longer sequence; else 0)
};

