// Every tuning choice of the forward kernels in one place: a constexpr function of (kernel kind, head dim, variant
// features). The generated kernel, its template and the host's launch geometry all read it; nothing else decides.
#pragma once

// Plain data and constexpr code only: this header is also compiled as host C++20 (compiler/codegen/kernel_config.cpp).

// Which forward main loop a launch runs.
enum FlexForwardKind {
  kFlexForwardMmaSync = 0,       // flex_forward.cuh: mma.sync, cp.async, one CTA per query tile (sm_80 and later)
  kFlexForwardWarpSpecialized = 1  // flex_forward_kernel_sm90.cuh: TMA producer warp, wgmma consumer warpgroups (sm_90a)
};

// What the policy needs to know of the generated variant (FlexVariant's constants, flex_variant_base.cuh).
struct FlexVariantFeatures {
  bool has_score_mod;  // kHasScoreMod: the mods' registers (hoisted state, temporaries) leave no room for wide tiles
  bool has_mask_mod;   // kHasMaskMod: masked launches get KV tiles of 128 columns (more of them skipped or full)
  bool tile_aligned;   // kTileAligned: the variant's per-tile / per-column state needs KV tiles at multiples of 64
  bool data_dependent_mask;  // kDataDependentMask: the mask reads buffers (documents): its kept area is irregular
  bool column_state;   // kColumnState: the mods hoist values per column of a 64-column part (SAM's rel_w[q, kv % 64]),
                       // which stay in registers across the work tile: 32 per thread at head dim 64
  bool fixed_max;      // kFixedMax: a bounded score_mod (softcap, whose tanh temporaries take registers)
  bool element_loads;  // kElementLoads: the mods load buffers per element (bias[h, q - kv + Skv - 1]): addresses and
                       // load latencies in registers
};

struct FlexForwardPolicy {
  int kind;                 // FlexForwardKind
  int head_dim;             // D of q and k (and v)
  int tile_head_dim;        // D the shared-memory tiles hold: D rounded up to a swizzle-friendly width (80 -> 96); the
                            // TMA unit fills the extra columns with zeros, which change neither Q K^T nor the stored O
  int block_m;              // query rows of a work tile (the block mask's q_tile)
  int block_n;              // KV rows of a KV tile (the block mask's kv_tile)
  int threads;              // threads per CTA
  int stages;               // K/V buffers in flight (warp-specialised: per K and per V ring)
  int consumer_warpgroups;  // warp-specialised: warpgroups doing the GEMMs and the softmax, 64 query rows each
  int producer_regs;        // warp-specialised: registers per thread after setmaxnreg, producer warpgroup
  int consumer_regs;        //   ... and consumer warpgroups. setmaxnreg moves registers within the CTA's launch
                            //   allocation only (threads x the launch bound's cap): a split beyond it never finishes
  bool pingpong;            // warp-specialised: the consumer warpgroups take turns issuing GEMMs (named barriers),
                            // so one's softmax runs under the other's GEMMs
  bool exp_on_fma;          // warp-specialised: some of the softmax's exponentials on the FMA pipe instead of MUFU
                            // (flex::Softmax::exp_kstep)
  int swizzle_bytes;        // warp-specialised: the tiles' swizzle (128 when the tile head dim is a multiple of 64)
  int smem_bytes;           // dynamic shared memory per CTA
  int min_blocks_per_sm;    // __launch_bounds__'s second argument
};

// Bytes of the warp-specialised kernel's shared memory (FlexSm90SharedLayout): Q, the K and V rings, the mbarriers,
// and 1 KB to align the base for the swizzle.
constexpr int flex_sm90_smem_bytes(int block_m, int block_n, int tile_head_dim, int stages) {
  return block_m * tile_head_dim * 2 + 2 * stages * block_n * tile_head_dim * 2 + 256 + 1024;
}

// The mma.sync kernel's table (flex_forward.cuh, FlexForwardTraits): 128 x 64 tiles, 4 warps (8 at head dims
// above 128, where a warp's 32 rows of O would not fit its registers), a padded Q tile and two K/V stages.
constexpr FlexForwardPolicy flex_forward_policy_mma_sync(int head_dim) {
  FlexForwardPolicy p{};
  p.kind = kFlexForwardMmaSync;
  p.head_dim = head_dim;
  p.tile_head_dim = head_dim;
  p.block_m = 128;
  p.block_n = 64;
  p.threads = head_dim > 128 ? 256 : 128;
  p.stages = 2;
  p.smem_bytes = (p.block_m + 2 * p.stages * p.block_n) * (head_dim + 8) * 2;
  p.min_blocks_per_sm = 1;
  return p;
}

// The warp-specialised kernel (FlashAttention-3's hopper/tile_size.h plays the same role there):
//   - two consumer warpgroups of 64 query rows (block_m 128) and one producer warpgroup: 384 threads. At head dims
//     up to 96 a warpgroup's GEMMs are short next to its softmax, so three consumer warpgroups (block_m 192, 512
//     threads, no ping-pong) share every K and V tile and keep the tensor cores fed from three softmaxes; their 160
//     registers hold 128 KV columns at head dim 64 and 96 at 96 (80 included). Narrower where the mods' registers
//     would spill: 64 columns at head dim 64 for per-column state, a bounded score_mod (softcap) or loads per element
//     (a relative bias), at 96 for any score_mod. Three stages fit. Masks that read buffers keep two warpgroups (at
//     128 columns they spill at 160);
//   - KV tiles as wide as registers and shared memory allow: S (block_n / 2 floats per thread), P (block_n / 4) and
//     O (tile_head_dim / 2) live at once while the next S GEMM overlaps the softmax. Plain attention takes 176 columns
//     at head dim 128; a score_mod's registers (softcap's temporaries, SAM's per-column state) spill there, and a
//     masked launch's diagonal costs a partial tile per query tile, so mods get 128. A mask that reads buffers
//     (documents) keeps an irregular area, which 64-column tiles follow closer. At 192 and 256 what the
//     two-stage rings leave room for next to Q, 64 for variants whose state needs 64-aligned tiles;
//   - head dims 80 is laid out as 96 (a 64-byte swizzle instead of 32, whose bank conflicts cost more than the
//     zero columns);
//   - ping-pong scheduling where both GEMMs of a warpgroup are shorter than the other's softmax (head dims up to 128);
//   - a quarter of the exponentials on the FMA pipe only where MUFU bounds the softmax most: head dim 64 with per-column
//     state (SAM), whose 64-column tiles keep the softmax longest next to the GEMMs. Every other variant is faster
//     with all of them on MUFU (softcap and 128-column score_mods at head dim 64 included).
constexpr FlexForwardPolicy flex_forward_policy_sm90(int head_dim, FlexVariantFeatures f) {
  FlexForwardPolicy p{};
  p.kind = kFlexForwardWarpSpecialized;
  p.head_dim = head_dim;
  p.tile_head_dim = head_dim == 80 ? 96 : head_dim;
  const bool plain = !f.has_score_mod && !f.has_mask_mod;
  // A mask alone that needs 64-aligned tiles (kv // 64 hoisted per tile) would not fit 96 columns at head dim 96: it
  // keeps the two warpgroups' 128.
  const bool three_warpgroups = !f.data_dependent_mask && (p.tile_head_dim <= 64 || (p.tile_head_dim == 96 && (f.has_score_mod || !f.tile_aligned)));
  p.consumer_warpgroups = three_warpgroups ? 3 : 2;
  p.block_m = 64 * p.consumer_warpgroups;
  p.threads = 128 * (p.consumer_warpgroups + 1);
  p.stages = 2;
  p.producer_regs = 40;
  p.consumer_regs = 232;
  if (three_warpgroups) {
    p.stages = 3;
    p.producer_regs = 32;  // 32 x 128 + 160 x 384 = the 65536 registers of 512 threads at the launch bound's 128
    p.consumer_regs = 160;
    p.block_n = p.tile_head_dim == 64 ? (f.column_state || f.fixed_max || f.element_loads ? 64 : 128) : f.has_score_mod ? 64 : 96;
  } else if (p.tile_head_dim <= 64) {
    p.block_n = 128;
  } else if (p.tile_head_dim <= 128) {
    p.block_n = plain ? 176 : f.data_dependent_mask ? 64 : 128;
  } else if (p.tile_head_dim <= 192) {
    p.block_n = f.tile_aligned ? 64 : 112;
  } else {
    p.block_n = f.tile_aligned ? 64 : 80;
  }
  p.pingpong = p.consumer_warpgroups == 2 && p.tile_head_dim <= 128;
  p.exp_on_fma = p.tile_head_dim == 64 && f.column_state;
  p.swizzle_bytes = p.tile_head_dim % 64 == 0 ? 128 : p.tile_head_dim % 32 == 0 ? 64 : 32;
  p.smem_bytes = flex_sm90_smem_bytes(p.block_m, p.block_n, p.tile_head_dim, p.stages);
  p.min_blocks_per_sm = 1;
  return p;
}

// Which loop a forward launch runs: the warp-specialised one on sm_90a for head dims 64..256 when the TMA unit can
// describe q, k and v (tensor maps need positive strides below 2^40 bytes); the mma.sync loop otherwise (head dim
// 32, whose tiles are too thin to keep the tensor cores fed from one producer, other GPUs, and odd strides).
constexpr int flex_forward_kind(int sm, int head_dim, bool tma_describable) {
  return sm == 90 && head_dim >= 64 && head_dim <= 256 && head_dim % 16 == 0 && tma_describable ? kFlexForwardWarpSpecialized
                                                                                               : kFlexForwardMmaSync;
}

constexpr FlexForwardPolicy flex_forward_policy(int kind, int head_dim, FlexVariantFeatures f) {
  return kind == kFlexForwardWarpSpecialized ? flex_forward_policy_sm90(head_dim, f) : flex_forward_policy_mma_sync(head_dim);
}
