#include "compiler/codegen/codegen_cuda_grad.h"

#include <fmt/format.h>

#include "compiler/passes/dependence.h"

namespace flexjit {

using namespace ir;

namespace {

bool is_var(const Expr& e, dsl::VarId v) {
  const Var* x = e.as<Var>();
  return x && x->var == v;
}

// True when q and kv occur in e only inside `q - kv` subtrees.
bool only_through_difference(const Expr& e) {
  if (const Binary* b = e.as<Binary>(); b && b->op == BinaryOp::Sub && is_var(b->a, dsl::VarId::Q) && is_var(b->b, dsl::VarId::KV))
    return true;
  if (is_var(e, dsl::VarId::Q) || is_var(e, dsl::VarId::KV)) return false;
  for (const Expr& c : children(e))
    if (!only_through_difference(c)) return false;
  return true;
}

bool is_one(const Expr& e) {
  const FloatImm* f = e.as<FloatImm>();
  return f && f->value == 1.f;
}

}  // namespace

const char* scatter_class_name(ScatterClass c) {
  switch (c) {
    case ScatterClass::Uniform: return "uniform";
    case ScatterClass::QOnly: return "q-only";
    case ScatterClass::KvOnly: return "kv-only";
    case ScatterClass::Diagonal: return "diagonal";
    case ScatterClass::General: return "general";
  }
  return "?";
}

ScatterClass classify_scatter(const GradScatter& s) {
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
  return diagonal ? ScatterClass::Diagonal : ScatterClass::General;
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

GeneratedGradVariant generate_cuda_grad_variant(const SpecIR& ir_in, const ScoreModGradient& grad, const RangeInfo& ranges,
                                                const VariantOptions& options, const std::string& struct_name) {
  // The forward part, unhoisted (the KV-major loop has no fixed row to hoist for) and with tile size 1,
  // so the kernel calls it with k0 = kv and j = 0 and the staging rewrite stays exact.
  SpecIR ir = ir_in;
  ir.score_mod = grad.score_mod;
  ir.mask_mod = grad.mask_mod;
  VariantOptions vo = options;
  vo.hoist = false;
  vo.tile_size = 1;
  GeneratedVariant fwd = generate_cuda_variant(ir, ranges, vo, struct_name);
  GeneratedGradVariant out;
  out.layout = fwd.layout;
  out.loads = fwd.loads;
  out.d_score_is_one = is_one(grad.d_score);

  std::string code = fwd.code;
  const std::string close = "};\n";
  code.resize(code.size() - close.size());  // reopen the struct
  const char* attrs = "  __device__ static __forceinline__";
  const std::string prologue = "    const int k0 = kv;\n    const int j = 0;\n    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)k0; (void)j; (void)score;\n";

  code += fmt::format("  // Backward: dS_pre = dS * d_score; scatter I adds dS * coef into gradient element `off`.\n");
  code += fmt::format("  static constexpr bool kDScoreIsOne = {};\n", out.d_score_is_one ? "true" : "false");
  code += fmt::format("  static constexpr int kNumScatters = {};\n", grad.scatters.size());
  std::vector<std::string> classes;
  for (const GradScatter& s : grad.scatters) {
    out.scatter_buffers.push_back(s.buffer);
    out.scatter_classes.push_back(classify_scatter(s));
    classes.push_back(fmt::format("{} /* {} */", static_cast<int>(out.scatter_classes.back()), scatter_class_name(out.scatter_classes.back())));
  }
  if (classes.empty()) classes.push_back("0");
  code += fmt::format("  static constexpr int kScatterClass[{}] = {{{}}};\n", grad.scatters.empty() ? 1 : grad.scatters.size(),
                      fmt::join(classes, ", "));

  EmittedExpressions d = emit_cuda_expressions(ir, ranges, vo, {grad.d_score}, 4);
  code += fmt::format("{} float d_score(const Params& p, int b, int h, int hkv, int q, int kv, float score) {{\n{}{}    return {};\n  }}\n",
                      attrs, prologue, d.body, d.values[0]);

  code += fmt::format("  template <int I>\n{} void scatter(const Params& p, int b, int h, int hkv, int q, int kv, float score, long long& off, "
                      "float& coef) {{\n{}",
                      attrs, prologue);
  for (size_t i = 0; i < grad.scatters.size(); ++i) {
    const GradScatter& s = grad.scatters[i];
    std::vector<Expr> roots = s.indices;
    roots.push_back(s.coefficient);
    EmittedExpressions e = emit_cuda_expressions(ir, ranges, vo, roots, 6);
    const dsl::BufferDecl& decl = ir.spec().buffers.at(s.buffer);
    std::string f = buffer_field(decl);
    // The forward load's index rule: [-n, -1] wraps, anything else clamps; row-major offset.
    std::string off = "0ll";
    for (size_t dim = 0; dim < s.indices.size(); ++dim)
      off = fmt::format("({}) * p.{}_n{} + fj::checked_index((long long){}, p.{}_n{}, nullptr, 0u)", off, f, dim, e.values[dim], f, dim);
    code += fmt::format("    {}if constexpr (I == {}) {{  // {}[...] ({})\n{}      off = {};\n      coef = {};\n    }}\n", i ? "else " : "", i,
                        decl.name, scatter_class_name(out.scatter_classes[i]), e.body, off, e.values.back());
  }
  if (grad.scatters.empty()) code += "    off = 0;\n    coef = 0.f;\n";
  code += "  }\n};\n";
  out.code = code;
  return out;
}

}  // namespace flexjit
