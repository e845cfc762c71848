// The front-end property both fuzzers check: any input either compiles (and then lowers,
// optimizes, generates CUDA and evaluates without error) or is rejected with diagnostics
// that each carry a position inside the input. Nothing else may happen.
#pragma once
#include <stdexcept>
#include <string>

#include "compiler/codegen/kernel_source.h"
#include "compiler/frontend.h"
#include "compiler/interpreter.h"
#include "compiler/ir_report.h"

namespace flexjit::fuzz {

// Returns "" if the property held, else a description of the violation.
inline std::string check_one(const std::string& score_text, const std::string& mask_text, bool* accepted = nullptr) {
  if (accepted) *accepted = false;
  dsl::Spec spec;
  dsl::Diagnostics decl;
  dsl::add_buffer(spec, "bias: f32[H, L]", "fuzz", decl);
  dsl::add_buffer(spec, "doc: i32[Sq]", "fuzz", decl);
  dsl::add_buffer(spec, "rel: bf16[B, H, Sq, 64]", "fuzz", decl);
  dsl::add_param(spec, "window: int", "fuzz", decl);
  dsl::add_param(spec, "const cap: float = 30", "fuzz", decl);
  if (!score_text.empty()) spec.score_mod = score_text;
  if (!mask_text.empty()) spec.mask_mod = mask_text;
  SpecIR ir;
  try {
    ir = build_spec_ir(spec);
  } catch (const CompileError& e) {
    const auto& list = e.diagnostics().list();
    if (list.empty()) return "rejected without a diagnostic";
    for (const dsl::Diagnostic& d : list) {
      if (!d.source) return "diagnostic without a source: " + d.message;
      if (d.span.begin > d.source->text().size() || d.span.end > d.source->text().size() || d.span.end < d.span.begin)
        return "diagnostic span outside its source: " + d.message;
      if (d.message.empty()) return "empty diagnostic message";
    }
    (void)e.diagnostics().render_text();
    (void)e.diagnostics().render_json();
    return "";
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  }
  try {
    ForwardKernelOptions fo;
    fo.head_dim = 64;
    KernelSource ks = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
    if (ks.source.empty()) return "empty kernel source";
    (void)ir_report(ir, true);
    EvalEnv env;
    env.vars[int(dsl::VarId::B)] = 1;
    env.vars[int(dsl::VarId::H)] = 2;
    env.vars[int(dsl::VarId::KvHead)] = 2;
    env.vars[int(dsl::VarId::Q)] = 5;
    env.vars[int(dsl::VarId::KV)] = 3;
    env.score = 0.25f;
    env.symbols.assign(ir.checked.symbols.size(), 8);
    static float bias[8 * 8] = {};
    static int doc[8] = {0, 0, 1, 1, 1, 2, 2, 3};
    static uint16_t rel[2 * 4 * 8 * 64] = {};
    env.buffers = {BufferView{dsl::DType::F32, bias, {8, 8}, {8, 1}}, BufferView{dsl::DType::I32, doc, {8}, {1}},
                   BufferView{dsl::DType::BF16, rel, {2, 4, 8, 64}, {4 * 8 * 64, 8 * 64, 64, 1}}};
    env.params.resize(2);
    env.params[0].type = ir::Type::Int;
    env.params[0].i = 3;
    env.params[1].type = ir::Type::Float;
    env.params[1].f = 30;
    EvalFlags flags;
    if (ir.score_mod) (void)evaluate(ir.score_mod, env, &flags);
    if (ir.mask_mod) (void)evaluate(ir.mask_mod, env, &flags);
    if (accepted) *accepted = true;
  } catch (const std::exception& e) {
    return std::string("accepted program failed downstream: ") + e.what();
  }
  return "";
}

}  // namespace flexjit::fuzz
