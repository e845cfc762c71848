// Sound interval arithmetic for classifying a mask over a box of indices (a query tile by a
// KV tile) without evaluating every element: a comparison is decided only when it holds or
// fails for every point of the box; anything uncertain becomes "unknown" (a partial tile).
#pragma once
#include "flex_ops.cuh"

namespace fji {

struct I { long long lo, hi; };                 // integers in [lo, hi]
struct F { float lo, hi; bool nan; };           // floats in [lo, hi], possibly NaN
struct B { bool can_true, can_false; };         // a bool that may be true and/or false

#define FJI_D __device__ __forceinline__
constexpr long long kMin = (-9223372036854775807ll - 1), kMax = 9223372036854775807ll;
FJI_D I full_int() { return I{kMin, kMax}; }
FJI_D F full_float() { return F{-__int_as_float(0x7f800000), __int_as_float(0x7f800000), true}; }
FJI_D I pt(long long v) { return I{v, v}; }
FJI_D F pt(float v) { return F{v, v, v != v}; }
FJI_D B pt(bool v) { return B{v, !v}; }
FJI_D bool is_pt(I a) { return a.lo == a.hi; }
FJI_D I hull(I a, I b) { return I{min(a.lo, b.lo), max(a.hi, b.hi)}; }
FJI_D F hull(F a, F b) { return F{fminf(a.lo, b.lo), fmaxf(a.hi, b.hi), a.nan || b.nan}; }
FJI_D B hull(B a, B b) { return B{a.can_true || b.can_true, a.can_false || b.can_false}; }

// Integers: results that might overflow int64 widen to the full range (always sound).
FJI_D bool small(I a) { return a.lo > -(1ll << 31) && a.hi < (1ll << 31); }
FJI_D bool medium(I a) { return a.lo > -(1ll << 61) && a.hi < (1ll << 61); }
FJI_D I add(I a, I b) { return medium(a) && medium(b) ? I{a.lo + b.lo, a.hi + b.hi} : full_int(); }
FJI_D I sub(I a, I b) { return medium(a) && medium(b) ? I{a.lo - b.hi, a.hi - b.lo} : full_int(); }
FJI_D I neg(I a) { return a.lo == kMin ? full_int() : I{-a.hi, -a.lo}; }
FJI_D I mul(I a, I b) {
  if (!small(a) || !small(b)) return full_int();
  long long p0 = a.lo * b.lo, p1 = a.lo * b.hi, p2 = a.hi * b.lo, p3 = a.hi * b.hi;
  return I{min(min(p0, p1), min(p2, p3)), max(max(p0, p1), max(p2, p3))};
}
// Floor division is monotone in each operand while the divisor keeps its sign, so the
// corners bound it; a divisor range containing 0 also yields 0 (the runtime's semantics).
FJI_D I floordiv(I a, I b) {
  if (b.lo <= 0 && b.hi >= 0) {
    if (is_pt(b)) return pt(0ll);
    return full_int();
  }
  if (a.lo == kMin || b.lo == kMin) return full_int();
  long long p0 = fj::floordiv(a.lo, b.lo), p1 = fj::floordiv(a.lo, b.hi), p2 = fj::floordiv(a.hi, b.lo), p3 = fj::floordiv(a.hi, b.hi);
  return I{min(min(p0, p1), min(p2, p3)), max(max(p0, p1), max(p2, p3))};
}
FJI_D I mod(I a, I b) {
  if (is_pt(b) && b.lo > 0) {
    long long c = b.lo;
    if (a.lo != kMin && fj::floordiv(a.lo, c) == fj::floordiv(a.hi, c)) return I{fj::mod(a.lo, c), fj::mod(a.hi, c)};
    return I{0, c - 1};
  }
  if (b.lo <= 0 && b.hi >= 0) return I{min(0ll, b.lo == kMin ? kMin : b.lo + 1), max(0ll, b.hi == kMax ? kMax : b.hi - 1)};
  if (b.lo > 0) return I{0, b.hi - 1};
  return I{b.lo + 1, 0};
}
FJI_D I min_(I a, I b) { return I{min(a.lo, b.lo), min(a.hi, b.hi)}; }
FJI_D I max_(I a, I b) { return I{max(a.lo, b.lo), max(a.hi, b.hi)}; }
FJI_D I abs_(I a) {
  if (a.lo == kMin) return full_int();
  if (a.lo >= 0) return a;
  if (a.hi <= 0) return I{-a.hi, -a.lo};
  return I{0, max(-a.lo, a.hi)};
}
FJI_D I sign(I a) { return I{a.lo > 0 ? 1 : (a.lo < 0 ? -1 : 0), a.hi > 0 ? 1 : (a.hi < 0 ? -1 : 0)}; }
// Bitwise operations and shifts are exact on points and unknown otherwise.
FJI_D I bitand_(I a, I b) {
  if (is_pt(a) && is_pt(b)) return pt(a.lo & b.lo);
  if (a.lo >= 0 && b.lo >= 0) return I{0, min(a.hi, b.hi)};
  if (is_pt(b) && b.lo >= 0) return I{0, b.lo};
  if (is_pt(a) && a.lo >= 0) return I{0, a.lo};
  return full_int();
}
FJI_D I bitor_(I a, I b) { return is_pt(a) && is_pt(b) ? pt(a.lo | b.lo) : full_int(); }
FJI_D I bitxor_(I a, I b) { return is_pt(a) && is_pt(b) ? pt(a.lo ^ b.lo) : full_int(); }
FJI_D I bitnot_(I a) { return I{~a.hi, ~a.lo}; }
FJI_D I shl(I a, I b) { return is_pt(a) && is_pt(b) ? pt(fj::shl(a.lo, b.lo)) : full_int(); }
FJI_D I shr(I a, I b) { return is_pt(a) && is_pt(b) ? pt(fj::shr(a.lo, b.lo)) : full_int(); }

// Comparisons.
FJI_D B lt(I a, I b) { return B{a.lo < b.hi, a.hi >= b.lo}; }
FJI_D B le(I a, I b) { return B{a.lo <= b.hi, a.hi > b.lo}; }
FJI_D B gt(I a, I b) { return lt(b, a); }
FJI_D B ge(I a, I b) { return le(b, a); }
FJI_D B eq(I a, I b) { return B{a.lo <= b.hi && b.lo <= a.hi, !(is_pt(a) && is_pt(b) && a.lo == b.lo)}; }
FJI_D B ne(I a, I b) { B e = eq(a, b); return B{e.can_false, e.can_true}; }
FJI_D B lt(F a, F b) { return (a.nan || b.nan) ? B{a.lo < b.hi, true} : B{a.lo < b.hi, a.hi >= b.lo}; }
FJI_D B le(F a, F b) { return (a.nan || b.nan) ? B{a.lo <= b.hi, true} : B{a.lo <= b.hi, a.hi > b.lo}; }
FJI_D B gt(F a, F b) { return lt(b, a); }
FJI_D B ge(F a, F b) { return le(b, a); }
FJI_D B eq(F a, F b) {
  bool can_true = a.lo <= b.hi && b.lo <= a.hi;
  bool exact = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo && !a.nan && !b.nan;
  return B{can_true, !exact};
}
FJI_D B ne(F a, F b) { B e = eq(a, b); return B{e.can_false, e.can_true}; }
FJI_D B eq(B a, B b) {
  return B{(a.can_true && b.can_true) || (a.can_false && b.can_false), (a.can_true && b.can_false) || (a.can_false && b.can_true)};
}
FJI_D B ne(B a, B b) { B e = eq(a, b); return B{e.can_false, e.can_true}; }
FJI_D B and_(B a, B b) { return B{a.can_true && b.can_true, a.can_false || b.can_false}; }
FJI_D B or_(B a, B b) { return B{a.can_true || b.can_true, a.can_false && b.can_false}; }
FJI_D B not_(B a) { return B{a.can_false, a.can_true}; }
FJI_D B xor_(B a, B b) { return ne(a, b); }
template <class T>
FJI_D T select(B c, T a, T b) {
  if (!c.can_false) return a;
  if (!c.can_true) return b;
  return hull(a, b);
}

// Floats: monotone operations map corners (fp32 rounding is monotone); anything that could
// produce NaN or is not monotone widens to the full range.
FJI_D F fix(F r, bool nan) {
  if (r.lo != r.lo || r.hi != r.hi) return full_float();
  r.nan = r.nan || nan;
  return r;
}
FJI_D F add(F a, F b) { return fix(F{a.lo + b.lo, a.hi + b.hi, false}, a.nan || b.nan || (isinf(a.lo) || isinf(a.hi) || isinf(b.lo) || isinf(b.hi))); }
FJI_D F sub(F a, F b) { return fix(F{a.lo - b.hi, a.hi - b.lo, false}, a.nan || b.nan || (isinf(a.lo) || isinf(a.hi) || isinf(b.lo) || isinf(b.hi))); }
FJI_D F neg(F a) { return F{-a.hi, -a.lo, a.nan}; }
FJI_D F mul(F a, F b) {
  float p0 = a.lo * b.lo, p1 = a.lo * b.hi, p2 = a.hi * b.lo, p3 = a.hi * b.hi;
  bool inf = isinf(a.lo) || isinf(a.hi) || isinf(b.lo) || isinf(b.hi);
  return fix(F{fminf(fminf(p0, p1), fminf(p2, p3)), fmaxf(fmaxf(p0, p1), fmaxf(p2, p3)), false}, a.nan || b.nan || inf);
}
FJI_D F div(F a, F b) {
  if (b.lo <= 0.f && b.hi >= 0.f) return full_float();
  float p0 = a.lo / b.lo, p1 = a.lo / b.hi, p2 = a.hi / b.lo, p3 = a.hi / b.hi;
  bool inf = isinf(a.lo) || isinf(a.hi) || isinf(b.lo) || isinf(b.hi);
  return fix(F{fminf(fminf(p0, p1), fminf(p2, p3)), fmaxf(fmaxf(p0, p1), fmaxf(p2, p3)), false}, a.nan || b.nan || inf);
}
FJI_D F min_(F a, F b) { return F{fminf(a.lo, b.lo), fminf(a.hi, b.hi), a.nan && b.nan}; }
FJI_D F max_(F a, F b) { return F{fmaxf(a.lo, b.lo), fmaxf(a.hi, b.hi), a.nan && b.nan}; }
FJI_D F abs_(F a) {
  if (a.lo >= 0.f) return a;
  if (a.hi <= 0.f) return F{-a.hi, -a.lo, a.nan};
  return F{0.f, fmaxf(-a.lo, a.hi), a.nan};
}
// A monotone non-decreasing function applied to the bounds.
#define FJI_MONOTONE(name, fn) \
  FJI_D F name(F a) { return fix(F{fn(a.lo), fn(a.hi), a.nan}, false); }
FJI_MONOTONE(exp_, expf)
FJI_MONOTONE(exp2_, exp2f)
FJI_MONOTONE(tanh_, tanhf)
FJI_MONOTONE(sigmoid_, fj::sigmoid)
FJI_MONOTONE(floor_, floorf)
FJI_MONOTONE(ceil_, ceilf)
FJI_MONOTONE(round_, rintf)
#undef FJI_MONOTONE
// Monotone on their domain; NaN below it.
FJI_D F log_(F a) { return fix(F{logf(a.lo), logf(a.hi), a.nan || a.lo < 0.f}, false); }
FJI_D F log2_(F a) { return fix(F{log2f(a.lo), log2f(a.hi), a.nan || a.lo < 0.f}, false); }
FJI_D F log1p_(F a) { return fix(F{log1pf(a.lo), log1pf(a.hi), a.nan || a.lo < -1.f}, false); }
FJI_D F sqrt_(F a) { return fix(F{sqrtf(fmaxf(a.lo, 0.f)), sqrtf(a.hi), a.nan || a.lo < 0.f}, false); }
FJI_D F rsqrt_(F a) { return div(pt(1.f), sqrt_(a)); }
FJI_D F sin_(F a) { return F{-1.f, 1.f, true}; }
FJI_D F cos_(F a) { return F{-1.f, 1.f, true}; }
FJI_D F pow_(F, F) { return full_float(); }
FJI_D F floordiv(F a, F b) { return floor_(div(a, b)); }
FJI_D F mod(F a, F b) { return full_float(); }
FJI_D F sign(F a) { return F{a.lo > 0.f ? 1.f : (a.lo < 0.f ? -1.f : 0.f), a.hi > 0.f ? 1.f : (a.hi < 0.f ? -1.f : 0.f), a.nan}; }

// Conversions.
FJI_D F to_float(I a) { return F{(float)a.lo, (float)a.hi, false}; }
FJI_D F to_float(B a) { return F{a.can_false ? 0.f : 1.f, a.can_true ? 1.f : 0.f, false}; }
FJI_D I to_int(F a) {
  if (a.nan) return full_int();
  return I{fj::float_to_int(a.lo), fj::float_to_int(a.hi)};
}
FJI_D I to_int(B a) { return I{a.can_false ? 0 : 1, a.can_true ? 1 : 0}; }

// 0: the mask is false everywhere in the box (empty tile), 1: true everywhere (full tile),
// 2: unknown (partial tile).
FJI_D int classify(B m) { return !m.can_true ? 0 : (!m.can_false ? 1 : 2); }
#undef FJI_D

}  // namespace fji
