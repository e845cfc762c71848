// Algebraic simplification under the exact semantics of docs/SEMANTICS.md (wrapping ints,
// IEEE fp32, checked-mode flags), folding constants as it goes.
#pragma once
#include "compiler/ir/ir.h"

namespace flexjit::ir {

// Why: users write (and lowering produces) redundant forms: `x + 0`, `x * 1.0`,
// `where(true, a, b)`, `(q + 1) + 2`, `kv - kv`. Removing them shrinks the generated code and
// puts expressions in one canonical shape (constants on the right of commutative operators,
// comparisons with the constant on the right) so CSE and the range analysis see more
// equalities. Only exact identities are used: `x + 0.0` is not one for floats (-0.0 + 0.0 is
// +0.0), `x - x` is not one for floats (inf, nan); and a rewrite that would drop a
// subexpression that can raise a checked-mode flag (a load, a division by a non-constant)
// is only done where the interpreter would not have evaluated it either.
Expr simplify(const Expr& e);

}  // namespace flexjit::ir
