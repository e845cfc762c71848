// The front-end property the fuzzers check: any program text either compiles (and then lowers,
// optimizes, generates every CUDA module a launch may need - forward, backward, decode - and
// evaluates in the interpreter without error) or is rejected with diagnostics that each carry
// a position inside the input. Nothing else may happen.
#pragma once
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "compiler/bindings.h"
#include "compiler/codegen/backward_source.h"
#include "compiler/codegen/decode_source.h"
#include "compiler/codegen/kernel_source.h"
#include "compiler/frontend.h"
#include "compiler/interpreter.h"
#include "compiler/ir_report.h"
#include "compiler/passes/autodiff.h"
#include "compiler/passes/range_analysis.h"

namespace flexjit::fuzz {

// What to generate for an accepted program (the libFuzzer target varies it with the input).
struct CodegenChoice {
  std::string arch = "sm_80";  // "sm_90a": the Hopper forward and backward kernels
  bool query_major = false;    // backward dq by the query-major pass
  int head_dim = 64;
  bool backward = true;        // the backward module
  bool decode = true;          // the decode module
};

// "" when every diagnostic of a rejection names a source and lies inside it.
inline std::string check_diagnostics(const dsl::Diagnostics& diags, bool need_source) {
  if (diags.list().empty()) return "rejected without a diagnostic";
  for (const dsl::Diagnostic& d : diags.list()) {
    if (d.message.empty()) return "empty diagnostic message";
    if (!d.source) {
      if (need_source) return "diagnostic without a source: " + d.message;
      continue;
    }
    if (d.span.begin > d.source->text().size() || d.span.end > d.source->text().size() || d.span.end < d.span.begin)
      return "diagnostic span outside its source: " + d.message;
  }
  // Rendering costs the line's length per diagnostic; a few of them exercise every renderer path
  // and keep the fuzzer fast on long inputs with hundreds of errors.
  if (diags.list().size() <= 8) {
    (void)diags.render_text();
    (void)diags.render_json();
  }
  return "";
}

// A view of `decl` over shared read-only storage: every dimension 1..3 elements (the
// interpreter clamps to the view's shape, so any extents are safe to evaluate with).
inline BufferView small_view(const dsl::BufferDecl& decl) {
  static const std::vector<unsigned char> storage = [] {
    std::vector<unsigned char> s(8 * 729);
    for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<unsigned char>(i * 37 + 11);
    return s;
  }();
  BufferView v;
  v.dtype = decl.dtype;
  v.data = storage.data();
  const size_t rank = decl.shape.size();
  v.shape.assign(rank, 1);
  for (size_t d = 0; d < rank && d < 6; ++d) v.shape[d] = decl.shape[d].is_symbol ? 3 : std::min<int64_t>(decl.shape[d].value, 3);
  v.strides = contiguous_strides(v.shape);
  return v;
}

// Evaluates the mods at one point, with every symbol 8 and every runtime parameter set.
inline void evaluate_at_a_point(const SpecIR& ir) {
  EvalEnv env;
  env.vars[int(dsl::VarId::B)] = 1;
  env.vars[int(dsl::VarId::H)] = 2;
  env.vars[int(dsl::VarId::KvHead)] = 2;
  env.vars[int(dsl::VarId::Q)] = 5;
  env.vars[int(dsl::VarId::KV)] = 3;
  env.score = 0.25f;
  env.symbols.assign(ir.checked.symbols.size(), 8);
  for (const dsl::ParamDecl& p : ir.spec().params) {
    Value v = p.type == dsl::ValueType::Int ? Value::of_int(3) : p.type == dsl::ValueType::Float ? Value::of_float(30) : Value::of_bool(true);
    env.params.push_back(v);
  }
  for (const dsl::BufferDecl& b : ir.spec().buffers) env.buffers.push_back(small_view(b));
  EvalFlags flags;
  if (ir.score_mod) (void)evaluate(ir.score_mod, env, &flags);
  if (ir.mask_mod) (void)evaluate(ir.mask_mod, env, &flags);
}

// Generates the forward, backward and decode modules of an accepted spec.
inline void generate_cuda(const SpecIR& ir, const CodegenChoice& c) {
  ForwardKernelOptions fo;
  fo.head_dim = c.head_dim;
  fo.arch = c.arch;
  KernelSource fwd = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
  if (fwd.source.empty()) throw std::runtime_error("empty forward kernel source");
  if (c.backward) {
    ScoreModGradient grad = differentiate_score_mod(ir);
    RangeInfo bwd_ranges = analyze_ranges(backward_roots(grad), ir.checked, VarDomains::forward(ir.checked));
    BackwardKernelOptions bo;
    bo.head_dim = c.head_dim;
    bo.arch = c.arch;
    bo.query_major = c.query_major;
    if (backward_kernel_source(ir, grad, bwd_ranges, bo).module.source.empty()) throw std::runtime_error("empty backward kernel source");
  }
  if (c.decode) {
    DecodeKernelOptions dopt;
    dopt.config.head_dim = c.head_dim;
    if (decode_kernel_source(ir, analyze_decode_ranges(ir), dopt).source.empty()) throw std::runtime_error("empty decode kernel source");
  }
}

// Returns "" if the property held, else a description of the violation. `declarations` holds
// extra buffer ("name: dtype[dims]") and parameter ("name: type") declarations, one a line.
inline std::string check_one(const std::string& score_text, const std::string& mask_text, bool* accepted = nullptr,
                             const std::string& declarations = "", const CodegenChoice& codegen = {}) {
  if (accepted) *accepted = false;
  dsl::Spec spec;
  dsl::Diagnostics decl;
  dsl::add_buffer(spec, "bias: f32[H, L]", "fuzz", decl);
  dsl::add_buffer(spec, "doc: i32[Sq]", "fuzz", decl);
  dsl::add_buffer(spec, "rel: bf16[B, H, Sq, 64]", "fuzz", decl);
  dsl::add_param(spec, "window: int", "fuzz", decl);
  dsl::add_param(spec, "const cap: float = 30", "fuzz", decl);
  size_t line_start = 0;
  while (line_start < declarations.size()) {
    size_t end = std::min(declarations.find('\n', line_start), declarations.size());
    std::string line = declarations.substr(line_start, end - line_start);
    line_start = end + 1;
    dsl::Diagnostics d;
    bool ok = line.find('[') != std::string::npos ? dsl::add_buffer(spec, line, "decl", d) : dsl::add_param(spec, line, "decl", d);
    if (!ok) {
      if (std::string v = check_diagnostics(d, /*need_source=*/true); !v.empty()) return "declaration `" + line + "`: " + v;
    }
  }
  for (dsl::BufferDecl& b : spec.buffers)
    b.requires_grad = b.dtype == dsl::DType::F32 || b.dtype == dsl::DType::BF16 || b.dtype == dsl::DType::F16;
  if (!score_text.empty()) spec.score_mod = score_text;
  if (!mask_text.empty()) spec.mask_mod = mask_text;
  SpecIR ir;
  try {
    ir = build_spec_ir(spec);
  } catch (const CompileError& e) {
    return check_diagnostics(e.diagnostics(), /*need_source=*/true);
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  }
  try {
    generate_cuda(ir, codegen);
    (void)ir_report(ir, true);
    evaluate_at_a_point(ir);
    if (accepted) *accepted = true;
  } catch (const std::exception& e) {
    return std::string("accepted program failed downstream: ") + e.what();
  }
  return "";
}

}  // namespace flexjit::fuzz
