// Constant factors around a score_mod, split off so the forward kernels can fold them into multiplies they do
// anyway: score_mod(s) = out * core(in * s) with constants out > 0 and in (softcap: 30 * tanh(s / 30)).
#pragma once
#include "compiler/ir/ir.h"

namespace flexjit {

struct ScoreScales {
  bool split = false;  // the form was found; the fields below are meaningful only then
  float in = 1.f;      // score enters the core only as in * score
  float out = 1.f;     // > 0, so the row maximum and the softmax of out * core are those of core, rescaled
  ir::Expr core;       // the score_mod without `out *`, with every `in * score` replaced by the score variable
  // [core_lo, core_hi] holds every value of the core for any score (tanh: [-1, 1]), when core_bounded. The forward
  // kernels may then subtract the fixed maximum core_hi in the softmax instead of tracking each row's maximum.
  bool core_bounded = false;
  double core_lo = 0, core_hi = 0;
};

// The split of a score_mod expression (as emitted, after staging). Not split when the root is not a
// multiplication by a positive finite constant, or when the score occurs anywhere other than multiplied or
// divided by one and the same finite nonzero constant.
ScoreScales split_score_scales(const ir::Expr& score_mod);

}  // namespace flexjit
