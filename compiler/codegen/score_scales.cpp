#include "compiler/codegen/score_scales.h"

#include <algorithm>
#include <cmath>

#include "compiler/ir/ir_mutator.h"

namespace flexjit {

using namespace ir;

namespace {

bool is_score(const Expr& e) { return is_var(e, VarId::Score); }

// The finite nonzero constant c of `score * c`, `c * score` or `score / c` (as the factor score is multiplied
// by: 1 / c for the division, as the emitter prints it), or 0 when e is none of those.
float score_factor(const Expr& e) {
  const Binary* b = e.as<Binary>();
  if (!b || b->type != Type::Float) return 0.f;
  auto finite_nonzero = [](const Expr& x) -> float {
    const FloatImm* c = x.as<FloatImm>();
    return c && std::isfinite(c->value) && c->value != 0.f ? c->value : 0.f;
  };
  if (b->op == BinaryOp::Mul) {
    if (is_score(b->a)) return finite_nonzero(b->b);
    if (is_score(b->b)) return finite_nonzero(b->a);
  }
  if (b->op == BinaryOp::Div && is_score(b->a)) {
    const float c = finite_nonzero(b->b);
    return c != 0.f && std::isfinite(1.f / c) ? 1.f / c : 0.f;
  }
  return 0.f;
}

// Replaces every `score * in` (score_factor == in) by `with`; `mismatch` is set when a scaled score with
// another factor is met.
class ReplaceScaledScore : public IRMutator {
 public:
  ReplaceScaledScore(float in, Expr with) : in_(in), with_(std::move(with)) {}
  bool mismatch = false;

 protected:
  Expr visit(const Binary* op, const Expr& e) override {
    const float f = score_factor(e);
    if (f != 0.f) {
      if (f != in_) mismatch = true;
      return with_;
    }
    return IRMutator::visit(op, e);
  }

 private:
  float in_;
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

ScoreScales split_score_scales(const Expr& score_mod) {
  ScoreScales s;
  const Binary* root = score_mod.as<Binary>();
  if (!root || root->op != BinaryOp::Mul || root->type != Type::Float) return s;
  const FloatImm* c = root->a.as<FloatImm>();
  Expr rest = root->b;
  if (!c) {
    c = root->b.as<FloatImm>();
    rest = root->a;
  }
  if (!c || !(c->value > 0.f) || !std::isfinite(c->value)) return s;

  // The factor of the first scaled score found decides `in`; every other must match it.
  float in = 0.f;
  for_each_node(rest, [&](const Expr& n) {
    if (in == 0.f) in = score_factor(n);
  });
  if (in == 0.f) return s;
  // With the scaled scores replaced by a constant, no bare score may remain.
  ReplaceScaledScore probe(in, FloatImm::make(0.f));
  if (uses_score(probe.mutate(rest)) || probe.mismatch) return s;

  ReplaceScaledScore to_core(in, Var::make(VarId::Score));
  s.core = to_core.mutate(rest);
  s.in = in;
  s.out = c->value;
  s.split = true;
  const Bounds cb = float_bounds(s.core);
  s.core_bounded = cb.known;
  s.core_lo = cb.lo;
  s.core_hi = cb.hi;
  return s;
}

}  // namespace flexjit
