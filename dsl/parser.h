// Recursive-descent parser (precedence climbing) for score_mod / mask_mod programs.
#pragma once
#include <memory>

#include "dsl/ast.h"
#include "dsl/diagnostic.h"

namespace flexjit::dsl {

// Nesting depth beyond which the parser reports E0104 instead of recursing further, so no
// input can overflow the stack.
inline constexpr int kMaxNestingDepth = 200;
// Height of any expression tree, counting long operator chains such as a+a+...+a; with
// `let` references expanded, sema enforces kMaxExpandedDepth.
inline constexpr uint32_t kMaxTreeDepth = 256;
inline constexpr uint32_t kMaxExpandedDepth = 1024;

// Parses a whole program. Errors are reported to diags and parsing recovers at the next `;`
// or closing bracket, so one run reports every error it can find. Never throws on bad input.
Program parse_program(const std::shared_ptr<const Source>& src, Diagnostics& diags);

}  // namespace flexjit::dsl
