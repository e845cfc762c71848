#include "compiler/passes/range_analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/ir_printer.h"

namespace flexjit {

using namespace ir;
using dsl::VarId;

namespace {

// ---------------------------------------------------------------------------------------
// Static constant bounds. Arithmetic is in 128 bits and saturates at +-kInf, which stands
// for "unbounded" (every finite quantity here stays far below 2^100).
using i128 = __int128;
constexpr i128 kInf = static_cast<i128>(1) << 100;
constexpr i128 kSymbolMax = (static_cast<i128>(1) << 31) - 1;  // documented limit of a symbol's value
constexpr i128 kSafe = static_cast<i128>(1) << 63;              // sums of |terms| below this cannot overflow int64
constexpr i128 kInt64Min = std::numeric_limits<int64_t>::min();
constexpr i128 kInt64Max = std::numeric_limits<int64_t>::max();
constexpr size_t kMaxBoundNodes = 256;                          // larger bounds are dropped (kept unbounded)
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

i128 sat(i128 v) { return v > kInf ? kInf : v < -kInf ? -kInf : v; }
i128 abs128(i128 v) { return v < 0 ? -v : v; }

i128 smul(i128 a, i128 b) {
  if (a == 0 || b == 0) return 0;
  bool neg = (a < 0) != (b < 0);
  if (abs128(a) >= kInf || abs128(b) >= kInf) return neg ? -kInf : kInf;
  i128 r;
  if (__builtin_mul_overflow(a, b, &r)) return neg ? -kInf : kInf;
  return sat(r);
}

// Sums of lower (or upper) bounds: one infinite term makes the sum infinite.
i128 sadd(i128 a, i128 b) {
  if (a <= -kInf || b <= -kInf) return -kInf;
  if (a >= kInf || b >= kInf) return kInf;
  return sat(a + b);
}

i128 floordiv128(i128 a, i128 c) {
  if (abs128(a) >= kInf) return (a < 0) != (c < 0) ? -kInf : kInf;
  i128 q = a / c;
  if (a % c != 0 && ((a < 0) != (c < 0))) --q;
  return q;
}

i128 floormod128(i128 a, i128 c) {
  i128 r = a % c;
  if (r != 0 && ((r < 0) != (c < 0))) r += c;
  return r;
}

struct SB {
  i128 lo = -kInf, hi = kInf;
};

enum class Tri { True, False, Unknown };

// ---------------------------------------------------------------------------------------
// Linear forms: const + sum(coef * atom). Atoms are symbols, products of atoms (monomials)
// and other subterms (floordiv/mod by constants, min, max, ...) with canonical operands.
struct Term {
  Expr atom;
  i128 coef = 0;
};

struct Lin {
  i128 c = 0;
  std::map<std::string, Term> terms;  // by atom key; the key order is the printing order
  bool is_const() const { return terms.empty(); }
};

Lin lin_const(i128 c) {
  Lin l;
  l.c = c;
  return l;
}

void add_term(Lin& l, const std::string& key, const Expr& atom, i128 coef) {
  if (coef == 0) return;
  auto it = l.terms.find(key);
  if (it == l.terms.end()) {
    l.terms.emplace(key, Term{atom, coef});
  } else {
    it->second.coef += coef;
    if (it->second.coef == 0) l.terms.erase(it);
  }
}

Lin lin_scale(const Lin& a, i128 k) {
  Lin r;
  if (k == 0) return r;
  r.c = smul(a.c, k);
  for (const auto& [key, t] : a.terms) r.terms.emplace(key, Term{t.atom, smul(t.coef, k)});
  return r;
}

Lin lin_add(const Lin& a, const Lin& b, i128 kb = 1) {
  Lin r = a;
  r.c = sat(r.c + smul(b.c, kb));
  for (const auto& [key, t] : b.terms) add_term(r, key, t.atom, smul(t.coef, kb));
  return r;
}

bool fits64(i128 v) { return v >= kInt64Min && v <= kInt64Max; }

class Analyzer {
 public:
  Analyzer(const dsl::CheckedSpec& spec) : spec_(spec) {}

  // --- canonical bound expressions ---

  Lin lin(const Expr& e) {
    Facts& f = facts(e);
    if (!f.lin) f.lin = compute_lin(e);
    return *f.lin;
  }

  // The canonical expression of a linear form; null if a coefficient does not fit in int64.
  Expr expr(const Lin& l) {
    for (const auto& [key, t] : l.terms)
      if (!fits64(t.coef) || t.coef == kInt64Min) return {};
    if (!fits64(l.c) || l.c == kInt64Min) return {};
    auto scaled = [](const Term& t, i128 k) {
      return k == 1 ? t.atom : Binary::make(BinaryOp::Mul, t.atom, make_int(static_cast<int64_t>(k)));
    };
    Expr acc;
    bool const_used = false;
    for (const auto& [key, t] : l.terms)
      if (t.coef > 0) acc = acc ? Binary::make(BinaryOp::Add, acc, scaled(t, t.coef)) : scaled(t, t.coef);
    for (const auto& [key, t] : l.terms) {
      if (t.coef > 0) continue;
      if (!acc) {
        if (l.c > 0) {
          acc = Binary::make(BinaryOp::Sub, make_int(static_cast<int64_t>(l.c)), scaled(t, -t.coef));
          const_used = true;
        } else {
          acc = t.coef == -1 ? Unary::make(UnaryOp::Neg, t.atom) : scaled(t, t.coef);
        }
      } else {
        acc = Binary::make(BinaryOp::Sub, acc, scaled(t, -t.coef));
      }
    }
    if (!acc) return make_int(static_cast<int64_t>(l.c));
    if (!const_used && l.c > 0) acc = Binary::make(BinaryOp::Add, acc, make_int(static_cast<int64_t>(l.c)));
    if (!const_used && l.c < 0) acc = Binary::make(BinaryOp::Sub, acc, make_int(static_cast<int64_t>(-l.c)));
    return acc;
  }

  Expr canon(const Expr& e) { return e ? expr(lin(e)) : e; }

  // --- static bounds and the prover ---

  SB sb(const Lin& l) {
    SB r{l.c, l.c};
    for (const auto& [key, t] : l.terms) {
      SB a = sb_atom(t.atom);
      if (t.coef > 0) {
        r.lo = sadd(r.lo, smul(t.coef, a.lo));
        r.hi = sadd(r.hi, smul(t.coef, a.hi));
      } else {
        r.lo = sadd(r.lo, smul(t.coef, a.hi));
        r.hi = sadd(r.hi, smul(t.coef, a.lo));
      }
    }
    return r;
  }
  SB sb(const Expr& e) { return sb(lin(e)); }

  // Decides d >= 0 for every symbol binding: true, false (violated for every binding), or unknown.
  Tri nonneg(const Lin& d) {
    SB b = sb(d);
    if (b.lo >= 0) return Tri::True;
    if (b.hi < 0) return Tri::False;
    return Tri::Unknown;
  }
  bool provably_le(const Expr& a, const Expr& b) { return a && b && nonneg(lin_add(lin(b), lin(a), -1)) == Tri::True; }
  bool provably_nonneg(const Expr& a) { return a && nonneg(lin(a)) == Tri::True; }
  bool provably_nonpos(const Expr& a) { return a && nonneg(lin_scale(lin(a), -1)) == Tri::True; }

  // True if e can be evaluated in 64-bit arithmetic without overflow for every binding.
  bool safe(const Expr& e) {
    if (!e) return false;
    Facts& f = facts(e);
    if (!f.safe) f.safe = compute_safe(lin(e));
    return *f.safe;
  }

  // The size of e written out as a tree (saturating): bounds are printed and compared as
  // text, so one built from shared sub-bounds must not grow exponentially.
  size_t tree_size(const Expr& e) {
    Facts& f = facts(e);
    if (!f.tree_size) {
      size_t n = 1;
      for (const Expr& c : children(e)) n = std::min(n + tree_size(c), kMaxBoundNodes + 1);
      f.tree_size = n;
    }
    return *f.tree_size;
  }

  Expr smart_min(const Expr& a, const Expr& b) { return min_max(BinaryOp::Min, a, b); }
  Expr smart_max(const Expr& a, const Expr& b) { return min_max(BinaryOp::Max, a, b); }

  // d >= 0 decided statically, or recorded as a residual condition `N <= P` (P and N the
  // positive and negated negative parts of d).
  Tri require_nonneg(const Lin& d, std::vector<Expr>& residuals) {
    Tri t = nonneg(d);
    if (t != Tri::Unknown) return t;
    Lin p, n;
    if (d.c > 0) p.c = d.c;
    else n.c = -d.c;
    for (const auto& [key, term] : d.terms) {
      if (term.coef > 0) p.terms.emplace(key, term);
      else n.terms.emplace(key, Term{term.atom, -term.coef});
    }
    Expr pe = expr(p), ne = expr(n);
    if (!pe || !ne || !safe(pe) || !safe(ne)) return Tri::False;  // not decidable at launch either
    residuals.push_back(Binary::make(BinaryOp::LE, ne, pe));
    return t;
  }

  Expr symbol(const std::string& name) {
    int i = spec_.symbol_index(name);
    if (i < 0) throw std::logic_error("flexjit internal error: the spec has no symbol " + name);
    return Symbol::make(i, name);
  }

 private:
  struct Facts {
    Expr keep;  // holds the node so that its address is not reused while cached
    std::optional<Lin> lin;
    std::optional<SB> sb_atom;
    std::optional<bool> safe;
    std::optional<size_t> tree_size;
  };

  Facts& facts(const Expr& e) {
    auto it = facts_.find(e.get());
    if (it != facts_.end()) return it->second;
    Facts& f = facts_[e.get()];
    f.keep = e;
    return f;
  }

  static std::string atom_key(const Expr& atom) {
    // Symbols first (in symbol-table order), then other atoms, immediates last.
    if (const Symbol* s = atom.as<Symbol>()) return fmt::format("A{:06d}", s->index);
    if (atom.as<IntImm>()) return "Z" + print_inline(atom);
    return "B" + print_inline(atom);
  }

  Lin atom_lin(const Expr& atom) {
    Lin l;
    l.terms.emplace(atom_key(atom), Term{atom, 1});
    return l;
  }

  static std::optional<int64_t> const_of(const Lin& l) {
    if (l.is_const() && fits64(l.c)) return static_cast<int64_t>(l.c);
    return std::nullopt;
  }

  // A monomial atom: the factors (flattened out of nested products) sorted by key.
  Expr monomial(const Expr& x, const Expr& y) {
    std::vector<Expr> factors;
    auto collect = [&factors](const Expr& a, auto&& self) -> void {
      const Binary* b = a.as<Binary>();
      if (b && b->op == BinaryOp::Mul && !b->b.as<IntImm>()) {
        self(b->a, self);
        self(b->b, self);
      } else {
        factors.push_back(a);
      }
    };
    collect(x, collect);
    collect(y, collect);
    std::stable_sort(factors.begin(), factors.end(), [](const Expr& a, const Expr& b) { return atom_key(a) < atom_key(b); });
    Expr acc = factors[0];
    for (size_t i = 1; i < factors.size(); ++i) acc = Binary::make(BinaryOp::Mul, acc, factors[i]);
    return acc;
  }

  Lin compute_lin(const Expr& e) {
    if (const IntImm* i = e.as<IntImm>()) return lin_const(i->value);
    if (e.type() != Type::Int) return atom_lin(e);
    if (const Unary* u = e.as<Unary>(); u && u->op == UnaryOp::Neg) return lin_scale(lin(u->a), -1);
    const Binary* b = e.as<Binary>();
    if (!b) return atom_lin(e);
    switch (b->op) {
      case BinaryOp::Add: return lin_add(lin(b->a), lin(b->b));
      case BinaryOp::Sub: return lin_add(lin(b->a), lin(b->b), -1);
      case BinaryOp::Mul: {
        Lin la = lin(b->a), lb = lin(b->b);
        if (la.is_const()) return lin_scale(lb, la.c);
        if (lb.is_const()) return lin_scale(la, lb.c);
        if ((la.terms.size() + 1) * (lb.terms.size() + 1) > 16) break;
        Lin r = lin_const(smul(la.c, lb.c));
        for (const auto& [k, t] : la.terms) add_term(r, k, t.atom, smul(t.coef, lb.c));
        for (const auto& [k, t] : lb.terms) add_term(r, k, t.atom, smul(t.coef, la.c));
        for (const auto& [ka, ta] : la.terms)
          for (const auto& [kb, tb] : lb.terms) {
            Expr m = monomial(ta.atom, tb.atom);
            add_term(r, atom_key(m), m, smul(ta.coef, tb.coef));
          }
        return r;
      }
      case BinaryOp::FloorDiv:
      case BinaryOp::Mod: {
        Lin lx = lin(b->a), ld = lin(b->b);
        auto c = const_of(ld);
        if (!c || *c == 0) break;
        bool divisible = true;
        for (const auto& [k, t] : lx.terms) divisible = divisible && t.coef % *c == 0;
        if (b->op == BinaryOp::FloorDiv) {
          if (divisible) {  // (c*K + r) // c == K + r // c
            Lin r = lin_const(floordiv128(lx.c, *c));
            for (const auto& [k, t] : lx.terms) r.terms.emplace(k, Term{t.atom, t.coef / *c});
            return r;
          }
          Expr x = expr(lx);
          if (!x) break;
          return atom_lin(Binary::make(BinaryOp::FloorDiv, x, make_int(*c)));
        }
        if (divisible) return lin_const(floormod128(lx.c, *c));  // (c*K + r) % c == r % c
        Expr x = expr(lx);
        if (!x) break;
        return atom_lin(Binary::make(BinaryOp::Mod, x, make_int(*c)));
      }
      case BinaryOp::Min:
      case BinaryOp::Max: {
        Expr x = canon(b->a), y = canon(b->b);
        if (!x || !y) break;
        Expr m = min_max(b->op, x, y);
        if (m.get() == x.get() || m.get() == y.get()) return lin(m);
        return atom_lin(m);
      }
      default: break;
    }
    return atom_lin(e);
  }

  // min/max of two canonical bounds: one of them when the prover orders them, else a Min/Max
  // atom with its operands in key order. Null (inexpressible) operands give null.
  Expr min_max(BinaryOp op, const Expr& a, const Expr& b) {
    if (!a || !b) return {};  // a bound that could not be expressed: the result is unbounded too
    Lin d = lin_add(lin(b), lin(a), -1);  // b - a
    bool a_le_b = nonneg(d) == Tri::True, b_le_a = nonneg(lin_scale(d, -1)) == Tri::True;
    if (a_le_b) return op == BinaryOp::Min ? a : b;
    if (b_le_a) return op == BinaryOp::Min ? b : a;
    bool swap = atom_key(b) < atom_key(a);
    return Binary::make(op, swap ? b : a, swap ? a : b);
  }

  SB sb_atom(const Expr& atom) {
    Facts& f = facts(atom);
    if (!f.sb_atom) f.sb_atom = compute_sb_atom(atom);
    return *f.sb_atom;
  }

  SB compute_sb_atom(const Expr& atom) {
    if (atom.as<Symbol>()) return {1, kSymbolMax};
    if (const IntImm* i = atom.as<IntImm>()) return {i->value, i->value};
    const Binary* b = atom.as<Binary>();
    if (!b || atom.type() != Type::Int) return {};
    switch (b->op) {
      case BinaryOp::Mul: {
        SB x = sb(b->a), y = sb(b->b);
        i128 p[4] = {smul(x.lo, y.lo), smul(x.lo, y.hi), smul(x.hi, y.lo), smul(x.hi, y.hi)};
        return {*std::min_element(p, p + 4), *std::max_element(p, p + 4)};
      }
      case BinaryOp::FloorDiv: {
        const IntImm* c = b->b.as<IntImm>();
        if (!c || c->value == 0) return {};
        SB x = sb(b->a);
        if (c->value > 0) return {floordiv128(x.lo, c->value), floordiv128(x.hi, c->value)};
        return {floordiv128(x.hi, c->value), floordiv128(x.lo, c->value)};
      }
      case BinaryOp::Mod: {
        const IntImm* c = b->b.as<IntImm>();
        if (!c || c->value == 0) return {};
        if (c->value < 0) return {static_cast<i128>(c->value) + 1, 0};
        SB x = sb(b->a);
        if (x.lo >= 0) return {x.hi <= c->value - 1 ? x.lo : 0, std::min<i128>(x.hi, c->value - 1)};
        return {0, static_cast<i128>(c->value) - 1};
      }
      case BinaryOp::Min: {
        SB x = sb(b->a), y = sb(b->b);
        return {std::min(x.lo, y.lo), std::min(x.hi, y.hi)};
      }
      case BinaryOp::Max: {
        SB x = sb(b->a), y = sb(b->b);
        return {std::max(x.lo, y.lo), std::max(x.hi, y.hi)};
      }
      default: return {};
    }
  }

  bool compute_safe(const Lin& l) {
    i128 mag = abs128(l.c);
    for (const auto& [k, t] : l.terms) {
      if (!safe_atom(t.atom)) return false;
      SB a = sb_atom(t.atom);
      mag = sadd(mag, smul(abs128(t.coef), std::max(abs128(a.lo), abs128(a.hi))));
    }
    return mag < kSafe;
  }

  bool safe_atom(const Expr& atom) {
    if (atom.as<Symbol>() || atom.as<IntImm>()) return true;
    const Binary* b = atom.as<Binary>();
    if (!b || atom.type() != Type::Int) return false;
    switch (b->op) {
      case BinaryOp::Mul: {
        if (!safe(b->a) || !safe(b->b)) return false;
        SB p = sb_atom(atom);
        return std::max(abs128(p.lo), abs128(p.hi)) < kSafe;
      }
      case BinaryOp::FloorDiv:
      case BinaryOp::Mod: return b->b.as<IntImm>() && safe(b->a);
      case BinaryOp::Min:
      case BinaryOp::Max: return safe(b->a) && safe(b->b);
      default: return false;
    }
  }

  const dsl::CheckedSpec& spec_;
  std::unordered_map<const Node*, Facts> facts_;
};

// ---------------------------------------------------------------------------------------
// The interval rules, one Int node at a time (operands first).
class RangeBuilder {
 public:
  RangeBuilder(Analyzer& an, const VarDomains& dom, RangeInfo& out) : an_(an), dom_(dom), out_(out) {}

  Interval compute(const Expr& e) {
    switch (e.kind()) {
      case NodeKind::IntImm:
      case NodeKind::Symbol: return {e, e};
      case NodeKind::Var: {
        const Interval* d = dom_.of(e.as<Var>()->var);
        return d ? Interval{an_.canon(d->lo), an_.canon(d->hi)} : Interval{};
      }
      case NodeKind::Param: return {};
      case NodeKind::Load:
        switch (e.as<Load>()->dtype) {
          case DType::U8: return {make_int(0), make_int(255)};
          case DType::I32: return {make_int(kInt32Min), make_int(kInt32Max)};
          default: return {};
        }
      case NodeKind::Cast:
        if (e.as<Cast>()->a.type() == Type::Bool) return {make_int(0), make_int(1)};
        return {};
      case NodeKind::Unary: return unary(e.as<Unary>());
      case NodeKind::Binary: return binary(e.as<Binary>());
      case NodeKind::Select: {
        const Select* s = e.as<Select>();
        if (const BoolImm* c = s->cond.as<BoolImm>()) return of(c->value ? s->t : s->f);
        Interval t = of(s->t), f = of(s->f);
        return {t.lo && f.lo ? an_.smart_min(t.lo, f.lo) : Expr{}, t.hi && f.hi ? an_.smart_max(t.hi, f.hi) : Expr{}};
      }
      default: return {};
    }
  }

  // Drops bounds that could not be evaluated safely at launch, or that grew too large.
  Interval finish(Interval r) {
    r.lo = an_.canon(r.lo);
    r.hi = an_.canon(r.hi);
    if (r.lo && (!an_.safe(r.lo) || an_.tree_size(r.lo) > kMaxBoundNodes)) r.lo = {};
    if (r.hi && (!an_.safe(r.hi) || an_.tree_size(r.hi) > kMaxBoundNodes)) r.hi = {};
    return r;
  }

 private:
  Interval of(const Expr& e) {
    auto it = out_.ranges.find(e.get());
    return it == out_.ranges.end() ? Interval{} : it->second;
  }

  Expr add(const Expr& a, const Expr& b) { return a && b ? an_.canon(Binary::make(BinaryOp::Add, a, b)) : Expr{}; }
  Expr sub(const Expr& a, const Expr& b) { return a && b ? an_.canon(Binary::make(BinaryOp::Sub, a, b)) : Expr{}; }
  Expr mul(const Expr& a, const Expr& b) { return a && b ? an_.canon(Binary::make(BinaryOp::Mul, a, b)) : Expr{}; }
  Expr neg(const Expr& a) { return a ? an_.canon(Unary::make(UnaryOp::Neg, a)) : Expr{}; }
  Expr fdiv(const Expr& a, int64_t c) { return a ? an_.canon(Binary::make(BinaryOp::FloorDiv, a, make_int(c))) : Expr{}; }

  // The result of an operation that wraps on overflow: valid only when both bounds exist and
  // the true result provably fits in int64 (so no wrap happened); otherwise unbounded.
  Interval wrapping(Interval r) {
    if (!r.lo || !r.hi) return {};
    if (an_.sb(r.lo).lo < kInt64Min || an_.sb(r.hi).hi > kInt64Max) return {};
    return r;
  }

  Interval unary(const Unary* u) {
    Interval a = of(u->a);
    switch (u->op) {
      case UnaryOp::Neg: return wrapping({neg(a.hi), neg(a.lo)});
      case UnaryOp::BitNot: return {a.hi ? sub(neg(a.hi), make_int(1)) : Expr{}, a.lo ? sub(neg(a.lo), make_int(1)) : Expr{}};
      case UnaryOp::Abs:
        if (an_.provably_nonneg(a.lo)) return a;
        if (an_.provably_nonpos(a.hi)) return wrapping({neg(a.hi), neg(a.lo)});
        return wrapping({make_int(0), a.lo && a.hi ? an_.smart_max(neg(a.lo), a.hi) : Expr{}});
      case UnaryOp::Sign:
        if (an_.provably_le(make_int(1), a.lo)) return {make_int(1), make_int(1)};
        if (an_.provably_nonneg(a.lo)) return {make_int(0), make_int(1)};
        if (an_.provably_le(a.hi, make_int(-1))) return {make_int(-1), make_int(-1)};
        if (an_.provably_nonpos(a.hi)) return {make_int(-1), make_int(0)};
        return {make_int(-1), make_int(1)};
      case UnaryOp::Floor:
      case UnaryOp::Ceil:
      case UnaryOp::Round: return a;
      default: return {};
    }
  }

  static std::optional<int64_t> const_int(const Expr& e) {
    if (const IntImm* i = e.as<IntImm>()) return i->value;
    return std::nullopt;
  }

  Interval scale(const Interval& a, int64_t c) {
    Expr k = make_int(c);
    if (c >= 0) return wrapping({mul(a.lo, k), mul(a.hi, k)});
    return wrapping({mul(a.hi, k), mul(a.lo, k)});
  }

  Interval binary(const Binary* b) {
    Interval x = of(b->a), y = of(b->b);
    auto cy = const_int(b->b), cx = const_int(b->a);
    switch (b->op) {
      case BinaryOp::Add: return wrapping({add(x.lo, y.lo), add(x.hi, y.hi)});
      case BinaryOp::Sub: return wrapping({sub(x.lo, y.hi), sub(x.hi, y.lo)});
      case BinaryOp::Mul:
        if (cy) return scale(x, *cy);
        if (cx) return scale(y, *cx);
        return wrapping(product(x, y));
      case BinaryOp::FloorDiv: return floordiv(x, y, cy);
      case BinaryOp::Mod: return mod(x, y, cy);
      case BinaryOp::Min:
        return {x.lo && y.lo ? an_.smart_min(x.lo, y.lo) : Expr{},
                x.hi && y.hi ? an_.smart_min(x.hi, y.hi) : (x.hi ? x.hi : y.hi)};
      case BinaryOp::Max:
        return {x.lo && y.lo ? an_.smart_max(x.lo, y.lo) : (x.lo ? x.lo : y.lo),
                x.hi && y.hi ? an_.smart_max(x.hi, y.hi) : Expr{}};
      case BinaryOp::BitAnd: {
        // x & y with y >= 0 lies in [0, y] (and in [0, x] when x >= 0 too).
        bool xn = an_.provably_nonneg(x.lo), yn = an_.provably_nonneg(y.lo);
        if (xn && yn) return {make_int(0), x.hi && y.hi ? an_.smart_min(x.hi, y.hi) : (x.hi ? x.hi : y.hi)};
        if (xn) return {make_int(0), x.hi};
        if (yn) return {make_int(0), y.hi};
        return {};
      }
      case BinaryOp::BitOr:
      case BinaryOp::BitXor: {
        // For x, y >= 0: max(x, y) <= x | y <= x + y and 0 <= x ^ y <= x + y; when both are
        // below 2^k, so is the result.
        if (!an_.provably_nonneg(x.lo) || !an_.provably_nonneg(y.lo) || !x.hi || !y.hi) return {};
        Expr lo = b->op == BinaryOp::BitOr ? an_.smart_max(x.lo, y.lo) : make_int(0);
        auto hx = const_int(x.hi), hy = const_int(y.hi);
        if (hx && hy) {
          int64_t m = std::max(*hx, *hy), p = 1;
          while (p <= m && p < (int64_t{1} << 62)) p <<= 1;
          if (p > m) return {lo, make_int(p - 1)};
        }
        return wrapping({lo, add(x.hi, y.hi)});
      }
      case BinaryOp::Shl:
        if (cy && *cy >= 0 && *cy <= 62) return scale(x, int64_t{1} << *cy);
        if (cy && (*cy < 0 || *cy > 63)) return {make_int(0), make_int(0)};
        return {};
      case BinaryOp::Shr:
        if (cy && *cy >= 0 && *cy <= 62) return {fdiv(x.lo, int64_t{1} << *cy), fdiv(x.hi, int64_t{1} << *cy)};
        if (cy && *cy < 0) return {make_int(0), make_int(0)};
        if (cy) return {make_int(-1), make_int(0)};
        return {};
      default: return {};
    }
  }

  Interval product(const Interval& x, const Interval& y) {
    if (!x.lo || !x.hi || !y.lo || !y.hi) return {};
    // With one factor's sign known the product is monotone in the other factor, so each
    // bound is one of two corners, picked by the sign of the other factor's bound when
    // that is provable (the sign may differ between symbol bindings otherwise).
    if (an_.provably_nonneg(x.lo)) return {lower_of(x, y.lo), upper_of(x, y.hi)};   // increasing in y
    if (an_.provably_nonpos(x.hi)) return {lower_of(x, y.hi), upper_of(x, y.lo)};   // decreasing in y
    if (an_.provably_nonneg(y.lo)) return {lower_of(y, x.lo), upper_of(y, x.hi)};
    if (an_.provably_nonpos(y.hi)) return {lower_of(y, x.hi), upper_of(y, x.lo)};
    // No sign known: every corner can be the extreme for some binding of the symbols.
    Expr p[4] = {mul(x.lo, y.lo), mul(x.lo, y.hi), mul(x.hi, y.lo), mul(x.hi, y.hi)};
    return {an_.smart_min(an_.smart_min(p[0], p[1]), an_.smart_min(p[2], p[3])),
            an_.smart_max(an_.smart_max(p[0], p[1]), an_.smart_max(p[2], p[3]))};
  }

  // min over v in [lo, hi] of v * k: lo * k when k >= 0, hi * k when k <= 0.
  Expr lower_of(const Interval& v, const Expr& k) {
    if (an_.provably_nonneg(k)) return mul(v.lo, k);
    if (an_.provably_nonpos(k)) return mul(v.hi, k);
    return an_.smart_min(mul(v.lo, k), mul(v.hi, k));
  }
  Expr upper_of(const Interval& v, const Expr& k) {
    if (an_.provably_nonneg(k)) return mul(v.hi, k);
    if (an_.provably_nonpos(k)) return mul(v.lo, k);
    return an_.smart_max(mul(v.lo, k), mul(v.hi, k));
  }

  Interval floordiv(const Interval& x, const Interval& y, std::optional<int64_t> c) {
    if (c) {
      if (*c == 0) return {make_int(0), make_int(0)};
      if (*c > 0) return {fdiv(x.lo, *c), fdiv(x.hi, *c)};
      return {fdiv(x.hi, *c), fdiv(x.lo, *c)};
    }
    // A divisor >= 0: x // d lies between min(x, 0) and max(x, 0) (and d == 0 gives 0).
    if (an_.provably_nonneg(y.lo))
      return {x.lo ? an_.smart_min(x.lo, make_int(0)) : Expr{}, x.hi ? an_.smart_max(x.hi, make_int(0)) : Expr{}};
    return {};
  }

  Interval mod(const Interval& x, const Interval& y, std::optional<int64_t> c) {
    if (c) {
      if (*c == 0) return {make_int(0), make_int(0)};
      if (*c < 0) return {make_int(*c + 1), make_int(0)};
      Expr top = make_int(*c - 1);
      if (an_.provably_nonneg(x.lo)) {
        if (an_.provably_le(x.hi, top)) return x;
        return {make_int(0), x.hi ? an_.smart_min(top, x.hi) : top};
      }
      return {make_int(0), top};
    }
    if (an_.provably_nonneg(y.lo) && y.hi) {
      Expr top = an_.smart_max(sub(y.hi, make_int(1)), make_int(0));
      if (an_.provably_nonneg(x.lo) && x.hi) top = an_.smart_min(top, x.hi);
      return {make_int(0), top};
    }
    if (an_.provably_nonpos(y.hi) && y.lo) return {an_.smart_min(add(y.lo, make_int(1)), make_int(0)), make_int(0)};
    return {};
  }

  Analyzer& an_;
  const VarDomains& dom_;
  RangeInfo& out_;
};

// The conjunction of residual conditions `N <= P`, without duplicates; of several
// `N <= constant` with the same N only the tightest is kept.
Expr conjunction(const std::vector<Expr>& conds) {
  std::vector<Expr> kept;
  std::unordered_map<std::string, size_t> by_text, by_lhs;
  for (const Expr& c : conds) {
    if (!by_text.emplace(print_inline(c), kept.size()).second) continue;
    const Binary* le = c.as<Binary>();
    if (le && le->op == BinaryOp::LE && le->b.as<IntImm>()) {
      auto [it, fresh] = by_lhs.emplace(print_inline(le->a), kept.size());
      if (!fresh) {
        Expr& old = kept[it->second];
        if (le->b.as<IntImm>()->value < old.as<Binary>()->b.as<IntImm>()->value) old = c;
        continue;
      }
    }
    kept.push_back(c);
  }
  Expr acc;
  for (const Expr& c : kept) acc = acc ? Binary::make(BinaryOp::And, acc, c) : c;
  return acc;
}

Interval span(Analyzer& an, const char* lo_sym, const char* hi_sym) {
  Expr lo = lo_sym ? an.symbol(lo_sym) : make_int(0);
  return {lo, Binary::make(BinaryOp::Sub, an.symbol(hi_sym), make_int(1))};
}

}  // namespace

// ---------------------------------------------------------------------------------------

VarDomains VarDomains::forward(const dsl::CheckedSpec& spec) {
  Analyzer an(spec);
  VarDomains d;
  d.b = span(an, nullptr, "B");
  d.h = span(an, nullptr, "H");
  d.kv_head = span(an, nullptr, "Hkv");
  d.q = span(an, nullptr, "Sq");
  d.kv = span(an, nullptr, "Skv");
  return d;
}

const Interval* VarDomains::of(VarId v) const {
  switch (v) {
    case VarId::B: return &b;
    case VarId::H: return &h;
    case VarId::KvHead: return &kv_head;
    case VarId::Q: return &q;
    case VarId::KV: return &kv;
    case VarId::TileStart: return &tile_start;
    case VarId::TileCol: return &tile_col;
    case VarId::Score: return nullptr;
  }
  return nullptr;
}

const LoadCheck* RangeInfo::check_of(const Expr& load) const {
  for (const LoadCheck& c : loads)
    if (c.load.same_as(load)) return &c;
  return nullptr;
}

std::string RangeInfo::describe(const Expr& e) const {
  auto it = ranges.find(e.get());
  if (it == ranges.end()) return "[-inf, +inf]";
  return fmt::format("[{}, {}]", it->second.lo ? print_inline(it->second.lo) : "-inf", it->second.hi ? print_inline(it->second.hi) : "+inf");
}

RangeInfo analyze_ranges(const std::vector<Expr>& roots, const dsl::CheckedSpec& spec, const VarDomains& domains) {
  RangeInfo out;
  out.roots = roots;
  Analyzer an(spec);
  RangeBuilder rb(an, domains, out);
  std::vector<Expr> int32_conds;
  for_each_node(out.roots, [&](const Expr& e) {
    if (e.type() == Type::Int) {
      Interval r = rb.finish(rb.compute(e));
      out.ranges.emplace(e.get(), r);
      if (!r.lo || !r.hi) {
        out.unbounded_ints.insert(e.get());
      } else {
        std::vector<Expr> conds;
        Tri lo_ok = an.require_nonneg(lin_add(an.lin(r.lo), lin_const(-static_cast<i128>(kInt32Min)), 1), conds);
        Tri hi_ok = an.require_nonneg(lin_add(lin_const(kInt32Max), an.lin(r.hi), -1), conds);
        // Strictly inside for every binding of the symbols: a runtime int parameter saturated to int32 compares with
        // such a value exactly (codegen_cuda.cpp, narrow_param).
        std::vector<Expr> strict_conds;
        if (an.require_nonneg(lin_add(an.lin(r.lo), lin_const(-static_cast<i128>(kInt32Min) - 1), 1), strict_conds) == Tri::True &&
            an.require_nonneg(lin_add(lin_const(kInt32Max - 1), an.lin(r.hi), -1), strict_conds) == Tri::True)
          out.strict_int32.insert(e.get());
        if (lo_ok == Tri::False || hi_ok == Tri::False) out.wide_ints.insert(e.get());
        else int32_conds.insert(int32_conds.end(), conds.begin(), conds.end());
      }
    }
    const Load* l = e.as<Load>();
    if (!l) return;
    LoadCheck check;
    check.load = e;
    const dsl::BufferDecl& decl = spec.spec.buffers.at(l->buffer);
    bool proven = true, impossible = false, nonneg_all = true;
    std::vector<Expr> conds;
    for (size_t d = 0; d < l->indices.size(); ++d) {
      Interval r = out.ranges.at(l->indices[d].get());
      check.index_ranges.push_back(r);
      const dsl::Dim& dim = decl.shape.at(d);
      Expr extent = dim.is_symbol ? an.symbol(dim.symbol) : make_int(dim.value);
      if (!r.lo || !r.hi) {
        impossible = true;
        nonneg_all = nonneg_all && an.provably_nonneg(r.lo);
        continue;
      }
      Tri lo_ok = an.require_nonneg(an.lin(r.lo), conds);
      Tri hi_ok = an.require_nonneg(lin_add(lin_add(an.lin(extent), lin_const(-1)), an.lin(r.hi), -1), conds);
      nonneg_all = nonneg_all && lo_ok == Tri::True;
      if (lo_ok == Tri::False || hi_ok == Tri::False) impossible = true;
      if (lo_ok != Tri::True || hi_ok != Tri::True) proven = false;
    }
    check.may_be_negative = !nonneg_all;
    if (impossible) {
      check.status = LoadCheck::Status::Unproven;
    } else if (proven) {
      check.status = LoadCheck::Status::Proven;
    } else {
      check.status = LoadCheck::Status::Conditional;
      check.obligation = conjunction(conds);
    }
    out.loads.push_back(std::move(check));
  });
  if (!int32_conds.empty()) out.int32_obligation = conjunction(int32_conds);
  return out;
}

}  // namespace flexjit
