// The CPU backward launch: argument checks (with messages saying what, where and how to fix),
// binding, the JIT-compiled gradient module and the job for the backward driver.
#pragma once
#include <memory>
#include <string>

#include "compiler/passes/autodiff.h"
#include "compiler/passes/range_analysis.h"
#include "compiler/spec_ir.h"
#include "runtime/flexjit.hpp"

namespace flexjit::cpu {

// What every backward launch of one spec shares (the executor caches it per canonical IR).
struct BackwardSpec {
  SpecIR ir;                   // the spec, with the programs the gradient shares nodes with
  ScoreModGradient gradient;   // differentiate_score_mod(ir)
  RangeInfo ranges;            // analyze_ranges over ir's programs (forward domains)
  std::string canonical;       // backward_cache_key(ir)
  bool mask_uses_b = true, mask_uses_h = true;
  bool d_score_is_one = true;  // d_score is the immediate 1.0 (bias-only mods): dS flows unchanged
};

// canonical_ir_text(ir) plus which buffers require a gradient: specs with equal keys have the
// same gradient and the same compiled backward module.
std::string backward_cache_key(const SpecIR& ir);

// Differentiates and analyses `ir` once. Throws flexjit::Error.
std::shared_ptr<const BackwardSpec> make_backward_spec(const SpecIR& ir);

// dq, dk, dv and the requested buffer gradients (BackwardArgs) of a launch of `ir` (whose
// dtype and head dims the operands are checked against); `spec` is make_backward_spec of an
// IR with the same backward_cache_key. Throws flexjit::Error.
void launch_backward(const SpecIR& ir, const BackwardSpec& spec, const BackwardArgs& args);

}  // namespace flexjit::cpu
