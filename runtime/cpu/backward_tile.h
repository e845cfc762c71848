// The plain-data interface between the CPU backward driver and its tile kernels, which are
// compiled once per instruction set (arch/backward_tile_kernel.cpp) and picked at run time.
// Nothing here may hold code (see attention_tile.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "runtime/cpu/attention_tile.h"
#include "runtime/cpu/mod_abi.h"

namespace flexjit::cpu {

// Byte offsets into a worker's scratch (one 64-byte aligned allocation of `total` bytes).
struct BackwardScratchLayout {
  size_t q = 0, d_o = 0, k = 0, v = 0, s = 0, pre = 0, dp = 0, d_score = 0, keep = 0, ones = 0, coef = 0, offset = 0, acc_a = 0, acc_b = 0,
         state = 0, total = 0;
};

struct BackwardJob {
  int64_t B = 0, H = 0, Hkv = 0, Sq = 0, Skv = 0, D = 0, Dv = 0;
  // A shard of a longer sequence (context parallelism): the global positions of query row 0 and
  // KV row 0, where the mods see them; the KV tiles lie on the global grid (kv_tiles.h).
  int64_t q_offset = 0, kv_offset = 0;
  // Added to b where the mods see it: a ragged batch runs one sequence per job (B = 1), whose b is its index.
  int64_t b_offset = 0;
  float scale = 1;
  ElemType dtype = ElemType::F32;  // of q, k, v, o, d_o, dq, dk, dv
  Operand q, k, v, o, d_o;
  OutOperand dq, dk, dv;
  const float* lse = nullptr;  // [B, H, Sq], required
  int64_t lse_stride[3] = {0, 0, 0};
  float* delta = nullptr;      // [B, H, Sq] contiguous: rowsum(dO * O), filled by run_delta
  int block_m = 64;  // query rows per tile
  int block_n = 64;  // KV rows per tile; equals the backward module's tile size

  // The backward module of the mods (mod_abi.h, with `grad`); null when the spec has none.
  const ModFunctions* mods = nullptr;
  bool has_score_mod = false, has_mask_mod = false;
  bool row_stage = false, col_stage = false, tile_stage = false;
  bool need_d_score = false;  // d_score is not the constant 1
  const uint64_t* params = nullptr;
  size_t state_bytes = 0;
  int num_scatters = 0;
  const int* scatter_target = nullptr;  // per scatter: index into the per-thread gradient arrays, -1: not wanted

  ClassifyFn classify = nullptr;  // null: every tile is full
  const void* classify_ctx = nullptr;

  BackwardScratchLayout scratch;
};

// delta[b, h, :] = rowsum(dO * O) over the Sq rows of head (b, h).
using DeltaKernel = void (*)(const BackwardJob& job, int64_t b, int64_t h);
// dK and dV of KV tile `kv_tile` of KV head (b, hkv), summed over its query heads.
using KvTileKernel = void (*)(const BackwardJob& job, void* scratch, int64_t b, int64_t hkv, int64_t kv_tile);
// dQ of query tile `q_tile` of head (b, h), and the scatters of its scores into `grads`
// (double arrays, one per gradient target, contiguous in the buffer's shape; this thread's own).
using QTileKernel = void (*)(const BackwardJob& job, void* scratch, double* const* grads, int64_t b, int64_t h, int64_t q_tile);

#define FLEXJIT_CPU_BACKWARD_DECLS                                                                                   \
  void run_delta(const BackwardJob& job, int64_t b, int64_t h);                                                     \
  void run_backward_kv_tile(const BackwardJob& job, void* scratch, int64_t b, int64_t hkv, int64_t kv_tile);       \
  void run_backward_q_tile(const BackwardJob& job, void* scratch, double* const* grads, int64_t b, int64_t h, int64_t q_tile);

namespace isa_generic {
FLEXJIT_CPU_BACKWARD_DECLS
}
#ifdef FLEXJIT_CPU_HAVE_X86_ISAS
namespace isa_avx2 {
FLEXJIT_CPU_BACKWARD_DECLS
}
namespace isa_avx512 {
FLEXJIT_CPU_BACKWARD_DECLS
}
#endif
#undef FLEXJIT_CPU_BACKWARD_DECLS

}  // namespace flexjit::cpu
