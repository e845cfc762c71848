// Shrinks a failing generated case to a small one that fails the same way: smaller sizes,
// simpler types, fewer declarations, and expressions with subtrees replaced by their children
// or by constants (never where that could break the generator's guarantees, GenExpr::keep).
#pragma once
#include <functional>

#include "fuzz/differential/random_spec.h"

namespace flexjit::fuzz {

// `fails` says whether a candidate still fails the same way; at most `budget` candidates are tried.
GenCase shrink_case(GenCase c, const std::function<bool(const GenCase&)>& fails, int budget = 400);

}  // namespace flexjit::fuzz
