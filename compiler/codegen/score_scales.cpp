#include "compiler/codegen/score_scales.h"

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
  return s;
}

}  // namespace flexjit
