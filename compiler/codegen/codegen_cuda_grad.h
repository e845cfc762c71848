// CodeGenCUDA for the backward pass: the unhoisted variant (score_mod, mask_mod) plus d_score and one
// scatter function per GradScatter of docs/AUTODIFF.md, with each scatter's reduction class.
#pragma once
#include <string>
#include <vector>

#include "compiler/codegen/codegen_cuda.h"
#include "compiler/passes/autodiff.h"

namespace flexjit {

// How a scatter's target index varies inside a backward tile (flex_backward.cuh's kScatter* values):
// the kernel reduces over the elements that share a target before its atomics.
enum class ScatterClass { Uniform = 0, QOnly = 1, KvOnly = 2, Diagonal = 3, General = 4 };
const char* scatter_class_name(ScatterClass c);

// Classifies one scatter from the variables its indices use: neither q nor kv (ALiBi slope[h]), q only
// (bias[offset[q]]), kv only, q and kv only through `q - kv` (relative bias), or anything else.
ScatterClass classify_scatter(const GradScatter& s);

struct GeneratedGradVariant {
  std::string code;                   // `struct <name> { ... };`
  ParamsLayout layout;                // the forward's layout (same buffers, symbols, parameters)
  std::vector<LoadSite> loads;
  std::vector<int> scatter_buffers;   // spec buffer index per scatter
  std::vector<ScatterClass> scatter_classes;
  bool d_score_is_one = true;
};

// The roots the backward's range analysis must cover (forward programs first, then d_score, every
// scatter index and coefficient): analyze_ranges over them gives the RangeInfo for the function below.
std::vector<ir::Expr> backward_roots(const ScoreModGradient& grad);

// `ranges` must come from analyze_ranges(backward_roots(grad), ...).
GeneratedGradVariant generate_cuda_grad_variant(const SpecIR& ir, const ScoreModGradient& grad, const RangeInfo& ranges,
                                                const VariantOptions& options, const std::string& struct_name = "FlexGradVariant");

}  // namespace flexjit
