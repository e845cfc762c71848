// The plain-data interface between the CPU attention driver and its query-tile kernel, which
// is compiled once per instruction set (arch/attention_tile_kernel.cpp) and picked at run time.
// Nothing here may hold code: the header is included by translation units built with
// different -march flags, and an inline function would be merged across them.
#pragma once
#include <cstddef>
#include <cstdint>

#include "runtime/cpu/mod_abi.h"

namespace flexjit::cpu {

enum class ElemType : uint8_t { F32, F16, BF16 };

// A [B, heads, S, D] operand: element strides of its four dimensions.
struct Operand {
  const void* data = nullptr;
  int64_t stride[4] = {0, 0, 0, 0};
};
struct OutOperand {
  void* data = nullptr;
  int64_t stride[4] = {0, 0, 0, 0};
};

// Block classes of one (query tile, KV tile) pair.
inline constexpr uint8_t kTileEmpty = 0;    // mask false everywhere: skipped
inline constexpr uint8_t kTileFull = 1;     // mask true everywhere: no mask_mod
inline constexpr uint8_t kTilePartial = 2;  // mask_mod evaluated per element

// Classifies the block (b, h, query tile, KV tile); must not throw.
using ClassifyFn = uint8_t (*)(const void* ctx, int64_t b, int64_t h, int64_t q_tile, int64_t kv_tile);

// Byte offsets into a worker's scratch (one 64-byte aligned allocation of `total` bytes).
struct ScratchLayout {
  size_t q = 0, k = 0, v = 0, s = 0, o = 0, row_max = 0, row_sum = 0, alpha = 0, keep = 0, ones = 0, state = 0, total = 0;
};

struct AttentionJob {
  int64_t B = 0, H = 0, Hkv = 0, Sq = 0, Skv = 0, D = 0, Dv = 0;
  // Added to b and to the query rows where the mods see them (ragged and decode launches run
  // one sequence at a time: b is the sequence index, q its position in the sequence; a shard of
  // a longer sequence, context parallelism, sees its global positions). kv_offset: the global
  // position of KV row 0, which also places the KV tiles on the global grid (kv_tiles.h).
  int64_t b_offset = 0, q_offset = 0, kv_offset = 0;
  float scale = 1;
  ElemType dtype = ElemType::F32;
  // K and V are f32 whatever `dtype` says: decode of an FP8 KV cache dequantises it into f32
  // copies (ragged_launch.cpp) while Q and O keep the spec's dtype.
  bool kv_f32 = false;
  Operand q, k, v;
  OutOperand o;
  float* lse = nullptr;  // optional [B, H, Sq]
  int64_t lse_stride[3] = {0, 0, 0};
  int block_m = 64;  // query rows per work item
  int block_n = 64;  // KV rows per tile: block classes and the mods' staging tile
  int chunk_n = 256; // most KV rows per product: consecutive non-empty tiles are multiplied together

  // The JIT-compiled mods; null when the spec has neither.
  const ModFunctions* mods = nullptr;
  bool has_score_mod = false, has_mask_mod = false;
  bool row_stage = false, col_stage = false, tile_stage = false;  // whether those functions have work
  const uint64_t* params = nullptr;
  size_t state_bytes = 0;

  // Block sparsity; null classify: every tile is full.
  ClassifyFn classify = nullptr;
  const void* classify_ctx = nullptr;

  ScratchLayout scratch;
};

// O and LSE of query tile `q_tile` of head (b, h): returns the error bits the mods raised.
using QueryTileKernel = uint32_t (*)(const AttentionJob& job, void* scratch, int64_t b, int64_t h, int64_t q_tile);

namespace isa_generic {
uint32_t run_query_tile(const AttentionJob& job, void* scratch, int64_t b, int64_t h, int64_t q_tile);
}
#ifdef FLEXJIT_CPU_HAVE_X86_ISAS
namespace isa_avx2 {
uint32_t run_query_tile(const AttentionJob& job, void* scratch, int64_t b, int64_t h, int64_t q_tile);
}
namespace isa_avx512 {
uint32_t run_query_tile(const AttentionJob& job, void* scratch, int64_t b, int64_t h, int64_t q_tile);
}
#endif

}  // namespace flexjit::cpu
