#include "compiler/passes/simplify.h"

#include <unordered_map>
#include <utility>

#include "compiler/ir/ir_equality.h"
#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/scalar_ops.h"

namespace flexjit::ir {

namespace {

bool is_int(const Expr& e, int64_t v) {
  const IntImm* i = e.as<IntImm>();
  return i && i->value == v;
}
bool is_bool(const Expr& e, bool v) {
  const BoolImm* b = e.as<BoolImm>();
  return b && b->value == v;
}
// Bitwise, so that -0.0 and 0.0 are told apart.
bool is_float_bits(const Expr& e, float v) {
  const FloatImm* f = e.as<FloatImm>();
  return f && scalar::float_bits(f->value) == scalar::float_bits(v);
}

// The comparison with its operands swapped: a < b  <=>  b > a.
BinaryOp flip(BinaryOp op) {
  switch (op) {
    case BinaryOp::LT: return BinaryOp::GT;
    case BinaryOp::LE: return BinaryOp::GE;
    case BinaryOp::GT: return BinaryOp::LT;
    case BinaryOp::GE: return BinaryOp::LE;
    default: return op;
  }
}

// !(a op b) for ints.
BinaryOp negate_int_comparison(BinaryOp op) {
  switch (op) {
    case BinaryOp::LT: return BinaryOp::GE;
    case BinaryOp::LE: return BinaryOp::GT;
    case BinaryOp::GT: return BinaryOp::LE;
    case BinaryOp::GE: return BinaryOp::LT;
    case BinaryOp::EQ: return BinaryOp::NE;
    default: return BinaryOp::EQ;
  }
}

class Simplifier : public IRMutator {
 protected:
  Expr visit(const Unary*, const Expr& e) override { return simp(mutate_children(e)); }
  Expr visit(const Binary*, const Expr& e) override { return simp(mutate_children(e)); }
  Expr visit(const Select*, const Expr& e) override { return simp(mutate_children(e)); }
  Expr visit(const Cast*, const Expr& e) override { return simp(mutate_children(e)); }

 private:
  // True if evaluating e may raise a checked-mode flag: such a subexpression is never dropped
  // from a position where it would have been evaluated.
  bool may_flag(const Expr& e) {
    auto it = flag_memo_.find(e.get());
    if (it != flag_memo_.end()) return it->second.second;
    bool r = false;
    if (e.kind() == NodeKind::Load) {
      r = true;
    } else if (const Binary* b = e.as<Binary>();
               b && e.type() == Type::Int && (b->op == BinaryOp::FloorDiv || b->op == BinaryOp::Mod) && !(b->b.as<IntImm>() && !is_int(b->b, 0))) {
      r = true;
    }
    if (!r)
      for (const Expr& c : children(e))
        if (may_flag(c)) {
          r = true;
          break;
        }
    flag_memo_.emplace(e.get(), std::make_pair(e, r));  // holds e so its address is not reused
    return r;
  }

  Expr bin(BinaryOp op, const Expr& a, const Expr& b) { return simp(Binary::make(op, a, b)); }
  Expr un(UnaryOp op, const Expr& a) { return simp(Unary::make(op, a)); }

  // x + k, printed as x - |k| for negative k.
  Expr add_const(const Expr& x, int64_t k) {
    if (k == 0) return x;
    if (k < 0 && k != INT64_MIN) return Binary::make(BinaryOp::Sub, x, make_int(-k));
    return Binary::make(BinaryOp::Add, x, make_int(k));
  }

  // Splits e into x + k when e is `x + imm` or `x - imm`.
  static bool split_offset(const Expr& e, Expr* x, int64_t* k) {
    const Binary* b = e.as<Binary>();
    if (!b || e.type() != Type::Int || !b->b.as<IntImm>()) return false;
    if (b->op == BinaryOp::Add) {
      *x = b->a;
      *k = b->b.as<IntImm>()->value;
      return true;
    }
    if (b->op == BinaryOp::Sub) {
      *x = b->a;
      *k = scalar::wrap_neg(b->b.as<IntImm>()->value);
      return true;
    }
    return false;
  }

  Expr simp(const Expr& in) {
    Expr e = fold_node(in);
    if (is_immediate(e)) return e;
    switch (e.kind()) {
      case NodeKind::Unary: return unary(e);
      case NodeKind::Binary: return binary(e);
      case NodeKind::Select: return select(e);
      default: return e;
    }
  }

  Expr unary(const Expr& e) {
    const Unary* u = e.as<Unary>();
    const Unary* inner = u->a.as<Unary>();
    // --x, !!x, ~~x are x (also for INT64_MIN under wrapping, and bitwise for floats).
    if (inner && inner->op == u->op && (u->op == UnaryOp::Neg || u->op == UnaryOp::Not || u->op == UnaryOp::BitNot)) return inner->a;
    if (u->op == UnaryOp::Not) {
      if (const Binary* c = u->a.as<Binary>()) {
        // !(a == b) is a != b for every type (IEEE != is the negation of ==); the ordered
        // comparisons only negate for ints (NaN makes both a < b and a >= b false).
        if (c->op == BinaryOp::EQ || c->op == BinaryOp::NE || (binary_op_is_comparison(c->op) && c->a.type() == Type::Int))
          return bin(negate_int_comparison(c->op), c->a, c->b);
      }
    }
    return e;
  }

  Expr select(const Expr& e) {
    const Select* s = e.as<Select>();
    if (const BoolImm* c = s->cond.as<BoolImm>()) return c->value ? s->t : s->f;  // the other branch is never evaluated
    if (equal(s->t, s->f) && !may_flag(s->cond)) return s->t;
    if (const Unary* n = s->cond.as<Unary>(); n && n->op == UnaryOp::Not) return simp(Select::make(n->a, s->f, s->t));
    if (e.type() == Type::Bool) {
      if (is_bool(s->t, true) && is_bool(s->f, false)) return s->cond;
      if (is_bool(s->t, false) && is_bool(s->f, true)) return un(UnaryOp::Not, s->cond);
    }
    return e;
  }

  Expr binary(const Expr& e) {
    const Binary* bn = e.as<Binary>();
    BinaryOp op = bn->op;
    Expr a = bn->a, b = bn->b;
    Type t = a.type();
    // Canonical order: the constant on the right. && and || keep their order (the right
    // operand is only evaluated when the left does not decide). Float min/max are commutative
    // as scalar_ops.h defines them (-0.0 < +0.0; a NaN yields the other operand).
    bool swappable = binary_op_is_comparison(op) ||
                     (binary_op_is_commutative(op) && op != BinaryOp::And && op != BinaryOp::Or);
    if (swappable && is_immediate(a) && !is_immediate(b)) return bin(flip(op), b, a);

    if (t == Type::Int) return int_binary(e, op, a, b);
    if (t == Type::Float) return float_binary(e, op, a, b);
    return bool_binary(e, op, a, b);
  }

  Expr int_binary(const Expr& e, BinaryOp op, const Expr& a, const Expr& b) {
    const IntImm* cb = b.as<IntImm>();
    bool same = equal(a, b);
    switch (op) {
      case BinaryOp::Add:
      case BinaryOp::Sub: {
        if (cb) {
          int64_t k = op == BinaryOp::Add ? cb->value : scalar::wrap_neg(cb->value);
          Expr x;
          int64_t k1;
          // (x + c1) + c2 -> x + (c1 + c2): exact under wrapping arithmetic.
          if (split_offset(a, &x, &k1)) return add_const(x, scalar::wrap_add(k1, k));
          if (k == 0) return a;
          return op == BinaryOp::Sub && k < 0 && k != INT64_MIN ? e : add_const(a, k);
        }
        if (op == BinaryOp::Sub && same && !may_flag(a)) return make_int(0);
        if (const Unary* n = b.as<Unary>(); n && n->op == UnaryOp::Neg)  // x + -y -> x - y, x - -y -> x + y
          return bin(op == BinaryOp::Add ? BinaryOp::Sub : BinaryOp::Add, a, n->a);
        return e;
      }
      case BinaryOp::Mul:
        if (cb) {
          if (cb->value == 1) return a;
          if (cb->value == 0 && !may_flag(a)) return b;
          if (cb->value == -1) return un(UnaryOp::Neg, a);
          const Binary* ab = a.as<Binary>();
          if (ab && ab->op == BinaryOp::Mul && ab->b.as<IntImm>())
            return bin(BinaryOp::Mul, ab->a, make_int(scalar::wrap_mul(ab->b.as<IntImm>()->value, cb->value)));
        }
        return e;
      case BinaryOp::FloorDiv:
        if (cb) {
          if (cb->value == 1) return a;
          // (x // c1) // c2 -> x // (c1 * c2) for positive c1, c2 (floor of floor is floor).
          const Binary* ab = a.as<Binary>();
          int64_t prod;
          if (cb->value > 0 && ab && ab->op == BinaryOp::FloorDiv && ab->b.as<IntImm>() && ab->b.as<IntImm>()->value > 0 &&
              !__builtin_mul_overflow(ab->b.as<IntImm>()->value, cb->value, &prod))
            return bin(BinaryOp::FloorDiv, ab->a, make_int(prod));
        }
        return e;
      case BinaryOp::Mod:
        if (cb && (cb->value == 1 || cb->value == -1) && !may_flag(a)) return make_int(0);
        return e;
      case BinaryOp::Min:
      case BinaryOp::Max: {
        if (same) return a;
        const Binary* ab = a.as<Binary>();
        if (cb && ab && ab->op == op && ab->b.as<IntImm>()) {
          int64_t c1 = ab->b.as<IntImm>()->value;
          int64_t c = op == BinaryOp::Min ? std::min(c1, cb->value) : std::max(c1, cb->value);
          return bin(op, ab->a, make_int(c));
        }
        return e;
      }
      case BinaryOp::EQ: case BinaryOp::LE: case BinaryOp::GE:
        return same && !may_flag(a) ? make_bool(true) : e;
      case BinaryOp::NE: case BinaryOp::LT: case BinaryOp::GT:
        return same && !may_flag(a) ? make_bool(false) : e;
      case BinaryOp::BitAnd:
        if (same || is_int(b, -1)) return a;
        if (is_int(b, 0) && !may_flag(a)) return b;
        return e;
      case BinaryOp::BitOr:
        if (same || is_int(b, 0)) return a;
        if (is_int(b, -1) && !may_flag(a)) return b;
        return e;
      case BinaryOp::BitXor:
        if (is_int(b, 0)) return a;
        if (same && !may_flag(a)) return make_int(0);
        return e;
      case BinaryOp::Shl:
      case BinaryOp::Shr:
        return is_int(b, 0) ? a : e;
      default: return e;
    }
  }

  Expr float_binary(const Expr& e, BinaryOp op, const Expr& a, const Expr& b) {
    switch (op) {
      case BinaryOp::Add: return is_float_bits(b, -0.0f) ? a : e;  // x + -0.0 == x for every x, unlike x + 0.0
      case BinaryOp::Sub: return is_float_bits(b, 0.0f) ? a : e;
      case BinaryOp::Mul:
      case BinaryOp::Div: return is_float_bits(b, 1.0f) ? a : e;
      case BinaryOp::Min:
      case BinaryOp::Max: return equal(a, b) ? a : e;
      default: return e;
    }
  }

  Expr bool_binary(const Expr& e, BinaryOp op, const Expr& a, const Expr& b) {
    bool same = equal(a, b);
    switch (op) {
      case BinaryOp::And:
        if (is_bool(a, true)) return b;
        if (is_bool(a, false)) return a;  // b is never evaluated
        if (is_bool(b, true) || same) return a;
        if (is_bool(b, false) && !may_flag(a)) return b;
        return e;
      case BinaryOp::Or:
        if (is_bool(a, false)) return b;
        if (is_bool(a, true)) return a;
        if (is_bool(b, false) || same) return a;
        if (is_bool(b, true) && !may_flag(a)) return b;
        return e;
      case BinaryOp::Xor:
      case BinaryOp::NE:
        if (is_bool(b, false)) return a;
        if (is_bool(b, true)) return un(UnaryOp::Not, a);
        if (same && !may_flag(a)) return make_bool(false);
        return e;
      case BinaryOp::EQ:
        if (is_bool(b, true)) return a;
        if (is_bool(b, false)) return un(UnaryOp::Not, a);
        if (same && !may_flag(a)) return make_bool(true);
        return e;
      default: return e;
    }
  }

  std::unordered_map<const Node*, std::pair<Expr, bool>> flag_memo_;
};

}  // namespace

Expr simplify(const Expr& e) { return Simplifier().mutate(e); }

}  // namespace flexjit::ir
