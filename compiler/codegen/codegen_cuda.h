// CodeGenCUDA: prints a spec's score_mod / mask_mod as a CUDA "variant" struct (params
// struct, hoisted Row/Col/Tile state and one device function per mod) that the kernel
// templates call at their fusion points.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/codegen/params_layout.h"
#include "compiler/codegen/score_scales.h"
#include "compiler/passes/range_analysis.h"
#include "compiler/passes/staging.h"
#include "compiler/spec_ir.h"

namespace flexjit {

struct VariantOptions {
  int tile_size = 64;           // the kernel's kBlockN (staging aligns kv // c and kv % c to it)
  bool int32 = true;            // 32-bit ints where ranges are bounded (the launch verified RangeInfo::int32_obligation)
  uint64_t checked_loads = 0;   // bit i set: conditional load i (RangeInfo::loads order) failed its obligation: emit it checked
  // Bit i set: buffer i's last stride is 1 at this launch, so its loads add the last index unscaled. Elementwise buffer
  // reads are the forward's per-element cost: without the 64-bit multiply by a runtime stride, the loads of one row
  // share one address and differ by immediates (docs/notes/KERNEL_NOTES.md, buffer loads without the last stride).
  uint64_t unit_inner_stride = 0;
  bool error_flags = true;      // checked mode: clamped loads and zero divisors set bits in the error word
  bool hoist = true;            // hoist row / column / tile invariant values
  bool fast_tanh = true;        // tanh.approx.f32 instead of tanhf
  // Also emit KvCol / kv_col / mask_mod_staged (kernels_templates/flex_variant_base.cuh): mask_mod's loads at the KV
  // column alone, computed once per column of a partial tile by the kernels that stage them.
  bool stage_kv_cols = false;
  // Split score_mod's row and column terms off (compiler/codegen/row_terms.h; kRowTerms in the variant): for the
  // forward kernels, which add the row terms to the LSE. Decode and the backward evaluate score_mod whole.
  bool split_row_terms = false;
  // A score_mod split with runtime factors (compiler/codegen/score_scales.h): what the launch's parameter values allow.
  RuntimeSplit runtime_split = RuntimeSplit::RunningMax;
};

// What the launcher needs to turn an error bit into a message.
struct LoadSite {
  std::string buffer;       // buffer name
  std::string expression;   // the load as the user wrote it (after lowering), e.g. "rel_h[b, h, q, kv // 64]"
  std::string status;       // "unchecked (proven)", "unchecked (obligation held at launch)", "checked"
  bool checked = false;
  unsigned flag_bit = 0;    // bit in the error word (0 when unchecked)
};

// The error bit set when an integer division or modulo meets a zero divisor at run time. Bit 30 is the launches'
// length check (kFlexBadLengthsFlag, kernels_templates/flex_params.cuh); bits 0..29 the checked loads'.
inline constexpr unsigned kZeroDivisorFlag = 1u << 31;

struct GeneratedVariant {
  std::string code;            // `struct <name> { ... };`
  ParamsLayout layout;
  std::vector<LoadSite> loads;  // one per RangeInfo::loads entry
  int row_values = 0, col_values = 0, tile_values = 0;
  int kv_col_values = 0;  // fields of KvCol (VariantOptions::stage_kv_cols); 0: no staged forms emitted
  bool tile_aligned = false;  // kTileAligned: the hooks need KV tiles at multiples of the staging tile
  bool has_score_mod = false;  // kHasScoreMod: score_mod (or its column terms) runs per element
  bool fixed_max = false;      // kFixedMax: the softmax subtracts a fixed bound instead of each row's maximum
  bool element_loads = false;  // kElementLoads: the mods load buffers per element (loads no stage hoisted)
};

// `ranges` must come from analyze_ranges over the same (optimized) score_mod and mask_mod.
GeneratedVariant generate_cuda_variant(const SpecIR& ir, const RangeInfo& ranges, const VariantOptions& options,
                                       const std::string& struct_name = "FlexVariant");

// Statements computing `roots` (nodes of the DAG `ranges` analysed) in one device-function body with
// the variant printer, unstaged (kv prints as `(k0 + j)`), each shared node once; `values` holds the C
// expression naming each root. For functions beside the variant (the backward's gradient functions).
struct EmittedExpressions {
  std::string body;
  std::vector<std::string> values;
};
EmittedExpressions emit_cuda_expressions(const SpecIR& ir, const RangeInfo& ranges, const VariantOptions& options,
                                         const std::vector<ir::Expr>& roots, int indent);

}  // namespace flexjit
