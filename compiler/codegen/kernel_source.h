// Assembles complete kernel sources: a generated variant spliced into a kernel template
// from kernels_templates/, plus the extern "C" entry points the runtime launches.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "compiler/codegen/codegen_cuda.h"
#include "compiler/codegen/kernel_config.h"

namespace flexjit {

// Entry point names of a forward module. A spec with a mask_mod also gets the block-mask
// builder in the same module (one compile, one cache entry).
inline constexpr const char* kForwardEntry = "flexjit_forward";
inline constexpr const char* kBlockMaskEntry = "flexjit_block_mask";
// Data-dependent masks: ranks each mask row's query tiles by work after the build (flex_rank_q_tiles).
inline constexpr const char* kRankEntry = "flexjit_rank_q_tiles";
// Entry point of a ragged-prefill module (flex_forward<..., kVarlen = true>).
inline constexpr const char* kForwardVarlenEntry = "flexjit_forward_varlen";
// A ragged-prefill module over an FP8 K / V also widens them into the element type first (flex_fp8_widen.cuh).
inline constexpr const char* kWidenFp8Entry = "flexjit_widen_fp8";

struct KernelSource {
  std::string source;               // complete CUDA source for NVRTC (includes embedded templates by name)
  std::string name;                 // program name for logs and dumped sources
  std::vector<std::string> entries; // extern "C" kernels defined in it
  ForwardConfig config;
  GeneratedVariant variant;
  std::string key_text;             // every specialisation that reached the source (for the cache key)
};

struct ForwardKernelOptions {
  dsl::DType dtype = dsl::DType::BF16;
  int head_dim = 128;
  // The NVRTC target the source is for: "sm_90a" selects the warp-specialised kernel (flex_tile_policy.cuh says for
  // which head dims); anything else, or empty, the portable mma.sync one.
  std::string arch;
  VariantOptions variant;
  // Whether tensor maps can describe the launch's q, k and v (runtime/tensor_maps.h); false keeps the mma.sync kernel.
  bool tma_describable = true;
  // A launch that is a shard of a longer sequence (AttentionArgs::q_offset, kv_offset): the mods see the launch's
  // rows plus the offsets (FLEX_SHARD_POSITIONS in flex_mods.cuh). Off, the kernel carries no offsets at all, so
  // whole-sequence launches keep their registers (the offsets cost some variants spills).
  bool shard_positions = false;
  // Ragged prefill only: K and V stored in this FP8 format (dsl::DType::F8E4M3 or F8E5M2), widened by the module's
  // kWidenFp8Entry before the forward kernel runs. Absent: K and V have the element type.
  std::optional<dsl::DType> fp8_kv;
};

// The forward kernel for a spec: the policy's kernel (flex_forward_policy) with the spec's variant.
KernelSource forward_kernel_source(const SpecIR& ir, const RangeInfo& ranges, const ForwardKernelOptions& options);

// The ragged-prefill forward kernel for a spec: the same variant and tiles as forward_kernel_source, the
// kVarlen instantiation (cu_seqlens), no block-mask builder. Its own module, compiled on first use.
KernelSource forward_varlen_kernel_source(const SpecIR& ir, const RangeInfo& ranges, const ForwardKernelOptions& options);

// Every kernel module a launch of the spec needs on `arch` (what `flexjit compile --arch` warms).
std::vector<KernelSource> kernels_for_launch(const SpecIR& ir, dsl::DType dtype, int head_dim, const std::string& arch);

// The canonical text of a spec's optimized IR (part of every cache key).
std::string canonical_ir_text(const SpecIR& ir);

}  // namespace flexjit
