// Assembles the backward kernel module of a spec: the gradient variant spliced into
// kernels_templates/flex_backward.cuh with the extern "C" entry points the runtime launches.
#pragma once
#include <string>
#include <vector>

#include "compiler/codegen/codegen_cuda_grad.h"
#include "compiler/codegen/kernel_source.h"

namespace flexjit {

inline constexpr const char* kBwdPreprocessEntry = "flexjit_bwd_preprocess";
inline constexpr const char* kBwdMainEntry = "flexjit_bwd_main";
inline constexpr const char* kBwdDqEntry = "flexjit_bwd_dq";
inline constexpr const char* kBwdConvertEntry = "flexjit_bwd_convert";
inline constexpr const char* kBwdTileStateEntry = "flexjit_bwd_tile_state";

// Host mirror of FlexBackwardTraits (flex_backward.cuh).
struct BackwardConfig {
  int head_dim;
  int block_m;  // query rows per tile
  int block_n;  // KV rows per CTA
  int warps;
  int stages;   // Q / dO buffers
  std::string str() const;
  int threads() const { return warps * 32; }
  int shared_bytes() const;
};

// Throws flexjit::Error for an unsupported head dim.
BackwardConfig backward_config(int head_dim);

struct BackwardKernelOptions {
  dsl::DType dtype = dsl::DType::BF16;
  int head_dim = 128;
  bool deterministic = false;  // 64-bit fixed-point accumulation of dQ and buffer gradients
  VariantOptions variant;
};

struct BackwardKernelSource {
  KernelSource module;          // source, name, entries, key_text (module.variant holds the layout and loads)
  BackwardConfig config;
  GeneratedGradVariant grad;
};

// `ranges` must come from analyze_ranges(backward_roots(grad), ...) with forward domains.
BackwardKernelSource backward_kernel_source(const SpecIR& ir, const ScoreModGradient& grad, const RangeInfo& ranges,
                                            const BackwardKernelOptions& options);

}  // namespace flexjit
