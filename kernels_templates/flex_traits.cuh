// Compile-time tile geometry of the mma.sync forward kernel (flex_forward.cuh), read off the policy
// (flex_tile_policy.cuh): constexpr values and messaged static_asserts.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flex_tile_policy.cuh"

// kHeadDim: D (multiple of 16, 32..256, not padded to a power of two). Element: __nv_bfloat16 or __half (Q, K, V, O);
// accumulation is fp32. kBlockM x kBlockN: query rows x KV columns of one CTA tile; the warps split only the query
// rows, so every row of S lives in one quad of one warp and row reductions are two shuffles.
template <int kHeadDim_, class Element_>
struct FlexForwardTraits {
  using Element = Element_;
  static constexpr FlexForwardPolicy kPolicy = flex_forward_policy_mma_sync(kHeadDim_);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kPolicy.block_m;
  static constexpr int kBlockN = kPolicy.block_n;
  static constexpr int kNThreads = kPolicy.threads;
  static constexpr int kNWarps = kNThreads / 32;
  static constexpr int kMinBlocksPerSM = kPolicy.min_blocks_per_sm;

  // Per warp: kRowsPerWarp query rows = kMTiles mma tiles of 16 rows. Each K/V fragment read from
  // shared memory feeds kMTiles mmas, so 2 halves the shared-memory traffic per flop versus 1.
  static constexpr int kRowsPerWarp = kBlockM / kNWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;
  static constexpr int kNTiles = kBlockN / 8;    // n8 accumulator tiles of S per m-tile
  static constexpr int kDTiles = kHeadDim / 8;   // n8 accumulator tiles of O per m-tile
  // The accumulator elements one thread owns: rows g, g+8 of each m-tile; columns 2t, 2t+1 of each n8 tile.
  static constexpr int kRowsPerThread = 2 * kMTiles;
  static constexpr int kColsPerThread = 2 * kNTiles;

  // Shared memory: rows padded by 16 bytes so the row stride is an odd number of 16-byte chunks; then the
  // 8 row addresses of an ldmatrix (and the 8 chunks of a cp.async phase) hit 8 distinct bank groups.
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks of one row
  static constexpr int kSmemStride = kHeadDim + 8;    // elements
  static constexpr int kSmemQElems = kBlockM * kSmemStride;
  static constexpr int kSmemKVElems = kBlockN * kSmemStride;
  static constexpr int kStages = kPolicy.stages;      // K/V double buffering
  static constexpr int kSmemBytes = (kSmemQElems + 2 * kStages * kSmemKVElems) * 2;

  static_assert(kSmemBytes == kPolicy.smem_bytes, "FlexForwardTraits: the policy's shared memory must match the layout");
  static_assert(sizeof(Element) == 2, "FlexForwardTraits: Element must be __nv_bfloat16 or __half");
  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 16 && kHeadDim <= 256,
                "FlexForwardTraits: kHeadDim must be a multiple of 16 in [16, 256] (mma k-steps of 16)");
  static_assert(kBlockM % (16 * kNWarps) == 0,
                "FlexForwardTraits: kBlockM must be a multiple of 16 * kNWarps (each warp owns whole 16-row mma tiles)");
  static_assert(kMTiles >= 1 && kMTiles <= 2,
                "FlexForwardTraits: each warp may own 16 or 32 query rows (kBlockM / kNWarps); more does not fit in registers");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 128,
                "FlexForwardTraits: kBlockN must be a multiple of 16 in [16, 128] (P is the A operand of P@V in k-steps of 16)");
  static_assert((kBlockM * kChunksPerRow) % kNThreads == 0,
                "FlexForwardTraits: the O tile's 16-byte chunks must split evenly over the threads (epilogue stores)");
  static_assert(kNThreads >= kChunksPerRow, "FlexForwardTraits: need at least one thread per 16-byte chunk of a row");
  static_assert(kSmemBytes <= 232448,
                "FlexForwardTraits: shared memory exceeds the 227 KB an sm_90 block may opt into; use a smaller tile");
};
