#include "compiler/passes/interval_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <unordered_map>

#include "compiler/ir/scalar_ops.h"

namespace flexjit {

using namespace ir;

namespace {

using i128 = __int128;
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr double kInfD = std::numeric_limits<double>::infinity();

// The set of values a node takes over the box, over-approximated. Only the fields of the
// node's type are meaningful.
struct AV {
  int64_t lo = kMin, hi = kMax;       // Int
  double flo = -kInfD, fhi = kInfD;   // Float: the non-NaN values lie in [flo, fhi]
  bool nan = true;                    // Float: NaN is possible
  bool t = true, f = true;            // Bool: true / false possible
};

AV int_av(int64_t lo, int64_t hi) {
  AV a;
  a.lo = lo;
  a.hi = hi;
  return a;
}
AV int_av128(i128 lo, i128 hi) {
  if (lo < kMin || hi > kMax) return AV{};  // the operation may wrap: any int
  return int_av(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
}
AV float_av(double lo, double hi, bool nan) {
  AV a;
  a.flo = lo;
  a.fhi = hi;
  a.nan = nan;
  return a;
}
AV full_float() { return float_av(-kInfD, kInfD, true); }
AV bool_av(bool t, bool f) {
  AV a;
  a.t = t;
  a.f = f;
  return a;
}

double down(double v, int ulps) {
  float x = static_cast<float>(v);
  for (int i = 0; i < ulps; ++i) x = std::nextafter(x, -std::numeric_limits<float>::infinity());
  return x;
}
double up(double v, int ulps) {
  float x = static_cast<float>(v);
  for (int i = 0; i < ulps; ++i) x = std::nextafter(x, std::numeric_limits<float>::infinity());
  return x;
}
// A float interval from endpoint results computed in double: widened by `ulps` fp32 ulps each
// way to cover fp32 rounding (and library error for transcendental functions).
AV widened(double lo, double hi, bool nan, int ulps = 1) { return float_av(down(lo, ulps), up(hi, ulps), nan); }

bool is_single(const AV& a, Type t) {
  switch (t) {
    case Type::Int: return a.lo == a.hi;
    case Type::Float: return !a.nan && a.flo == a.fhi && std::signbit(a.flo) == std::signbit(a.fhi);
    case Type::Bool: return a.t != a.f;
  }
  return false;
}
Scalar single_value(const AV& a, Type t) {
  switch (t) {
    case Type::Int: return Scalar::of_int(a.lo);
    case Type::Float: return Scalar::of_float(static_cast<float>(a.flo));
    case Type::Bool: return Scalar::of_bool(a.t);
  }
  return {};
}
AV of_scalar(const Scalar& s) {
  switch (s.type) {
    case Type::Int: return int_av(s.i, s.i);
    case Type::Float: return std::isnan(s.f) ? full_float() : float_av(s.f, s.f, false);
    case Type::Bool: return bool_av(s.b, !s.b);
  }
  return {};
}

i128 floordiv128(i128 a, i128 b) {
  i128 q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t trunc_to_int(double v) {
  if (v >= 9223372036854775808.0) return kMax;
  if (v <= -9223372036854775808.0) return kMin;
  return static_cast<int64_t>(v);
}

AV hull(const AV& a, const AV& b, Type t) {
  AV r;
  switch (t) {
    case Type::Int: return int_av(std::min(a.lo, b.lo), std::max(a.hi, b.hi));
    case Type::Float: return float_av(std::min(a.flo, b.flo), std::max(a.fhi, b.fhi), a.nan || b.nan);
    case Type::Bool: return bool_av(a.t || b.t, a.f || b.f);
  }
  return r;
}

class BoxEvaluator {
 public:
  explicit BoxEvaluator(const IntervalEnv& env) : env_(env) {}

  AV eval(const Expr& e) {
    auto it = memo_.find(e.get());
    if (it != memo_.end()) return it->second;
    AV r = compute(e);
    memo_.emplace(e.get(), r);
    return r;
  }

 private:
  AV compute(const Expr& e) {
    switch (e.kind()) {
      case NodeKind::IntImm:
      case NodeKind::FloatImm:
      case NodeKind::BoolImm: return of_scalar(immediate_value(e));
      case NodeKind::Var: {
        VarId v = e.as<Var>()->var;
        if (v == VarId::Score) return full_float();
        const ConcreteInterval& c = env_.vars[static_cast<int>(v)];
        return int_av(c.lo, c.hi);
      }
      case NodeKind::Symbol: {
        const Symbol* s = e.as<Symbol>();
        if (s->index < 0 || static_cast<size_t>(s->index) >= env_.symbols.size())
          throw std::invalid_argument("classify_box: no value for shape symbol " + s->name);
        return int_av(env_.symbols[s->index], env_.symbols[s->index]);
      }
      case NodeKind::Param: {
        const Param* p = e.as<Param>();
        if (p->index < 0 || static_cast<size_t>(p->index) >= env_.params.size())
          throw std::invalid_argument("classify_box: no value for parameter " + p->name);
        double v = env_.params[p->index];
        switch (e.type()) {
          case Type::Int: return of_scalar(Scalar::of_int(trunc_to_int(v)));
          case Type::Float: return of_scalar(Scalar::of_float(static_cast<float>(v)));
          case Type::Bool: return of_scalar(Scalar::of_bool(v != 0));
        }
        return {};
      }
      case NodeKind::Load: {
        const Load* l = e.as<Load>();
        for (const Expr& i : l->indices) eval(i);
        switch (l->dtype) {
          case DType::U8: return int_av(0, 255);
          case DType::I32: return int_av(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
          case DType::I64: return AV{};
          case DType::Bool: return bool_av(true, true);
          default: return full_float();
        }
      }
      case NodeKind::Select: {
        const Select* s = e.as<Select>();
        AV c = eval(s->cond);
        if (c.t && !c.f) return eval(s->t);
        if (c.f && !c.t) return eval(s->f);
        return hull(eval(s->t), eval(s->f), e.type());
      }
      case NodeKind::Cast: return cast(e.type(), e.as<Cast>()->a);
      case NodeKind::Unary: {
        const Unary* u = e.as<Unary>();
        AV a = eval(u->a);
        Type t = u->a.type();
        if (is_single(a, t)) return of_scalar(apply_unary(u->op, single_value(a, t)));
        if (t == Type::Bool) return bool_av(a.f, a.t);  // Not
        return t == Type::Int ? int_unary(u->op, a) : float_unary(u->op, a);
      }
      case NodeKind::Binary: {
        const Binary* b = e.as<Binary>();
        AV x = eval(b->a), y = eval(b->b);
        Type t = b->a.type();
        if (is_single(x, t) && is_single(y, t)) return of_scalar(apply_binary(b->op, single_value(x, t), single_value(y, t)));
        if (t == Type::Bool) return bool_binary(b->op, x, y);
        if (binary_op_is_comparison(b->op)) return t == Type::Int ? int_compare(b->op, x, y) : float_compare(b->op, x, y);
        return t == Type::Int ? int_binary(b->op, x, y) : float_binary(b->op, x, y);
      }
    }
    return {};
  }

  AV cast(Type to, const Expr& from) {
    AV a = eval(from);
    Type t = from.type();
    if (is_single(a, t)) return of_scalar(apply_cast(to, single_value(a, t)));
    if (t == Type::Bool) {
      double lo = a.f ? 0 : 1, hi = a.t ? 1 : 0;
      return to == Type::Int ? int_av(static_cast<int64_t>(lo), static_cast<int64_t>(hi)) : float_av(lo, hi, false);
    }
    if (t == Type::Int) return float_av(scalar::int_to_float(a.lo), scalar::int_to_float(a.hi), false);  // monotone
    // float -> int truncates (monotone, saturating); NaN gives 0.
    int64_t lo = trunc_to_int(a.flo), hi = trunc_to_int(a.fhi);
    if (a.nan) {
      lo = std::min<int64_t>(lo, 0);
      hi = std::max<int64_t>(hi, 0);
    }
    return int_av(lo, hi);
  }

  static AV bool_binary(BinaryOp op, const AV& x, const AV& y) {
    switch (op) {
      case BinaryOp::And: return bool_av(x.t && y.t, x.f || y.f);
      case BinaryOp::Or: return bool_av(x.t || y.t, x.f && y.f);
      case BinaryOp::Xor:
      case BinaryOp::NE: return bool_av((x.t && y.f) || (x.f && y.t), (x.t && y.t) || (x.f && y.f));
      case BinaryOp::EQ: return bool_av((x.t && y.t) || (x.f && y.f), (x.t && y.f) || (x.f && y.t));
      default: return bool_av(true, true);
    }
  }

  static AV int_compare(BinaryOp op, const AV& x, const AV& y) {
    switch (op) {
      case BinaryOp::LT: return bool_av(x.lo < y.hi, x.hi >= y.lo);
      case BinaryOp::LE: return bool_av(x.lo <= y.hi, x.hi > y.lo);
      case BinaryOp::GT: return bool_av(x.hi > y.lo, x.lo <= y.hi);
      case BinaryOp::GE: return bool_av(x.hi >= y.lo, x.lo < y.hi);
      case BinaryOp::EQ:
      case BinaryOp::NE: {
        bool can_eq = x.lo <= y.hi && y.lo <= x.hi;
        bool can_ne = !(x.lo == x.hi && y.lo == y.hi && x.lo == y.lo);
        return op == BinaryOp::EQ ? bool_av(can_eq, can_ne) : bool_av(can_ne, can_eq);
      }
      default: return bool_av(true, true);
    }
  }

  static AV float_compare(BinaryOp op, const AV& x, const AV& y) {
    bool nan = x.nan || y.nan;  // a NaN operand makes every comparison but != false
    switch (op) {
      case BinaryOp::LT: return bool_av(x.flo < y.fhi, x.fhi >= y.flo || nan);
      case BinaryOp::LE: return bool_av(x.flo <= y.fhi, x.fhi > y.flo || nan);
      case BinaryOp::GT: return bool_av(x.fhi > y.flo, x.flo <= y.fhi || nan);
      case BinaryOp::GE: return bool_av(x.fhi >= y.flo, x.flo < y.fhi || nan);
      case BinaryOp::EQ:
      case BinaryOp::NE: {
        bool can_eq = x.flo <= y.fhi && y.flo <= x.fhi;
        bool can_ne = !(x.flo == x.fhi && y.flo == y.fhi && x.flo == y.flo) || nan;
        return op == BinaryOp::EQ ? bool_av(can_eq, can_ne) : bool_av(can_ne, can_eq);
      }
      default: return bool_av(true, true);
    }
  }

  static AV int_unary(UnaryOp op, const AV& a) {
    switch (op) {
      case UnaryOp::Neg: return int_av128(-static_cast<i128>(a.hi), -static_cast<i128>(a.lo));
      case UnaryOp::BitNot: return int_av(~a.hi, ~a.lo);
      case UnaryOp::Abs:
        if (a.lo >= 0) return a;
        if (a.hi <= 0) return int_av128(-static_cast<i128>(a.hi), -static_cast<i128>(a.lo));
        return int_av128(0, std::max(-static_cast<i128>(a.lo), static_cast<i128>(a.hi)));
      case UnaryOp::Sign: return int_av(scalar::int_sign(a.lo), scalar::int_sign(a.hi));
      case UnaryOp::Floor:
      case UnaryOp::Ceil:
      case UnaryOp::Round: return a;
      default: return AV{};
    }
  }

  // x // d over the divisors of one sign in [dlo, dhi] (no zero): the extremes are at corners.
  static void floordiv_part(const AV& x, i128 dlo, i128 dhi, i128& lo, i128& hi) {
    for (i128 xv : {static_cast<i128>(x.lo), static_cast<i128>(x.hi)})
      for (i128 dv : {dlo, dhi}) {
        i128 q = floordiv128(xv, dv);
        lo = std::min(lo, q);
        hi = std::max(hi, q);
      }
  }

  // x % d over the divisors of one sign in [dlo, dhi] (no zero).
  static void mod_part(const AV& x, i128 dlo, i128 dhi, i128& lo, i128& hi) {
    i128 xl = x.lo, xh = x.hi;
    if (dlo == dhi && floordiv128(xl, dlo) == floordiv128(xh, dlo)) {  // one period: x % d is x - k*d, increasing
      lo = std::min(lo, xl - floordiv128(xl, dlo) * dlo);
      hi = std::max(hi, xh - floordiv128(xh, dlo) * dlo);
      return;
    }
    if (dlo > 0) {
      if (xl >= 0 && xh < dlo) {
        lo = std::min(lo, xl);
        hi = std::max(hi, xh);
      } else {
        lo = std::min<i128>(lo, 0);
        hi = std::max(hi, xl >= 0 ? std::min(xh, dhi - 1) : dhi - 1);
      }
    } else {
      if (xh <= 0 && xl > dhi) {
        lo = std::min(lo, xl);
        hi = std::max(hi, xh);
      } else {
        lo = std::min(lo, xh <= 0 ? std::max(xl, dlo + 1) : dlo + 1);
        hi = std::max<i128>(hi, 0);
      }
    }
  }

  static AV int_binary(BinaryOp op, const AV& x, const AV& y) {
    i128 a = x.lo, A = x.hi, c = y.lo, C = y.hi;
    switch (op) {
      case BinaryOp::Add: return int_av128(a + c, A + C);
      case BinaryOp::Sub: return int_av128(a - C, A - c);
      case BinaryOp::Mul: {
        i128 p[4] = {a * c, a * C, A * c, A * C};
        return int_av128(*std::min_element(p, p + 4), *std::max_element(p, p + 4));
      }
      case BinaryOp::FloorDiv:
      case BinaryOp::Mod: {
        i128 lo = std::numeric_limits<i128>::max(), hi = std::numeric_limits<i128>::min();
        auto part = op == BinaryOp::FloorDiv ? floordiv_part : mod_part;
        if (c <= -1) part(x, c, std::min<i128>(C, -1), lo, hi);
        if (C >= 1) part(x, std::max<i128>(c, 1), C, lo, hi);
        if (c <= 0 && C >= 0) {  // a zero divisor gives 0
          lo = std::min<i128>(lo, 0);
          hi = std::max<i128>(hi, 0);
        }
        return int_av128(lo, hi);
      }
      case BinaryOp::Min: return int_av(std::min(x.lo, y.lo), std::min(x.hi, y.hi));
      case BinaryOp::Max: return int_av(std::max(x.lo, y.lo), std::max(x.hi, y.hi));
      case BinaryOp::BitAnd:
        if (x.lo >= 0 && y.lo >= 0) return int_av(0, std::min(x.hi, y.hi));
        if (x.lo >= 0) return int_av(0, x.hi);
        if (y.lo >= 0) return int_av(0, y.hi);
        if (x.hi < 0 && y.hi < 0) return int_av(kMin, std::min(x.hi, y.hi));
        return AV{};
      case BinaryOp::BitOr:
      case BinaryOp::BitXor: {
        if (x.lo < 0 || y.lo < 0) return AV{};
        int64_t m = std::max(x.hi, y.hi);
        int64_t mask = m == 0 ? 0 : static_cast<int64_t>((~uint64_t{0}) >> __builtin_clzll(static_cast<uint64_t>(m)));
        return int_av(op == BinaryOp::BitOr ? std::max(x.lo, y.lo) : 0, mask);
      }
      case BinaryOp::Shl:
        if (c >= 0 && C <= 63) {
          i128 lo = std::numeric_limits<i128>::max(), hi = std::numeric_limits<i128>::min();
          for (i128 n : {c, C}) {
            if (n > 62) return AV{};
            for (i128 v : {a, A}) {
              i128 r = v * (static_cast<i128>(1) << static_cast<int>(n));
              lo = std::min(lo, r);
              hi = std::max(hi, r);
            }
          }
          return int_av128(lo, hi);
        }
        return AV{};
      case BinaryOp::Shr:
        if (c >= 0 && C <= 63) {
          int64_t r[4] = {x.lo >> y.lo, x.lo >> y.hi, x.hi >> y.lo, x.hi >> y.hi};
          return int_av(*std::min_element(r, r + 4), *std::max_element(r, r + 4));
        }
        return AV{};
      default: return AV{};
    }
  }

  static AV float_unary(UnaryOp op, const AV& a) {
    auto f = [op](double v) { return static_cast<double>(apply_unary(op, Scalar::of_float(static_cast<float>(v))).f); };
    switch (op) {
      case UnaryOp::Neg: return float_av(-a.fhi, -a.flo, a.nan);
      case UnaryOp::Abs:
        if (a.flo >= 0) return a;
        if (a.fhi <= 0) return float_av(-a.fhi, -a.flo, a.nan);
        return float_av(0, std::max(-a.flo, a.fhi), a.nan);
      case UnaryOp::Sign:
      case UnaryOp::Floor:
      case UnaryOp::Ceil:
      case UnaryOp::Round: return float_av(f(a.flo), f(a.fhi), a.nan);  // monotone and exact
      case UnaryOp::Exp:
      case UnaryOp::Exp2:
      case UnaryOp::Tanh:
      case UnaryOp::Sigmoid: return widened(f(a.flo), f(a.fhi), a.nan, 2);
      case UnaryOp::Log:
      case UnaryOp::Log2:
      case UnaryOp::Sqrt: {
        double lo = std::max(a.flo, 0.0);
        if (a.fhi < 0) return full_float();
        return widened(f(lo), f(a.fhi), a.nan || a.flo < 0, 2);
      }
      case UnaryOp::Log1p: {
        if (a.fhi < -1) return full_float();
        return widened(f(std::max(a.flo, -1.0)), f(a.fhi), a.nan || a.flo < -1, 2);
      }
      case UnaryOp::Rsqrt:
        if (a.flo <= 0) return full_float();
        return widened(f(a.fhi), f(a.flo), a.nan, 2);
      case UnaryOp::Sin:
      case UnaryOp::Cos: return float_av(-1, 1, a.nan || std::isinf(a.flo) || std::isinf(a.fhi));
      default: return full_float();
    }
  }

  static AV float_binary(BinaryOp op, const AV& x, const AV& y) {
    bool nan = x.nan || y.nan;
    auto corners = [&](auto fn, int ulps) {
      double p[4] = {fn(x.flo, y.flo), fn(x.flo, y.fhi), fn(x.fhi, y.flo), fn(x.fhi, y.fhi)};
      for (double v : p)
        if (std::isnan(v)) return full_float();
      return widened(*std::min_element(p, p + 4), *std::max_element(p, p + 4), nan, ulps);
    };
    switch (op) {
      case BinaryOp::Add: return corners([](double u, double v) { return u + v; }, 1);
      case BinaryOp::Sub: return corners([](double u, double v) { return u - v; }, 1);
      case BinaryOp::Mul: {
        // 0 * inf inside the box is NaN even when no corner is.
        bool zero_inf = (x.flo <= 0 && x.fhi >= 0 && (std::isinf(y.flo) || std::isinf(y.fhi))) ||
                        (y.flo <= 0 && y.fhi >= 0 && (std::isinf(x.flo) || std::isinf(x.fhi)));
        AV r = corners([](double u, double v) { return u * v; }, 1);
        r.nan = r.nan || zero_inf;
        return r;
      }
      case BinaryOp::Div:
      case BinaryOp::FloorDiv: {
        if (y.flo <= 0 && y.fhi >= 0) return full_float();
        AV r = corners([](double u, double v) { return u / v; }, 1);
        if (op == BinaryOp::FloorDiv) r = float_av(std::floor(r.flo), std::floor(r.fhi), r.nan);
        return r;
      }
      case BinaryOp::Min:
      case BinaryOp::Max: {
        // min/max return the other operand when one is NaN (scalar_ops.h).
        bool is_min = op == BinaryOp::Min;
        AV r = float_av(is_min ? std::min(x.flo, y.flo) : std::max(x.flo, y.flo), is_min ? std::min(x.fhi, y.fhi) : std::max(x.fhi, y.fhi),
                        x.nan && y.nan);
        if (x.nan) r = float_av(std::min(r.flo, y.flo), std::max(r.fhi, y.fhi), r.nan);
        if (y.nan) r = float_av(std::min(r.flo, x.flo), std::max(r.fhi, x.fhi), r.nan);
        return r;
      }
      default: return full_float();
    }
  }

  const IntervalEnv& env_;
  std::unordered_map<const Node*, AV> memo_;
};

}  // namespace

TriBool classify_box(const Expr& mask, const IntervalEnv& env) {
  if (!mask) return TriBool::True;
  if (mask.type() != Type::Bool) throw std::invalid_argument("classify_box: the mask is not a bool expression");
  AV r = BoxEvaluator(env).eval(mask);
  if (r.t && !r.f) return TriBool::True;
  if (r.f && !r.t) return TriBool::False;
  return TriBool::Unknown;
}

}  // namespace flexjit
