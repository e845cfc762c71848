// CodeGenCUDA for the backward pass: the variant (score_mod, mask_mod) plus d_score and the scatter functions
// of each GradScatter of docs/AUTODIFF.md, with each scatter's reduction class for the kernel that computes it.
// Every backward kernel calls these hooks through flex_bwd::BackwardMods (kernels_templates/flex_backward_mods.cuh).
#pragma once
#include <string>
#include <vector>

#include "compiler/codegen/codegen_cuda.h"
#include "compiler/codegen/staged_terms.h"
#include "compiler/passes/autodiff.h"

namespace flexjit {

// The KV tile of the query-major pass (FlexBackwardQTraits::kBlockN, the forward's kBlockN): the row-owned
// classes below are decided for tiles of this width.
inline constexpr int kQueryMajorTile = 64;

// How a scatter's target index varies over the score elements; the kernels reduce over the elements that share
// a target before their atomics. The first five are the KV-major kernel's (flex_backward_scatter.cuh's kScatter* values);
// RowCol and RowTile are row-owned targets that only a query-major CTA can keep in registers (the KV-major kernel
// treats them as General).
enum class ScatterClass {
  Uniform = 0,   // neither q nor kv (ALiBi slope[h])
  QOnly = 1,     // q, not kv (bias[offset[q]]): row-owned as well
  KvOnly = 2,    // kv, not q
  Diagonal = 3,  // q and kv only through `q - kv` (relative bias)
  General = 4,   // anything else
  RowCol = 5,    // q, and kv only through kv % c with c dividing kQueryMajorTile (SAM rel_w[b, h, q, kv % 64])
  RowTile = 6,   // q, and kv only through kv // c with c a multiple of kQueryMajorTile (SAM rel_h[b, h, q, kv // 64])
};
const char* scatter_class_name(ScatterClass c);

// Classifies one scatter from the variables its indices use (DependenceInfo) and, for targets that depend on both
// q and kv, from the stage the tile rewrite of compiler/passes/staging.h gives each index with kQueryMajorTile-wide
// tiles (Col: kv only through the column j; Tile: only through the tile start k0). Anything not provably one of
// the reduced classes is General.
ScatterClass classify_scatter(const GradScatter& s);

// Whether a query-major CTA owns the scatter's targets per row: QOnly, RowCol, RowTile.
bool row_owned(ScatterClass c);

// Whether some scatter of `grad` is one only the query-major pass reduces (RowCol / RowTile, SAM's rel_h and
// rel_w) and `staged` does not cover (the Hopper KV-major kernel reduces the staged terms' gradients itself):
// the automatic dQ strategy then picks that pass.
bool needs_query_major_pass(const ScoreModGradient& grad, const StagedTerms& staged = {});

// The class value the KV-major kernel is given (kScatterClass): RowCol / RowTile are General there, and with a
// query-major pass every row-owned class is kScatterQMajor (5, skipped).
int kv_major_scatter_class(ScatterClass c, bool query_major_pass);
// The query-major kernel's class (kScatterRowClass: 0 none, 1 row sum, 2 row-col, 3 row-tile).
int query_major_scatter_class(ScatterClass c);

// Which backward kernel a generated struct serves.
struct GradVariantOptions {
  bool query_major_pass = false;  // the launch runs the query-major pass: row-owned scatters are routed to it
  bool hoisted = false;           // for the query-major kernel: Row / Col / Tile hoisting with kQueryMajorTile-wide
                                  // tiles, as the forward; else unhoisted (the KV-major loop has no fixed row)
  // For the Hopper KV-major kernel of an atomic module: the terms it stages (left out of score_mod, their
  // scatters given class kScatterStaged). Null or empty: none.
  const StagedTerms* staged = nullptr;
};

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
                                                const VariantOptions& options, const std::string& struct_name = "FlexGradVariant",
                                                const GradVariantOptions& grad_options = {});

}  // namespace flexjit
