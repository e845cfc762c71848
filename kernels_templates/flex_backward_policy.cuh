// Every tuning choice of the backward kernels in one place, as flex_tile_policy.cuh is for the forward: a constexpr
// function of (main kernel kind, head dim, module features). The kernels' traits, the generated module and the host's
// launch geometry all read it.
#pragma once

// Plain data and constexpr code only: this header is also compiled as host C++20 (compiler/codegen/backward_source.cpp).

// Which KV-major main kernel a module runs.
enum FlexBackwardKind {
  kFlexBackwardMmaSync = 0,  // flex_backward.cuh: mma.sync, padded tiles (sm_80 and later, every head dim)
  kFlexBackwardWgmma = 1     // flex_backward_sm90.cuh: wgmma on swizzled tiles, two warpgroups (sm_90a)
};

// What the policy needs to know of the module: its dQ strategy and the generated gradient variant's staged terms
// and scatters (compiler/codegen/backward_source.cpp fills it).
struct FlexBackwardFeatures {
  bool query_major;       // dQ by the query-major pass (flex_backward_qmajor.cuh) instead of the main kernel
  bool deterministic;     // fixed-point accumulation, no float atomics
  bool bf16;              // the element type is bf16 (else fp16)
  bool d_score_is_one;    // score_mod's derivative in score is 1 (dS^T then holds the staged terms' gradient)
  bool diagonal_scatter;  // a buffer gradient indexed by q - kv (the learnable bias[h, q - kv + S - 1])
  bool staged_col;        // staged terms (flex_backward_staged.cuh): a kv % 64 term,
  bool staged_tile;       //   a kv // 64 term,
  bool staged_grad;       //   a gradient of either,
  bool tile_term_grad;    //   a gradient of the kv // 64 term,
  bool spread_rows;       //   and CTAs that own 16 kv % 64 columns of eight kv // 64 blocks
  bool staged_diag;       // a staged diagonal band (a term buf[..., f(q - kv)], flex_backward_staged.cuh)
  bool tma_operands;      // the launch's q, k, v and d_o can be described by TMA tensor maps (runtime/tensor_maps.h)
  bool split_scatter;     // one q-only or diagonal buffer gradient, reduced in the tile around the GEMMs (flex_backward_sm90.cuh)
};

struct FlexBackwardPolicy {
  int kind;        // FlexBackwardKind
  int head_dim;
  // The KV-major main kernel (both kinds): query rows per tile, KV rows per CTA, warps, Q / dO stages.
  int block_m, block_n, warps, stages;
  int swizzle_bytes;  // wgmma kind: the swizzle of K, V, Q and dO (at least two regions per row, for the dQ split)
  // The launch order (flex_backward_main_sm90): groups of head_group (KV head, batch) pairs, every pair's KV block n
  // before block n + 1, so the heavy low blocks of causal masks start first while the Q / dO tiles streamed at once
  // stay within L2.
  int head_group;
  bool dq_bulk;    // wgmma kind: dQ partials by bulk reductions from shared memory instead of float4 atomics
  bool grad_gemm;  // wgmma kind, spread rows: the staged gradients by selector GEMMs on the dS^T tile
  bool producer;   // wgmma kind: warp-specialised (a producer warpgroup loads by TMA, flex_backward_sm90.cuh kProducer)
  bool two_ds;     // warp-specialised, head dim <= 128: two dS^T tiles, one per query tile in turn
  int smem_bytes;  // the main kernel's dynamic shared memory
  // The query-major pass (dQ and row-owned scatters): query rows per CTA, KV rows per tile, warps, K / V stages.
  int qmajor_block_m, qmajor_block_n, qmajor_warps, qmajor_stages;
};

// The main kernel: wgmma on sm_90a, mma.sync otherwise. Head dims 192 and 256 take wgmma in the head-dim split form
// (flex_backward_sm90.cuh, kSplitD: the two warpgroups share 64 KV rows and each keeps half of dK / dV), which is
// warp-specialised only and has no staged terms (none are found above head dim 128); `split_ok` says the module's
// operands have TMA tensor maps, else those head dims keep mma.sync.
constexpr int flex_backward_kind(bool hopper_arch, int head_dim, bool split_ok = true) {
  if (!hopper_arch || head_dim % 16 != 0) return kFlexBackwardMmaSync;
  if (head_dim <= 128) return kFlexBackwardWgmma;
  return split_ok && (head_dim == 192 || head_dim == 256) ? kFlexBackwardWgmma : kFlexBackwardMmaSync;
}

// Shared memory of the main kernel. wgmma kind (flex_bwd_sm90::Smem): dense swizzled K, V [block_n][D] and Q, dO
// [block_m][D] per stage, dS^T [block_n][block_m] (two with two_ds; above head dim 128 two P^T tiles too), lse2 / delta, the
// reduction slots, the diagonal scatter's planes [warps][4][block_m + 16] floats (none above 128), the cached tile
// classes, 1 KB to align the base; then the staged terms' tiles, their gradients' planes, slabs or selectors, the
// dQ rows and the staged gradients' blocks. mma.sync kind (FlexBackwardTraits): the same tiles padded
// by 8 columns, without the planes and the alignment.
constexpr int kSm90MaxDynamicShared = 227 * 1024;  // the opt-in limit per block

// Two stages of the staged gradients' blocks (flex_backward_staged.cuh kBlockedStageBytes).
constexpr int kFlexBackwardStagedBlockBytes = 2 * 64 * (16 + 8) * 8;

// Everything but the staged gradients' blocks.
constexpr int flex_backward_smem_bytes_without_blocks(const FlexBackwardPolicy& p, const FlexBackwardFeatures& f, bool dq_bulk, bool grad_gemm) {
  const int d = p.head_dim, m = p.block_m, n = p.block_n;
  if (p.kind == kFlexBackwardMmaSync) {
    const int stride = d + 8;
    return 2 * n * stride * 2 + 2 * p.stages * m * stride * 2 + n * (m + 8) * 2 + 2 * p.stages * m * 4 + p.warps * m * 8 + 2048;
  }
  int bytes = 2 * n * d * 2 + 2 * p.stages * m * d * 2 + n * m * 2;
  if (p.two_ds) bytes += n * m * 2;
  if (d > 128) bytes += 2 * n * m * 2;  // the split form's two P^T tiles; no planes (its diagonal scatters use the slots)
  bytes += 2 * p.stages * m * 4 + p.warps * m * 8 + (d > 128 ? 0 : p.warps * 4 * (m + 16) * 4) + 2048;
  if (f.staged_col) bytes += p.stages * m * 64 * 2;
  if (f.staged_tile) bytes += p.stages * m * (f.spread_rows ? 8 : 2) * 2;
  if (f.staged_diag) bytes += p.stages * (m + n) * 4;  // a band of m + n - 1 floats per stage, padded to 16 bytes
  // Selectors: two spare swizzle regions of K ([block_n][swizzle bytes]) where both warpgroups take as many dQ
  // columns (half of D rounded up to whole regions: head dims 32, 64, 128), else two [128][16] tiles and 1 KB to
  // align them.
  const int region_cols = p.swizzle_bytes / 2;
  const bool selectors_in_k = 2 * ((d / 2 + region_cols - 1) / region_cols * region_cols) == d;
  if (f.staged_grad && grad_gemm) bytes += selectors_in_k ? 2 * n * p.swizzle_bytes : 2 * n * 16 * 2 + 1024;
  else if (f.staged_grad) bytes += f.spread_rows ? 8 * m * 20 * 4 + 8 * (m + 4) * 4 : 2 * m * 68 * 4;
  if (dq_bulk) bytes += m * d * (f.deterministic ? 8 : 4);  // fixed point, or fp32
  return bytes + 1024;
}

// Whether a module sends its staged gradients as blocks (flex_backward_staged.cuh, "Blocked accumulators"): a
// deterministic warp-specialised module with selector GEMMs and fixed-point dQ rows, where the blocks' two stages
// fit beside the rest (at head dim 96 they do not, and the dQ rows matter more). Its CTA sums of a query tile
// ([64 q][16] of the Col term, [64 q][8] of the Tile term) then leave by one 64-bit bulk reduction each instead of a
// 64-bit atomic per element.
constexpr bool flex_backward_staged_blocks(const FlexBackwardPolicy& p, const FlexBackwardFeatures& f, bool dq_bulk, bool grad_gemm) {
  return p.kind == kFlexBackwardWgmma && f.deterministic && p.producer && dq_bulk && grad_gemm &&
         flex_backward_smem_bytes_without_blocks(p, f, dq_bulk, grad_gemm) + kFlexBackwardStagedBlockBytes <= kSm90MaxDynamicShared;
}

constexpr int flex_backward_smem_bytes(const FlexBackwardPolicy& p, const FlexBackwardFeatures& f, bool dq_bulk, bool grad_gemm) {
  return flex_backward_smem_bytes_without_blocks(p, f, dq_bulk, grad_gemm) +
         (flex_backward_staged_blocks(p, f, dq_bulk, grad_gemm) ? kFlexBackwardStagedBlockBytes : 0);
}

// Q / dO stages of the main kernel with the tiles of `p` (its kind, head dim and tile sizes): two, but one for the
// mma.sync kernel's padded tiles above head dim 128, and for the wgmma kind's split form (head dims 192, 256; nothing
// staged) where its bulk dQ rows do not fit beside two (224 KB of tiles at D256; D192's fp32 rows fit, its
// fixed-point rows do not).
constexpr int flex_backward_stages(FlexBackwardPolicy p, bool dq_bulk, bool deterministic) {
  if (p.head_dim <= 128) return 2;
  if (p.kind != kFlexBackwardWgmma) return 1;
  if (!dq_bulk) return 2;
  p.stages = 2;
  FlexBackwardFeatures f{};
  f.deterministic = deterministic;
  return flex_backward_smem_bytes(p, f, true, false) <= kSm90MaxDynamicShared ? 2 : 1;
}

// The policy (the measurements behind each choice: docs/notes/BACKWARD_SM90.md, "The backward policy's choices"):
//   - 64 query rows x 128 KV rows per CTA with 8 warps and two Q / dO stages; at head dims above 128 64 KV rows (the
//     registers of dK and dV) and one stage where two do not fit (flex_backward_stages). The query-major pass: the
//     forward's 128 x 64 tiles, one K / V stage above 128;
//   - the wgmma kind's swizzle: 128 bytes at D128 and D256, 64 at 64, 96 and 192, 32 at 32 and 80, so a row has at
//     least two regions and the dQ column split (and at 192 / 256 the dK / dV split) lands on a region boundary;
//   - launch groups of 8 (KV head, batch) pairs: heavy low KV blocks of causal masks start first, while the Q / dO
//     tiles streamed at once stay within L2 (all heads at once overflow it);
//   - bulk dQ reductions (with dQ in this kernel, when the rows fit the 227 KB of shared memory): in fp32 from head
//     dim 96, where one bulk operation per query row of D * 4 bytes outweighs its issue cost, and with a diagonal
//     scatter only in the warp-specialised kernel (its writer warp sends the rows; in the 256-thread kernel the split
//     reduction's cross-warp sums run while dQ runs and hide the float4 atomics' latency); deterministic, in 64-bit
//     fixed point at every head dim, where they replace one 64-bit atomic per element; above head dim 128 (the split
//     form) with one Q / dO stage where two leave them no room;
//   - warp specialisation (a producer warpgroup with 24 registers streams Q, dO by TMA and lse2, delta by its lanes; a
//     writer warp sends the bulk dQ rows; the two consumer warpgroups get 240 registers and meet only at named
//     barriers, the scatters' reductions included) wherever the operands have tensor maps and no staged gradient
//     needs the 256-thread form's CTA-wide barriers (its planes and slabs; selector GEMMs need none), deterministic
//     launches included;
//   - selector GEMMs for spread rows' staged gradients when dS^T is their gradient (bf16, d_score = 1; fp16 would lose
//     small dS bits the fp32 slabs keep) and the kv // 64 term has one, so each warpgroup runs one selector GEMM
//     (with rel_w's gradient alone warpgroup 0 would do all of it while the slabs use all eight warps);
//   - two dS^T tiles in the warp-specialised kernel up to head dim 128 where they fit beside the rest (the staged
//     gradients' blocks and the bulk dQ rows keep their place): a warpgroup then stores a tile's dS^T while the other
//     may still run the previous tile's dQ GEMM, where one tile made both meet at a barrier first. Not with a split
//     scatter, whose cross-warp sums of one tile read the reduction slots the next tile's warp sums write, ordered by
//     that barrier alone.
constexpr FlexBackwardPolicy flex_backward_policy(int kind, int head_dim, FlexBackwardFeatures f) {
  FlexBackwardPolicy p{};
  p.kind = kind;
  p.head_dim = head_dim;
  const bool big = head_dim > 128;
  p.block_m = 64;
  p.block_n = big ? 64 : 128;
  p.warps = 8;
  p.swizzle_bytes = (head_dim == 128 || head_dim == 256) ? 128 : (head_dim == 64 || head_dim == 96 || head_dim == 192) ? 64 : 32;
  p.stages = flex_backward_stages(p, false, false);
  p.head_group = 8;
  p.qmajor_block_m = 128;
  p.qmajor_block_n = 64;
  p.qmajor_warps = 8;
  p.qmajor_stages = big ? 1 : 2;
  const bool wgmma = kind == kFlexBackwardWgmma;
  p.grad_gemm = wgmma && f.spread_rows && f.tile_term_grad && f.bf16 && f.d_score_is_one;
  const bool staged_ok = !(f.staged_col || f.staged_tile) || !f.staged_grad || p.grad_gemm;
  // The split form has no other form: warp-specialised with the query-major pass too (its KV-major kernel then skips dQ).
  p.producer = wgmma && (!f.query_major || big) && f.tma_operands && staged_ok;
  constexpr int kDqBulkMinHeadDim = 96;
  const bool bulk_pays = f.deterministic || (head_dim >= kDqBulkMinHeadDim && (!f.diagonal_scatter || p.producer));
  // Bulk rows never take a Q / dO stage away, except fixed-point ones, which replace a 64-bit atomic per element.
  if (wgmma && !f.query_major && bulk_pays) {
    FlexBackwardPolicy bulk = p;
    bulk.stages = flex_backward_stages(p, true, f.deterministic);
    if (flex_backward_smem_bytes(bulk, f, true, p.grad_gemm) <= kSm90MaxDynamicShared && (bulk.stages == p.stages || f.deterministic)) {
      p.dq_bulk = true;
      p.stages = bulk.stages;
    }
  }
  if (wgmma && p.producer && !big && !f.split_scatter) {
    FlexBackwardPolicy two = p;
    two.two_ds = true;
    if (flex_backward_smem_bytes(two, f, p.dq_bulk, p.grad_gemm) <= kSm90MaxDynamicShared &&
        flex_backward_staged_blocks(two, f, p.dq_bulk, p.grad_gemm) == flex_backward_staged_blocks(p, f, p.dq_bulk, p.grad_gemm))
      p.two_ds = true;
  }
  p.smem_bytes = flex_backward_smem_bytes(p, f, p.dq_bulk, p.grad_gemm);
  return p;
}

// Whether a module with a diagonal term stages its band: only the warp-specialised kernel's producer loads it, and only
// where its (block_m + block_n) * 4 bytes per stage leave the bulk dQ rows their place (deterministic rows at D128
// fill the 227 KB: there the per-element loads cost less than fixed-point atomics per element).
constexpr bool flex_backward_stages_diag(int kind, int head_dim, FlexBackwardFeatures f) {
  f.staged_diag = false;
  const FlexBackwardPolicy without = flex_backward_policy(kind, head_dim, f);
  f.staged_diag = true;
  const FlexBackwardPolicy with = flex_backward_policy(kind, head_dim, f);
  return with.producer && with.dq_bulk == without.dq_bulk;
}

// The tiles alone, which depend on the head dim only: what the kernels' traits read.
constexpr FlexBackwardPolicy flex_backward_tiles(int head_dim) { return flex_backward_policy(kFlexBackwardMmaSync, head_dim, FlexBackwardFeatures{}); }

// The automatic dQ strategy's tuning half (compiler/codegen/backward_source.cpp adds the correctness half: scatters
// only the query-major pass reduces). Deterministic launches whose Hopper module takes bulk dQ rows (64-bit fixed
// point, order-independent) stay KV-major up to head dim 128: they beat the query-major pass on causal, the learnable
// bias and SAM (docs/BACKWARD.md, dQ strategy). The split form's fixed-point rows (D192) cost it a Q / dO stage and
// lose to the pass. Where the rows do not fit, the query-major pass computes dQ without atomics, which beats staged
// gradients as 64-bit fixed-point atomics per element of each [64 q][64] block and, with nothing staged, the wgmma
// kernel's fixed-point dQ atomics per element (the split form at head dim 256 included).
constexpr bool flex_backward_prefers_query_major(int kind, int head_dim, const FlexBackwardFeatures& f, bool any_staged) {
  if (!f.deterministic) return false;
  if (kind == kFlexBackwardWgmma && head_dim <= 128 && flex_backward_policy(kind, head_dim, f).dq_bulk) return false;
  if (f.staged_grad) return true;
  return !any_staged && kind == kFlexBackwardWgmma;
}
