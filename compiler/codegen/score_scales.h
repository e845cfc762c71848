// Launch-constant factors around a score_mod, split off so the forward kernels can fold them into multiplies they do
// anyway: score_mod(s) = out * core(in * s) with out > 0 (softcap: cap * tanh(s / cap), cap a literal or a runtime
// parameter).
#pragma once
#include <string>
#include <vector>

#include "compiler/ir/ir.h"

namespace flexjit {

// A factor fixed for a launch: a literal, or a runtime float parameter (its value, or its reciprocal for a division
// by it, which the host computes once per launch: ParamsLayout's FloatParamReciprocal slot).
struct ScaleFactor {
  float constant = 1.f;      // the value, when param < 0
  int param = -1;            // the spec's parameter index, or -1
  std::string param_name;
  bool reciprocal = false;   // the factor is 1 / param
  bool runtime() const { return param >= 0; }
  bool same(const ScaleFactor& o) const { return param == o.param && reciprocal == o.reciprocal && (param >= 0 || constant == o.constant); }
  // The factor's value for a launch's float parameter values (indexed like the spec's params).
  float value(const std::vector<float>& params) const;
};

struct ScoreScales {
  bool split = false;  // the form was found; the fields below are meaningful only then
  ScaleFactor in;      // score enters the core only as in * score
  ScaleFactor out;     // > 0 (a literal's sign is checked here, a parameter's at launch), so the row maximum and the
                       // softmax of out * core are those of core, rescaled
  ir::Expr core;       // the score_mod without `out *`, with every `in * score` replaced by the score variable
  // [core_lo, core_hi] holds every value of the core for any score (tanh: [-1, 1]), when core_bounded. The forward
  // kernels may then subtract the fixed maximum core_hi in the softmax instead of tracking each row's maximum.
  bool core_bounded = false;
  double core_lo = 0, core_hi = 0;
  // Whether exp2 of the core's whole range, scaled by out, stays a normal number in bf16 P (fixed_max_fits).
  bool fixed_max_fits(float out_value) const;
};

// The split of a score_mod expression (as emitted, after staging). Not split when the root is not a
// multiplication by a positive finite literal or by a float parameter, or when the score occurs anywhere other than
// multiplied or divided by one and the same literal or parameter.
ScoreScales split_score_scales(const ir::Expr& score_mod);

// How a launch runs a score_mod whose split has runtime factors (VariantOptions::runtime_split): the parameter values
// decide whether the split holds (out > 0) and whether the fixed maximum fits.
enum class RuntimeSplit { Unsplit, RunningMax, FixedMax };
RuntimeSplit runtime_split_for(const ScoreScales& scales, const std::vector<float>& params);

}  // namespace flexjit
