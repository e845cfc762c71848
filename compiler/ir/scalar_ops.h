// Scalar implementations of every IR operation, exactly as docs/SEMANTICS.md defines them.
// The reference interpreter and constant folding both call these, so a folded constant and
// an interpreted value agree by construction.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "compiler/ir/ir.h"

namespace flexjit::ir {

// A value of one of the three language types; only the field matching `type` is meaningful.
struct Scalar {
  Type type = Type::Int;
  int64_t i = 0;
  float f = 0;
  bool b = false;
  static Scalar of_int(int64_t v) { return {Type::Int, v, 0, false}; }
  static Scalar of_float(float v) { return {Type::Float, 0, v, false}; }
  static Scalar of_bool(bool v) { return {Type::Bool, 0, 0, v}; }
};

namespace scalar {

// --- int (64-bit two's complement, wrapping) ---

inline int64_t wrap_add(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b)); }
inline int64_t wrap_sub(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b)); }
inline int64_t wrap_mul(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b)); }
inline int64_t wrap_neg(int64_t a) { return static_cast<int64_t>(0 - static_cast<uint64_t>(a)); }
inline int64_t int_abs(int64_t a) { return a < 0 ? wrap_neg(a) : a; }
inline int64_t int_sign(int64_t a) { return (a > 0) - (a < 0); }

// Floor division (Python's //). A zero divisor gives 0 and reports it through *div_by_zero.
inline int64_t int_floordiv(int64_t a, int64_t b, bool* div_by_zero = nullptr) {
  if (b == 0) {
    if (div_by_zero) *div_by_zero = true;
    return 0;
  }
  if (b == -1) return wrap_neg(a);  // INT64_MIN // -1 wraps to INT64_MIN (and C++ `/` would trap)
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

// Floor modulo (Python's %): the result has the sign of the divisor.
inline int64_t int_mod(int64_t a, int64_t b, bool* div_by_zero = nullptr) {
  if (b == 0) {
    if (div_by_zero) *div_by_zero = true;
    return 0;
  }
  if (b == -1) return 0;  // INT64_MIN % -1 is 0 (and C++ `%` would trap)
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

inline int64_t int_shl(int64_t a, int64_t n) { return (n < 0 || n > 63) ? 0 : static_cast<int64_t>(static_cast<uint64_t>(a) << n); }
inline int64_t int_shr(int64_t a, int64_t n) {
  if (n < 0) return 0;
  if (n > 63) return a < 0 ? -1 : 0;
  return a >> n;  // arithmetic since C++20
}

// --- float (IEEE fp32) ---

inline float float_floordiv(float a, float b) { return std::floor(a / b); }
inline float float_mod(float a, float b) {
  float r = std::fmod(a, b);
  if (r != 0 && (std::signbit(r) != std::signbit(b))) r += b;
  return r;
}
inline float float_sign(float a) {
  if (std::isnan(a)) return a;
  return a > 0 ? 1.0f : a < 0 ? -1.0f : 0.0f;
}
// Round half to even, independent of the floating-point environment's rounding mode.
inline float float_round(float a) {
  if (!std::isfinite(a)) return a;
  float fl = std::floor(a);
  float diff = a - fl;  // exact: a and floor(a) share an exponent range
  float r;
  if (diff > 0.5f) r = fl + 1.0f;
  else if (diff < 0.5f) r = fl;
  else r = std::fmod(fl, 2.0f) == 0.0f ? fl : fl + 1.0f;
  return std::copysign(r, a);  // keeps -0.0 for -0.4 as rintf does
}
// min/max: a NaN operand yields the other operand (also a signaling NaN, unlike glibc's
// fminf, so that a value loaded from a buffer behaves like one computed), and -0.0 counts as
// less than +0.0 (C leaves that case open). Both are then commutative, as LLVM's
// llvm.minimumnum / llvm.maximumnum are.
inline float float_min(float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}
inline float float_max(float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}
inline float float_sigmoid(float a) { return 1.0f / (1.0f + std::exp(-a)); }
inline float float_rsqrt(float a) { return 1.0f / std::sqrt(a); }

// --- conversions ---

inline float int_to_float(int64_t a) { return static_cast<float>(a); }
// int(x): truncation toward zero; NaN gives 0; values beyond the int64 range saturate.
inline int64_t float_to_int(float a) {
  if (std::isnan(a)) return 0;
  if (a >= 9223372036854775808.0f) return std::numeric_limits<int64_t>::max();
  if (a <= -9223372036854775808.0f) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(a);
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace scalar

// Applies a unary operator to a value of the operand type the IR node checked.
inline Scalar apply_unary(UnaryOp op, const Scalar& x) {
  using namespace scalar;
  if (x.type == Type::Bool) {
    if (op == UnaryOp::Not) return Scalar::of_bool(!x.b);
    throw std::logic_error("flexjit internal error: unary op on a bool");
  }
  if (x.type == Type::Int) {
    switch (op) {
      case UnaryOp::Neg: return Scalar::of_int(wrap_neg(x.i));
      case UnaryOp::BitNot: return Scalar::of_int(~x.i);
      case UnaryOp::Abs: return Scalar::of_int(int_abs(x.i));
      case UnaryOp::Sign: return Scalar::of_int(int_sign(x.i));
      case UnaryOp::Floor: case UnaryOp::Ceil: case UnaryOp::Round: return x;
      default: break;
    }
    throw std::logic_error("flexjit internal error: float-only unary op on an int");
  }
  float a = x.f;
  switch (op) {
    case UnaryOp::Neg: return Scalar::of_float(-a);
    case UnaryOp::Abs: return Scalar::of_float(std::fabs(a));
    case UnaryOp::Sign: return Scalar::of_float(float_sign(a));
    case UnaryOp::Floor: return Scalar::of_float(std::floor(a));
    case UnaryOp::Ceil: return Scalar::of_float(std::ceil(a));
    case UnaryOp::Round: return Scalar::of_float(float_round(a));
    case UnaryOp::Exp: return Scalar::of_float(std::exp(a));
    case UnaryOp::Exp2: return Scalar::of_float(std::exp2(a));
    case UnaryOp::Log: return Scalar::of_float(std::log(a));
    case UnaryOp::Log2: return Scalar::of_float(std::log2(a));
    case UnaryOp::Log1p: return Scalar::of_float(std::log1p(a));
    case UnaryOp::Sqrt: return Scalar::of_float(std::sqrt(a));
    case UnaryOp::Rsqrt: return Scalar::of_float(float_rsqrt(a));
    case UnaryOp::Tanh: return Scalar::of_float(std::tanh(a));
    case UnaryOp::Sigmoid: return Scalar::of_float(float_sigmoid(a));
    case UnaryOp::Sin: return Scalar::of_float(std::sin(a));
    case UnaryOp::Cos: return Scalar::of_float(std::cos(a));
    case UnaryOp::Not: case UnaryOp::BitNot: break;
  }
  throw std::logic_error("flexjit internal error: int/bool-only unary op on a float");
}

// Applies a binary operator to two values of one type. An int division or modulo by zero
// yields 0 and sets *div_by_zero (when given).
inline Scalar apply_binary(BinaryOp op, const Scalar& x, const Scalar& y, bool* div_by_zero = nullptr) {
  using namespace scalar;
  if (x.type == Type::Bool) {
    switch (op) {
      case BinaryOp::EQ: return Scalar::of_bool(x.b == y.b);
      case BinaryOp::NE: case BinaryOp::Xor: return Scalar::of_bool(x.b != y.b);
      case BinaryOp::And: return Scalar::of_bool(x.b && y.b);
      case BinaryOp::Or: return Scalar::of_bool(x.b || y.b);
      default: break;
    }
    throw std::logic_error("flexjit internal error: arithmetic on bools");
  }
  if (x.type == Type::Int) {
    int64_t a = x.i, b = y.i;
    switch (op) {
      case BinaryOp::Add: return Scalar::of_int(wrap_add(a, b));
      case BinaryOp::Sub: return Scalar::of_int(wrap_sub(a, b));
      case BinaryOp::Mul: return Scalar::of_int(wrap_mul(a, b));
      case BinaryOp::FloorDiv: return Scalar::of_int(int_floordiv(a, b, div_by_zero));
      case BinaryOp::Mod: return Scalar::of_int(int_mod(a, b, div_by_zero));
      case BinaryOp::Min: return Scalar::of_int(a < b ? a : b);
      case BinaryOp::Max: return Scalar::of_int(a > b ? a : b);
      case BinaryOp::EQ: return Scalar::of_bool(a == b);
      case BinaryOp::NE: return Scalar::of_bool(a != b);
      case BinaryOp::LT: return Scalar::of_bool(a < b);
      case BinaryOp::LE: return Scalar::of_bool(a <= b);
      case BinaryOp::GT: return Scalar::of_bool(a > b);
      case BinaryOp::GE: return Scalar::of_bool(a >= b);
      case BinaryOp::BitAnd: return Scalar::of_int(a & b);
      case BinaryOp::BitOr: return Scalar::of_int(a | b);
      case BinaryOp::BitXor: return Scalar::of_int(a ^ b);
      case BinaryOp::Shl: return Scalar::of_int(int_shl(a, b));
      case BinaryOp::Shr: return Scalar::of_int(int_shr(a, b));
      default: break;
    }
    throw std::logic_error("flexjit internal error: float/bool-only binary op on ints");
  }
  float a = x.f, b = y.f;
  switch (op) {
    case BinaryOp::Add: return Scalar::of_float(a + b);
    case BinaryOp::Sub: return Scalar::of_float(a - b);
    case BinaryOp::Mul: return Scalar::of_float(a * b);
    case BinaryOp::Div: return Scalar::of_float(a / b);
    case BinaryOp::FloorDiv: return Scalar::of_float(float_floordiv(a, b));
    case BinaryOp::Mod: return Scalar::of_float(float_mod(a, b));
    case BinaryOp::Min: return Scalar::of_float(float_min(a, b));
    case BinaryOp::Max: return Scalar::of_float(float_max(a, b));
    case BinaryOp::Pow: return Scalar::of_float(std::pow(a, b));
    case BinaryOp::EQ: return Scalar::of_bool(a == b);
    case BinaryOp::NE: return Scalar::of_bool(a != b);
    case BinaryOp::LT: return Scalar::of_bool(a < b);
    case BinaryOp::LE: return Scalar::of_bool(a <= b);
    case BinaryOp::GT: return Scalar::of_bool(a > b);
    case BinaryOp::GE: return Scalar::of_bool(a >= b);
    default: break;
  }
  throw std::logic_error("flexjit internal error: int/bool-only binary op on floats");
}

// Converts a value to `to` as the IR's Cast node does.
inline Scalar apply_cast(Type to, const Scalar& x) {
  using namespace scalar;
  if (to == x.type) return x;
  if (to == Type::Float) return Scalar::of_float(x.type == Type::Int ? int_to_float(x.i) : (x.b ? 1.0f : 0.0f));
  if (to == Type::Int) return Scalar::of_int(x.type == Type::Float ? float_to_int(x.f) : (x.b ? 1 : 0));
  throw std::logic_error("flexjit internal error: cast to bool");
}

// Immediates <-> scalars.
inline bool is_immediate(const Expr& e) {
  NodeKind k = e.kind();
  return k == NodeKind::IntImm || k == NodeKind::FloatImm || k == NodeKind::BoolImm;
}
inline Scalar immediate_value(const Expr& e) {
  if (const IntImm* i = e.as<IntImm>()) return Scalar::of_int(i->value);
  if (const FloatImm* f = e.as<FloatImm>()) return Scalar::of_float(f->value);
  if (const BoolImm* b = e.as<BoolImm>()) return Scalar::of_bool(b->value);
  throw std::logic_error("flexjit internal error: not an immediate");
}
inline Expr make_immediate(const Scalar& s) {
  switch (s.type) {
    case Type::Int: return make_int(s.i);
    case Type::Float: return make_float(s.f);
    case Type::Bool: return make_bool(s.b);
  }
  return {};
}

// One folding step: if every operand of e is an immediate and evaluating e can neither fault
// nor raise a runtime flag (an int division or modulo by zero keeps its runtime semantics),
// returns the immediate result; otherwise returns e unchanged. Loads are never folded.
inline Expr fold_node(const Expr& e) {
  switch (e.kind()) {
    case NodeKind::Unary: {
      const Unary* u = e.as<Unary>();
      return is_immediate(u->a) ? make_immediate(apply_unary(u->op, immediate_value(u->a))) : e;
    }
    case NodeKind::Binary: {
      const Binary* b = e.as<Binary>();
      if (!is_immediate(b->a) || !is_immediate(b->b)) return e;
      bool dz = false;
      Scalar r = apply_binary(b->op, immediate_value(b->a), immediate_value(b->b), &dz);
      return dz ? e : make_immediate(r);
    }
    case NodeKind::Select: {
      const Select* s = e.as<Select>();
      if (!is_immediate(s->cond) || !is_immediate(s->t) || !is_immediate(s->f)) return e;
      return immediate_value(s->cond).b ? s->t : s->f;
    }
    case NodeKind::Cast: {
      const Cast* c = e.as<Cast>();
      return is_immediate(c->a) ? make_immediate(apply_cast(e.type(), immediate_value(c->a))) : e;
    }
    default: return e;
  }
}

}  // namespace flexjit::ir
