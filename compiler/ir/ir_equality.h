// Structural equality and hashing of IR expressions (the basis of CSE and of cache keys).
#pragma once
#include <cstddef>

#include "compiler/ir/ir.h"

namespace flexjit::ir {

// True if a and b compute the same thing by construction (same kinds, ops, constants and
// operands, recursively). Float constants compare bitwise.
bool equal(const Expr& a, const Expr& b);

// A hash consistent with equal().
size_t structural_hash(const Expr& e);

}  // namespace flexjit::ir
