// The Hopper backward's shared-memory layout (flex_backward_sm90.cuh): the tiles, the pipeline's stages and the
// regions of staged terms, dQ rows and mbarriers, at offsets the host counts the same way (flex_backward_smem_bytes).
#pragma once
#include "flex_backward_policy.cuh"
#include "flex_backward_staged.cuh"
#include "flex_type_traits.cuh"
#include "flex_wgmma.cuh"

namespace flex_bwd_sm90 {

// Shared-memory tiles and their offsets, in the policy's swizzle (flex_backward_policy.cuh: D has at least two swizzle
// regions, so the dQ column split lands on a region boundary). The variant adds the regions of its staged terms
// (flex_backward_staged.cuh) at the end. flex_backward_smem_bytes is the host's count of the same bytes.
// kTwoDs: two dS^T tiles, used by the query tiles in turn (the policy's two_ds).
template <class Traits, class Variant = void, bool kDqBulk = false, bool kGradGemm = false, bool kDqFixed = false, bool kProducer = false,
          bool kTwoDs = false>
struct Smem {
  using Staged = flex_bwd_staged::Flags<Variant>;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kSwizzle = Traits::kPolicy.swizzle_bytes;
  using TileKV = flex::SwizzledTile<kBlockN, kHeadDim, kSwizzle>;  // K, V: [block_n kv][D]
  using TileQ = flex::SwizzledTile<kBlockM, kHeadDim, kSwizzle>;   // Q, dO: [64 q][D] per stage
  using TileDS = flex::SwizzledTile<kBlockN, kBlockM, 128>;        // dS^T: [block_n kv][64 q]
  // The head-dim split form (see the kernel): 64 KV rows shared by both warpgroups, each with half of D.
  static constexpr bool kSplitD = kHeadDim > 128;
  // dQ columns of each warpgroup: the first takes half of D rounded up to whole swizzle regions
  // (D128: 64 + 64, D96: 64 + 32, D80: 48 + 32, D64: 32 + 32, D32: 16 + 16; D256: 128 + 128, D192: 96 + 96).
  static constexpr int kDqN0 = (kHeadDim / 2 + TileKV::kRegionCols - 1) / TileKV::kRegionCols * TileKV::kRegionCols;
  static constexpr int kDqN1 = kHeadDim - kDqN0;
  // K as TileKV, or with a spare region after each warpgroup's dQ columns for the selectors (kGradGemm with equal
  // column counts, see flex_backward_staged.cuh), which the dQ GEMM then reads as 16 more B columns.
  static constexpr bool kSelectorsInK = kGradGemm && kDqN0 == kDqN1;
  using TileK = flex::SwizzledTile<kBlockN, kHeadDim, kSwizzle, kSelectorsInK ? kDqN0 / TileKV::kRegionCols : 0>;
  static constexpr int kSelectorCols = kSelectorsInK ? 16 : 0;
  static constexpr int kStages = flex_backward_stages(flex_backward_policy(kFlexBackwardWgmma, kHeadDim, FlexBackwardFeatures{}), kDqBulk, kDqFixed);
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + TileK::kBytes;
  static constexpr int kOffQ = kOffV + TileKV::kBytes;
  static constexpr int kOffDO = kOffQ + kStages * TileQ::kBytes;
  static constexpr int kOffDS = kOffDO + kStages * TileQ::kBytes;
  static constexpr int kDsTiles = kTwoDs ? 2 : 1;
  static constexpr int kOffPt = kOffDS + kDsTiles * TileDS::kBytes;  // kSplitD: P^T, in dS^T's layout, two tiles (see the kernel)
  static constexpr int kOffLse = kOffPt + (kSplitD ? 2 * TileDS::kBytes : 0);
  static constexpr int kOffDelta = kOffLse + kStages * kBlockM * 4;
  static constexpr int kOffRed = kOffDelta + kStages * kBlockM * 4;     // [kNWarps][kBlockM] 8-byte slots
  // Planes of a diagonal scatter's warp reduction (flex_bwd::TileScatter::warp_sum_planes): [warp][4][kBlockM + 16] floats.
  static constexpr int kOffPlanes = kOffRed + Traits::kNWarps * kBlockM * 8;
  static constexpr int kPlaneBytes = kSplitD ? 0 : Traits::kNWarps * 4 * (kBlockM + 16) * 4;  // kSplitD: the slots only
  static constexpr int kOffSched = kOffPlanes + kPlaneBytes;  // tile classes of the CTA's column
  // kProducer: the mbarriers of the Q / dO / lse2 / delta ring (full, then empty, per stage), of K and V, and the dQ
  // rows' slot (flex_bwd_sm90::DqRowsSlot), in the last kBarBytes of the tile-class cache, which then holds that many
  // fewer positions: the reduction slots stay free for the scatters, and D128's deterministic rows, which leave no
  // byte of the 227 KB free, keep fitting.
  static constexpr int kBarBytes = kProducer ? 128 : 0;
  // kProducer: K and V by TMA, unless staged terms are present (spread rows, or K with the selectors' spare regions:
  // the consumers copy them by cp.async once per CTA).
  static constexpr bool kKvByTma = !Staged::kAny;
  static constexpr int kSchedBytes = Traits::kMaxSched - kBarBytes;
  static constexpr int kOffBars = kOffSched + kSchedBytes;
  static constexpr int kOffStCol = kOffSched + Traits::kMaxSched;                               // [stages] Col tiles
  static constexpr int kOffStGrad = kOffStCol + (Staged::kCol ? kStages * flex_bwd_staged::kColBytes : 0);  // dS^T planes / slabs
  // kGradGemm: no slabs; the selector tiles (1 KB aligned) unless they live in K's spare regions.
  static constexpr int kGradBytes = kGradGemm ? (kSelectorsInK ? 0 : flex_bwd_staged::kSelectorRegionBytes) : Staged::kGradRegionBytes;
  static constexpr int kOffSelectors = (kOffStGrad + 1023) / 1024 * 1024;
  static constexpr int kOffStTile = kOffStGrad + (Staged::kGrad ? kGradBytes : 0);  // [stages] Tile values
  static constexpr int kOffStDiag = kOffStTile + (Staged::kTile ? kStages * Staged::kTileStageBytes : 0);  // [stages] Diag bands
  static constexpr int kOffDqBuf = kOffStDiag + (Staged::kDiag ? kStages * flex_bwd_staged::kDiagBytes : 0);  // dQ partial rows
  // kDqBulk: the CTA's dQ partial of a query tile, sent to dq_accum by one bulk reduction: [64 q][D] fp32, or with
  // kDqFixed (deterministic launches) 64-bit fixed point, whose integer sums do not depend on the order the CTAs'
  // reductions arrive in. Unpadded, so that the tile's rows are as contiguous as dq_accum's; their 8-column groups
  // are permuted instead (flex_bwd::bulk_dq_group_xor), which keeps the stores conflict-free.
  using DqValue = typename flex::Conditional<kDqFixed, unsigned long long, float>::type;
  static constexpr int kDqRowBytes = kHeadDim * (int)sizeof(DqValue);
  // Deterministic selector GEMMs where they fit (flex_backward_policy.cuh flex_backward_staged_blocks, the host's
  // rule): two stages of the query tile's fixed-point sums, [64 q][16] of the Col term then [64 q][8] of the Tile
  // term (flex_backward_staged.cuh).
  static constexpr int kOffStBlocks = kOffDqBuf + (kDqBulk ? kBlockM * kDqRowBytes : 0);
  static constexpr int kStBlocksStageBytes = flex_bwd_staged::kBlockedStageBytes;
  static_assert(2 * kStBlocksStageBytes == kFlexBackwardStagedBlockBytes, "flex_backward_main_sm90: the blocks' bytes");
  static constexpr bool kStagedBlocks =
      kDqFixed && kGradGemm && kProducer && kOffStBlocks + 2 * kStBlocksStageBytes + 1024 <= kSm90MaxDynamicShared;
  static constexpr int kBytes = kOffStBlocks + (kStagedBlocks ? 2 * kStBlocksStageBytes : 0);
  // What the launch must give: 1 KB of slack, so the tiles can start on a 1024-byte boundary (the swizzle
  // XOR acts on absolute address bits) whatever the base of dynamic shared memory.
  static constexpr int kAllocBytes = kBytes + 1024;

  static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 80 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 192 || kHeadDim == 256,
                "flex_backward_main_sm90: head dims 32, 64, 80, 96, 128, 192 and 256 only");
  static_assert(kBlockM == 64 && kBlockN == (kSplitD ? 64 : 128) && Traits::kNWarps == 8,
                "flex_backward_main_sm90: 64 x 128 tiles (64 x 64 split over D above 128), 8 warps");
  static_assert(!kTwoDs || (kProducer && !kSplitD), "flex_backward_main_sm90: two dS^T tiles in the warp-specialised form up to head dim 128");
  static_assert(!kSplitD || (kDqN0 == kHeadDim / 2 && kProducer && !Staged::kAny),
                "flex_backward_main_sm90: the head-dim split form is warp-specialised, with nothing staged");
  static_assert(TileK::kBytes % 1024 == 0 && TileKV::kBytes % 1024 == 0 && TileQ::kBytes % 1024 == 0 && TileDS::kBytes % 1024 == 0,
                "flex_backward_main_sm90: every tile must keep the next one 1024-byte aligned");
  static_assert(kDqN1 > 0 && kDqN0 % TileKV::kRegionCols == 0, "flex_backward_main_sm90: dQ split must land on a region boundary");
  static_assert(kOffStCol % 16 == 0 && kBlockM == flex_bwd_staged::kRows, "flex_backward_main_sm90: staged tiles need 16-byte rows of 64 queries");
  static_assert(!kProducer || (kOffBars % 16 == 0 && 16 * kStages + 48 <= kBarBytes), "flex_backward_main_sm90: the mbarriers' region");
  static_assert(kOffDqBuf % 16 == 0, "flex_backward_main_sm90: the dQ rows must be 16-byte aligned for the bulk reduction");
  static_assert(!kGradGemm || (Staged::kSpread && Staged::kGrad), "flex_backward_main_sm90: selector GEMMs reduce spread rows' staged gradients");
  static_assert(!kGradGemm || kSelectorsInK || kOffSelectors + 2 * flex_bwd_staged::SelectorTile::kBytes <= kOffStTile,
                "flex_backward_main_sm90: selector region");
};

}  // namespace flex_bwd_sm90
