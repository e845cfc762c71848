// Prints IR as readable text: nodes used more than once become numbered temporaries, so a
// DAG prints in linear size. Used by `flexjit dump --emit=ir`, tests and cache keys.
#pragma once
#include <functional>
#include <string>

#include "compiler/ir/ir.h"

namespace flexjit::ir {

// Optional per-node note printed as a trailing comment on a temporary's line (analyses use
// it to show dependence and range facts). Return "" for no note.
using NodeAnnotator = std::function<std::string(const Expr&)>;

// Multi-line form: `%0 = ...` lines for shared or annotated nodes, then the result.
std::string print_ir(const Expr& e, const NodeAnnotator& annotate = {});

// One-line form with every node inlined (for small expressions and messages).
std::string print_inline(const Expr& e);

// A float literal that reads back to the same fp32 value: "30.0", "1e-06", "inf".
std::string float_literal(float v);

}  // namespace flexjit::ir
