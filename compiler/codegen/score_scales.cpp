#include "compiler/codegen/score_scales.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "compiler/ir/ir_mutator.h"

namespace flexjit {

using namespace ir;

namespace {

bool is_score(const Expr& e) { return is_var(e, VarId::Score); }

// A finite nonzero literal or a float parameter as a factor (optionally its reciprocal); nullopt otherwise.
std::optional<ScaleFactor> factor_of(const Expr& x, bool reciprocal) {
  if (const FloatImm* c = x.as<FloatImm>()) {
    if (!std::isfinite(c->value) || c->value == 0.f) return std::nullopt;
    const float v = reciprocal ? 1.f / c->value : c->value;
    if (!std::isfinite(v)) return std::nullopt;
    ScaleFactor f;
    f.constant = v;
    return f;
  }
  if (const Param* p = x.as<Param>(); p && p->type == Type::Float) {
    ScaleFactor f;
    f.param = p->index;
    f.param_name = p->name;
    f.reciprocal = reciprocal;
    return f;
  }
  return std::nullopt;
}

// The factor score is multiplied by in `score * c`, `c * score` or `score / c` (1 / c for the division, as the
// emitter prints it), or nullopt when e is none of those.
std::optional<ScaleFactor> score_factor(const Expr& e) {
  const Binary* b = e.as<Binary>();
  if (!b || b->type != Type::Float) return std::nullopt;
  if (b->op == BinaryOp::Mul) {
    if (is_score(b->a)) return factor_of(b->b, false);
    if (is_score(b->b)) return factor_of(b->a, false);
  }
  if (b->op == BinaryOp::Div && is_score(b->a)) return factor_of(b->b, true);
  return std::nullopt;
}

// Replaces every `score * in` (score_factor == in) by `with`; `mismatch` is set when a scaled score with
// another factor is met.
class ReplaceScaledScore : public IRMutator {
 public:
  ReplaceScaledScore(ScaleFactor in, Expr with) : in_(std::move(in)), with_(std::move(with)) {}
  bool mismatch = false;

 protected:
  Expr visit(const Binary* op, const Expr& e) override {
    if (const std::optional<ScaleFactor> f = score_factor(e)) {
      if (!f->same(in_)) mismatch = true;
      return with_;
    }
    return IRMutator::visit(op, e);
  }

 private:
  ScaleFactor in_;
  Expr with_;
};

bool uses_score(const Expr& e) {
  bool found = false;
  for_each_node(e, [&](const Expr& n) { found = found || is_score(n); });
  return found;
}

struct Bounds {
  bool known = false;
  double lo = 0, hi = 0;
};

Bounds bounds(double lo, double hi) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};
  return {true, lo, hi};
}

// Bounds of a float expression for every value of its variables: tanh and sigmoid bound whatever they take, and
// constants, negation, +, -, *, min, max and select carry bounds through. Anything else is unbounded.
Bounds float_bounds(const Expr& e) {
  if (const FloatImm* c = e.as<FloatImm>()) return bounds(c->value, c->value);
  if (const Unary* u = e.as<Unary>()) {
    if (u->type != Type::Float) return {};
    if (u->op == UnaryOp::Tanh) return bounds(-1, 1);
    if (u->op == UnaryOp::Sigmoid) return bounds(0, 1);
    const Bounds a = float_bounds(u->a);
    if (u->op == UnaryOp::Neg && a.known) return bounds(-a.hi, -a.lo);
    return {};
  }
  if (const Binary* b = e.as<Binary>()) {
    if (b->type != Type::Float) return {};
    const Bounds x = float_bounds(b->a), y = float_bounds(b->b);
    if (!x.known || !y.known) return {};
    switch (b->op) {
      case BinaryOp::Add: return bounds(x.lo + y.lo, x.hi + y.hi);
      case BinaryOp::Sub: return bounds(x.lo - y.hi, x.hi - y.lo);
      case BinaryOp::Mul: {
        const double p[4] = {x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi};
        return bounds(*std::min_element(p, p + 4), *std::max_element(p, p + 4));
      }
      case BinaryOp::Min: return bounds(std::min(x.lo, y.lo), std::min(x.hi, y.hi));
      case BinaryOp::Max: return bounds(std::max(x.lo, y.lo), std::max(x.hi, y.hi));
      default: return {};
    }
  }
  if (const Select* s = e.as<Select>()) {
    const Bounds x = float_bounds(s->t), y = float_bounds(s->f);
    if (!x.known || !y.known) return {};
    return bounds(std::min(x.lo, y.lo), std::max(x.hi, y.hi));
  }
  return {};
}

}  // namespace

float ScaleFactor::value(const std::vector<float>& params) const {
  if (param < 0) return constant;
  const float v = static_cast<size_t>(param) < params.size() ? params[static_cast<size_t>(param)] : 0.f;
  return reciprocal ? 1.f / v : v;
}

bool ScoreScales::fixed_max_fits(float out_value) const {
  // exp2((core - max) * log2(e) * out) over the core's range stays at or above 2^-100: a normal number in bf16 P,
  // with room below it for the row sums (flex::Softmax).
  constexpr double kFixedMaxRangeLog2 = 100.0, kLog2e = 1.4426950408889634;
  return core_bounded && out_value > 0.f && std::isfinite(out_value) && (core_hi - core_lo) * kLog2e * out_value <= kFixedMaxRangeLog2;
}

ScoreScales split_score_scales(const Expr& score_mod) {
  ScoreScales s;
  const Binary* root = score_mod.as<Binary>();
  if (!root || root->op != BinaryOp::Mul || root->type != Type::Float) return s;
  std::optional<ScaleFactor> out = factor_of(root->a, false);
  Expr rest = root->b;
  if (!out) {
    out = factor_of(root->b, false);
    rest = root->a;
  }
  if (!out || (!out->runtime() && !(out->constant > 0.f))) return s;

  // The factor of the first scaled score found decides `in`; every other must match it.
  std::optional<ScaleFactor> in;
  for_each_node(rest, [&](const Expr& n) {
    if (!in) in = score_factor(n);
  });
  if (!in) return s;
  // With the scaled scores replaced by a constant, no bare score may remain.
  ReplaceScaledScore probe(*in, FloatImm::make(0.f));
  if (uses_score(probe.mutate(rest)) || probe.mismatch) return s;

  ReplaceScaledScore to_core(*in, Var::make(VarId::Score));
  s.core = to_core.mutate(rest);
  s.in = *in;
  s.out = *out;
  s.split = true;
  const Bounds cb = float_bounds(s.core);
  s.core_bounded = cb.known;
  s.core_lo = cb.lo;
  s.core_hi = cb.hi;
  return s;
}

RuntimeSplit runtime_split_for(const ScoreScales& scales, const std::vector<float>& params) {
  const float out = scales.out.value(params);
  if (!(out > 0.f) || !std::isfinite(out)) return RuntimeSplit::Unsplit;
  return scales.fixed_max_fits(out) ? RuntimeSplit::FixedMax : RuntimeSplit::RunningMax;
}

}  // namespace flexjit
