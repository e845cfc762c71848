#include "compiler/codegen/staged_rows_source.h"

#include <fmt/format.h>

#include "compiler/codegen/params_layout.h"

namespace flexjit {

using namespace ir;

std::string staged_rows_function(const SpecIR& ir, const RangeInfo& ranges, const VariantOptions& options, const StagedTerm& term,
                                 const std::string& name) {
  const Load* l = term.load.as<Load>();
  const std::string f = buffer_field(ir.spec().buffers.at(term.buffer));
  const size_t n = l->indices.size();
  // The lead indices use only b, h and hkv (find_staged_terms' rule): printed with q, kv, k0 and j defined as 0.
  std::vector<Expr> lead(l->indices.begin(), l->indices.end() - 2);
  EmittedExpressions e = emit_cuda_expressions(ir, ranges, options, lead, 4);
  std::string elem_off = "0ll", grad_off = "0ll";
  for (size_t d = 0; d < lead.size(); ++d) {
    elem_off += fmt::format(" + (long long){} * p.{}_s{}", e.values[d], f, d);
    grad_off = fmt::format("({}) * p.{}_n{} + (long long){}", grad_off, f, d, e.values[d]);
  }
  return fmt::format(
      "  __device__ static __forceinline__ flex::StagedRows {name}(const Params& p, int b, int h, int hkv) {{\n"
      "    const int q = 0, kv = 0, k0 = 0, j = 0;\n"
      "    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)kv; (void)k0; (void)j;\n"
      "{body}"
      "    flex::StagedRows r;\n"
      "    r.base = static_cast<const unsigned short*>(p.{f}) + ({elem_off});\n"
      "    r.row_stride = p.{f}_s{rs};\n"
      "    r.col_stride = p.{f}_s{cs};\n"
      "    r.cols = p.{f}_n{cs};\n"
      "    r.rows = p.{f}_n{rs};\n"
      "    r.grad_base = (({grad_off}) * p.{f}_n{rs}) * p.{f}_n{cs};\n"
      "    return r;\n"
      "  }}\n",
      fmt::arg("name", name), fmt::arg("body", e.body), fmt::arg("f", f), fmt::arg("elem_off", elem_off), fmt::arg("rs", n - 2),
      fmt::arg("cs", n - 1), fmt::arg("grad_off", grad_off));
}

std::string staged_diag_function(const SpecIR& ir, const RangeInfo& ranges, const VariantOptions& options, const StagedTerm& term) {
  const Load* l = term.load.as<Load>();
  const dsl::BufferDecl& decl = ir.spec().buffers.at(term.buffer);
  const std::string f = buffer_field(decl);
  const size_t n = l->indices.size();
  EmittedExpressions e = emit_cuda_expressions(ir, ranges, options, l->indices, 4);
  std::string off = "0ll";
  for (size_t d = 0; d + 1 < n; ++d) off += fmt::format(" + (long long){} * p.{}_s{}", e.values[d], f, d);
  const char* load = decl.dtype == dsl::DType::F32 ? "load_f32" : decl.dtype == dsl::DType::F16 ? "load_f16" : "load_bf16";
  return fmt::format(
      "  __device__ static __forceinline__ float staged_diag(const Params& p, int b, int h, int hkv, int d) {{\n"
      "    const int q = d, kv = 0, k0 = 0, j = 0;\n"
      "    (void)p; (void)b; (void)h; (void)hkv; (void)q; (void)kv; (void)k0; (void)j;\n"
      "{body}"
      "    const long long last = (long long){last};\n"
      "    if (last < 0 || last >= p.{f}_n{ld}) return 0.f;\n"
      "    return fj::{load}(p.{f}, {off} + last * p.{f}_s{ld});\n"
      "  }}\n",
      fmt::arg("body", e.body), fmt::arg("last", e.values[n - 1]), fmt::arg("f", f), fmt::arg("ld", n - 1), fmt::arg("load", load),
      fmt::arg("off", off));
}

}  // namespace flexjit
