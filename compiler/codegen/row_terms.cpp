#include "compiler/codegen/row_terms.h"

#include <functional>
#include <vector>

#include "compiler/passes/dependence.h"

namespace flexjit {

using namespace ir;

namespace {

// One summand of an additive chain: sign * value.
struct Term {
  Expr value;
  bool negative = false;
};

// The sum of the terms (null when there are none); `made` receives every node built for it.
Expr sum_of(const std::vector<Term>& terms, std::vector<Expr>* made = nullptr) {
  Expr out;
  for (const Term& t : terms) {
    if (!out) out = t.negative ? Unary::make(UnaryOp::Neg, t.value) : t.value;
    else out = Binary::make(t.negative ? BinaryOp::Sub : BinaryOp::Add, out, t.value);
    if (made && (t.negative || out.get() != t.value.get())) made->push_back(out);
  }
  return out;
}

class Splitter {
 public:
  Splitter(const Expr& root, const std::function<bool(const Expr&)>& bounded) : deps_({root}), bounded_(bounded) {}

  // Sorts the float expression e, times `factor` (null: 1) and negated when `negative`, into the three sums.
  void collect(const Expr& e, bool negative, const Expr& factor) {
    if (const Binary* b = e.as<Binary>()) {
      if (b->op == BinaryOp::Add || b->op == BinaryOp::Sub) {
        collect(b->a, negative, factor);
        collect(b->b, b->op == BinaryOp::Sub ? !negative : negative, factor);
        return;
      }
      if (b->op == BinaryOp::Mul && uniform(b->a)) return collect(b->b, negative, times(factor, b->a));
      if (b->op == BinaryOp::Mul && uniform(b->b)) return collect(b->a, negative, times(factor, b->b));
    }
    if (const Unary* u = e.as<Unary>(); u && u->op == UnaryOp::Neg) return collect(u->a, !negative, factor);
    if (const Cast* c = e.as<Cast>(); c && c->a.type() == Type::Int && split_conversion(c->a, negative, factor)) return;
    const Dependence& d = deps_.of(e);
    const bool q = d.uses(VarId::Q), kv = d.uses(VarId::KV);
    // Literals stay: the rest's bounds (a fixed softmax maximum) see them, and they cost nothing to fold.
    const bool literal = d.vars == 0 && !d.has_load && !d.uses_params && d.symbols.empty();
    std::vector<Term>& into = d.uses(VarId::Score) || (q && kv) || literal ? rest_ : kv ? col_ : row_;
    into.push_back(Term{times(factor, e), negative});
  }

  RowTerms result() {
    RowTerms out;
    if (row_.empty()) return out;
    out.split = true;
    out.rest = rest_.empty() ? make_float(0.f) : sum_of(rest_);
    out.col = sum_of(col_);
    out.row = sum_of(row_);
    out.origin = std::move(origin_);
    return out;
  }

 private:
  // Neither the query row, the KV column nor the score: the same for every element of a head (b, h, parameters).
  bool uniform(const Expr& e) const {
    const Dependence& d = deps_.of(e);
    return !d.uses(VarId::Q) && !d.uses(VarId::KV) && !d.uses(VarId::Score);
  }

  static Expr times(const Expr& factor, const Expr& e) {
    if (!factor) return e;
    return Binary::make(BinaryOp::Mul, factor, e);
  }

  // float(I) for an integer sum I = s kv + Q(q) + N with s = +-1, Q over q alone (possibly empty) and N uniform:
  //   float(s kv + N + Q) = float(s j + N) + float(Q + s k0)   with j = kv - k0, k0 the anchor.
  // Exact while both parts stay below 2^24 in magnitude (positions do). Without Q this still anchors the column:
  // float(kv) itself would lose the low bits of the scores it is added to far from the sequence's start. False when
  // I has another shape.
  bool split_conversion(const Expr& sum, bool negative, const Expr& factor) {
    std::vector<Term> terms;
    flatten_int(sum, false, terms);
    int kv_sign = 0;
    std::vector<Term> q_terms, n_terms;
    for (const Term& t : terms) {
      const Dependence& d = deps_.of(t.value);
      const bool q = d.uses(VarId::Q), kv = d.uses(VarId::KV);
      if (kv && !q && is_var(t.value, VarId::KV) && kv_sign == 0) kv_sign = t.negative ? -1 : 1;
      else if (kv) return false;
      else if (q) q_terms.push_back(t);
      else n_terms.push_back(t);
    }
    // A sum without a finite range may wrap, which its parts would not do alike.
    if (kv_sign == 0 || (bounded_ && !bounded_(sum))) return false;
    // The parts of the plain distance (kv - q: j and k0 - q) are as narrow as the sum; others are left 64-bit.
    const bool plain = n_terms.empty() && q_terms.size() <= 1 && (q_terms.empty() || is_var(q_terms[0].value, VarId::Q));
    std::vector<Term> col_int{Term{Var::make(VarId::TileCol), kv_sign < 0}};
    col_int.insert(col_int.end(), n_terms.begin(), n_terms.end());
    q_terms.push_back(Term{Var::make(VarId::TileStart), kv_sign < 0});
    std::vector<Expr> made;
    const Expr col = sum_of(col_int, &made), row = sum_of(q_terms, &made);
    if (plain)
      for (const Expr& m : made) origin_.emplace(m.get(), sum);
    col_.push_back(Term{times(factor, Cast::make(Type::Float, col)), negative});
    row_.push_back(Term{times(factor, Cast::make(Type::Float, row)), negative});
    return true;
  }

  // The summands of an integer +/- chain (negations included).
  static void flatten_int(const Expr& e, bool negative, std::vector<Term>& out) {
    if (const Binary* b = e.as<Binary>(); b && (b->op == BinaryOp::Add || b->op == BinaryOp::Sub)) {
      flatten_int(b->a, negative, out);
      flatten_int(b->b, b->op == BinaryOp::Sub ? !negative : negative, out);
      return;
    }
    if (const Unary* u = e.as<Unary>(); u && u->op == UnaryOp::Neg) return flatten_int(u->a, !negative, out);
    out.push_back(Term{e, negative});
  }

  DependenceInfo deps_;
  std::function<bool(const Expr&)> bounded_;
  std::vector<Term> rest_, col_, row_;
  std::unordered_map<const Node*, Expr> origin_;
};

}  // namespace

RowTerms split_row_terms(const Expr& score_mod, const std::function<bool(const Expr&)>& bounded) {
  if (!score_mod) return {};
  Splitter s(score_mod, bounded);
  s.collect(score_mod, false, Expr());
  return s.result();
}

}  // namespace flexjit
