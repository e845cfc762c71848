// A checked spec lowered to IR: the unit every pass, code generator and back end works on.
#pragma once
#include "compiler/ir/ir.h"
#include "dsl/sema.h"

namespace flexjit {

struct SpecIR {
  dsl::CheckedSpec checked;  // the spec, its declarations and its symbol table
  ir::Expr score_mod;        // Type::Float, or null when the spec has no score_mod
  ir::Expr mask_mod;         // Type::Bool, or null when the spec has no mask_mod

  const dsl::Spec& spec() const { return checked.spec; }
};

// Lowers checked programs to IR: lets are inlined (sharing the lowered value, so the result
// is a DAG), const parameters become immediates, implicit int->float promotions become
// casts, and clamp/where/aliases become their primitive forms.
SpecIR lower_spec(const dsl::CheckedSpec& checked);

}  // namespace flexjit
