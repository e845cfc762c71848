// Constant folding: evaluates every node whose operands are all immediates, with the same
// scalar code the interpreter uses (compiler/ir/scalar_ops.h), so folding never changes a value.
#pragma once
#include "compiler/ir/ir.h"

namespace flexjit::ir {

// Why: lowering leaves const parameters and literals as separate immediates (`cap * 2.0` with
// `const cap = 30`); folding them once here keeps every back end from recomputing them per
// element. Integer division or modulo by a constant zero is NOT folded: it keeps its runtime
// meaning (0 and the checked-mode flag).
Expr fold_constants(const Expr& e);

}  // namespace flexjit::ir
