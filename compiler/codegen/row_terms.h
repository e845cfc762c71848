// score_mod's additive terms that depend on the query row alone or on the KV column alone, split off for the forward
// kernels: score_mod(s) = rest(s) + col(kv) + row(q).
//
// Why: a softmax row does not change when the same value is added to each of its scores, so the forward kernels
// leave row(q) out of the per-element work and add it to the row's LSE once (`score + bias[offset[q]]` then costs
// nothing per element), and compute col(kv) once per column for all of a thread's rows. ALiBi's
// `slope[h] * (kv - q)` is split too, through the conversion: float(kv - q) = float(kv - a) + float(a - q) for an
// anchor row a, which the kernels take within 32 rows of q (the first row of the warp's rows), so both parts stay as
// small as kv - q itself near the diagonal and keep its precision.
#pragma once
#include <functional>
#include <unordered_map>

#include "compiler/ir/ir.h"

namespace flexjit {

struct RowTerms {
  bool split = false;  // at least one row term was found; the fields below are meaningful only then
  ir::Expr rest;       // score_mod without the row and column terms (the score variable when nothing else is left)
  // The sum of the column terms (null when none), over kv and j, where j stands for kv - a: the kernels evaluate it
  // with k0 = a and j = kv - a, so kv prints as (k0 + j).
  ir::Expr col;
  ir::Expr row;  // the sum of the row terms, over q and k0, where k0 stands for the anchor a
  // New integer nodes of a split kv - q (j and k0 - q) -> the sum they were cut from: the same magnitude within the
  // anchor's rows, so the range analysis' verdict on 32-bit arithmetic carries over. Other parts stay 64-bit.
  std::unordered_map<const ir::Node*, ir::Expr> origin;
};

// The split of a score_mod expression (IR after the optimisation passes, before staging). Not split when no additive
// term (through +, -, negation, multiplication by a factor without q, kv and score, and conversions of integer sums
// with a single +-kv term) depends on q without kv and score, or on neither. `bounded` (when given) says whether an
// integer node has a finite range (RangeInfo): a conversion is split only then.
RowTerms split_row_terms(const ir::Expr& score_mod, const std::function<bool(const ir::Expr&)>& bounded = nullptr);

}  // namespace flexjit
