#include "compiler/passes/autodiff.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "compiler/ir/ir_mutator.h"
#include "compiler/passes/cse.h"
#include "compiler/passes/simplify.h"

namespace flexjit {

using namespace ir;

namespace {

constexpr float kLn2 = 0.693147180559945309f;

bool is_float_imm(const Expr& e, float v) {
  const FloatImm* f = e.as<FloatImm>();
  return f && f->value == v && std::signbit(f->value) == std::signbit(v);
}

// Float arithmetic for derivative expressions. Multiplying by an immediate 1.0 is dropped
// here (it is exact) so that chains of adjoints stay small before simplify sees them.
Expr fimm(float v) { return make_float(v); }
Expr add(const Expr& a, const Expr& b) { return Binary::make(BinaryOp::Add, a, b); }
Expr sub(const Expr& a, const Expr& b) { return Binary::make(BinaryOp::Sub, a, b); }
Expr mul(const Expr& a, const Expr& b) {
  if (is_float_imm(a, 1.0f)) return b;
  if (is_float_imm(b, 1.0f)) return a;
  return Binary::make(BinaryOp::Mul, a, b);
}
bool same_operand(const Expr& a, const Expr& b) {
  if (a.same_as(b)) return true;
  const FloatImm* x = a.as<FloatImm>();
  const FloatImm* y = b.as<FloatImm>();
  return x && y && std::memcmp(&x->value, &y->value, sizeof(float)) == 0;
}
// (z * y) / y -> z. The chain rule produces it whenever a scale multiplies a function of a
// quotient by the same scale (softcap: cap * tanh(score / cap) gives cap * (1 - t^2) / cap).
// The cancelled form is the exact derivative, with less rounding and no overflow of z * y;
// it differs from evaluating the uncancelled formula only where y is 0 or infinite.
Expr div(const Expr& a, const Expr& b) {
  if (const Binary* m = a.as<Binary>(); m && m->op == BinaryOp::Mul) {
    if (same_operand(m->b, b)) return m->a;
    if (same_operand(m->a, b)) return m->b;
  }
  return Binary::make(BinaryOp::Div, a, b);
}
Expr neg(const Expr& a) {
  const Unary* u = a.as<Unary>();
  if (u && u->op == UnaryOp::Neg) return u->a;
  return Unary::make(UnaryOp::Neg, a);
}
Expr call(UnaryOp op, const Expr& a) { return Unary::make(op, a); }
Expr bin(BinaryOp op, const Expr& a, const Expr& b) { return Binary::make(op, a, b); }
Expr select(const Expr& c, const Expr& t, const Expr& f) { return Select::make(c, t, f); }

struct LoadAdjoint {
  size_t position;  // in the forward post-order: a deterministic order for the scatters
  Expr load;
  Expr adjoint;
};

// One reverse sweep over the forward DAG. Each node's adjoint (d root / d node) is the sum of
// the contributions of its users, so nodes are visited users-first (reverse post-order) and a
// node's adjoint is complete when it is reached. Only "active" nodes get adjoints: floats
// that depend, through differentiable operations, on score or on a load that needs a gradient.
class ReverseAccumulator {
 public:
  explicit ReverseAccumulator(const std::vector<dsl::BufferDecl>& buffers) : buffers_(buffers) {}

  void run(const Expr& root) {
    std::vector<Expr> order;
    for_each_node(root, [&](const Expr& e) { order.push_back(e); });
    for (const Expr& e : order)
      if (compute_active(e)) active_.insert(e.get());
    if (!active_.count(root.get())) return;
    pending_[root.get()].push_back(fimm(1.0f));
    for (size_t i = order.size(); i-- > 0;) {
      auto found = pending_.find(order[i].get());
      if (found == pending_.end()) continue;
      Expr adj = found->second.front();
      for (size_t k = 1; k < found->second.size(); ++k) adj = add(adj, found->second[k]);
      pending_.erase(found);
      backprop(order[i], adj, i);
    }
  }

  Expr d_score;                    // null when score_mod does not depend on score
  std::vector<LoadAdjoint> loads;  // loads that need a gradient and got a contribution

 private:
  bool needs_grad(const Load* l) const {
    return l->type == Type::Float && l->buffer >= 0 && static_cast<size_t>(l->buffer) < buffers_.size() &&
           buffers_[l->buffer].requires_grad;
  }

  bool active(const Expr& e) const { return active_.count(e.get()) != 0; }

  bool compute_active(const Expr& e) const {
    if (e.type() != Type::Float) return false;
    switch (e.kind()) {
      case NodeKind::Var: return e.as<Var>()->var == dsl::VarId::Score;
      case NodeKind::Load: return needs_grad(e.as<Load>());
      case NodeKind::Unary: {
        const Unary* u = e.as<Unary>();
        switch (u->op) {
          case UnaryOp::Sign: case UnaryOp::Floor: case UnaryOp::Ceil: case UnaryOp::Round: return false;
          default: return active(u->a);
        }
      }
      case NodeKind::Binary: {
        const Binary* b = e.as<Binary>();
        if (b->op == BinaryOp::FloorDiv) return false;
        return active(b->a) || active(b->b);
      }
      case NodeKind::Select: return active(e.as<Select>()->t) || active(e.as<Select>()->f);
      default: return false;  // immediates, params, casts from int / bool
    }
  }

  void accumulate(const Expr& e, const Expr& adj) { pending_[e.get()].push_back(adj); }

  void backprop(const Expr& e, const Expr& adj, size_t position) {
    switch (e.kind()) {
      case NodeKind::Var:
        d_score = d_score ? add(d_score, adj) : adj;
        return;
      case NodeKind::Load:
        loads.push_back({position, e, adj});
        return;
      case NodeKind::Unary: return backprop_unary(e, e.as<Unary>(), adj);
      case NodeKind::Binary: return backprop_binary(e, e.as<Binary>(), adj);
      case NodeKind::Select: {
        const Select* s = e.as<Select>();
        if (s->t.same_as(s->f)) {
          accumulate(s->t, adj);
          return;
        }
        // The condition is a constant; the gradient goes to the taken branch only.
        if (active(s->t)) accumulate(s->t, select(s->cond, adj, fimm(0.0f)));
        if (active(s->f)) accumulate(s->f, select(s->cond, fimm(0.0f), adj));
        return;
      }
      default: return;
    }
  }

  // e = op(x); x's contribution is adj * op'(x), written with e where that is cheaper
  // (exp, sqrt, tanh, sigmoid reuse the forward value), as PyTorch's formulas do.
  void backprop_unary(const Expr& e, const Unary* u, const Expr& adj) {
    const Expr& x = u->a;
    if (!active(x)) return;
    Expr d;
    switch (u->op) {
      case UnaryOp::Neg: d = neg(adj); break;
      case UnaryOp::Abs: d = mul(adj, call(UnaryOp::Sign, x)); break;  // sign(0) = 0: abs'(0) = 0
      case UnaryOp::Exp: d = mul(adj, e); break;
      case UnaryOp::Exp2: d = mul(adj, mul(e, fimm(kLn2))); break;
      case UnaryOp::Log: d = div(adj, x); break;
      case UnaryOp::Log2: d = div(adj, mul(x, fimm(kLn2))); break;
      case UnaryOp::Log1p: d = div(adj, add(x, fimm(1.0f))); break;
      case UnaryOp::Sqrt: d = div(adj, mul(e, fimm(2.0f))); break;
      case UnaryOp::Rsqrt: d = mul(adj, mul(mul(mul(e, e), e), fimm(-0.5f))); break;
      case UnaryOp::Tanh: d = mul(adj, sub(fimm(1.0f), mul(e, e))); break;
      case UnaryOp::Sigmoid: d = mul(adj, mul(e, sub(fimm(1.0f), e))); break;
      case UnaryOp::Sin: d = mul(adj, call(UnaryOp::Cos, x)); break;
      case UnaryOp::Cos: d = neg(mul(adj, call(UnaryOp::Sin, x))); break;
      default: return;  // sign, floor, ceil, round: derivative 0; !, ~ are not float ops
    }
    accumulate(x, d);
  }

  void backprop_binary(const Expr& e, const Binary* b, const Expr& adj) {
    const Expr& x = b->a;
    const Expr& y = b->b;
    bool ax = active(x), ay = active(y);
    switch (b->op) {
      case BinaryOp::Add:
        if (ax) accumulate(x, adj);
        if (ay) accumulate(y, adj);
        return;
      case BinaryOp::Sub:
        if (ax) accumulate(x, adj);
        if (ay) accumulate(y, neg(adj));
        return;
      case BinaryOp::Mul:
        if (ax) accumulate(x, mul(adj, y));
        if (ay) accumulate(y, mul(adj, x));
        return;
      case BinaryOp::Div:
        if (ax) accumulate(x, div(adj, y));
        if (ay) accumulate(y, neg(mul(adj, div(e, y))));  // -adj * (x / y) / y
        return;
      case BinaryOp::Mod:
        // x % y = x - floor(x / y) * y (PyTorch's remainder backward).
        if (ax) accumulate(x, adj);
        if (ay) accumulate(y, neg(mul(adj, bin(BinaryOp::FloorDiv, x, y))));
        return;
      case BinaryOp::Min:
      case BinaryOp::Max: {
        // The gradient goes to the operand whose value was selected (the first one on a
        // tie; a NaN operand is never selected, as the forward never returns it over a number).
        Expr took_x = bin(BinaryOp::EQ, e, x);
        if (ax) accumulate(x, select(took_x, adj, fimm(0.0f)));
        if (ay) accumulate(y, select(took_x, fimm(0.0f), adj));
        return;
      }
      case BinaryOp::Pow:
        // PyTorch's pow_backward_self / pow_backward_exponent: no gradient into the base when
        // the exponent is 0, none into the exponent when the base is 0 and the exponent >= 0;
        // otherwise pow(x, y) * log(x), NaN for a negative base.
        if (ax)
          accumulate(x, select(bin(BinaryOp::EQ, y, fimm(0.0f)), fimm(0.0f),
                               mul(adj, mul(y, bin(BinaryOp::Pow, x, sub(y, fimm(1.0f)))))));
        if (ay)
          accumulate(y, select(bin(BinaryOp::And, bin(BinaryOp::EQ, x, fimm(0.0f)), bin(BinaryOp::GE, y, fimm(0.0f))), fimm(0.0f),
                               mul(adj, mul(e, call(UnaryOp::Log, x)))));
        return;
      default: return;  // float // has derivative 0; the rest are not float-valued
    }
  }

  const std::vector<dsl::BufferDecl>& buffers_;
  std::unordered_set<const Node*> active_;
  std::unordered_map<const Node*, std::vector<Expr>> pending_;
};

}  // namespace

ScoreModGradient differentiate_score_mod(const SpecIR& ir) {
  ScoreModGradient out;
  // Canonical forward nodes first, so that two structurally equal loads are one load (one
  // scatter whose coefficient sums both uses).
  std::vector<Expr> forward = cse({ir.score_mod, ir.mask_mod});
  out.score_mod = forward[0];
  out.mask_mod = forward[1];
  if (!out.score_mod) {
    out.d_score = fimm(1.0f);
    return out;
  }

  ReverseAccumulator acc(ir.spec().buffers);
  acc.run(out.score_mod);
  out.d_score = simplify(acc.d_score ? acc.d_score : fimm(0.0f));

  std::vector<LoadAdjoint> loads = acc.loads;
  std::sort(loads.begin(), loads.end(), [](const LoadAdjoint& a, const LoadAdjoint& b) {
    int ba = a.load.as<Load>()->buffer, bb = b.load.as<Load>()->buffer;
    return ba != bb ? ba < bb : a.position < b.position;
  });
  for (const LoadAdjoint& l : loads) {
    Expr coefficient = simplify(l.adjoint);
    // An exact zero (`t[h] * 0.0`) would add nothing; no scatter is emitted for it.
    if (is_float_imm(coefficient, 0.0f) || is_float_imm(coefficient, -0.0f)) continue;
    out.scatters.push_back({l.load.as<Load>()->buffer, l.load.as<Load>()->indices, coefficient});
  }

  // One CSE over everything, forward first: the forward nodes are already canonical, so they
  // stay as they are and equal subexpressions of the derivatives become those very nodes.
  std::vector<Expr> roots = {out.score_mod, out.mask_mod, out.d_score};
  for (const GradScatter& s : out.scatters) {
    roots.push_back(s.coefficient);
    roots.insert(roots.end(), s.indices.begin(), s.indices.end());
  }
  roots = cse(roots);
  size_t k = 0;
  out.score_mod = roots[k++];
  out.mask_mod = roots[k++];
  out.d_score = roots[k++];
  for (GradScatter& s : out.scatters) {
    s.coefficient = roots[k++];
    for (Expr& i : s.indices) i = roots[k++];
  }
  return out;
}

}  // namespace flexjit
