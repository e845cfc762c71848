// Scatter terms of a score_mod gradient that add nothing over a softmax row, removed.
//
// Why: a buffer value read at an index and with a derivative that are both constant along a query row (a per-row
// bias such as `bias[offset[q]]`, `bias[h]`) receives c(q) * sum over kv of dS[q, kv], and that sum is zero: dS =
// P (dP - D) with D = sum_kv P dP and sum_kv P = 1 (the kept columns of a row; a fully masked row has P = 0). The
// backward kernels would compute it as the cancellation of terms rounded through the bf16 O that D reads, noise of
// the size of dS itself; removing the scatter gives the exact zero. Blocks of one row run with a merged LSE (ring
// attention) each give zero too, which still sums to the unsplit gradient.
#pragma once
#include "compiler/passes/autodiff.h"

namespace flexjit {

// Removes from g.scatters every term whose coefficient and indices depend on neither kv nor the score.
void drop_row_constant_scatters(ScoreModGradient& g);

}  // namespace flexjit
