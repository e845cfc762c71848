// Common-subexpression elimination: structurally equal subexpressions become one node.
#pragma once
#include <vector>

#include "compiler/ir/ir.h"

namespace flexjit::ir {

// Why: lowering inlines `let`s by sharing, but equal expressions written twice (the same
// load in score_mod and mask_mod, `q - kv` in both, a repeated `kv // 64`) are separate
// nodes. Code generators print each node once into a temporary, so merging them here means
// each value is computed once per element. Works across all roots at once, so score_mod
// and mask_mod share nodes; the result has one entry per root, in order (null stays null).
std::vector<Expr> cse(const std::vector<Expr>& roots);

}  // namespace flexjit::ir
