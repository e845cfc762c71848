// Assembles the backward kernel module of a spec: the gradient variant spliced into
// kernels_templates/flex_backward.cuh (and flex_backward_qmajor.cuh) with the extern "C" entry points the runtime launches.
// flex_backward.cuh includes flex_backward_mods.cuh, where every backward kernel calls the variant's hooks; NVRTC
// gets every embedded template, so the module source names only the kernels' headers.
#pragma once
#include <string>
#include <vector>

#include "compiler/codegen/codegen_cuda_grad.h"
#include "compiler/codegen/kernel_source.h"
#include "kernels_templates/flex_backward_policy.cuh"

namespace flexjit {

inline constexpr const char* kBwdPreprocessEntry = "flexjit_bwd_preprocess";
inline constexpr const char* kBwdMainEntry = "flexjit_bwd_main";
inline constexpr const char* kBwdDqEntry = "flexjit_bwd_dq";
inline constexpr const char* kBwdConvertEntry = "flexjit_bwd_convert";
inline constexpr const char* kBwdTileStateEntry = "flexjit_bwd_tile_state";
inline constexpr const char* kBwdQMajorEntry = "flexjit_bwd_qmajor";

// The main kernel's launch geometry and module flags, read off the backward policy
// (kernels_templates/flex_backward_policy.cuh, which FlexBackwardTraits reads too).
struct BackwardConfig {
  int head_dim;
  int block_m;  // query rows per tile
  int block_n;  // KV rows per CTA
  int warps;
  int stages;   // Q / dO buffers
  // The Hopper main kernel (flex_backward_sm90.cuh: wgmma, two warpgroups) instead of the mma.sync one; same
  // tiles, grid and schedule.
  bool hopper = false;
  // Staged terms of the Hopper kernel (compiler/codegen/staged_terms.h): a kv % 64 term ([stages][64][64]
  // 2-byte tiles), a kv // 64 term ([stages][64][2]), and the fp32 dS^T planes their gradients are reduced
  // through ([2][64][68]).
  bool staged_col = false;
  bool staged_tile = false;
  bool staged_grad = false;
  // A Diag term (buf[..., f(q - kv)]): its band of 191 floats per (query tile, KV block) in each ring slot, loaded by
  // the warp-specialised kernel's producer warp.
  bool staged_diag = false;
  // Spread rows (flex_backward_staged.cuh): each CTA owns 16 kv % 64 columns of eight kv // 64 blocks instead of
  // 128 contiguous KV rows; the Tile values are [stages][64][8] and the gradients go through [8][64][20] slabs.
  bool spread_rows = false;
  // Spread rows' staged gradients as products of the dS^T tile with 0/1 selectors instead of the slabs
  // (flex_backward_staged.cuh): bf16 modules whose d_score is 1 (the tile then holds the terms' gradient) and
  // whose Col and Tile terms both have a gradient; no slabs. The selectors take two spare swizzle regions of the K
  // tile, where each warpgroup's dQ GEMM reads them as 16 more columns (head dims 32, 64, 128), or two [128][16]
  // tiles of their own with a GEMM each (80, 96).
  bool grad_gemm = false;
  // dQ partials by bulk reductions from shared memory ([64][D + 8] fp32) instead of atomics from the accumulators
  // (flex_backward_sm90.cuh kDqBulk): the Hopper kernel of a KV-major module where the policy picks them and the
  // rows fit in shared memory.
  bool dq_bulk = false;
  // A deterministic module: its bulk dQ rows hold 64-bit fixed point ([64][D + 2]) instead of fp32.
  bool deterministic = false;
  // The warp-specialised Hopper kernel (flex_backward_sm90.cuh kProducer): a third warpgroup loads by TMA, so the
  // launch passes FlexBackwardTmaMaps and 384 threads.
  bool warp_specialized = false;
  // Two dS^T tiles, one per query tile in turn (flex_backward_sm90.cuh kTwoDs; the policy's two_ds).
  bool two_ds = false;
  std::string str() const;
  int threads() const { return warps * 32 + (warp_specialized ? 128 : 0); }
  // CTAs per (KV head, batch) of the main kernel: ceil(Skv / block_n), or 4 per started 512 rows when spread.
  int main_grid_x(int64_t seqlen_kv) const;
  // Dynamic shared memory of the main kernel (the generated source static_asserts it against the template's).
  int shared_bytes() const;
  // Whether the main kernel sends its staged gradients as blocks (flex_backward_staged_blocks): the host then lays
  // the fixed-point accumulators of the Col and Tile terms' buffers out in blocks (FlexBackwardParams::staged_blocks).
  bool staged_blocks() const;
  // The staged-term flags as the policy's features (the rest left false).
  FlexBackwardFeatures features() const;
  // The module's policy as far as the flags above give it (the tiles, stages and the kernel's choices).
  FlexBackwardPolicy policy() const;
};

// Throws flexjit::Error for an unsupported head dim. `arch` "sm_90a" selects the Hopper main kernel for head
// dims up to 128; empty or anything else the portable one.
BackwardConfig backward_config(int head_dim, const std::string& arch = "");

// The query-major pass's tiles (FlexBackwardQTraits, flex_backward_qmajor.cuh), read off the backward policy.
struct QueryMajorConfig {
  int head_dim = 0;
  int block_m = 0;  // query rows per CTA
  int block_n = 0;  // KV rows per tile
  int warps = 0;
  int stages = 0;   // K / V buffers
  int threads() const { return warps * 32; }
  int shared_bytes() const { return (2 * block_m + 2 * stages * block_n) * (head_dim + 8) * 2; }
};

// Throws flexjit::Error for a head dim the query-major pass does not support.
QueryMajorConfig query_major_config(int head_dim);

struct BackwardKernelOptions {
  dsl::DType dtype = dsl::DType::BF16;
  int head_dim = 128;
  bool deterministic = false;  // 64-bit fixed-point accumulation of dQ and buffer gradients
  // dq by the query-major pass (flexjit_bwd_qmajor, no atomics; it also takes the row-owned scatters) instead of
  // the KV-major kernel's atomics and flexjit_bwd_dq.
  bool query_major = false;
  std::string arch;  // the NVRTC target: "sm_90a" selects the Hopper main kernel (see backward_config)
  // The launch's q, k, v and d_o can be described by TMA tensor maps (runtime::tensor_maps_describe): the Hopper
  // kernel may then be the warp-specialised one.
  bool tma_operands = true;
  // A launch that is a shard of a longer sequence (BackwardArgs::q_offset, kv_offset): the hooks see global positions
  // through flex::ShardPositions (kernels_templates/flex_shard_positions.cuh), whose two offset slots the host
  // appends to the variant's ParamsLayout. Such a module stages no terms (their loaders index rows by launch row) and
  // has no query-major pass; whole-sequence modules carry no offsets at all.
  bool shard_positions = false;
  // A ragged batch (Kernel::backward_varlen, kernels_templates/flex_backward_ragged.cuh): every kernel works on its
  // sequence's view of the launch, and the tile classes come from the mask's interval classifier at each sequence's
  // lengths (flexjit_bwd_tile_state takes FlexRaggedTileStateParams). Like a shard's, such a module stages no terms,
  // has no query-major pass.
  bool ragged = false;
  VariantOptions variant;
};

// The terms the module's KV-major kernel stages: the Hopper kernel of an atomic (not query-major) module only.
StagedTerms backward_staged_terms(const ScoreModGradient& grad, const RangeInfo& ranges, const BackwardKernelOptions& options);

// The automatic dQ strategy: the query-major pass when a scatter only that pass reduces (RowCol / RowTile) is
// not staged by the atomic module's kernel, or, deterministic, when a staged term has a gradient
// (`options.query_major` is ignored).
bool auto_picks_query_major(const ScoreModGradient& grad, const RangeInfo& ranges, const BackwardKernelOptions& options);

struct BackwardKernelSource {
  KernelSource module;          // source, name, entries, key_text (module.variant holds the layout and loads)
  BackwardConfig config;
  QueryMajorConfig qconfig;     // meaningful when query_major
  GeneratedGradVariant grad;    // the KV-major kernel's variant (scatter classes for this module)
  // The spec buffers whose gradients the staged Col and Tile terms reduce (-1: none), for the host's layout of their
  // accumulators (BackwardConfig::staged_blocks).
  int staged_col_grad_buffer = -1;
  int staged_tile_grad_buffer = -1;
};

// `ranges` must come from analyze_ranges(backward_roots(grad), ...) with forward domains.
BackwardKernelSource backward_kernel_source(const SpecIR& ir, const ScoreModGradient& grad, const RangeInfo& ranges,
                                            const BackwardKernelOptions& options);

}  // namespace flexjit
