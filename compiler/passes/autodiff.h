// Reverse-mode differentiation of score_mod: d score_mod / d score and the scatter terms that
// carry dS into the gradients of captured buffers that require one (docs/AUTODIFF.md).
#pragma once
#include <vector>

#include "compiler/ir/ir.h"
#include "compiler/spec_ir.h"

namespace flexjit {

// One scatter term: dS * coefficient is added into grad[buffer][indices] (an fp32 gradient
// buffer of the buffer's shape; indices resolve as the forward load's do: negative ones in
// [-n, -1] wrap, others clamp).
struct GradScatter {
  int buffer;                     // spec buffer index; the buffer has requires_grad
  std::vector<ir::Expr> indices;  // the forward load's index expressions (ints), the same nodes
  ir::Expr coefficient;           // Float: d score_mod / d (this load's value), in fp32 for any dtype
};

struct ScoreModGradient {
  ir::Expr d_score;                   // Float: d score_mod / d score (1.0 without a score_mod)
  std::vector<GradScatter> scatters;  // one per distinct load of a buffer that requires a gradient,
                                      // by buffer index, then by position in the forward DAG
  // The spec's programs as the results share nodes with: CSE'd together with every expression
  // above, so a code generator printing each node once computes shared values once. They are
  // the very nodes of the input when it came from build_spec_ir (already CSE'd).
  ir::Expr score_mod;  // null when the spec has none
  ir::Expr mask_mod;   // null when the spec has none
};

// Why: FlexAttention's training use is learnable score modifications (relative-position
// tables, ALiBi slopes, SAM's rel_h / rel_w). The backward kernel needs, per score element,
// the derivative with respect to the pre-mod score (to turn dS into the gradient that flows
// into Q and K) and, for every load of a buffer marked requires_grad, the amount to add into
// that buffer's gradient. Reverse accumulation over the DAG gives all of them in one sweep,
// linear in its size. Loads of other buffers, parameters, ints, bools and select conditions
// are constants; non-differentiable points follow PyTorch (docs/AUTODIFF.md lists them).
ScoreModGradient differentiate_score_mod(const SpecIR& ir);

}  // namespace flexjit
