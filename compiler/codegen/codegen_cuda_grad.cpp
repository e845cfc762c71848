#include "compiler/codegen/codegen_cuda_grad.h"

#include <fmt/format.h>

#include <functional>

#include "compiler/codegen/params_layout.h"
#include "compiler/codegen/staged_rows_source.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/dependence.h"
#include "compiler/passes/staging.h"

namespace flexjit {

using namespace ir;

namespace {

// Whether a scatter's target is computed from the score (t[int(score)]).
bool uses_score(const GradScatter& s) {
  DependenceInfo deps(s.indices);
  for (const Expr& i : s.indices)
    if (deps.of(i).uses(dsl::VarId::Score)) return true;
  return false;
}

}  // namespace

const char* scatter_class_name(ScatterClass c) {
  switch (c) {
    case ScatterClass::Uniform: return "uniform";
    case ScatterClass::QOnly: return "q-only";
    case ScatterClass::KvOnly: return "kv-only";
    case ScatterClass::Diagonal: return "diagonal";
    case ScatterClass::General: return "general";
    case ScatterClass::RowCol: return "row-col";
    case ScatterClass::RowTile: return "row-tile";
  }
  return "?";
}

ScatterClass classify_scatter(const GradScatter& s) {
  // An index computed from the score (t[int(score)]) moves with every element: nothing to reduce.
  if (uses_score(s)) return ScatterClass::General;
  DependenceInfo deps(s.indices);
  bool uses_q = false, uses_kv = false, diagonal = true;
  for (const Expr& i : s.indices) {
    const Dependence& d = deps.of(i);
    uses_q |= d.uses(dsl::VarId::Q);
    uses_kv |= d.uses(dsl::VarId::KV);
    diagonal = diagonal && only_through_difference(i);
  }
  if (!uses_q && !uses_kv) return ScatterClass::Uniform;
  if (!uses_kv) return ScatterClass::QOnly;
  if (!uses_q) return ScatterClass::KvOnly;
  if (diagonal) return ScatterClass::Diagonal;
  // The forward's staging rewrite (kv = k0 + j, exact for kv // c and kv % c on aligned tiles) says per index
  // whether it is constant along a row's tiles (Col: only j) or across a tile's columns (Tile: only k0).
  StagingOptions so;
  so.tile_size = kQueryMajorTile;
  so.hoist = false;
  bool col = false, tile = false;
  for (const Expr& i : s.indices) {
    StagedMods st = stage_mods(i, Expr(), so);
    switch (st.stage_of(st.score_mod)) {
      case Stage::Row: break;
      case Stage::Col: col = true; break;
      case Stage::Tile: tile = true; break;
      case Stage::Element: return ScatterClass::General;
    }
  }
  if (col == tile) return ScatterClass::General;  // both: the target changes with every element of a row
  return col ? ScatterClass::RowCol : ScatterClass::RowTile;
}

bool row_owned(ScatterClass c) { return c == ScatterClass::QOnly || c == ScatterClass::RowCol || c == ScatterClass::RowTile; }

bool needs_query_major_pass(const ScoreModGradient& grad, const StagedTerms& staged) {
  for (size_t i = 0; i < grad.scatters.size(); ++i) {
    const ScatterClass c = classify_scatter(grad.scatters[i]);
    if ((c == ScatterClass::RowCol || c == ScatterClass::RowTile) && !staged.covers_scatter(static_cast<int>(i))) return true;
  }
  return false;
}

int kv_major_scatter_class(ScatterClass c, bool query_major_pass) {
  constexpr int kQMajor = 5;  // flex_bwd::kScatterQMajor
  if (query_major_pass && row_owned(c)) return kQMajor;
  if (c == ScatterClass::RowCol || c == ScatterClass::RowTile) return static_cast<int>(ScatterClass::General);
  return static_cast<int>(c);
}

int query_major_scatter_class(ScatterClass c) {
  switch (c) {
    case ScatterClass::QOnly: return 1;    // flex_bwdq::kRowSum
    case ScatterClass::RowCol: return 2;   // kRowCol
    case ScatterClass::RowTile: return 3;  // kRowTile
    default: return 0;                     // kRowNone
  }
}

std::vector<Expr> backward_roots(const ScoreModGradient& grad) {
  std::vector<Expr> roots;
  if (grad.score_mod) roots.push_back(grad.score_mod);
  if (grad.mask_mod) roots.push_back(grad.mask_mod);
  roots.push_back(grad.d_score);
  for (const GradScatter& s : grad.scatters) {
    for (const Expr& i : s.indices) roots.push_back(i);
    roots.push_back(s.coefficient);
  }
  return roots;
}

namespace {

constexpr const char* kAttrs = "  __device__ static __forceinline__";

// The variables a gradient function's body may name: kv prints as `(k0 + j)` in unstaged code.
std::string prologue(bool with_score) {
  return fmt::format("    const int k0 = kv;\n    const int j = 0;\n    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j;{}\n",
                     with_score ? " (void)score;" : "");
}

// One `template <int I>` function with an `if constexpr (I == i)` branch per scatter: the statements printing
// `roots(scatter)`, then `branch(scatter, names of the printed roots)`; `tail` ends the function. A scatter
// whose `roots` are empty gets no branch.
std::string scatter_function(const SpecIR& ir, const ScoreModGradient& grad, const RangeInfo& ranges, const VariantOptions& vo,
                             const std::vector<ScatterClass>& classes, const std::string& signature, bool with_score,
                             const std::function<std::vector<Expr>(const GradScatter&)>& roots,
                             const std::function<std::string(const GradScatter&, const std::vector<std::string>&)>& branch,
                             const std::string& tail) {
  std::string code = fmt::format("  template <int I>\n{} {} {{\n{}", kAttrs, signature, prologue(with_score));
  for (size_t i = 0; i < grad.scatters.size(); ++i) {
    const GradScatter& s = grad.scatters[i];
    const std::vector<Expr> r = roots(s);
    if (r.empty()) continue;
    EmittedExpressions e = emit_cuda_expressions(ir, ranges, vo, r, 6);
    code += fmt::format("    if constexpr (I == {}) {{  // {}[...] ({})\n{}{}    }}\n", i, ir.spec().buffers.at(s.buffer).name,
                        scatter_class_name(classes[i]), e.body, branch(s, e.values));
  }
  return code + tail + "  }\n";
}

// The forward load's index rule ([-n, -1] wraps, anything else clamps), row-major offset of the printed indices.
std::string offset_text(const SpecIR& ir, const GradScatter& s, const std::vector<std::string>& index) {
  const std::string f = buffer_field(ir.spec().buffers.at(s.buffer));
  std::string off = "0ll";
  for (size_t dim = 0; dim < s.indices.size(); ++dim)
    off = fmt::format("({}) * p.{}_n{} + fj::checked_index((long long){}, p.{}_n{}, nullptr, 0u)", off, f, dim, index[dim], f, dim);
  return off;
}

// The staged terms' constants and accessors (flex_backward_sm90.cuh, "staged terms"); every variant declares
// the constants, the accessors exist only for the terms present.
std::string staged_block(const SpecIR& ir, const RangeInfo& ranges, const VariantOptions& vo, const StagedTerms* staged, size_t num_scatters) {
  std::string code =
      "  // Staged additive terms: left out of score_mod above; the Hopper KV-major kernel reads them per query tile\n"
      "  // from shared memory and reduces their gradients (kScatterStaged).\n";
  code += fmt::format("  static constexpr bool kStagedSpread = {};  // spread KV rows per CTA (flex_backward_staged.cuh)\n",
                      staged && staged->spreads_rows(num_scatters) ? "true" : "false");
  for (StagedKind kind : {StagedKind::Col, StagedKind::Tile}) {
    const StagedTerm* t = staged ? staged->find(kind) : nullptr;
    const std::string Name = kind == StagedKind::Col ? "Col" : "Tile";
    const std::string name = kind == StagedKind::Col ? "col" : "tile";
    if (!t) {
      code += fmt::format("  static constexpr bool kStaged{0} = false;\n  static constexpr int kStaged{0}Scatter = -1;\n", Name);
      continue;
    }
    const dsl::BufferDecl& decl = ir.spec().buffers.at(t->buffer);
    code += fmt::format(
        "  static constexpr bool kStaged{Name} = true;  // {load}\n"
        "  static constexpr int kStaged{Name}Scatter = {scatter};\n"
        "  using Staged{Name}Element = {elem};\n",
        fmt::arg("Name", Name), fmt::arg("load", print_inline(t->load)), fmt::arg("scatter", t->scatter),
        fmt::arg("elem", decl.dtype == dsl::DType::F16 ? "__half" : "__nv_bfloat16"));
    code += staged_rows_function(ir, ranges, vo, *t, "staged_" + name);
  }
  const StagedTerm* diag = staged ? staged->find(StagedKind::Diag) : nullptr;
  if (!diag) return code + "  static constexpr bool kStagedDiag = false;\n";
  code += fmt::format("  static constexpr bool kStagedDiag = true;  // {}\n", print_inline(diag->load));
  return code + staged_diag_function(ir, ranges, vo, *diag);
}

}  // namespace

GeneratedGradVariant generate_cuda_grad_variant(const SpecIR& ir_in, const ScoreModGradient& grad, const RangeInfo& ranges,
                                                const VariantOptions& options, const std::string& struct_name,
                                                const GradVariantOptions& grad_options) {
  // The forward part: unhoisted with tile size 1 for the KV-major kernel (called with k0 = kv and j = 0, so the
  // staging rewrite stays exact), or hoisted with the forward's tiles for the query-major kernel.
  SpecIR ir = ir_in;
  const StagedTerms* staged = grad_options.staged && !grad_options.staged->terms.empty() ? grad_options.staged : nullptr;
  ir.score_mod = staged ? staged->residual : grad.score_mod;
  ir.mask_mod = grad.mask_mod;
  VariantOptions vo = options;
  vo.hoist = grad_options.hoisted;
  vo.tile_size = grad_options.hoisted ? kQueryMajorTile : 1;
  GeneratedVariant fwd = generate_cuda_variant(ir, ranges, vo, struct_name);
  GeneratedGradVariant out;
  out.layout = fwd.layout;
  out.loads = fwd.loads;
  out.d_score_is_one = is_float_const(grad.d_score, 1.f);

  std::string code = fwd.code;
  const std::string close = "};\n";
  code.resize(code.size() - close.size());  // reopen the struct

  code += "  // Backward: dS_pre = dS * d_score; scatter I adds dS * coef into gradient element `off`.\n";
  code += fmt::format("  static constexpr bool kDScoreIsOne = {};\n", out.d_score_is_one ? "true" : "false");
  code += fmt::format("  static constexpr int kNumScatters = {};\n", grad.scatters.size());
  std::vector<std::string> kv_classes, row_classes;
  for (size_t i = 0; i < grad.scatters.size(); ++i) {
    const GradScatter& s = grad.scatters[i];
    const ScatterClass c = classify_scatter(s);
    out.scatter_buffers.push_back(s.buffer);
    out.scatter_classes.push_back(c);
    constexpr int kStagedClass = 6;  // flex_bwd::kScatterStaged
    if (staged && staged->covers_scatter(static_cast<int>(i)))
      kv_classes.push_back(fmt::format("{} /* {}, staged */", kStagedClass, scatter_class_name(c)));
    else
      kv_classes.push_back(fmt::format("{} /* {} */", kv_major_scatter_class(c, grad_options.query_major_pass), scatter_class_name(c)));
    row_classes.push_back(fmt::format("{}", grad_options.query_major_pass ? query_major_scatter_class(c) : 0));
  }
  if (kv_classes.empty()) {  // a zero-length array is not C++
    kv_classes.push_back("0");
    row_classes.push_back("0");
  }
  const size_t n = kv_classes.size();
  code += staged_block(ir, ranges, vo, staged, grad.scatters.size());
  code += fmt::format("  // KV-major kernel's class per scatter (5: computed by the query-major pass instead, 6: a staged term's).\n"
                      "  static constexpr int kScatterClass[{}] = {{{}}};\n",
                      n, fmt::join(kv_classes, ", "));
  code += fmt::format("  // Query-major pass's class per scatter (0 none, 1 row sum, 2 row-col, 3 row-tile).\n"
                      "  static constexpr int kScatterRowClass[{}] = {{{}}};\n",
                      n, fmt::join(row_classes, ", "));

  EmittedExpressions d = emit_cuda_expressions(ir, ranges, vo, {grad.d_score}, 4);
  code += fmt::format("{} float d_score(const Params& p, int b, int h, int hkv, int q, int kv, float score) {{\n{}{}    return {};\n  }}\n",
                      kAttrs, prologue(true), d.body, d.values[0]);

  const std::string args = "const Params& p, int b, int h, int hkv, int q, int kv";
  auto indices_and_coef = [](const GradScatter& s) {
    std::vector<Expr> r = s.indices;
    r.push_back(s.coefficient);
    return r;
  };
  // Only row-owned targets are asked for their offset alone, and those never depend on the score (which this
  // function does not take).
  auto indices = [](const GradScatter& s) { return uses_score(s) ? std::vector<Expr>{} : s.indices; };
  auto coef = [](const GradScatter& s) { return std::vector<Expr>{s.coefficient}; };
  const bool none = grad.scatters.empty();
  code += scatter_function(
      ir, grad, ranges, vo, out.scatter_classes, fmt::format("void scatter({}, float score, long long& off, float& coef)", args), true,
      indices_and_coef,
      [&](const GradScatter& s, const std::vector<std::string>& v) {
        return fmt::format("      off = {};\n      coef = {};\n", offset_text(ir, s, v), v.back());
      },
      none ? "    off = 0;\n    coef = 0.f;\n" : "");
  // The query-major pass: the coefficient per element, the target once per row / column / tile.
  code += scatter_function(
      ir, grad, ranges, vo, out.scatter_classes, fmt::format("float scatter_coef({}, float score)", args), true, coef,
      [](const GradScatter&, const std::vector<std::string>& v) { return fmt::format("      return {};\n", v[0]); }, "    return 0.f;\n");
  code += scatter_function(
      ir, grad, ranges, vo, out.scatter_classes, fmt::format("long long scatter_offset({})", args), false, indices,
      [&](const GradScatter& s, const std::vector<std::string>& v) { return fmt::format("      return {};\n", offset_text(ir, s, v)); },
      "    return 0;\n");
  out.code = code + "};\n";
  return out;
}

}  // namespace flexjit
